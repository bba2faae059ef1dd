"""The built artifact installs elsewhere and its roles, modules, filters and playbooks work by FQCN."""

import json
import os
import re
import shutil
import subprocess
import tarfile
import textwrap
import uuid

import pytest
from conftest import ROOT

STAGES = ["preflight", "node", "fabric", "image", "weights", "serve", "verify", "watch"]

PLAYBOOK = """\
---
- name: Reuse the preflight role on any inventory, from the installed collection
  hosts: sparkfleet_cluster
  gather_facts: false
  roles:
    - role: sparkfleet.cluster.preflight
      vars:
        preflight_check_become: false
        preflight_check_fabric: false  # this machine has no ConnectX-7 ports to find
  post_tasks:
    - name: Call a module by FQCN
      sparkfleet.cluster.node_facts:

    - name: Show where the facts came from
      ansible.builtin.debug:
        msg: "{{ sparkfleet_node.memory.total_kib > 0 }}"
"""

INVENTORY = """\
sparkfleet_cluster:
  hosts:
    # (no ansible_host, and its name resolves nowhere: the head, Prometheus' host, names its address itself)
    alpha: {sparkfleet_node_rank: 0, sparkfleet_fabric_address: 198.51.100.10, monitoring_listen_address: 198.51.100.20}
    beta: {sparkfleet_node_rank: 1, sparkfleet_fabric_address: 198.51.100.11}
  vars:
    ansible_connection: local
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
    sparkfleet_model_profile: tiny-cpu
    sparkfleet_tensor_parallel_size: 2
  children:
    sparkfleet_head:
      hosts:
        alpha:
"""


def run(argv, cwd, env):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The artifact, built once for the module and installed offline into a collections directory of its own;
    the playbooks run from a directory that has nothing to do with the checkout or the collection."""
    base = tmp_path_factory.mktemp("build")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    built = run(["ansible-galaxy", "collection", "build", "--output-path", str(base), ROOT], base, env)
    assert built.returncode == 0, built.stderr
    (artifact,) = base.glob("sparkfleet-cluster-*.tar.gz")
    collections = base / "collections"
    installed = run(["ansible-galaxy", "collection", "install", "--offline", "-p", str(collections), str(artifact)],
                    base, env)
    assert installed.returncode == 0, installed.stderr + installed.stdout
    work = base / "elsewhere"
    work.mkdir()
    (work / "hosts.yml").write_text(textwrap.dedent(INVENTORY))
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
    return {"artifact": artifact, "collections": collections, "work": work, "env": env,
            "root": collections / "ansible_collections/sparkfleet/cluster"}


def test_build_install_and_use_by_fqcn(installed):
    with tarfile.open(installed["artifact"]) as tar:
        names = tar.getnames()
    assert "roles/preflight/tasks/main.yml" in names and "plugins/action/cluster_validate.py" in names
    assert "profiles/tiny-cpu.yml" in names and "MANIFEST.json" in names
    assert "playbooks/site.yml" in names and "playbooks/lab.yml" in names
    assert not [n for n in names if n.startswith((".venv", "collections", ".lab", "inventory/lab/hosts"))]

    work, collections = installed["work"], installed["collections"]
    (work / "play.yml").write_text(PLAYBOOK)
    played = run(["ansible-playbook", "-i", "hosts.yml", "play.yml"], work, installed["env"])
    assert played.returncode == 0, played.stdout[-3000:] + played.stderr[-2000:]
    assert "rank 1 worker beta" in played.stdout
    assert str(collections / "ansible_collections/sparkfleet/cluster/roles/preflight") in played.stdout or \
        "sparkfleet.cluster.preflight" in played.stdout


def test_site_by_fqcn_from_installed_artifact(installed):
    """sparkfleet.cluster.site is the main job: every stage's play, in order, each with its stage tag."""
    work, env = installed["work"], installed["env"]
    site = str(installed["root"] / "playbooks/site.yml")

    syntax = run(["ansible-playbook", "-i", "hosts.yml", "sparkfleet.cluster.site", "--syntax-check"], work, env)
    assert syntax.returncode == 0, syntax.stdout[-3000:] + syntax.stderr[-2000:]
    assert f"playbook: {site}" in syntax.stdout

    # --list-tasks and --list-tags in one run: each play's tags, then its tasks
    listed = run(["ansible-playbook", "-i", "hosts.yml", "sparkfleet.cluster.site", "--list-tasks", "--list-tags"],
                 work, env)
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-2000:]
    assert f"playbook: {site}" in listed.stdout
    plays = re.findall(r"play #(\d+) \(sparkfleet_cluster(?::sparkfleet_monitor)?\): (\w+)\tTAGS: \[(\w+)\]",
                       listed.stdout)
    assert [(int(n), tag) for n, _name, tag in plays] == list(enumerate(STAGES, 1))
    assert [name.lower() for _number, name, _tag in plays] == STAGES
    for stage in STAGES:
        assert f"TASK TAGS: [always, {stage}]" in listed.stdout, stage
    for role in ["preflight", "node_memory", "gpu", "container_runtime", "fabric", "nccl", "vllm_image",
                 "model_weights", "vllm_service", "verify", "monitoring"]:
        assert f"sparkfleet.cluster.{role} : " in listed.stdout, role

    # A stage tag selects that stage's play only (beside what is tagged always).
    serve = run(["ansible-playbook", "-i", "hosts.yml", "sparkfleet.cluster.site", "--list-tasks", "--tags", "serve"],
                work, env)
    assert serve.returncode == 0, serve.stdout[-3000:] + serve.stderr[-2000:]
    assert "Discover what each node has (the runtime follows the accelerator)" in serve.stdout
    assert "Discover what each node has (containers leave kernel settings to the host)" not in serve.stdout


