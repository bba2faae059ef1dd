"""vLLM's command line from profile data, and the kernel's Xid lines."""

import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.sparkfleet.cluster.plugins.filter.kernel import xid_errors
from ansible_collections.sparkfleet.cluster.plugins.filter.vllm import (
    docker_ranks,
    group_members,
    rank_runtime,
    vllm_cli_args,
)


def test_flags_of_every_kind_render_in_a_stable_order():
    args = {
        "max-model-len": 900000,
        "enforce-eager": True,
        "enable-flashinfer-autotune": False,
        "cudagraph-capture-sizes": [1, 2, 4],
        "speculative-config": {"num_speculative_tokens": 3, "method": "mtp"},
        "kv-cache-dtype": "fp8",
        "master-port": None,
    }
    assert vllm_cli_args(args) == [
        "--cudagraph-capture-sizes", "1", "2", "4",
        "--no-enable-flashinfer-autotune",
        "--enforce-eager",
        "--kv-cache-dtype", "fp8",
        "--max-model-len", "900000",
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":3}',
    ]


@pytest.mark.parametrize("name", ["--port", "", "max model len"])
def test_a_flag_name_with_dashes_or_spaces_is_refused(name):
    with pytest.raises(AnsibleFilterError, match="expected a name without dashes in front"):
        vllm_cli_args({name: 1})


KERNEL = [
    "[  12.000000] mlx5_core 0000:01:00.0: firmware version 28.41.1000",
    "[ 812.337761] NVRM: Xid (PCI:000f:01:00): 81, pid=4242, name=python3, Ch 00000008",
    "[ 901.100000] NVRM: Xid (PCI:000f:01:00): 31, pid=4242, name=VLLM::Worker, MMU Fault",
    "[ 950.000000] NVRM: GPU at PCI:000f:01:00: GPU-1234",
]


def test_xid_errors_keep_real_errors_and_drop_benign_codes():
    assert xid_errors(KERNEL, ["0x51"]) == [KERNEL[2]]
    assert xid_errors(KERNEL, [81]) == [KERNEL[2]]
    assert xid_errors(KERNEL) == [KERNEL[1], KERNEL[2]]
    assert xid_errors(KERNEL[:1] + KERNEL[3:]) == []


GPU = {"accelerator": {"kind": "nvidia"}}
CPU = {"accelerator": {"kind": "none"}}


@pytest.mark.parametrize("setting, node, runtime", [
    ("auto", GPU, "docker"), ("auto", CPU, "native"), ("auto", {}, "native"), ("auto", None, "native"),
    ("docker", CPU, "docker"), ("native", GPU, "native"),
])
def test_a_rank_runs_in_docker_on_nvidia_nodes_unless_told(setting, node, runtime):
    assert rank_runtime(setting, node) == runtime


def test_the_image_goes_to_the_docker_ranks_only():
    hostvars = {"a": {"sparkfleet_node": GPU}, "b": {"sparkfleet_node": CPU},
                "c": {"sparkfleet_node": CPU, "vllm_service_runtime": "docker"},
                "d": {"sparkfleet_node": GPU, "vllm_service_runtime": "native"}}
    assert docker_ranks(["a", "b", "c", "d"], hostvars) == ["a", "c"]


def test_the_group_members_come_in_rank_order_with_their_rendezvous_address():
    hostvars = {"b": {"sparkfleet_node_rank": 1, "sparkfleet_fabric_address": "10.0.0.2"},
                "a": {"sparkfleet_node_rank": "0", "sparkfleet_fabric_address": "10.0.0.1"}}
    assert group_members(["b", "a"], hostvars, "29530") == [
        {"rank": 0, "host": "a", "address": "10.0.0.1", "port": 29530},
        {"rank": 1, "host": "b", "address": "10.0.0.2", "port": 29530}]


@pytest.mark.parametrize("hostvars,found", [
    ({"a": {"sparkfleet_node_rank": 0}}, "a: sparkfleet_node_rank or sparkfleet_fabric_address is missing"),
    ({"a": {"sparkfleet_node_rank": 1, "sparkfleet_fabric_address": "10.0.0.1"}}, "found ranks [1]; expected 0..0"),
])
def test_group_members_refuse_what_the_supervisor_could_not_use(hostvars, found):
    with pytest.raises(AnsibleFilterError, match=re.escape(found)):
        group_members(list(hostvars), hostvars, 29530)
