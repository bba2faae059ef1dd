"""sparkfleet-node-metrics as the timer runs it, on a scratch textfile directory: a GB10's nvidia-smi (a stand-in
printing its real answer), a saved kernel log, the verification's textfile republished - and what a service user
could plant beside it (a link, a file of another name, foreign metric names) left out."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ansible_collections.sparkfleet.cluster.plugins.module_utils import node_metrics as nm
from ansible_collections.sparkfleet.cluster.plugins.module_utils import prometheus_text as prom

COLLECTOR = Path(__file__).resolve().parents[2] / "roles/monitoring/files/sparkfleet-node-metrics"
LIBRARY = Path(os.path.abspath(nm.__file__)).parents[5]  # the directory holding ansible_collections/
GB10 = ("index, uuid, power.draw [W], clocks.current.sm [MHz], temperature.gpu, utilization.gpu [%], "
        "memory.used [MiB], memory.total [MiB]\n0, GPU-5e1c, 31.20 W, 2411 MHz, 49, 97 %, [N/A], [N/A]\n")
VERIFY = ("# HELP sparkfleet_verify_ok x\n# TYPE sparkfleet_verify_ok gauge\nsparkfleet_verify_ok 1\n"
          "sparkfleet_kv_pool_tokens 87296\n")


def run(tmp_path, *extra, smi="nvidia-smi.sh"):
    return subprocess.run([sys.executable, str(COLLECTOR), "--textfile-dir", str(tmp_path / "textfiles"),
                           "--republish", str(tmp_path / "service"), "--state-dir", str(tmp_path / "state"),
                           "--nccl-record", str(tmp_path / "nccl.json"), "--group-state", str(tmp_path / "group.json"),
                           "--kernel-log", str(tmp_path / "kernel.log"), "--nvidia-smi", str(tmp_path / smi),
                           *extra], env={**os.environ, "SPARKFLEET_PYTHONPATH": str(LIBRARY)},
                          capture_output=True, text=True, check=False, timeout=60)


def published(tmp_path, name="sparkfleet_node.prom"):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for s in prom.parse_prometheus((tmp_path / "textfiles" / name).read_text())}


def scene(tmp_path):
    for directory in ("textfiles", "service"):
        (tmp_path / directory).mkdir(mode=0o755)
    smi = tmp_path / "nvidia-smi.sh"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{GB10}EOF\n")
    smi.chmod(0o755)
    (tmp_path / "kernel.log").write_text(
        "NVRM: Xid (PCI:000f:01:00): 31, pid=77, name=python3, Ch 00000008, MMU Fault\nusb 1-1: new device\n")
    (tmp_path / "group.json").write_text('{"rank": 0, "phase": "ready", "epoch": 12}')
    (tmp_path / "service" / "sparkfleet_verify.prom").write_text(VERIFY)


def test_a_gb10_node_publishes_power_xids_and_its_epoch_and_the_verification_is_republished(tmp_path):
    scene(tmp_path)
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    got = published(tmp_path)
    assert got[("sparkfleet_gpu_power_watts", (("gpu", "0"), ("uuid", "GPU-5e1c")))] == 31.2
    assert got[("sparkfleet_gpu_xid_events_total", (("code", "31"),))] == 1
    assert got[("sparkfleet_group_current_epoch", ())] == 12
    assert not [key for key in got if key[0].startswith("sparkfleet_gpu_memory")]
    assert (tmp_path / "textfiles" / "sparkfleet_verify.prom").read_text() == VERIFY
    assert not [p for p in (tmp_path / "textfiles").iterdir() if p.name.startswith(".")]  # no partial file left

    # journald forgot the Xid line (vacuum): the counter does not fall, so no "new" Xid is read from a reset
    (tmp_path / "kernel.log").write_text("usb 1-1: new device\n")
    assert run(tmp_path).returncode == 0
    assert published(tmp_path)[("sparkfleet_gpu_xid_events_total", (("code", "any"),))] == 1


def test_what_a_service_user_plants_is_not_republished_and_a_gone_source_takes_its_copy_away(tmp_path):
    scene(tmp_path)
    secret = tmp_path / "root-only.prom"
    secret.write_text("sparkfleet_weights_scrub_ok 1\n")
    (tmp_path / "service" / "sparkfleet_scrub.prom").symlink_to(secret)  # a link to root's file
    (tmp_path / "service" / "sparkfleet_watchdog.prom").write_text("sparkfleet_watchdog_trips_total 0\n")
    (tmp_path / "textfiles" / "sparkfleet_watchdog.prom").write_text("sparkfleet_watchdog_trips_total 5\n")
    assert run(tmp_path).returncode == 0
    assert not (tmp_path / "textfiles" / "sparkfleet_scrub.prom").exists()
    assert (tmp_path / "textfiles" / "sparkfleet_watchdog.prom").read_text().endswith(" 5\n")  # the watchdog's own

    (tmp_path / "service" / "sparkfleet_verify.prom").write_text(VERIFY + "node_memory_MemAvailable_bytes 1\n")
    done = run(tmp_path)
    assert "metrics its writer does not write: node_memory_MemAvailable_bytes" in done.stdout
    assert not (tmp_path / "textfiles" / "sparkfleet_verify.prom").exists()

    (tmp_path / "service" / "sparkfleet_verify.prom").write_text(VERIFY)
    assert run(tmp_path).returncode == 0 and (tmp_path / "textfiles" / "sparkfleet_verify.prom").exists()
    (tmp_path / "service" / "sparkfleet_verify.prom").unlink()
    assert run(tmp_path).returncode == 0
    assert not (tmp_path / "textfiles" / "sparkfleet_verify.prom").exists()


def test_the_router_hosts_membership_file_is_republished_from_its_own_directory_only(tmp_path):
    scene(tmp_path)
    router = tmp_path / "router"
    router.mkdir()
    fleet = 'sparkfleet_fleet_member{group="a"} 1\nsparkfleet_fleet_router_up 1\n'
    (tmp_path / "service" / "sparkfleet_verify.prom").write_text(VERIFY)
    (router / "sparkfleet_fleet.prom").write_text(fleet)
    assert run(tmp_path, "--republish-fleet", str(router)).returncode == 0
    assert (tmp_path / "textfiles" / "sparkfleet_fleet.prom").read_text() == fleet
    assert (tmp_path / "textfiles" / "sparkfleet_verify.prom").read_text() == VERIFY  # neither takes the other away
    # each writer publishes its own file only: the rank's user cannot publish the fleet's, nor the router's a
    # verification
    (router / "sparkfleet_fleet.prom").unlink()
    (tmp_path / "service" / "sparkfleet_fleet.prom").write_text(fleet)
    (router / "sparkfleet_verify.prom").write_text(VERIFY.replace("ok 1", "ok 0"))
    assert run(tmp_path, "--republish-fleet", str(router)).returncode == 0
    assert not (tmp_path / "textfiles" / "sparkfleet_fleet.prom").exists()
    assert (tmp_path / "textfiles" / "sparkfleet_verify.prom").read_text() == VERIFY
    (tmp_path / "service" / "sparkfleet_verify.prom").unlink()
    assert run(tmp_path, "--republish-fleet", str(router)).returncode == 0
    assert not (tmp_path / "textfiles" / "sparkfleet_verify.prom").exists()


def test_a_textfile_directory_others_may_write_is_refused(tmp_path):
    scene(tmp_path)
    (tmp_path / "textfiles").chmod(0o777)
    done = run(tmp_path)
    assert done.returncode == 1
    assert "expected root's, writable by root alone" in done.stdout
    assert not (tmp_path / "textfiles" / "sparkfleet_node.prom").exists()


def test_a_hung_nvidia_smi_is_cut_off_and_no_second_one_starts_while_it_lingers(tmp_path):
    scene(tmp_path)
    (tmp_path / "hung").mkdir()
    hung = tmp_path / "hung" / "nvidia-smi"  # a script's process is named after the script, as the real one is
    hung.write_text(f"#!/bin/sh\necho started >> {tmp_path}/hung/starts\nsleep 30\n")
    hung.chmod(0o755)
    started = time.monotonic()
    done = run(tmp_path, "--timeout", "1", smi="hung/nvidia-smi")
    assert done.returncode == 0 and time.monotonic() - started < 20
    assert "nvidia-smi did not answer within 1.0 s" in done.stdout
    got = published(tmp_path)
    assert got[("sparkfleet_gpu_query_ok", ())] == 0
    assert ("sparkfleet_node_metrics_timestamp_seconds", ()) in got  # the rest of the file is still written

    # one stuck in the kernel cannot be killed: while it lingers, the next runs start no other

    def starts():
        return (tmp_path / "hung" / "starts").read_text().count("started")
    before = starts()
    lingering = subprocess.Popen([str(hung)])
    try:
        (tmp_path / "state" / "nvidia-smi.pid").write_text(str(lingering.pid))
        deadline = time.monotonic() + 30
        while starts() < before + 1 and time.monotonic() < deadline:  # ours has begun (a busy machine is slow)
            time.sleep(0.05)
        assert starts() == before + 1
        done = run(tmp_path, "--timeout", "1", smi="hung/nvidia-smi")
        assert done.returncode == 0
        assert published(tmp_path)[("sparkfleet_gpu_query_ok", ())] == 0
        time.sleep(0.2)
        assert starts() == before + 1  # ours alone: the collector started none while it lingered
    finally:
        lingering.kill()
        lingering.wait()