def docker_answers():
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def file_paths(report):
    """Every path a task's result names, from the ansible.posix.json callback's report."""
    paths = []
    for play in report["plays"]:
        for task in play["tasks"]:
            for result in task["hosts"].values():
                for item in result.get("results", [result]):
                    if isinstance(item, dict) and "path" in item:
                        paths.append(item["path"])
    return paths


# Without an engine the lab would install and start one (roles/lab/tasks/engine.yml): never from a test.
@pytest.mark.skipif(not docker_answers(), reason="no Docker engine answers here")
def test_lab_state_stays_outside_installed_collection(installed):
    """sparkfleet.cluster.lab from the artifact keeps its inventory and state under the working directory.

    lab_state=absent on a lab name nothing uses: it removes containers and networks of that name only where they
    exist (none do), then the inventory file and the state directory - the files planted here show where those
    paths resolve: the working directory's are removed, the ones planted inside the installed collection stay.
    """
    work, root = installed["work"], installed["root"]
    name = f"sparkfleet-buildtest-{uuid.uuid4().hex[:8]}"
    planted = {
        "inventory": work / "inventory/lab/hosts.yml",
        "state": work / ".lab" / name / "known_hosts",
        "inside_inventory": root / "inventory/lab/hosts.yml",
        "inside_state": root / ".lab" / name / "known_hosts",
    }
    for path in planted.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("planted by the test\n")
    # pipelining: each module runs in one local process, no temporary files (the run stays short)
    env = dict(installed["env"], ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_PIPELINING="true")
    try:
        removed = run(["ansible-playbook", "sparkfleet.cluster.lab", "-e", "lab_state=absent", "-e",
                       f"lab_name={name}"], work, env)
        assert removed.returncode == 0, removed.stdout[-3000:] + removed.stderr[-2000:]
        paths = file_paths(json.loads(removed.stdout))
        assert str(work / "inventory/lab/hosts.yml") in paths, paths
        assert str(work / ".lab" / name) in paths, paths
        assert not [p for p in paths if p.startswith(str(installed["collections"]))], paths
        assert not planted["inventory"].exists() and not planted["state"].parent.exists()
        assert planted["inside_inventory"].exists() and planted["inside_state"].exists()
    finally:
        planted["inside_inventory"].unlink(missing_ok=True)
        shutil.rmtree(root / ".lab", ignore_errors=True)
    containers = run(["docker", "ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}"], work, env)
    networks = run(["docker", "network", "ls", "--filter", f"name={name}", "--format", "{{.Name}}"], work, env)
    assert (containers.returncode, containers.stdout, networks.returncode, networks.stdout) == (0, "", 0, "")
