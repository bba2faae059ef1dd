# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The fabric plan for plays: ``nodes | sparkfleet.cluster.fabric_plan(topology, ...)``."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkfleet.cluster.plugins.module_utils import fabric

DOCUMENTATION = r"""
---
name: fabric_plan
short_description: Every node's ConnectX-7 fabric interfaces and addresses for a topology
description:
  - One subnet per cable and rail (a /24 of O(supernet)), the host number is the node's place in the list + 1.
    C(direct) - two nodes, one cable between cage O(cage) on both; C(triangle) and C(ring) - three or four
    nodes, each node's cage 0 cabled to the next node's cage 1; C(switch) - two to four nodes on one switch.
  - Two rails address both twins of each cabled cage (each QSFP cage shows as two PCIe functions).
  - O(pinned) (the inventory's C(sparkfleet_fabric_address)) fixes the rail-0 addresses of a direct or switch
    fabric; a triangle or ring cannot take pinned addresses.
  - Bad input fails with what was found, what was expected and the fix.
version_added: 0.3.0
options:
  _input:
    description: The nodes, in rank order.
    type: list
    elements: str
    required: true
  topology:
    description: C(direct), C(triangle), C(ring) or C(switch).
    type: str
    required: true
  rails:
    description: 1 or 2.
    type: int
    default: 1
  supernet:
    description: The private range the per-cable subnets come from.
    type: str
    default: 10.100.0.0/16
  cage:
    description: The cabled cage of a direct or switch fabric (0 or 1).
    type: int
    default: 1
  mtu:
    description: MTU of every fabric interface.
    type: int
    default: 9000
  pinned:
    description: Rail-0 addresses by node (direct and switch only).
    type: dict
    default: {}
  prefix:
    description: Prefix length of the pinned addresses' subnet.
    type: int
    default: 24
"""

EXAMPLES = r"""
- name: The plan of a two-node cluster with both twins addressed
  ansible.builtin.debug:
    msg: "{{ ['spark-a', 'spark-b'] | sparkfleet.cluster.fabric_plan('direct', rails=2) }}"
"""

RETURN = r"""
_value:
  description: "{node: [{cage, rail, twin, subnet, address, prefix, mtu, peers: [{node, address}]}]}"
  type: dict
"""


def fabric_plan(nodes: list[str], topology: str, rails: int = 1, supernet: str = "10.100.0.0/16", cage: int = 1,
                mtu: int = 9000, pinned: dict[str, str] | None = None, prefix: int = 24) -> dict[str, Any]:
    try:
        return fabric.plan(list(nodes), topology, int(rails), supernet, int(cage), int(mtu),
                           {k: str(v) for k, v in (pinned or {}).items()} or None, int(prefix))
    except (fabric.FabricError, ValueError) as err:
        raise AnsibleFilterError(str(err)) from err


class FilterModule:
    def filters(self):
        return {"fabric_plan": fabric_plan}
