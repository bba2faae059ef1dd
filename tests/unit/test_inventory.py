"""Cross-host inventory validation: each bad inventory gives one line naming where, key and fix."""

import copy

import pytest
from inventory_cases import GOOD, lines, validate

from ansible_collections.sparkfleet.cluster.plugins.module_utils import inventory


def test_good_inventory_gives_plan_by_rank():
    hosts = copy.deepcopy(GOOD)
    problems, plan = validate({"node1": hosts["node1"], "node0": hosts["node0"]})
    assert problems == []
    assert [n["host"] for n in plan["nodes"]] == ["node0", "node1"]
    assert [n["role"] for n in plan["nodes"]] == ["head", "worker"]
    assert plan["profile"]["name"] == "glm-5.3-flash-nvfp4-tp2"
    assert plan["sparkfleet_profile_paths"] == []  # default filled in


def test_string_rank_is_converted_like_ansible_does():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["sparkfleet_node_rank"] = "1"
    problems, plan = validate(hosts)
    assert problems == []
    assert plan["nodes"][1]["rank"] == 1


def test_duplicate_fabric_address_names_host_key_and_fix():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["sparkfleet_fabric_address"] = "192.168.100.10"
    assert lines(hosts) == [
        "node1: sparkfleet_fabric_address: found 192.168.100.10, already the address of node0; "
        "expected a fabric address of its own on every node; fix: give node1 an unused address in the fabric subnet"
    ]


def test_mistyped_key_suggests_the_documented_one():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["sparkfleet_fabric_adress"] = "192.168.100.12"
    (line,) = lines(hosts)
    assert line.startswith("node1: sparkfleet_fabric_adress: found an unknown key;")
    assert line.endswith("fix: rename it to sparkfleet_fabric_address")


def test_unknown_key_without_close_match():
    hosts = copy.deepcopy(GOOD)
    hosts["node0"]["sparkfleet_colour"] = "blue"
    (line,) = lines(hosts)
    assert line.startswith("node0: sparkfleet_colour: found an unknown key;")
    assert "argument_specs.yml" in line


def test_role_prefixed_unknown_key_is_caught_and_foreign_keys_are_not():
    hosts = copy.deepcopy(GOOD)
    hosts["node0"]["preflight_show_plna"] = True
    hosts["node0"]["my_own_variable"] = 1
    assert lines(hosts) == ["node0: preflight_show_plna: found an unknown key; expected only documented keys "
                            "with this prefix; fix: rename it to preflight_show_plan"]


def test_three_nodes_for_tp2():
    hosts = copy.deepcopy(GOOD)
    hosts["node2"] = dict(hosts["node1"], sparkfleet_node_rank=2, sparkfleet_fabric_address="192.168.100.12")
    (line,) = lines(hosts)
    assert line.startswith("sparkfleet_cluster: sparkfleet_tensor_parallel_size: found 3 nodes (node0, node1, node2) "
                           "for tensor_parallel_size 2; expected exactly 2 nodes")
    assert "fix: remove 1 node(s) from group sparkfleet_cluster" in line


def test_tp_size_the_profile_does_not_support():
    hosts = copy.deepcopy(GOOD)
    for values in hosts.values():
        values["sparkfleet_tensor_parallel_size"] = 3
    found = lines(hosts)
    assert any("found 3; expected a size profile glm-5.3-flash-nvfp4-tp2 supports (2)" in line for line in found)
    assert any("found 2 nodes (node0, node1) for tensor_parallel_size 3" in line for line in found)


def test_duplicate_rank():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["sparkfleet_node_rank"] = 0
    assert lines(hosts) == ["node0, node1: sparkfleet_node_rank: found rank 0 on 2 nodes; expected a unique rank "
                            "per node; fix: number the nodes 0..1, once each"]


def test_gap_in_ranks():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["sparkfleet_node_rank"] = 2
    (line,) = lines(hosts)
    assert line == ("node1: sparkfleet_node_rank: found 2; expected a rank from 0 to 1 (one per node of 2); "
                    "fix: number the nodes 0..1, once each")  # the host out of range is named


