# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""A fleet's groups checked as a whole on the controller (module_utils/fleet.py), for fleet.yml."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkfleet.cluster.plugins.module_utils import fleet


def fleet_groups_problems(groups):
    """What is wrong with the fleet inventory's sparkfleet_fleet_groups, one line each ([] when nothing)."""
    return fleet.check_groups_spec(groups)


def fleet_problems(groups, router):
    """What is wrong with the fleet as a whole, one line each ([] when nothing): `groups` maps each group's name to
    its nodes as fleet_describe.yml describes them, `router` is the router host's name, address and ports."""
    if not isinstance(groups, dict) or not all(isinstance(nodes, list) for nodes in groups.values()):
        raise AnsibleFilterError(f"fleet_problems: found a {type(groups).__name__}; expected a mapping of group name "
                                 "to its nodes' descriptions; fix: pass what fleet_describe.yml wrote")
    return fleet.check_fleet(groups, router or {})


class FilterModule:
    def filters(self):
        return {"fleet_groups_problems": fleet_groups_problems, "fleet_problems": fleet_problems}
