"""Shared by tests/unit/test_inventory.py and test_input_rules.py: a good 2-node inventory and the validation as
the cluster_validate action runs it (the roles' real argument specs, Ansible's own validator)."""

from ansible_collections.sparkfleet.cluster.plugins.action.cluster_validate import ansible_validate, load_role_specs
from ansible_collections.sparkfleet.cluster.plugins.module_utils import inventory
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import profiles

SPECS = load_role_specs()

GOOD = {
    "node0": {"sparkfleet_node_rank": 0, "sparkfleet_fabric_address": "192.168.100.10",
              "sparkfleet_model_profile": "glm-5.3-flash-nvfp4-tp2", "sparkfleet_tensor_parallel_size": 2},
    "node1": {"sparkfleet_node_rank": 1, "sparkfleet_fabric_address": "192.168.100.11",
              "sparkfleet_model_profile": "glm-5.3-flash-nvfp4-tp2", "sparkfleet_tensor_parallel_size": 2},
}


def load_profile(name):
    return profiles.load(name, [profiles.collection_profile_dir()])


def validate(hosts, head=("node0",), **kwargs):
    """The shipped GLM profiles leave checkpoint.revision to the user: the weights stage is out of these runs
    unless a test says otherwise."""
    return inventory.validate_cluster(hosts, head, SPECS, ansible_validate, load_profile,
                                      **dict({"weights_stage": False}, **kwargs))


def lines(hosts, head=("node0",), **kwargs):
    problems, plan = validate(hosts, head, **kwargs)
    assert plan is None
    return [p.line() for p in problems]
