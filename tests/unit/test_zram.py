"""The zram helper's reading of the kernel and its decisions (roles/node_memory/files/sparkfleet-zram).

The real device is changed only by the opt-in host scenario (molecule/host); here the kernel's files are
written the way a 6.x kernel shows them.
"""

import json

import pytest
import sourcefile

GIB_KIB = 1024 * 1024


@pytest.fixture(scope="module")
def zram():
    return sourcefile.load("roles/node_memory/files/sparkfleet-zram", "sparkfleet_zram")


def kernel(tmp_path, algorithms="lzo [lzo-rle] lz4 lz4hc 842 zstd", disksize=0, swaps="", available_kib=100 * GIB_KIB,
           mounts="/dev/nvme0n1p2 / ext4 rw 0 0\n"):
    block = tmp_path / "sys/block/zram0"
    block.mkdir(parents=True)
    (block / "comp_algorithm").write_text(algorithms + "\n")
    (block / "disksize").write_text(f"{disksize}\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "swaps").write_text("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n" + swaps)
    (proc / "meminfo").write_text(f"MemTotal:       127539200 kB\nMemAvailable:   {available_kib} kB\n")
    (proc / "mounts").write_text(mounts)
    return str(tmp_path)


SWAPFILE = "/swap.img                               file\t\t16777212\t0\t\t-2\n"


def test_reads_the_device_as_the_kernel_shows_it(zram, tmp_path):
    root = kernel(tmp_path, disksize=10 * 1024 ** 3,
                  swaps=SWAPFILE + "/dev/zram0                              partition\t10485756\t2048\t\t100\n")
    state = zram.device_state("zram0", root)
    assert state["disksize_mib"] == 10240 and state["algorithm"] == "lzo-rle"
    assert state["algorithms_offered"] == ["lzo", "lzo-rle", "lz4", "lz4hc", "842", "zstd"]
    assert state["swap"] == {"size_kib": 10485756, "used_kib": 2048, "priority": 100}
    assert state["other_swaps"] == {"/swap.img": {"size_kib": 16777212, "used_kib": 0, "priority": -2}}
    assert zram.device_state("zram7", root) is None


def test_a_fresh_device_is_sized_formatted_and_swapped_on(zram, tmp_path):
    state = zram.device_state("zram0", kernel(tmp_path))
    assert zram.plan(state, 10240, "zstd", 100, 100 * GIB_KIB, 4096) == ["algorithm", "disksize", "mkswap", "swapon"]


def test_a_device_that_matches_is_left_alone(zram, tmp_path):
    state = zram.device_state("zram0", kernel(
        tmp_path, algorithms="lzo lzo-rle lz4 [zstd]", disksize=10 * 1024 ** 3,
        swaps="/dev/zram0 partition 10485756 0 100\n"))
    assert zram.plan(state, 10240, "zstd", 100, 100 * GIB_KIB, 4096) == []


def test_only_the_priority_differs_so_the_device_is_not_recreated(zram, tmp_path):
    state = zram.device_state("zram0", kernel(
        tmp_path, algorithms="lzo lzo-rle lz4 [zstd]", disksize=10 * 1024 ** 3,
        swaps="/dev/zram0 partition 10485756 512 5\n"))
    assert zram.plan(state, 10240, "zstd", 100, 100 * GIB_KIB, 4096) == ["swapoff", "swapon"]


def test_a_resize_swaps_off_resets_and_recreates(zram, tmp_path):
    state = zram.device_state("zram0", kernel(
        tmp_path, algorithms="lzo [lzo-rle] lz4 zstd", disksize=6 * 1024 ** 3,
        swaps="/dev/zram0 partition 6291452 1024 100\n"))
    assert zram.plan(state, 10240, "zstd", 100, 100 * GIB_KIB, 4096) == [
        "swapoff", "reset", "algorithm", "disksize", "mkswap", "swapon"]


def test_a_resize_is_refused_while_swap_use_exceeds_available_minus_the_reserve(zram, tmp_path):
    # 6 GiB swapped out, 9 GiB available: swapping back in would leave 3 GiB, under the 4 GiB reserve.
    state = zram.device_state("zram0", kernel(
        tmp_path, disksize=6 * 1024 ** 3, available_kib=9 * GIB_KIB,
        swaps=f"/dev/zram0 partition 6291452 {6 * GIB_KIB} 100\n"))
    with pytest.raises(zram.Refused) as refused:
        zram.plan(state, 10240, "zstd", 100, 9 * GIB_KIB, 4096)
    message = str(refused.value)
    assert "holds 6144 MiB of swapped-out pages and MemAvailable is 9216 MiB" in message
    assert "4096 MiB reserve. Nothing was changed." in message
    # With one more GiB available it goes ahead.
    assert zram.plan(state, 10240, "zstd", 100, 10 * GIB_KIB, 4096)[0] == "swapoff"


def test_a_mounted_device_is_never_recreated(zram, tmp_path):
    state = zram.device_state("zram0", kernel(tmp_path, disksize=1024 ** 3, mounts="/dev/zram0 /var/tmp ext2 rw 0 0\n"))
    with pytest.raises(zram.Refused, match="mounted as a file system"):
        zram.plan(state, 10240, "zstd", 100, 100 * GIB_KIB, 4096)


def test_a_kernel_without_zstd_keeps_its_algorithm_and_says_so(zram, tmp_path):
    state = zram.device_state("zram0", kernel(tmp_path, algorithms="[lzo-rle] lzo lz4"))
    assert zram.choose_algorithm("zstd", state) == (
        "lzo-rle", "the kernel offers no zstd for zram (it offers lzo-rle lzo lz4): keeping lzo-rle")
    assert zram.choose_algorithm("lz4", state) == ("lz4", None)


def test_check_mode_reports_the_change_and_touches_nothing(zram, tmp_path, capsys):
    root = kernel(tmp_path, swaps=SWAPFILE)
    assert zram.main(["--root", root, "apply", "--size-mib", "10240", "--check"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] is True and result["steps"] == ["algorithm", "disksize", "mkswap", "swapon"]
    assert (tmp_path / "sys/block/zram0/disksize").read_text() == "0\n"


def test_a_swap_file_at_a_higher_priority_is_pointed_out(zram, tmp_path, capsys):
    root = kernel(tmp_path, swaps="/swap.img file 16777212 0 200\n")
    assert zram.main(["--root", root, "apply", "--size-mib", "64", "--check"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert warnings == ["/swap.img has swap priority 200, not below zram's 100: the kernel may page to it first"]


def test_a_refusal_exits_2_with_the_reason_in_json_and_on_stderr(zram, tmp_path, capsys):
    root = kernel(tmp_path, disksize=6 * 1024 ** 3, available_kib=5 * GIB_KIB,
                  swaps=f"/dev/zram0 partition 6291452 {2 * GIB_KIB} 100\n")
    assert zram.main(["--root", root, "apply", "--size-mib", "10240", "--check"]) == 2
    out, err = capsys.readouterr()
    assert "Nothing was changed" in json.loads(out)["refused"]
    assert err.startswith("sparkfleet-zram: refused: /dev/zram0 holds 2048 MiB")
