"""The memory gate every vLLM start passes through (roles/node_memory/files/sparkfleet-memory-gate)."""

import pytest
import sourcefile


@pytest.fixture(scope="module")
def gate():
    return sourcefile.load("roles/node_memory/files/sparkfleet-memory-gate", "memory_gate")


def test_reads_mem_available_in_bytes(gate, tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       127539200 kB\nMemFree:         1000 kB\nMemAvailable:   120512340 kB\n")
    assert gate.mem_available_bytes(str(meminfo)) == 120512340 * 1024


def test_a_read_only_kernel_setting_is_said_once_and_not_fatal(gate, tmp_path, capsys):
    assert gate.drop_caches(str(tmp_path / "no-such-dir" / "drop_caches")) is False
    assert "memory gate: page cache left alone:" in capsys.readouterr().out


def test_the_gate_opens_when_the_memory_is_there(gate, capsys):
    assert gate.main(["--min-available-bytes", "1", "--no-drop-caches"]) == 0
    assert "memory gate open: MemAvailable" in capsys.readouterr().out


def test_the_gate_stays_closed_and_says_what_it_found(gate, capsys):
    code = gate.main(["--min-available-bytes", str(2 ** 60), "--timeout", "0", "--no-drop-caches"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("memory gate closed: found MemAvailable ")
    assert "expected at least 1073741824.00 GiB" in err and "fix: find what holds memory" in err


def test_leftover_shared_memory_is_removed_unless_a_process_holds_it(gate, tmp_path, capsys):
    leftover, live = tmp_path / "psm_dead01", tmp_path / "psm_live02"
    leftover.write_bytes(b"x")
    live.write_bytes(b"y")
    with open(live, "rb"):  # this very process holds it open, as a live engine would
        removed = gate.clean_leftovers(str(tmp_path / "psm_*"))
    assert removed == [str(leftover)]
    assert not leftover.exists() and live.exists()
    assert "removed 1 leftover shared-memory file(s)" in capsys.readouterr().out
