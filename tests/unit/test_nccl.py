"""The per-rank NCCL environment (plugins/module_utils/nccl.py) from a fabric plan and discovered devices."""

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils import fabric, nccl

HCAS = {(0, ""): "rocep1s0f0", (0, "P2"): "roceP2p1s0f0", (1, ""): "rocep1s0f1", (1, "P2"): "roceP2p1s0f1"}


def interfaces(plan, node):
    return [dict(i, netdev=fabric.netdev_name(i["cage"], i["twin"])) for i in plan[node]]


def test_two_nodes_single_rail_pin_the_discovered_gid():
    plan = fabric.plan(["a", "b"], "direct")
    env = nccl.rank_env(interfaces(plan, "b"), HCAS, {"rocep1s0f1": 3}, "direct")
    assert env["NCCL_IB_HCA"] == "rocep1s0f1" and env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert env["VLLM_HOST_IP"] == "10.100.0.2"
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_IB_ROCE_VERSION_NUM"] == "2"
    assert "NCCL_IB_ADDR_FAMILY" not in env


def test_dual_rail_uses_both_twins_and_leaves_a_gid_that_differs_to_nccl():
    plan = fabric.plan(["a", "b"], "direct", rails=2)
    same = nccl.rank_env(interfaces(plan, "a"), HCAS, {"rocep1s0f1": 3, "roceP2p1s0f1": 3}, "direct")
    assert same["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and same["NCCL_IB_GID_INDEX"] == "3"
    differ = nccl.rank_env(interfaces(plan, "a"), HCAS, {"rocep1s0f1": 3, "roceP2p1s0f1": 5}, "direct")
    assert "NCCL_IB_GID_INDEX" not in differ and differ["NCCL_IB_ADDR_FAMILY"] == "AF_INET"


def test_a_triangle_routes_by_subnet_on_every_cabled_hca_with_sockets_on_management():
    plan = fabric.plan(["h", "w1", "w2"], "triangle", rails=2)
    env = nccl.rank_env(interfaces(plan, "w1"), HCAS, {}, "triangle",
                        management={"ifname": "enP7s7", "address": "192.168.1.102"})
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1,rocep1s0f0,roceP2p1s0f0"
    assert env["NCCL_SOCKET_IFNAME"] == "enP7s7" and env["VLLM_HOST_IP"] == "192.168.1.102"
    assert env["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1" and env["NCCL_IB_ADDR_FAMILY"] == "AF_INET"
    assert "NCCL_IB_GID_INDEX" not in env and "NCCL_MIN_NCHANNELS" not in env


def test_a_ring_fixes_four_channels_and_allows_cross_nic():
    plan = fabric.plan(["n0", "n1", "n2", "n3"], "ring")
    env = nccl.rank_env(interfaces(plan, "n2"), HCAS, {}, "ring", management={"ifname": "enP7s7", "address": "x"})
    assert (env["NCCL_MIN_NCHANNELS"], env["NCCL_MAX_NCHANNELS"], env["NCCL_CROSS_NIC"]) == ("4", "4", "1")


def test_every_key_can_be_overridden_or_removed():
    plan = fabric.plan(["a", "b"], "direct")
    env = nccl.rank_env(interfaces(plan, "a"), HCAS, {"rocep1s0f1": 3}, "direct",
                        overrides={"NCCL_DEBUG": "INFO", "NCCL_IB_GID_INDEX": None, "NCCL_IB_QPS_PER_CONNECTION": 4})
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_IB_QPS_PER_CONNECTION"] == "4"
    assert "NCCL_IB_GID_INDEX" not in env


def test_missing_devices_and_a_mesh_without_management_are_refused():
    plan = fabric.plan(["a", "b"], "direct", rails=2)
    with pytest.raises(ValueError, match="no RoCE device found for cage 1 twin P2"):
        nccl.rank_env(interfaces(plan, "a"), {(1, ""): "rocep1s0f1"}, {}, "direct")
    triangle = fabric.plan(["h", "w1", "w2"], "triangle")
    with pytest.raises(ValueError, match="a triangle needs the management interface"):
        nccl.rank_env(interfaces(triangle, "h"), HCAS, {}, "triangle")


def sample(name):
    import os

    with open(os.path.join(os.path.dirname(__file__), "data", "nccl", name), encoding="utf-8") as handle:
        return handle.read()


def test_nccl_tests_output_with_a_root_column():
    result = nccl.parse_nccl_tests(sample("all_reduce_perf-root-column.txt"))
    assert result["avg_busbw"] == 122.67 and len(result["rows"]) == 5
    assert result["rows"][-1] == {"size": 33554432, "count": 8388608, "type": "float", "time_us": 195.40,
                                  "algbw": 171.72, "busbw": 300.51,
                                  "in_place": {"time_us": 195.40, "algbw": 171.73, "busbw": 300.52}}


def test_nccl_tests_output_in_the_older_format():
    result = nccl.parse_nccl_tests(sample("all_reduce_perf-old.txt"))
    assert result["avg_busbw"] == 1.14762
    assert result["rows"] == [{"size": 1310720000, "count": 327680000, "type": "float", "time_us": 1142117.0,
                               "algbw": 1.15, "busbw": 1.15,
                               "in_place": {"time_us": 1141891.0, "algbw": 1.15, "busbw": 1.15}}]


def test_output_without_a_table_gives_no_rows():
    assert nccl.parse_nccl_tests("NCCL WARN NET/IB : No device found.\n") == {"rows": [], "avg_busbw": None}


def test_without_any_roce_device_nccl_runs_over_sockets():
    plan = fabric.plan(["a", "b"], "direct", pinned={"a": "10.9.0.1", "b": "10.9.0.2"})
    env = nccl.rank_env(interfaces(plan, "b"), {}, {}, "direct")
    assert env["NCCL_NET"] == "Socket" and env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in env and "NCCL_IB_ROCE_VERSION_NUM" not in env and "NCCL_IB_GID_INDEX" not in env
    assert env["VLLM_HOST_IP"] == "10.9.0.2" and env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
    ring = fabric.plan(["n0", "n1", "n2", "n3"], "ring")
    env = nccl.rank_env(interfaces(ring, "n2"), {}, {}, "ring", {"ifname": "eth0", "address": "192.168.1.12"})
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and "NCCL_IB_SUBNET_AWARE_ROUTING" not in env
    assert env["NCCL_MIN_NCHANNELS"] == env["NCCL_MAX_NCHANNELS"] == "4"


def test_the_probes_result_line_from_a_real_h200_pair():
    result = nccl.parse_probe(sample("probe-h200-nvlink.txt"))
    assert result["world_size"] == 2 and result["nccl"] == "2.28.9" and result["gpu"] == "NVIDIA H200"
    assert result["latency_us"]["28672"] == 11.16 and result["bus_bandwidth_gbs"] == 332.37
    below = nccl.parse_probe(sample("probe-h200-sockets.txt"))  # sockets only: exits 1 under the floor
    assert below["bus_bandwidth_gbs"] == 3.48 and below["latency_us"]["28672"] == 99.81
    with pytest.raises(ValueError, match="found no 'SPARKFLEET_NCCL_PROBE' line in the probe's output"):
        nccl.parse_probe("Traceback (most recent call last):\nRuntimeError: connect() timed out\n")
    with pytest.raises(ValueError, match="without 'bus_bandwidth_gbs'"):
        nccl.parse_probe('SPARKFLEET_NCCL_PROBE {"world_size": 2, "latency_us": {}}\n')


READY = {"wanted": True, "serving": False, "image": True, "env_changed": False, "passed_before": False}


def skip(nodes, setting="auto", check_mode=False):
    return nccl.probe_skip_reason(nodes, setting, "sparkfleet/vllm:current", "/var/lib/sparkfleet/nccl/passed",
                                  check_mode)


def test_the_probe_runs_when_every_node_is_ready_and_none_has_passed():
    assert skip([READY, READY]) == ""


@pytest.mark.parametrize("change, start", [
    ({"wanted": False}, "no NVIDIA GPU outside a container on every node"),
    ({"serving": True}, "the vLLM unit is serving"),
    ({"image": False}, "the serving image sparkfleet/vllm:current is not on every node yet"),
])
def test_one_node_decides_for_all(change, start):
    assert skip([READY, dict(READY, **change)]).startswith(start)


def test_check_mode_never_probes_and_a_node_that_cannot_probe_is_named_first():
    assert skip([READY, READY], check_mode=True) == "not in --check"
    assert skip([READY, dict(READY, wanted=False)], check_mode=True).startswith("no NVIDIA GPU")


def test_a_pass_is_not_repeated_until_an_environment_changes_unless_asked():
    passed = dict(READY, passed_before=True)
    assert skip([passed, passed]).startswith("passed before (/var/lib/sparkfleet/nccl/passed)")
    assert skip([passed, dict(passed, env_changed=True)]) == ""
    assert skip([passed, passed], setting="true") == ""
    assert skip([passed, dict(READY)]) == ""  # a node without a record probes


def test_true_probes_without_the_image_check_of_auto_but_never_beside_a_serving_engine():
    assert skip([READY, dict(READY, image=False)], setting="true") == ""
    assert skip([READY, dict(READY, serving=True)], setting="true").startswith("the vLLM unit is serving")


def test_no_nodes_is_no_probe():
    assert skip([]).startswith("no NVIDIA GPU")
