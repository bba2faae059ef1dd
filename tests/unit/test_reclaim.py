"""The cgroup v2 reclaim helper (roles/node_memory/files/sparkfleet-reclaim).

This machine's cgroup v2 hierarchy has no memory controller, so the kernel's files are laid out in a tree
as on a cgroup v2 node (DGX OS): the helper's finding, its units and its refusals are what is tested; the
write itself is one write(2) of the byte count.
"""

import pytest
import sourcefile


@pytest.fixture(scope="module")
def reclaim():
    return sourcefile.load("roles/node_memory/files/sparkfleet-reclaim", "sparkfleet_reclaim")


def cgroup_tree(tmp_path, hybrid=False):
    root = tmp_path / "cgroup"
    unified = root / "unified" if hybrid else root
    unified.mkdir(parents=True)
    (unified / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    for scope in ("system.slice/sparkfleet-vllm.service",
                  "system.slice/docker-4f2c9a1b7e0d5c3a8b6f1e2d9c7a5b3f1e0d2c4b6a8f9e7d5c3b1a2f4e6d8c0b.scope",
                  "system.slice/docker-4f2c11111111111111111111111111111111111111111111111111111111111.scope"):
        (unified / scope).mkdir(parents=True)
        (unified / scope / "memory.reclaim").write_text("")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 127539200 kB\nMemAvailable: 2048000 kB\n")
    return str(root), str(meminfo)


def test_amounts_use_binary_units(reclaim):
    assert reclaim.parse_amount("2G") == 2 * 1024 ** 3
    assert reclaim.parse_amount("512m") == 512 * 1024 ** 2
    assert reclaim.parse_amount("4096") == 4096
    with pytest.raises(ValueError, match=r"--amount '2\.5G': expected a positive whole number"):
        reclaim.parse_amount("2.5G")


def test_a_units_cgroup_gets_the_byte_count(reclaim, tmp_path, capsys):
    root, meminfo = cgroup_tree(tmp_path)
    assert reclaim.main(["--unit", "sparkfleet-vllm.service", "--amount", "2G",
                         "--cgroup-root", root, "--meminfo", meminfo]) == 0
    assert (tmp_path / "cgroup/system.slice/sparkfleet-vllm.service/memory.reclaim").read_text() == "2147483648\n"
    assert "asked 2G, done; MemAvailable 2000 -> 2000 MiB" in capsys.readouterr().out


def test_a_container_by_unambiguous_prefix_on_a_hybrid_host(reclaim, tmp_path):
    root, meminfo = cgroup_tree(tmp_path, hybrid=True)
    assert reclaim.main(["--container", "4f2c9a", "--amount", "1G", "--cgroup-root", root, "--meminfo", meminfo]) == 0
    written = list((tmp_path / "cgroup/unified/system.slice").glob("docker-4f2c9a*/memory.reclaim"))
    assert written[0].read_text() == f"{1024 ** 3}\n"


def test_an_ambiguous_container_prefix_is_refused(reclaim, tmp_path, capsys):
    root, meminfo = cgroup_tree(tmp_path)
    assert reclaim.main(["--container", "4f2c", "--cgroup-root", root, "--meminfo", meminfo]) == 1
    assert "'4f2c' matches 2 cgroups" in capsys.readouterr().err


def test_nothing_is_done_while_memory_is_above_the_guard(reclaim, tmp_path, capsys):
    root, meminfo = cgroup_tree(tmp_path)
    assert reclaim.main(["--unit", "sparkfleet-vllm.service", "--below-mib", "1500",
                         "--cgroup-root", root, "--meminfo", meminfo]) == 0
    assert "nothing to do, MemAvailable 2000 MiB >= 1500 MiB" in capsys.readouterr().out
    assert (tmp_path / "cgroup/system.slice/sparkfleet-vllm.service/memory.reclaim").read_text() == ""


def test_cgroup_v1_only_is_refused_with_the_way_out(reclaim, tmp_path, capsys):
    (tmp_path / "v1/memory").mkdir(parents=True)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 1 kB\n")
    assert reclaim.main(["--unit", "x.service", "--cgroup-root", str(tmp_path / "v1"), "--meminfo", str(meminfo)]) == 1
    assert "memory.reclaim exists only on cgroup v2 (boot with systemd.unified_cgroup_hierarchy=1" in \
        capsys.readouterr().err


def test_a_unit_that_is_not_running_is_named(reclaim, tmp_path, capsys):
    root, meminfo = cgroup_tree(tmp_path)
    assert reclaim.main(["--unit", "other.service", "--cgroup-root", root, "--meminfo", meminfo]) == 1
    assert "no cgroup for unit other.service below" in capsys.readouterr().err
