#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Gather what a sparkfleet node has: memory, accelerator, RDMA devices, container."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_facts
short_description: Discover a node's memory, NVIDIA GPUs, RDMA devices and container status
description:
  - Reads C(/proc), C(/sys) and C(/etc/os-release); changes nothing.
  - Roles decide from these facts whether a step applies; a lab node reports no accelerator and no RDMA
    device because it has none, exactly as a real node without them would.
version_added: 0.1.0
options: {}
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
- name: Discover the node
  sparkfleet.cluster.node_facts:

- name: Skip GPU work where there is no GPU
  ansible.builtin.debug:
    msg: "{{ sparkfleet_node.accelerator.count }} GPU(s)"
"""

RETURN = r"""
ansible_facts:
  description: Facts published for the node.
  returned: always
  type: dict
  contains:
    sparkfleet_node:
      description: What the node has.
      type: dict
      returned: always
      sample:
        architecture: aarch64
        os: {id: ubuntu, version_id: "24.04", pretty_name: Ubuntu 24.04.3 LTS}
        memory: {total_kib: 127539200, available_kib: 120512340, swap_total_kib: 16777212}
        accelerator: {kind: nvidia, count: 1, devices: [{bus_id: "000f:01:00.0", model: NVIDIA GB10}]}
        rdma:
          present: true
          devices: [{name: rocep1s0f1, netdevs: [enp1s0f1np1], ports: ["1"]}]
        container: null
        init: systemd
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils.node import node_facts


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts={"sparkfleet_node": node_facts()})


if __name__ == "__main__":
    main()
