"""Jinja filters (subnet_of, plan_lines) and the job_progress status line."""

import ipaddress

import pytest

from ansible_collections.sparkfleet.cluster.plugins.action.job_progress import describe
from ansible_collections.sparkfleet.cluster.plugins.filter import network, plan
from ansible_collections.sparkfleet.cluster.plugins.filter.fabric import ipv4_of

# ---------------------------------------------------------------------------------------------- subnet_of


@pytest.mark.parametrize(("address", "prefix", "network_text"), [
    ("10.0.0.7", 24, "10.0.0.0/24"),
    ("192.168.100.10", "24", "192.168.100.0/24"),  # Jinja may hand the prefix over as a string
    ("10.213.5.130", 25, "10.213.5.128/25"),
    ("172.17.3.4", 16, "172.17.0.0/16"),
    ("10.0.0.7", 32, "10.0.0.7/32"),
    ("10.0.0.7", 0, "0.0.0.0/0"),
    ("fd00::1:2", 64, "fd00::/64"),
])
def test_subnet_of(address, prefix, network_text):
    assert network.subnet_of(address, prefix) == network_text


@pytest.mark.parametrize(("address", "prefix"), [("10.0.0.7", 33), ("10.0.0.300", 24), ("not-an-ip", 24)])
def test_subnet_of_refuses_nonsense(address, prefix):
    with pytest.raises(ValueError):
        network.subnet_of(address, prefix)


def test_subnet_of_result_holds_the_address():
    assert ipaddress.ip_address("10.0.0.7") in ipaddress.ip_network(network.subnet_of("10.0.0.7", 20))


def test_filter_modules_register_the_filters():
    assert network.FilterModule().filters() == {"subnet_of": network.subnet_of, "nth_address": network.nth_address}
    assert network.nth_address("10.213.4.0/24", -2) == "10.213.4.254"
    assert network.nth_address("10.213.4.0/24", 1) == "10.213.4.1"
    assert plan.FilterModule().filters() == {"plan_lines": plan.plan_lines}


# ---------------------------------------------------------------------------------------------- plan_lines

PROFILE = {
    "name": "tiny-cpu",
    "description": "Tiny random Llama-style model for the CPU lab (vLLM CPU build, no GPU)",
    "tensor_parallel_sizes": [1, 2, 3, 4],
    "served_model_name": "tiny-cpu",
    "max_model_len": 512,
    "checkpoint": {"source": "local", "repo_id": "sparkfleet/tiny-cpu"},
}


def make_plan(hosts):
    """What cluster_validate returns: the cluster-wide values, the nodes by rank, the profile."""
    return {
        "sparkfleet_model_profile": "tiny-cpu",
        "sparkfleet_tensor_parallel_size": len(hosts),
        "sparkfleet_profile_paths": [],
        "nodes": [{"host": host, "rank": rank, "role": "head" if rank == 0 else "worker",
                   "fabric_address": f"192.168.100.{10 + rank}"} for rank, host in enumerate(hosts)],
        "profile": dict(PROFILE),
    }


SPARK_FACTS = {
    "architecture": "aarch64",
    "os": {"id": "ubuntu", "version_id": "24.04", "pretty_name": "Ubuntu 24.04.2 LTS"},
    "memory": {"total_kib": 128 * 1024 * 1024, "available_kib": 120 * 1024 * 1024 + 512 * 1024,
               "swap_total_kib": 0},
    "accelerator": {"kind": "nvidia", "count": 1,
                    "devices": [{"bus_id": "0000:0f:01.0", "model": "NVIDIA GB10"}]},
    "rdma": {"present": True, "devices": [
        {"name": "rocep1s0f0", "netdevs": ["enp1s0f0np0"], "ports": ["1"]},
        {"name": "roceP2p1s0f0", "netdevs": ["enP2p1s0f0np0"], "ports": ["1"]},
    ]},
    "container": None,
}