def test_missing_required_key_and_wrong_type():
    hosts = copy.deepcopy(GOOD)
    del hosts["node0"]["sparkfleet_fabric_address"]
    hosts["node1"]["sparkfleet_node_rank"] = "one"
    found = lines(hosts)
    assert len(found) == 2
    assert found[0].startswith("node0: sparkfleet_fabric_address: found nothing; expected a str")
    assert found[1].startswith("node1: sparkfleet_node_rank: found 'one'; expected a int")


def test_bad_fabric_address():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["sparkfleet_fabric_address"] = "192.168.100.300/24"
    (line,) = lines(hosts)
    assert line.startswith("node1: sparkfleet_fabric_address: found '192.168.100.300/24'; expected an IPv4 address")


def test_cluster_key_differing_between_hosts():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["sparkfleet_model_profile"] = "tiny-cpu"
    (line,) = lines(hosts)
    assert line.startswith("sparkfleet_cluster: sparkfleet_model_profile: found ")
    assert "fix: set sparkfleet_model_profile once in group_vars/sparkfleet_cluster" in line


@pytest.mark.parametrize("head, expected", [
    ((), "sparkfleet_head: hosts: found 0 hosts; expected exactly one head node"),
    (("node0", "node1"), "sparkfleet_head: hosts: found 2 hosts (node0, node1); expected exactly one head node"),
    (("node1",), "node1: sparkfleet_node_rank: found 1; expected rank 0 on the head node"),
    (("node9",), "node9: group membership: found in sparkfleet_head but not in sparkfleet_cluster"),
])
def test_exactly_one_head_holding_rank_zero(head, expected):
    (line,) = lines(copy.deepcopy(GOOD), head)
    assert line.startswith(expected)


def test_unknown_profile_lists_the_available_ones():
    hosts = copy.deepcopy(GOOD)
    for values in hosts.values():
        values["sparkfleet_model_profile"] = "glm-5.3-flash-nvfp5-tp2"
    (line,) = lines(hosts)
    assert line.startswith("sparkfleet_cluster: sparkfleet_model_profile: found no file glm-5.3-flash-nvfp5-tp2.yml")
    assert "glm-5.3-flash-nvfp4-tp2" in line and "tiny-cpu" in line


def test_empty_cluster():
    (line,) = lines({})
    assert line.startswith("sparkfleet_cluster: hosts: found an empty group")


def test_every_problem_is_one_line():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["sparkfleet_fabric_adress"] = "x"
    hosts["node0"]["sparkfleet_node_rank"] = "zero"
    for line in lines(hosts):
        assert "\n" not in line and "; expected " in line and "; fix: " in line


def test_same_typo_on_every_node_is_one_line():
    hosts = copy.deepcopy(GOOD)
    for values in hosts.values():
        values["sparkfleet_model_profil"] = "tiny-cpu"
    assert lines(hosts) == ["node0, node1: sparkfleet_model_profil: found an unknown key; expected only documented "
                            "keys with this prefix; fix: rename it to sparkfleet_model_profile"]


@pytest.mark.parametrize("sysctls, key, fix", [
    ({"vm.watermark_scale_factor": 500}, "node_memory_sysctls: vm.watermark_scale_factor",
     "set 100: at 500 the kernel silently hides ~12 GiB from MemAvailable"),
    ({"vm.swappiness": 0}, "node_memory_sysctls: vm.swappiness", "set 180: swappiness 0 with zram preceded"),
])
def test_memory_settings_the_field_saw_break_nodes_are_refused(sysctls, key, fix):
    hosts = {"a": {"node_memory_sysctls": sysctls}, "b": {"node_memory_sysctls": sysctls}}
    problems = inventory.check_memory_settings(hosts)
    assert len(problems) == 1
    assert problems[0].where == "a, b" and problems[0].key == key
    assert fix in problems[0].fix


def test_memory_settings_must_match_on_every_node():
    hosts = {"a": {"node_memory_sysctls": {"vm.swappiness": 180}}, "b": {"node_memory_sysctls": {"vm.swappiness": 100}}}
    problems = inventory.check_memory_settings(hosts)
    assert [p.key for p in problems] == ["node_memory_sysctls"]
    assert problems[0].expected == "one value for the whole cluster"


def test_the_fields_memory_settings_pass():
    hosts = {"a": {"node_memory_sysctls": {"vm.swappiness": 180, "vm.watermark_scale_factor": 100}}}
    assert inventory.check_memory_settings(hosts) == []
