#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Pick subnets for the lab's Docker networks that collide with nothing on this machine."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: lab_subnets
short_description: Choose free IPv4 subnets for the lab's Docker networks
description:
  - For each requested network, returns the subnet it already has when it exists (so re-runs change
    nothing), else the first subnet of O(pool) that overlaps neither a route of this machine nor another
    Docker network (Docker's default bridge included).
  - Reads C(ip -j -4 route) and C(docker network inspect); changes nothing.
version_added: 0.1.0
options:
  networks:
    description: Names of the Docker networks the lab needs.
    type: list
    elements: str
    required: true
  pool:
    description: The range to carve subnets from.
    type: str
    default: 10.213.0.0/16
  prefix:
    description: Prefix length of each subnet.
    type: int
    default: 24
  hosts:
    description: How many host addresses to hand out in each subnet (from the 10th address on).
    type: int
    default: 0
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would change without changing it.
    support: full
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Choose the lab's subnets
  sparkfleet.cluster.lab_subnets:
    networks: [sparkfleet-mgmt, sparkfleet-fabric]
  register: subnets
"""

RETURN = r"""
subnets:
  description: Network name to subnet in CIDR form.
  returned: success
  type: dict
  sample: {sparkfleet-mgmt: 10.213.0.0/24, sparkfleet-fabric: 10.213.1.0/24}
gateways:
  description: Network name to the subnet's first address (the bridge on this machine).
  returned: success
  type: dict
  sample: {sparkfleet-mgmt: 10.213.0.1, sparkfleet-fabric: 10.213.1.1}
addresses:
  description: Network name to the list of O(hosts) host addresses, from the 10th address on.
  returned: success
  type: dict
  sample: {sparkfleet-mgmt: [10.213.0.10, 10.213.0.11], sparkfleet-fabric: [10.213.1.10, 10.213.1.11]}
"""

import ipaddress
import json

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils.subnets import free_subnets, host_addresses


def docker_networks(module, attempts=5):
    """{name: [subnets]} of every Docker network.

    A network removed between the listing and the inspection (another lab being removed at the same time) makes
    `docker network inspect` fail for that one id: the listing is then taken again."""
    for _attempt in range(attempts):
        ids = module.run_command(["docker", "network", "ls", "-q"], check_rc=True)[1].split()
        if not ids:
            return {}
        rc, out, err = module.run_command(["docker", "network", "inspect", *ids])
        if rc == 0:
            return {net["Name"]: [cfg["Subnet"] for cfg in ((net.get("IPAM") or {}).get("Config") or [])
                                  if cfg.get("Subnet")] for net in json.loads(out)}
        lines = err.strip().splitlines()
        if not lines or not all("no such network" in line.lower() for line in lines):
            break
    module.fail_json(msg=f"found `docker network inspect` failing (rc {rc}: {err.strip()}); expected the "
                         "description of every Docker network on this machine; fix: check the Docker engine "
                         "(`docker network ls`) and run the lab playbook again")


def routes(module):
    rc, out, err = module.run_command(["ip", "-j", "-4", "route", "show", "table", "all"])
    if rc != 0:
        module.fail_json(msg=f"found `ip -j -4 route` failing ({err.strip()}); expected the route table; "
                             "fix: install iproute2 on the controller")
    return [r["dst"] for r in json.loads(out or "[]") if r.get("dst") not in (None, "default")
            and r.get("type", "unicast") in ("unicast", "local")]


def main():
    module = AnsibleModule(
        argument_spec=dict(networks=dict(type="list", elements="str", required=True),
                           pool=dict(type="str", default="10.213.0.0/16"),
                           prefix=dict(type="int", default=24),
                           hosts=dict(type="int", default=0)),
        supports_check_mode=True,
    )
    existing = docker_networks(module)
    wanted = module.params["networks"]
    result = {name: existing[name][0] for name in wanted if existing.get(name)}
    missing = [name for name in wanted if name not in result]
    if missing:
        used = routes(module) + [subnet for name, subnets in existing.items() for subnet in subnets]
        try:
            chosen = free_subnets(module.params["pool"], module.params["prefix"], used, len(missing))
        except ValueError as err:
            module.fail_json(msg=str(err))
        result.update(zip(missing, chosen, strict=True))
    try:
        addresses = {name: host_addresses(subnet, module.params["hosts"], first=10) for name, subnet in result.items()}
    except ValueError as err:
        module.fail_json(msg=str(err))
    gateways = {name: str(next(ipaddress.ip_network(subnet).hosts())) for name, subnet in result.items()}
    module.exit_json(changed=False, subnets=result, gateways=gateways, addresses=addresses)


if __name__ == "__main__":
    main()
