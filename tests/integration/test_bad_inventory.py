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
    spare = dict(cluster["hosts"]["node1"], sparkfleet_node_rank=2, sparkfleet_fabric_address="198.51.100.12",
                 ansible_host="198.51.100.12")
    cluster["hosts"]["node2"] = spare
    (inventory / "hosts.yml").write_text(yaml.safe_dump(data))
    return ("sparkfleet_cluster: sparkfleet_tensor_parallel_size: found 3 nodes (node0, node1, node2) for "
            "tensor_parallel_size 2; expected exactly 2 nodes, one rank each; fix: remove 1 node(s) from group "
            "sparkfleet_cluster, or set sparkfleet_tensor_parallel_size: 3 with a profile that supports it")


@pytest.mark.parametrize("breakage", [duplicate_fabric_address, mistyped_key, three_nodes_for_tp2])
def test_bad_inventory_fails_in_preflight(breakage, lab_inventory_copy, tmp_path):
    expected = breakage(lab_inventory_copy)
    runner = run_playbook(tmp_path / "run", os.path.join(ROOT, "site.yml"), inventory=str(lab_inventory_copy))
    text = output(runner)
    assert runner.status == "failed" and runner.rc != 0
    assert expected in text.splitlines(), text[-3000:]  # the whole problem on one line of its own
    assert "Inventory check failed (nothing was changed on any host)" in text
    assert runner.stats["changed"] == {}
    assert set(task_names(runner)) <= ALLOWED_BEFORE_FAILURE, task_names(runner)
