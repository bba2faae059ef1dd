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
    must be now. Never a guessed constant; changes nothing.
  - A node without RoCE devices (the lab) reports none; the addresses are still mapped to their netdevs.
options:
  addresses:
    description: IPv4 addresses of this node to map (its fabric addresses).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
author:
  - sparkfleet developers
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
        addresses: {192.168.100.10: {netdev: enp1s0f1np1, roce: rocep1s0f1, gid_index: 3}}
"""

import json

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils import fabric


def main():
    module = AnsibleModule(argument_spec={"addresses": {"type": "list", "elements": "str", "default": []}},
                           supports_check_mode=True)
    rc, out, err = module.run_command(["ip", "-j", "addr", "show"])
    if rc != 0:
        module.fail_json(msg=f"ip -j addr show failed ({rc}): {err.strip()}; expected iproute2 with JSON output")
    links = fabric.parse_ip_addr(json.loads(out or "[]"))
    roce = fabric.roce_devices("/")
    by_netdev = {device["netdev"]: device for device in roce if device["netdev"]}
    addresses = {}
    for address in module.params["addresses"]:
        netdev = fabric.interface_holding(links, address)
        device = by_netdev.get(netdev)
        entry = {"netdev": netdev, "roce": device["name"] if device else None, "gid_index": None}
        if device:
            try:
                entry["gid_index"] = fabric.roce_v2_gid_index("/", device["name"], address, device["port"])
            except fabric.FabricError as error:
                module.fail_json(msg=str(error))
        addresses[address] = entry
    module.exit_json(changed=False, ansible_facts={"sparkfleet_fabric": {"roce": roce, "links": links,
                                                                         "addresses": addresses}})


if __name__ == "__main__":
    main()