LAB_FACTS = {
    "architecture": "unknown",
    "os": {"id": "debian", "version_id": "12", "pretty_name": "Debian GNU/Linux 12 (bookworm)"},
    "memory": {"total_kib": 16 * 1024 * 1024, "available_kib": 3 * 1024 * 1024 // 2, "swap_total_kib": 0},
    "accelerator": {"kind": "none", "count": 0, "devices": []},
    "rdma": {"present": False, "devices": []},
    "container": "docker",
}


def test_plan_lines_header():
    lines = plan.plan_lines(make_plan(["spark0", "spark1"]), {"spark0": {}, "spark1": {}})
    assert lines[:2] == [
        "profile tiny-cpu: Tiny random Llama-style model for the CPU lab (vLLM CPU build, no GPU)",
        "tensor parallel 2 over 2 node(s); served as tiny-cpu, max_model_len 512",
    ]


def test_plan_lines_with_node_facts():
    hostvars = {
        "spark0": {"ansible_host": "10.0.0.20", "sparkfleet_node": SPARK_FACTS},
        "spark1": {"ansible_host": "10.0.0.21", "sparkfleet_node": LAB_FACTS},
    }
    assert plan.plan_lines(make_plan(["spark0", "spark1"]), hostvars)[2:] == [
        "rank 0 head   spark0 | mgmt 10.0.0.20 | rendezvous 192.168.100.10 | aarch64 | 128.0 GiB memory "
        "(120.5 GiB available) | GPU NVIDIA GB10 | RDMA rocep1s0f0, roceP2p1s0f0",
        "rank 1 worker spark1 | mgmt 10.0.0.21 | rendezvous 192.168.100.11 | unknown | 16.0 GiB memory "
        "(1.5 GiB available) | GPU none | RDMA none | in a docker container",
    ]


def test_plan_lines_without_node_facts():
    # Before node_facts ran (or when it found nothing): the inventory's view only; the host name as mgmt address.
    hostvars = {"node0": {"ansible_host": "node0.lab"}, "node1": {"sparkfleet_node": {}},
                "node2": {"sparkfleet_node": None}}
    assert plan.plan_lines(make_plan(["node0", "node1", "node2"]), hostvars) == [
        "profile tiny-cpu: Tiny random Llama-style model for the CPU lab (vLLM CPU build, no GPU)",
        "tensor parallel 3 over 3 node(s); served as tiny-cpu, max_model_len 512",
        "rank 0 head   node0 | mgmt node0.lab | rendezvous 192.168.100.10",
        "rank 1 worker node1 | mgmt node1 | rendezvous 192.168.100.11",
        "rank 2 worker node2 | mgmt node2 | rendezvous 192.168.100.12",
    ]


def test_plan_lines_follow_the_plan_order_not_hostvars():
    cluster_plan = make_plan(["b", "a"])
    lines = plan.plan_lines(cluster_plan, {"a": {}, "b": {}})
    assert [line.split(" | ")[0] for line in lines[2:]] == ["rank 0 head   b", "rank 1 worker a"]


def test_plan_lines_mixed_facts_and_several_gpus():
    facts = dict(SPARK_FACTS, container="podman",
                 accelerator={"kind": "nvidia", "count": 2, "devices": [
                     {"bus_id": "0000:01:00.0", "model": "NVIDIA H200"},
                     {"bus_id": "0000:02:00.0", "model": "NVIDIA H200"}]},
                 rdma={"present": False, "devices": []})
    del facts["architecture"]  # an older fact without it
    hostvars = {"h0": {"sparkfleet_node": facts}, "h1": {}}
    assert plan.plan_lines(make_plan(["h0", "h1"]), hostvars)[2:] == [
        "rank 0 head   h0 | mgmt h0 | rendezvous 192.168.100.10 | ? | 128.0 GiB memory (120.5 GiB available) | "
        "GPU NVIDIA H200, NVIDIA H200 | RDMA none | in a podman container",
        "rank 1 worker h1 | mgmt h1 | rendezvous 192.168.100.11",
    ]


# ---------------------------------------------------------------------------------------------- describe

def test_describe_typical_progress():
    progress = {"phase": "download", "done_bytes": 3 * 1024 ** 3, "total_bytes": 12 * 1024 ** 3,
                "bytes_per_second": 104857600.0, "file": "model-00002-of-00005.safetensors"}
    assert describe("spark1", "weights", progress) == \
        "spark1: weights download 3.0 GiB / 12.0 GiB (25%) at 100.0 MiB/s"


def test_describe_rounds_the_percentage():
    progress = {"phase": "verify", "done_bytes": 2, "total_bytes": 3, "bytes_per_second": 0.5}
    assert describe("h", "job", progress) == "h: job verify 2 B / 3 B (67%) at 0 B/s"


def test_describe_total_zero_has_no_percentage():
    progress = {"phase": "copy", "done_bytes": 0, "total_bytes": 0, "bytes_per_second": 0.0, "file": ""}
    assert describe("node0", "weights", progress) == "node0: weights copy 0 B / 0 B at 0 B/s"


def test_describe_empty_progress():
    assert describe("node0", "weights", {}) == "node0: weights  0 B / 0 B at 0 B/s"


def test_a_monitor_address_is_an_ipv4_address_or_what_the_controller_resolves_the_name_to():
    assert ipv4_of("192.168.1.50") == "192.168.1.50"
    assert ipv4_of("localhost") == ""  # loopback lets nobody in
    assert ipv4_of("no-such-monitor.invalid") == ""  # RFC 2606: never resolves
    assert ipv4_of("") == "" and ipv4_of(None) == ""
