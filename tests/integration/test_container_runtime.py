"""The container_runtime role against Debian's docker.io, really installed and running in a lab node (the triangle
lab's last node, once the fabric and node tests are done with it).

Lab nodes are unprivileged systemd containers with SYS_ADMIN and NET_ADMIN: dockerd 20.10 runs there on the vfs
storage driver. The role installs it, merges daemon.json (keeping what the admin had), restarts the engine
through its handler, and lets the admin user run docker; a container created afterwards carries the log limits.
"""

import json
import os

import pytest
import yaml
from conftest import ROOT, on_node, output, run_playbook

PLAYBOOK = os.path.join(ROOT, "tests/integration/playbooks/container_runtime.yml")
NODE = "node2"  # on the triangle lab, after its fabric and node tests
ADMIN_KEYS = {"debug": True, "log-opts": {"labels": "rank"}}


def converge(lab, tmp_path, name, cmdline=None):
    runner = run_playbook(tmp_path / name, PLAYBOOK, inventory=lab["inventory"], extravars={"target": NODE},
                          cmdline=cmdline)
    assert runner.status == "successful", output(runner)[-4000:]
    return runner


def daemon_json(lab):
    return json.loads(on_node(lab, NODE, "cat", "/etc/docker/daemon.json").stdout)


def log_config_of_a_new_container(lab):
    """Create a container from an image made of the node's own files; return the log configuration the engine
    gave it. (Starting it would need a session keyring, which the lab node's seccomp profile withholds.)"""
    on_node(lab, NODE, "sh", "-c", "docker image inspect tiny:1 >/dev/null 2>&1 || tar -C / -ch usr/bin/echo "
            "$(ldd /usr/bin/echo | grep -o '/[^ ]*' | sed 's|^/||') | docker import - tiny:1 >/dev/null")
    cid = on_node(lab, NODE, "docker", "create", "tiny:1", "/usr/bin/echo", "hello").stdout.strip()
    config = json.loads(on_node(lab, NODE, "docker", "inspect", "-f", "{{json .HostConfig.LogConfig}}", cid).stdout)
    on_node(lab, NODE, "docker", "rm", cid)
    return config


@pytest.fixture(scope="module")
def converged(fabric_lab, tmp_path_factory):
    # An admin's own daemon.json from before sparkfleet.
    on_node(fabric_lab, NODE, "sh", "-c",
            f"mkdir -p /etc/docker && echo '{json.dumps(ADMIN_KEYS)}' > /etc/docker/daemon.json")
    return converge(fabric_lab, tmp_path_factory.mktemp("runtime"), "converge")


def test_the_engine_runs_with_the_merged_configuration(converged, fabric_lab):
    assert daemon_json(fabric_lab) == {"debug": True, "log-driver": "json-file",
                                       "log-opts": {"labels": "rank", "max-size": "100m", "max-file": "3"}}
    assert on_node(fabric_lab, NODE, "systemctl", "is-active", "docker").stdout.strip() == "active"
    info = on_node(fabric_lab, NODE, "docker", "info", "--format", "{{.LoggingDriver}} {{.Debug}}").stdout
    assert info.split() == ["json-file", "true"]
    assert log_config_of_a_new_container(fabric_lab) == {
        "Type": "json-file", "Config": {"labels": "rank", "max-file": "3", "max-size": "100m"}}


def test_the_admin_user_runs_docker_without_sudo(converged, fabric_lab):
    with open(fabric_lab["inventory"], encoding="utf-8") as handle:
        user = yaml.safe_load(handle)["all"]["children"]["sparkfleet_cluster"]["vars"]["ansible_user"]
    assert user != "root"
    assert "docker" in on_node(fabric_lab, NODE, "id", "-nG", user).stdout.split()
    version = on_node(fabric_lab, NODE, "runuser", "-u", user, "--", "docker", "version", "--format",
                      "{{.Server.Version}}")
    assert version.stdout.startswith("20.10.")


def test_a_second_run_and_a_check_run_change_nothing(converged, fabric_lab, tmp_path):
    assert converge(fabric_lab, tmp_path, "again").stats["changed"] == {}
    assert converge(fabric_lab, tmp_path, "check", cmdline="--check").stats["changed"] == {}


def test_drift_is_put_back_and_the_engine_restarted(converged, fabric_lab, tmp_path):
    drifted = dict(daemon_json(fabric_lab), **{"log-opts": {"labels": "rank", "max-size": "5m", "max-file": "3"}})
    on_node(fabric_lab, NODE, "sh", "-c", f"echo '{json.dumps(drifted)}' > /etc/docker/daemon.json")
    before = on_node(fabric_lab, NODE, "systemctl", "show", "-p", "MainPID", "--value", "docker").stdout
    runner = converge(fabric_lab, tmp_path, "repair")
    assert runner.stats["changed"] == {NODE: 2}, output(runner)[-3000:]  # the file, then the handler
    assert on_node(fabric_lab, NODE, "systemctl", "show", "-p", "MainPID", "--value", "docker").stdout != before
    assert log_config_of_a_new_container(fabric_lab)["Config"]["max-size"] == "100m"


def test_the_docker_modules_of_later_stages_work_on_the_node(converged, fabric_lab, tmp_path):
    log_config_of_a_new_container(fabric_lab)  # leaves tiny:1 on the node
    wanted = on_node(fabric_lab, NODE, "docker", "image", "inspect", "-f", "{{.Id}}", "tiny:1").stdout.strip()
    runner = run_playbook(tmp_path / "modules", os.path.join(ROOT, "tests/integration/playbooks/docker_modules.yml"),
                          inventory=fabric_lab["inventory"], extravars={"target": NODE, "image": "tiny:1"})
    text = output(runner)
    assert runner.status == "successful", text[-4000:]
    assert f"found {wanted}" in text
    assert runner.stats["changed"] == {NODE: 2}  # tagged, untagged
    assert on_node(fabric_lab, NODE, "docker", "image", "inspect", "tiny:current", check=False).returncode != 0
