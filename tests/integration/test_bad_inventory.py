"""A bad inventory fails in preflight with one clear line, before any task reaches a node."""

import os

import pytest
import yaml
from conftest import ROOT, output, run_playbook, task_names

ALLOWED_BEFORE_FAILURE = {
    "Validating arguments against arg spec 'main' - "
    "Validate the inventory and print the cluster plan, changing nothing",
    "Validate the inventory on the controller",
}


def hosts_of(inventory):
    return yaml.safe_load((inventory / "hosts.yml").read_text())["all"]["children"]["sparkfleet_cluster"]["hosts"]


def duplicate_fabric_address(inventory):
    node0 = hosts_of(inventory)["node0"]["sparkfleet_fabric_address"]
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "node1.yml").write_text(f"---\nsparkfleet_fabric_address: {node0}\n")
    return (f"node1: sparkfleet_fabric_address: found {node0}, already the address of node0; expected a fabric "
            "address of its own on every node; fix: give node1 an unused address in the fabric subnet")


def mistyped_key(inventory):
    (inventory / "group_vars").mkdir()
    (inventory / "group_vars" / "sparkfleet_cluster.yml").write_text("---\nsparkfleet_tensor_paralel_size: 2\n")
    return ("node0, node1: sparkfleet_tensor_paralel_size: found an unknown key; expected only documented keys "
            "with this prefix; fix: rename it to sparkfleet_tensor_parallel_size")


def three_nodes_for_tp2(inventory):
    data = yaml.safe_load((inventory / "hosts.yml").read_text())
    cluster = data["all"]["children"]["sparkfleet_cluster"]
    # an address in the cable's subnet, as node1's (only the node count is wrong)
    address = cluster["hosts"]["node1"]["sparkfleet_fabric_address"].rsplit(".", 1)[0] + ".250"
    spare = dict(cluster["hosts"]["node1"], sparkfleet_node_rank=2, sparkfleet_fabric_address=address,
                 ansible_host="198.51.100.12")
    cluster["hosts"]["node2"] = spare
    (inventory / "hosts.yml").write_text(yaml.safe_dump(data))
    return ("sparkfleet_cluster: sparkfleet_tensor_parallel_size: found 3 nodes (node0, node1, node2) for "
            "tensor_parallel_size 2; expected exactly 2 nodes, one rank each; fix: remove 1 node(s) from group "
            "sparkfleet_cluster, or set sparkfleet_tensor_parallel_size: 3 with a profile that supports it")


@pytest.mark.parametrize("breakage", [duplicate_fabric_address, mistyped_key, three_nodes_for_tp2])
def test_bad_inventory_fails_in_preflight(breakage, weights_inventory_copy, tmp_path):
    expected = breakage(weights_inventory_copy)
    runner = run_playbook(tmp_path / "run", os.path.join(ROOT, "site.yml"), inventory=str(weights_inventory_copy))
    text = output(runner)
    assert runner.status == "failed" and runner.rc != 0
    assert expected in text.splitlines(), text[-3000:]  # the whole problem on one line of its own
    assert "Inventory check failed (nothing was changed on any host)" in text
    assert runner.stats["changed"] == {}
    assert set(task_names(runner)) <= ALLOWED_BEFORE_FAILURE, task_names(runner)


def capacity_refusal(inventory, tmp_path, vllm_args):
    """site.yml with these vLLM overrides, refused by the one capacity plan (made with the nodes' memory, after
    node discovery) before any change: the run's output."""
    (inventory / "group_vars").mkdir()
    overrides = yaml.safe_dump({"sparkfleet_vllm_args": vllm_args})
    (inventory / "group_vars" / "sparkfleet_cluster.yml").write_text(overrides)
    runner = run_playbook(tmp_path / "run", os.path.join(ROOT, "site.yml"), inventory=str(inventory))
    text = output(runner)
    assert runner.status == "failed"
    assert "Capacity plan refused (nothing was changed on any host):" in text, text[-3000:]
    assert runner.stats["changed"] == {}
    plays = {e["event_data"].get("play") for e in runner.events if e["event"] == "playbook_on_play_start"}
    assert plays == {"Preflight"}
    return text


