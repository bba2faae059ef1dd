#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""What the node's fabric looks like: RoCE devices, links, addresses and GID indexes."""

DOCUMENTATION = r"""
---
module: fabric_facts
short_description: Discover the ConnectX-7 fabric of a node - RoCE devices, links, addresses, GID indexes
version_added: 0.3.0
description:
  - Reads C(/sys/class/infiniband) and C(/sys/class/net) (RoCE device to netdev, cage and twin, port state,
    link speed, MTU) and C(ip -j addr) (addresses), and for every address in O(addresses) finds the netdev
    that holds it and, on a RoCE device, the index of the RoCE v2 GID holding it - what C(NCCL_IB_GID_INDEX)
    must be now (or, in C(gid_error), what the GID table holds instead). Never a guessed constant; changes
    nothing.
  - A node without RoCE devices (the lab) reports none; the addresses are still mapped to their netdevs.
  - With O(netdevs) it fails, naming what it found, when a planned netdev does not exist; with O(require_roce)
    also when a planned cage has no RoCE device, no cabled port, or (two rails) a twin down.
options:
  addresses:
    description: IPv4 addresses of this node to map (its fabric addresses).
    type: list
    elements: str
    default: []
  netdevs:
    description: The netdevs the fabric plan uses on this node; each must exist.
    type: list
    elements: str
    default: []
  require_roce:
    description: The node must have RoCE devices on the planned O(cages) (a GB10 node; not the lab).
    type: bool
    default: false
  cages:
    description: The QSFP cages the plan uses on this node.
    type: list
    elements: int
    default: []
  rails:
    description: 1 (one twin per cage) or 2 (both twins must be up).
    type: int
    default: 1
  expect:
    description:
      - Planned interfaces (C(netdev), C(address), C(prefix), C(mtu)); what is not in effect is returned in
        RV(ansible_facts.sparkfleet_fabric.unmet), one line each. Never fails on it.
    type: list
    elements: dict
    default: []
  speed_mbps:
    description: Link speed each expected netdev that is a RoCE device must report (0 skips the check).
    type: int
    default: 0
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would change without changing it.
    support: full
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
  facts:
    description: Publishes C(ansible_facts) that later tasks of the play read.
    support: full
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Map the fabric addresses
  sparkfleet.cluster.fabric_facts:
    addresses: ["{{ sparkfleet_fabric_address }}"]
"""

RETURN = r"""
ansible_facts:
  description: Facts published for the node.
  returned: always
  type: dict
  contains:
    sparkfleet_fabric:
      description: The fabric as found.
      type: dict
      returned: always
      sample:
        roce: [{name: rocep1s0f1, netdev: enp1s0f1np1, cage: 1, twin: "", state: ACTIVE}]
        links: {enp1s0f1np1: {mtu: 9000, operstate: up, up: true, ipv4: [192.168.100.10/24], ipv6: []}}
        addresses: {192.168.100.10: {netdev: enp1s0f1np1, roce: rocep1s0f1, gid_index: 3, gid_error: null}}
        others: [10.0.0.21/24]
        unmet: ["enp1s0f1np1: found MTU 1500; expected 9000"]
      contains:
        roce:
          description: Every RoCE device with its netdev, cage, twin, port state and the netdev's link.
          type: list
          elements: dict
          returned: always
        links:
          description: Every interface by name, with its MTU, operstate, whether it is up, and its addresses.
          type: dict
          returned: always
        addresses:
          description:
            - Each address of O(addresses), with the netdev holding it and, on a RoCE device, the RoCE v2 GID
              index (or in C(gid_error), what the GID table holds instead).
          type: dict
          returned: always
        others:
          description: The IPv4 addresses (CIDR) of interfaces outside the fabric, C(lo) left out.
          type: list
          elements: str
          returned: always
        unmet:
          description: What of O(expect) is not in effect, one line each; empty when all of it is.
          type: list
          elements: str
          returned: always
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils import fabric


def main():
    module = AnsibleModule(argument_spec={
        "addresses": {"type": "list", "elements": "str", "default": []},
        "netdevs": {"type": "list", "elements": "str", "default": []},
        "require_roce": {"type": "bool", "default": False},
        "cages": {"type": "list", "elements": "int", "default": []},
        "rails": {"type": "int", "default": 1},
        "expect": {"type": "list", "elements": "dict", "default": []},
        "speed_mbps": {"type": "int", "default": 0},
    }, supports_check_mode=True)
    rc, out, err = module.run_command(["ip", "-j", "addr", "show"])
    if rc != 0:
        module.fail_json(msg=f"ip -j addr show failed ({rc}): {err.strip()}; expected iproute2 with JSON output")
    links = fabric.parse_ip_addr(json.loads(out or "[]"))
    roce = fabric.roce_devices("/")
    missing = [name for name in module.params["netdevs"] if name not in links]
    if missing:
        module.fail_json(msg=f"{', '.join(missing)}: found no such interface (interfaces: {', '.join(sorted(links))}); "
                             "expected the ConnectX-7 netdevs the fabric plan names; fix: check that mlx5_core is "
                             "loaded (ip -br link) and that sparkfleet_fabric_cage names the cabled cage")
    if module.params["require_roce"]:
        problems = fabric.check_rails(os.uname().nodename, roce, sorted(set(module.params["cages"])),
                                      module.params["rails"])
        if problems:
            module.fail_json(msg="\n".join(problems), roce=roce)
    by_netdev = {device["netdev"]: device for device in roce if device["netdev"]}
    addresses = {}
    for address in module.params["addresses"]:
        netdev = fabric.interface_holding(links, address)
        device = by_netdev.get(netdev)
        entry = {"netdev": netdev, "roce": device["name"] if device else None, "gid_index": None, "gid_error": None}
        if device:
            try:
                entry["gid_index"] = fabric.roce_v2_gid_index("/", device["name"], address, device["port"])
            except fabric.FabricError as error:  # reported by the caller: right after an apply it may be pending
                entry["gid_error"] = str(error)
        addresses[address] = entry
    fabric_netdevs = set(module.params["netdevs"]) | set(by_netdev)
    others = sorted(cidr for name, link in links.items() if name not in fabric_netdevs and name != "lo"
                    for cidr in link["ipv4"])
    module.exit_json(changed=False, ansible_facts={"sparkfleet_fabric": {
        "roce": roce, "links": links, "addresses": addresses, "others": others,
        "unmet": fabric.unmet(links, roce, module.params["expect"], module.params["speed_mbps"])}})


if __name__ == "__main__":
    main()
