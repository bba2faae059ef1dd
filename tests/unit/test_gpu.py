"""nvidia-smi and kernel Xid parsing (plugins/module_utils/gpu.py) on real output, and the clock check.

The nvidia-smi samples were read on a 2x H200 machine (driver 580.159.04) with scripts/gpu_probe.py; the
Xid lines are from public bug reports (see data/gpu/xid-lines.txt). GB10 prints [N/A] for memory.
"""

import os
import stat
import sys

from ansible_collections.sparkfleet.cluster.plugins.module_utils import gpu

DATA = os.path.join(os.path.dirname(__file__), "data", "gpu")


def sample(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as handle:
        return handle.read()


def test_the_query_of_two_h200s_reads_every_field_by_name():
    gpus = gpu.parse_query(sample("h200x2-query-idle.csv"))
    assert [g["index"] for g in gpus] == [0, 1]
    first = gpus[0]
    assert first["name"] == "NVIDIA H200" and first["pci.bus_id"] == "00000000:00:06.0"
    assert first["driver_version"] == "580.159.04" and first["persistence_mode"] == "Enabled"
    assert first["clocks.current.sm"] == 345 and first["clocks.max.sm"] == 1980
    assert first["power.draw"] == 79.06 and first["memory.total"] == 143771 and first["utilization.gpu"] == 0
    assert set(first) == set(gpu.QUERY_FIELDS)


def test_clocks_read_after_a_load():
    assert [g["clocks.current.sm"] for g in gpu.parse_query(sample("h200x2-query-clocks.csv"))] == [1980, 1980]


def test_gb10s_unified_memory_reads_as_missing_not_as_text():
    text = sample("h200x2-query-idle.csv").replace("143771 MiB, 0 MiB", "[N/A], [N/A]").replace(
        "NVIDIA H200", "NVIDIA GB10")
    first = gpu.parse_query(text)[0]
    assert first["memory.total"] is None and first["memory.used"] is None and first["name"] == "NVIDIA GB10"
    assert gpu.parse_query("clocks.current.sm [MHz]\n[Not Supported]\n") == [{"clocks.current.sm": None}]


def test_a_row_that_does_not_fit_the_header_is_an_error():
    try:
        gpu.parse_query("index, name\n0, GB10, extra\n")
    except ValueError as err:
        assert "3 values for 2 fields" in str(err)
    else:
        raise AssertionError("a ragged row was accepted")


def test_driver_branch():
    assert gpu.driver_branch("580.159.04") == 580
    assert gpu.driver_branch("590.48.01") == 590
    assert gpu.driver_branch(None) is None and gpu.driver_branch("unknown") is None


def test_every_xid_format_is_read_and_other_nvrm_lines_are_not():
    lines = [line for line in sample("xid-lines.txt").splitlines() if not line.startswith("#")]
    xids = [x for x in map(gpu.parse_xid, lines) if x]
    assert [x["code"] for x in xids] == [13, 109, 45, 31, 62, 149, 32]
    assert xids[0]["pid"] is None and xids[0]["name"] is None and xids[0]["pci"] == "0000:cb:00"
    assert xids[1]["pid"] == 1797828 and xids[1]["name"] == "pt_main_thread"
    assert xids[1]["message"] == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
    assert xids[3]["message"].endswith("Fault is of type FAULT_PTE ACCESS_TYPE_VIRT_READ")
    assert xids[5]["pid"] is None and xids[5]["message"].startswith("NETIR Fatal XC0")
    assert xids[6]["message"] == "Channel ID 00000000 intr 00004000"
    # A real H200's boot: NVRM lines, none of them an Xid.
    assert gpu.xid_errors(sample("h200-dmesg-nvrm.txt").splitlines()) == []


def test_benign_codes_are_dropped_in_either_base():
    lines = sample("xid-lines.txt").splitlines()
    assert [gpu.parse_xid(x)["code"] for x in gpu.xid_errors(lines, ["13", "0x2d", 62, 149, 32])] == [109, 31]


def test_the_peak_decides_the_clock_verdict():
    # Read on an H200 under bf16 matrix products: 1980 MHz at first, then ~1470 MHz at its power limit.
    loaded = [1980, 1500, 1410, 1485, 1425, 1485, 1470, 1455, 1485, 1455, 1470, 1455]
    ok, message = gpu.clock_verdict(loaded, 1500)
    assert ok and message == ("SM clock reached peak 1980 MHz over 12 readings (median 1470 MHz), expected at least "
                              "1500 MHz")
    ok, message = gpu.clock_verdict([611, 650, 728, 700], 1500)
    assert not ok and "peak 728 MHz over 4 readings" in message and "cold power cycle" in message
    assert gpu.clock_verdict([], 1500) == (False, "no SM clock reading came from nvidia-smi during the load")


def script(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_clocks_are_read_only_once_the_load_runs_and_the_load_is_ended(tmp_path):
    # nvidia-smi stand-in: prints the clock the load wrote last (600 MHz before the load says it runs).
    clock = tmp_path / "clock"
    clock.write_text("600")
    smi = script(tmp_path / "nvidia-smi",
                 f"#!/bin/sh\necho 'index, clocks.current.sm [MHz]'\necho \"0, $(cat {clock}) MHz\"\n")
    load = [sys.executable, "-c",
            f"import time; time.sleep(0.5); open({str(clock)!r}, 'w').write('2405'); "
            "print('gpu burn: loaded 1 GPU(s)', flush=True); time.sleep(60)"]
    result = gpu.clocks_under_load(load, seconds=0.6, interval=0.2, smi=smi, ready_timeout=20)
    assert result["ready"] is True and result["load_rc"] is not None  # ended, not left running
    assert result["samples"][0] and set(result["samples"][0]) == {2405}


def test_a_load_that_dies_is_reported_not_mistaken_for_a_slow_clock(tmp_path):
    smi = script(tmp_path / "nvidia-smi", "#!/bin/sh\necho 'index, clocks.current.sm [MHz]'\necho '0, 600 MHz'\n")
    load = [sys.executable, "-c", "import sys; print('no CUDA device'); sys.exit(3)"]
    result = gpu.clocks_under_load(load, seconds=1, smi=smi, ready_timeout=20)
    assert result == {"samples": {}, "load_rc": 3, "load_output": "no CUDA device\n", "ready": False, "error": None}


def test_a_hung_nvidia_smi_is_named_not_a_traceback(tmp_path, monkeypatch):
    import subprocess

    def hang(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], 60)

    monkeypatch.setattr(subprocess, "run", hang)
    try:
        gpu.query(smi="nvidia-smi")
    except RuntimeError as err:
        assert "did not answer within 60 s" in str(err) and "power-cycle" in str(err)
    else:
        raise AssertionError("a hung nvidia-smi went unnoticed")


def test_the_hold_pattern_takes_the_whole_driver_branch_and_nothing_else():
    import re

    import yaml

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "roles", "gpu", "vars", "main.yml"), encoding="utf-8") as f:
        template = yaml.safe_load(f)["__gpu_package_pattern"]
    pattern = re.compile(template.replace("{{ gpu_driver_branch }}", "580"))
    held = ["nvidia-driver-580-open ii", "libnvidia-compute-580:arm64 ii", "nvidia-dkms-580-open ii",
            "nvidia-firmware-580-580.159.03 ii", "linux-modules-nvidia-580-open-6.17.0-1026-nvidia hi",
            "nvidia-kernel-common-580 ii", "libnvidia-gl-580-server ii"]
    left = ["nvidia-driver-590-open ii", "nvidia-container-toolkit ii", "libnvidia-compute-5800 ii",
            "nvidia-driver-580-open rc", "python3-nvidia-580x ii"]
    assert [p for p in held if pattern.search(p)] == held
    assert [p for p in left if pattern.search(p)] == []
