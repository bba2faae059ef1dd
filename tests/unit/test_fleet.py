"""module_utils/fleet.py: a fleet's groups checked as a whole, and the router's members from each head's state."""

import copy

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils import fleet

KEY = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def node(host, address, fabric, rank, subnet, model="tiny-cpu", key=KEY, routers=("192.168.50.5",)):
    return {"host": host, "address": address, "fabric_address": fabric, "rank": rank, "head": rank == 0,
            "api_port": 8888, "state_port": 29530, "master_port": 29501, "model": model, "api_key_sha256": key,
            "fabric_subnets": [subnet], "router_addresses": list(routers)}


def two_groups():
    return {"a": [node("a0", "192.168.50.10", "10.100.0.1", 0, "10.100.0.0/24"),
                  node("a1", "192.168.50.11", "10.100.0.2", 1, "10.100.0.0/24")],
            "b": [node("b0", "192.168.50.20", "10.101.0.1", 0, "10.101.0.0/24"),
                  node("b1", "192.168.50.21", "10.101.0.2", 1, "10.101.0.0/24")]}


def group_b(fabric0, fabric1, subnet):
    """Group b's two nodes on the fabric addresses and subnet given."""
    return [node("b0", "192.168.50.20", fabric0, 0, subnet), node("b1", "192.168.50.21", fabric1, 1, subnet)]


ROUTER = {"host": "router0", "address": "192.168.50.5", "port": 30000, "metrics_port": 29000}


def test_two_groups_apart_behind_a_router_they_let_in_pass():
    assert fleet.check_fleet(two_groups(), ROUTER) == []


def test_a_router_on_a_groups_head_needs_no_entry_there_but_free_ports():
    groups = two_groups()
    for member in groups["a"]:
        member["router_addresses"] = []
    router = dict(ROUTER, host="a0", address="192.168.50.10")
    for member in groups["b"]:
        member["router_addresses"] = ["192.168.50.0/24"]  # a network holding the router's address is enough
    assert fleet.check_fleet(groups, router) == []
    problems = fleet.check_fleet(groups, dict(router, port=8888, metrics_port=29530))
    assert problems == [
        "router a0: router_port: found 8888, the group's api_port on this node; expected a port the node's rank does "
        "not use; fix: set router_port to a free port",
        "router a0: router_metrics_port: found 29530, the group's state_port on this node; expected a port the "
        "node's rank does not use; fix: set router_metrics_port to a free port"]


def test_a_node_in_two_groups_is_refused_naming_both():
    groups = two_groups()
    groups["b"][1] = node("a1-again", "192.168.50.11", "10.101.0.2", 1, "10.101.0.0/24")
    assert fleet.check_fleet(groups, ROUTER) == [
        "group b: a1-again: ansible_host: found 192.168.50.11, a node of group a too; expected every node in one "
        "group only (a node serves one rank of one group); fix: take the node out of one of the two groups' "
        "inventories"]


def test_shared_fabric_addresses_and_overlapping_subnets_are_refused():
    groups = two_groups()
    groups["b"] = group_b("10.100.0.1", "10.100.1.2", "10.100.0.0/23")
    problems = fleet.check_fleet(groups, ROUTER)
    assert len(problems) == 2, problems
    assert problems[0].startswith("group b: b0: sparkfleet_fabric_address: found 10.100.0.1, the fabric address of a "
                                  "node of group a; expected fabric addresses unique across the fleet")
    assert problems[1].startswith("group b: sparkfleet_fabric_subnets: found 10.100.0.0/23, overlapping a fabric "
                                  "subnet of group a;")


def test_groups_serving_different_models_or_keys_are_refused_without_showing_the_key():
    groups = two_groups()
    for member in groups["b"]:
        member.update(model="glm-5.3-flash-nvfp4-tp2", api_key_sha256="0" * 64)
    problems = fleet.check_fleet(groups, ROUTER)
    assert problems == [
        "fleet: sparkfleet_model_profile: found tiny-cpu in group(s) a; glm-5.3-flash-nvfp4-tp2 in group(s) b; "
        "expected the router sends any request to any group: every group serves the same model under the same "
        "name; fix: serve one profile in every group, or run one fleet per model",
        "fleet: sparkfleet_api_key: found group(s) a one key; group(s) b one key; expected the router passes the "
        "client's key through: every group takes the same key; fix: give every group the same sparkfleet_api_key"]
    assert not [line for line in problems if KEY in line or "0" * 64 in line]


def test_a_group_that_does_not_let_the_router_in_is_named():
    groups = two_groups()
    for member in groups["b"]:
        member["router_addresses"] = ["192.168.60.0/24", "not-an-address"]
    assert fleet.check_fleet(groups, ROUTER) == [
        "group b: sparkfleet_router_addresses: found 192.168.50.5 not among ['192.168.60.0/24', 'not-an-address']; "
        "expected the router's address, let in to the head's API port 8888 and its group agent's port 29530; fix: "
        "add 192.168.50.5 to the group's sparkfleet_router_addresses"]


