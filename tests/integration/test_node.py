"""The node stage on a lab (the triangle's three nodes, converged once for the fabric tests too): kernel memory
settings written (not applied: a container shares the host's kernel) and the memory watchdog running, also after
the node restarts."""

import os
import subprocess
import time

import pytest
from conftest import ROOT, container, on_node, output, run_playbook

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
    subprocess.run(["docker", "restart", "-t", "10", container(fabric_lab, "node1")], check=True, capture_output=True)
    on_node(fabric_lab, "node1", "systemctl", "is-system-running", "--wait", check=False, timeout=120)
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
