"""The built artifact installs elsewhere and its roles, modules and filters work by FQCN."""

import os
import subprocess
import tarfile
import textwrap

from conftest import ROOT

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
    alpha: {sparkfleet_node_rank: 0, sparkfleet_fabric_address: 198.51.100.10}
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
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_build_install_and_use_by_fqcn(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    built = run(["ansible-galaxy", "collection", "build", "--output-path", str(tmp_path), ROOT], tmp_path, env)
    assert built.returncode == 0, built.stderr
    (artifact,) = tmp_path.glob("sparkfleet-cluster-*.tar.gz")
    with tarfile.open(artifact) as tar:
        names = tar.getnames()
    assert "roles/preflight/tasks/main.yml" in names and "plugins/action/cluster_validate.py" in names
    assert "profiles/tiny-cpu.yml" in names and "MANIFEST.json" in names
    assert not [n for n in names if n.startswith((".venv", "collections", ".lab", "inventory/lab/hosts"))]

    collections = tmp_path / "collections"
    installed = run(["ansible-galaxy", "collection", "install", "--offline", "-p", str(collections), str(artifact)],
                    tmp_path, env)
    assert installed.returncode == 0, installed.stderr + installed.stdout

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "play.yml").write_text(PLAYBOOK)
    (work / "hosts.yml").write_text(textwrap.dedent(INVENTORY))
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
    played = run(["ansible-playbook", "-i", "hosts.yml", "play.yml"], work, env)
    assert played.returncode == 0, played.stdout[-3000:] + played.stderr[-2000:]
    assert "rank 1 worker beta" in played.stdout
    assert str(collections / "ansible_collections/sparkfleet/cluster/roles/preflight") in played.stdout or \
        "sparkfleet.cluster.preflight" in played.stdout