def test_a_group_without_exactly_one_head_is_refused():
    groups = copy.deepcopy(two_groups())
    groups["a"][1]["head"] = True
    assert fleet.check_fleet(groups, ROUTER)[0] == (
        "group a: sparkfleet_head: found 2 heads; expected exactly one node in the group's sparkfleet_head; fix: "
        "fix the group's inventory; its preflight says more")


@pytest.mark.parametrize(("groups", "found"), [
    (None, "found None; expected a non-empty list of groups"),
    ([], "found []; expected a non-empty list of groups"),
    ([{"name": "a", "inventory": "../a"}, {"name": "a", "inventory": "../b"}],
     "sparkfleet_fleet_groups[1]: found the name a again (also sparkfleet_fleet_groups[0]); expected each name once"),
    ([{"name": "A b", "inventory": "../a"}], "found name='A b'; expected 1-32 of a-z, 0-9, _ and -"),
    ([{"name": "a", "inventory": ""}], "found inventory=''; expected the path of the group's inventory"),
    ([{"name": "a", "inventory": "../a", "router": "x"}], "found the key(s) router; expected name and inventory only"),
    (["a"], "found a str; expected a mapping with name and inventory"),
])
def test_a_bad_list_of_groups_is_refused_in_one_line_each(groups, found):
    problems = fleet.check_groups_spec(groups)
    assert len(problems) == 1 and problems[0].startswith("fleet: ") and found in problems[0], problems
    assert "; fix: list each group once" in problems[0]


URLS = {"a": "http://192.168.50.10:8888", "b": "http://192.168.50.20:8888"}


def test_only_verified_groups_not_held_out_are_members():
    states = {"a": {"phase": "ready", "epoch": 7}, "b": {"phase": "verifying", "epoch": 9}}
    add, remove, why = fleet.membership(states, held=[], current=[URLS["b"], "http://elsewhere:1"], urls=URLS)
    # a worker no group owns (added through the router's open /add_worker, or a group since dropped) goes too
    assert (add, remove) == ([URLS["a"]], [URLS["b"], "http://elsewhere:1"])
    assert why == {"a": "verified (epoch 7)", "b": "its head is verifying (epoch 9)"}


def test_a_held_group_leaves_and_a_silent_head_is_no_member():
    states = {"a": {"phase": "ready", "epoch": 7}, "b": None}
    add, remove, why = fleet.membership(states, held=["a"], current=list(URLS.values()), urls=URLS)
    assert (add, sorted(remove)) == ([], sorted(URLS.values()))
    assert why == {"a": "held out by a fleet upgrade", "b": "its head's group agent did not answer"}


def test_nothing_changes_when_the_router_already_agrees():
    states = {"a": {"phase": "ready", "epoch": 7}, "b": {"phase": "gave-up", "epoch": 3}}
    assert fleet.membership(states, held=[], current=[URLS["a"]], urls=URLS)[:2] == ([], [])


@pytest.mark.parametrize("state", [[], "ready", 7, {"phase": ["ready"]}])
def test_a_head_state_that_is_not_a_mapping_is_no_answer(state):
    add, remove, why = fleet.membership({"a": state, "b": None}, held=[], current=[URLS["a"]], urls=URLS)
    assert (add, remove) == ([], [URLS["a"]])
    if not isinstance(state, dict):
        assert why["a"] == "its head's group agent did not answer"


def test_router_ports_are_compared_as_numbers_with_every_port_the_node_uses():
    groups = two_groups()
    groups["a"][0]["ports"] = [29531, 873, 9090, 9100]
    for member in groups["b"]:
        member["router_addresses"] = ["192.168.50.10"]
    router = dict(ROUTER, host="a0", address="192.168.50.10", port="9100", metrics_port="8888")
    assert fleet.check_fleet(groups, router) == [
        "router a0: router_port: found 9100, the group's service ports on this node; expected a port the node's rank "
        "does not use; fix: set router_port to a free port",
        "router a0: router_metrics_port: found 8888, the group's api_port on this node; expected a port the node's "
        "rank does not use; fix: set router_metrics_port to a free port"]


def test_a_fabric_subnet_holding_a_management_address_or_the_routers_is_refused():
    groups = two_groups()
    groups["b"] = group_b("192.168.50.201", "192.168.50.202", "192.168.50.0/24")
    problems = fleet.check_fleet(groups, ROUTER)
    assert problems == [
        "group b: sparkfleet_fabric_subnets: found 192.168.50.0/24, holding the management address(es) "
        "192.168.50.10, 192.168.50.11, 192.168.50.20, 192.168.50.21, 192.168.50.5; expected fabric subnets apart "
        "from every management address and the router's (else that traffic would take the fabric); fix: give the "
        "group another sparkfleet_fabric_supernet"]