def test_a_kv_pin_the_nodes_cannot_hold_is_refused_before_any_change(weights_inventory_copy, tmp_path):
    """The pin fits the profile's rules but not the nodes' memory, which only node_facts knows."""
    text = capacity_refusal(weights_inventory_copy, tmp_path, {"kv-cache-memory-bytes": "400G"})
    line = next(line for line in text.splitlines() if "sparkfleet_vllm_args: kv-cache-memory-bytes: found" in line)
    assert "sparkfleet_cluster: sparkfleet_vllm_args: kv-cache-memory-bytes: found " in line  # where, then key
    assert "GiB needed per node (weights 0.02 + runtime 3.00 + KV 400.00 + floor 1.00 + OS 1.00)" in line
    assert "expected at most the node's" in line and "fix: lower the KV pin by at least" in line


def test_a_context_beyond_the_model_is_refused_by_the_one_capacity_plan(weights_inventory_copy, tmp_path):
    """The plan is computed once, with the nodes' memory: what it refuses, it refuses before any change."""
    text = capacity_refusal(weights_inventory_copy, tmp_path, {"max-model-len": 4096})
    # The whole problem in one piece (Ansible's error line shows the message's line break as "\n").
    assert ("sparkfleet_cluster: sparkfleet_vllm_args: max-model-len: found 4,096; expected at most the model's "
            "limit 2,048; fix: lower max-model-len in sparkfleet_vllm_args or the profile") in text, text[-3000:]


def test_an_image_base_without_a_digest_is_refused_before_any_change(weights_inventory_copy, tmp_path):
    """Ranks in Docker need the patched image, built FROM a base pinned by digest: preflight says so first."""
    (weights_inventory_copy / "group_vars").mkdir()
    (weights_inventory_copy / "group_vars" / "sparkfleet_cluster.yml").write_text(
        "---\nvllm_service_runtime: docker\nvllm_image_base: vllm/vllm-openai:v0.33.0\n")
    runner = run_playbook(tmp_path / "run", os.path.join(ROOT, "site.yml"), inventory=str(weights_inventory_copy))
    text = " ".join(output(runner).split())
    assert runner.status == "failed"
    assert "vllm_image: found base vllm/vllm-openai:v0.33.0, build node node0 (image nodes node0, node1)" in text, (
        text[-3000:])
    assert "expected a base pinned by digest (repository@sha256:<64 hex> or a local image ID" in text
    assert runner.stats["changed"] == {}
    plays = {e["event_data"].get("play") for e in runner.events if e["event"] == "playbook_on_play_start"}
    assert plays == {"Preflight"}


def ring_on_two_nodes(inventory):
    (inventory / "group_vars").mkdir()
    (inventory / "group_vars" / "sparkfleet_cluster.yml").write_text("---\nsparkfleet_fabric_topology: ring\n")
    return ("Fabric plan refused (nothing was changed):", "topology ring: found 2 nodes (node0, node1); expected 4 "
            "(four nodes in a ring, each cage 0 cabled to the next node's cage 1 (one subnet per link)); fix: choose "
            "the topology that matches the cabling (sparkfleet_fabric_topology)")


def fabric_subnet_over_the_management_network(inventory):
    """A /8 prefix makes the cable's subnet 10.0.0.0/8, over the management network: the first check refuses it
    from the plan and each node's ansible_host (the fabric discovery would otherwise, from the node's networks)."""
    (inventory / "group_vars").mkdir()
    (inventory / "group_vars" / "sparkfleet_cluster.yml").write_text("---\nsparkfleet_fabric_prefix: 8\n")
    management = hosts_of(inventory)["node0"]["ansible_host"]
    return ("Inventory check found 2 problems (nothing was changed on any host):",
            "node0: sparkfleet_fabric_subnets: found 10.0.0.0/8 planned for node0 enp1s0f1np1, which holds the "
            f"node's management address {management} (ansible_host); expected fabric subnets apart from the "
            "management network; fix: choose sparkfleet_fabric_subnets (or the pinned sparkfleet_fabric_address "
            f"values, or sparkfleet_fabric_supernet) outside {management}'s network")


@pytest.mark.parametrize("breakage", [ring_on_two_nodes, fabric_subnet_over_the_management_network])
def test_a_fabric_that_cannot_be_built_is_refused_before_any_change(breakage, weights_inventory_copy, tmp_path):
    heading, expected = breakage(weights_inventory_copy)
    runner = run_playbook(tmp_path / "run", os.path.join(ROOT, "site.yml"), inventory=str(weights_inventory_copy))
    text = output(runner)
    assert runner.status == "failed"
    assert heading in text and expected in [line.strip() for line in text.splitlines()], text[-3000:]
    assert runner.stats["changed"] == {}
    plays = {e["event_data"].get("play") for e in runner.events if e["event"] == "playbook_on_play_start"}
    assert plays == {"Preflight"}
