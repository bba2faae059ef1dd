"""The node stage on a lab (the triangle's three nodes, converged once for the fabric tests too): kernel memory
settings written (not applied: a container shares the host's kernel) and the memory watchdog running, also after
the node restarts; a user's semaphores kept when the user's last SSH session closes (logind's RemoveIPC=no)."""

import os
import re
import shlex
import subprocess
import time
import uuid

import pytest
import yaml
from conftest import ROOT, lab_hosts, on_node, output, restart_node, run_playbook

NODE = os.path.join(ROOT, "playbooks/node.yml")


@pytest.fixture(scope="module")
def converged(fabric_lab):
    """The node stage's output from the triangle lab's converge (site.yml's preflight, node and fabric stages)."""
    return fabric_lab["converge"]


def test_settings_are_written_and_the_kernel_left_to_the_host(converged, fabric_lab):
    said = " ".join(converged.split())  # the callback wraps long messages
    assert "runs in a docker container: vm.* settings and zram belong to the host kernel" in said
    assert "has no NVIDIA GPU (no nvidia-smi or no device): persistence mode, clock policy" in said
    assert "as lab nodes do: they serve vLLM natively, so no Docker engine" in said
    # The host's kernel is left alone: the zram helper never ran inside a container.
    zram_task = converged.split("node_memory : Bring the zram swap device to its settings now]")[1].split("TASK")[0]
    assert "skipping: [node0]" in zram_task and "skipping: [node1]" in zram_task
    for node in ("node0", "node1"):
        text = on_node(fabric_lab, node, "cat", "/etc/sysctl.d/90-sparkfleet-memory.conf").stdout
        assert "vm.swappiness=180" in text and "vm.watermark_scale_factor=100" in text
        zram = on_node(fabric_lab, node, "cat", "/etc/systemd/zram-generator.conf").stdout.splitlines()
        assert {"[zram0]", "zram-size = 10240", "compression-algorithm = zstd", "swap-priority = 100"} <= set(zram)


def test_the_watchdog_runs_armed_with_the_fields_threshold(converged, fabric_lab):
    for node in ("node0", "node1"):
        state = on_node(fabric_lab, node, "systemctl", "is-active", "sparkfleet-watchdog.service").stdout.strip()
        assert state == "active"
        enabled = on_node(fabric_lab, node, "systemctl", "is-enabled", "sparkfleet-watchdog.service").stdout.strip()
        assert enabled == "enabled"
    journal = on_node(fabric_lab, "node0", "journalctl", "-u", "sparkfleet-watchdog.service", "--no-pager").stdout
    assert "watchdog armed (threshold 786432 kB, every 0.2 s, grace 3 s" in journal
    metrics = on_node(fabric_lab, "node0", "cat", "/var/lib/prometheus/node-exporter/sparkfleet_watchdog.prom").stdout
    assert "sparkfleet_watchdog_threshold_bytes 805306368" in metrics


def test_a_second_run_and_a_check_run_change_nothing(converged, fabric_lab, tmp_path):
    again = run_playbook(tmp_path / "again", NODE, inventory=fabric_lab["inventory"])
    assert again.status == "successful" and again.stats["changed"] == {}, output(again)[-3000:]
    check = run_playbook(tmp_path / "check", NODE, inventory=fabric_lab["inventory"], cmdline="--check")
    assert check.status == "successful" and check.stats["changed"] == {}, output(check)[-3000:]


def test_the_watchdog_comes_back_after_the_node_restarts(converged, fabric_lab):
    # When systemd started it (the host's monotonic clock, which a container restart does not reset; a PID is
    # no identity here: the fresh PID namespace can hand the daemon the same number again).
    started = ("systemctl", "show", "-p", "ExecMainStartTimestampMonotonic", "--value", "sparkfleet-watchdog")
    before = int(on_node(fabric_lab, "node1", *started).stdout)
    restart_node(fabric_lab, "node1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = on_node(fabric_lab, "node1", "systemctl", "is-active", "sparkfleet-watchdog.service", check=False)
        if state.stdout.strip() == "active":
            break
        time.sleep(1)
    assert state.stdout.strip() == "active"
    assert int(on_node(fabric_lab, "node1", *started).stdout) > before  # a new start, at this boot
    assert "vm.swappiness=180" in on_node(fabric_lab, "node1", "cat", "/etc/sysctl.d/90-sparkfleet-memory.conf").stdout
    # The generator ran at this boot and, inside a container, set nothing up and failed nothing.
    assert on_node(fabric_lab, "node1", "systemctl", "--failed", "--plain", "--no-legend").stdout.strip() == ""


# A rank's IPC as vLLM makes it: a named POSIX semaphore (/dev/shm/sem.<name>, what multiprocessing's SemLock
# opens) and a shared-memory object (/dev/shm/<name>, what shm_open makes), both held open until it is killed.
HOLDER = """
import ctypes, os, sys, time
name = sys.argv[1]
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.sem_open.restype = ctypes.c_void_p
libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
if not libc.sem_open(("/" + name).encode(), os.O_CREAT | os.O_EXCL, 0o600, 1):  # SEM_FAILED is NULL in glibc
    sys.exit("sem_open: " + os.strerror(ctypes.get_errno()))
shm = os.open("/dev/shm/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
os.write(shm, b"rank")
while True:
    time.sleep(3600)
"""
LOGIND_CONTROL = "/etc/systemd/logind.conf.d/99-sparkfleet-test-removeipc.conf"


def admin_ssh(lab, node):
    """ssh to a lab node as the inventory's admin user, with the inventory's key and the lab's known_hosts, on a
    connection of its own (never Ansible's persistent one), so that the session ends when ssh exits."""
    with open(lab["inventory"], encoding="utf-8") as handle:
        group = yaml.safe_load(handle)["all"]["children"]["sparkfleet_cluster"]["vars"]
    host = lab_hosts(lab)[node]["ansible_host"]
    return group["ansible_user"], ["ssh", "-i", group["ansible_ssh_private_key_file"],
                                   *shlex.split(group["ansible_ssh_common_args"]), "-o", "BatchMode=yes",
                                   "-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "ConnectTimeout=10",
                                   f"{group['ansible_user']}@{host}"]


def logged_in(lab, node, user):
    """Whether logind still knows the user (a session, or the user kept for UserStopDelaySec after the last one)."""
    return on_node(lab, node, "loginctl", "show-user", user, check=False).returncode == 0


def wait_for_logout(lab, node, user, seconds, what):
    """Wait (bounded) until logind has let the user go; fail with its sessions and their states otherwise."""
    deadline = time.monotonic() + seconds
    while logged_in(lab, node, user):
        if time.monotonic() > deadline:
            sessions = on_node(lab, node, "sh", "-c", "loginctl list-sessions --no-legend | while read -r id _; do "
                               "loginctl show-session $id -p Id -p Name -p State -p Scope -p Service; done; "
                               "loginctl user-status " + shlex.quote(user) + " --no-pager", check=False)
            pytest.fail(f"{node}: waited {seconds} s for {what}; logind still has {user}:\n{sessions.stdout}"
                        f"{sessions.stderr}")
        time.sleep(1)


def log_in_start_a_rank_and_log_out(lab, node, name):
    """Over a real SSH session as the admin, start a process of the admin's that holds a semaphore and a
    shared-memory object named `name`, then close the session and wait until logind has let the user go (which is
    when RemoveIPC acts). The holder is unit <name>.service.

    The holder runs as the admin but outside the session, as a rank under systemd or in a container does: a
    process left inside the session's scope (setsid, nohup) keeps the session "closing" until it exits, and logind
    removes nothing before that, RemoveIPC=yes or not."""
    user, ssh = admin_ssh(lab, node)
    # No earlier session of the admin: Ansible's connection would persist 60 s after its last task (ansible.cfg's
    # ControlPersist), so its sessions are ended here (its next task opens a new connection); logind keeps the user
    # 10 s more (UserStopDelaySec). Only sessions end: a holder started before runs in a unit of its own.
    if logged_in(lab, node, user):
        on_node(lab, node, "loginctl", "terminate-user", user, check=False)
    wait_for_logout(lab, node, user, 90, "the admin's earlier sessions (Ansible's) to end")
    unit = f"{name}.service"
    script = (f"echo session=$XDG_SESSION_ID; "
              f"sudo -n systemd-run --quiet --collect --unit={unit} --uid=$(id -u) --property=Type=exec "
              f"/usr/bin/python3 -c {shlex.quote(HOLDER)} {name} && "
              f"timeout 20 sh -c 'until [ -e /dev/shm/sem.{name} ] && [ -e /dev/shm/{name} ]; do sleep 0.2; done' && "
              f"stat -c 'owner=%U' /dev/shm/sem.{name}; loginctl list-sessions --no-legend")
    session = subprocess.run([*ssh, script], capture_output=True, text=True, timeout=60, check=False)
    assert session.returncode == 0, f"{node}: {session.stderr}{session.stdout}"
    said = session.stdout.splitlines()
    # The login was a logind session of its own (pam_systemd), and the rank's objects are the admin's.
    assert said[0] != "session=" and said[0].startswith("session="), session.stdout
    assert f"owner={user}" in said, session.stdout
    assert any(line.split()[:1] == [said[0].removeprefix("session=")] and user in line.split() for line in said[2:])
    wait_for_logout(lab, node, user, 60, "logind to let the admin go after the session closed")
    state = on_node(lab, node, "systemctl", "is-active", unit, check=False).stdout.strip()
    assert state == "active", f"{node}: the holder {unit} is {state}: it was to keep its objects open"


def shm_objects(lab, node, name):
    found = on_node(lab, node, "sh", "-c", f"ls /dev/shm/sem.{name} /dev/shm/{name} 2>/dev/null", check=False)
    return set(found.stdout.split())


def stop_holder(lab, node, name):
    """End the holder we started, by its PID, and remove what it made."""
    unit = f"{name}.service"
    pid = on_node(lab, node, "systemctl", "show", "--property=MainPID", "--value", unit, check=False).stdout.strip()
    if pid and pid != "0":
        on_node(lab, node, "kill", "-TERM", pid, check=False)
        on_node(lab, node, "timeout", "10", "sh", "-c", f"while kill -0 {pid} 2>/dev/null; do sleep 0.2; done",
                check=False)
    on_node(lab, node, "systemctl", "reset-failed", unit, check=False)
    on_node(lab, node, "rm", "-f", f"/dev/shm/sem.{name}", f"/dev/shm/{name}")


def restart_logind(lab, node):
    on_node(lab, node, "systemctl", "restart", "systemd-logind.service")
    assert on_node(lab, node, "systemctl", "is-active", "systemd-logind.service").stdout.strip() == "active"


def test_closing_the_admins_ssh_session_leaves_a_ranks_semaphores_alone(converged, fabric_lab):
    node = "node2"
    # The node stage wrote the drop-in and restarted logind, which runs in the lab's containers.
    dropin = on_node(fabric_lab, node, "stat", "-c", "%a %U:%G", "/etc/systemd/logind.conf.d/90-sparkfleet.conf")
    assert dropin.stdout.strip() == "644 root:root"
    text = on_node(fabric_lab, node, "cat", "/etc/systemd/logind.conf.d/90-sparkfleet.conf").stdout
    assert "[Login]\nRemoveIPC=no\n" in text and text.startswith("#")
    handler = converged.split("node_memory : Restart systemd-logind]")[1]
    handler = re.split(r"\n(?:TASK|RUNNING HANDLER|PLAY) ", handler)[0]
    assert f"changed: [{node}]" in handler
    assert on_node(fabric_lab, node, "systemctl", "is-active", "systemd-logind.service").stdout.strip() == "active"
    kept, removed = f"sparkfleet-test-kept-{uuid.uuid4().hex[:8]}", f"sparkfleet-test-removed-{uuid.uuid4().hex[:8]}"
    started = []
    try:
        started.append(kept)
        log_in_start_a_rank_and_log_out(fabric_lab, node, kept)
        assert shm_objects(fabric_lab, node, kept) == {f"/dev/shm/sem.{kept}", f"/dev/shm/{kept}"}
        # The control: the same with logind's default put back (a later drop-in wins) removes both objects, while
        # their holder still runs, as it removed vLLM's semaphores in the field.
        on_node(fabric_lab, node, "sh", "-c", f"printf '[Login]\\nRemoveIPC=yes\\n' > {LOGIND_CONTROL}")
        restart_logind(fabric_lab, node)
        started.append(removed)
        log_in_start_a_rank_and_log_out(fabric_lab, node, removed)
        assert shm_objects(fabric_lab, node, removed) == set()
        assert shm_objects(fabric_lab, node, kept) == set()  # the first holder's too: everything of the user's
    finally:
        on_node(fabric_lab, node, "rm", "-f", LOGIND_CONTROL)
        restart_logind(fabric_lab, node)
        for name in started:
            stop_holder(fabric_lab, node, name)
    assert on_node(fabric_lab, node, "systemctl", "--failed", "--plain", "--no-legend").stdout.strip() == ""
