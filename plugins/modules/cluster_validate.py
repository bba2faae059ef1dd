#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Documentation of the cluster_validate action; the work is done on the controller in plugins/action."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cluster_validate
short_description: Check a sparkfleet inventory across all its hosts and return the cluster plan
description:
  - Runs on the controller only and contacts no host, so a bad inventory fails before anything is changed.
  - Checks every variable with a sparkfleet prefix against the roles' C(meta/argument_specs.yml) (unknown
    or mistyped keys, types, required keys), keys that must hold one value for the whole cluster, unique
    node ranks 0..N-1, unique fabric addresses, exactly one head holding rank 0, and one node per
    tensor-parallel rank of a size the model profile supports.
  - On failure, C(msg) holds one line per problem, naming the host or group, the key, what was found, what was
    expected and the fix.
version_added: 0.1.0
options: {}
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would change without changing it.
    support: full
  action:
    description: Runs on the controller, through the action plugin of the same name.
    support: full
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Validate the inventory
  sparkfleet.cluster.cluster_validate:
  run_once: true
"""

RETURN = r"""
plan:
  description: The cluster plan; the validated cluster-wide keys, the nodes by rank, and the profile.
  returned: success
  type: dict
  sample:
    sparkfleet_model_profile: tiny-cpu
    sparkfleet_tensor_parallel_size: 2
    nodes:
      - {host: node0, rank: 0, role: head, fabric_address: 10.60.1.10}
      - {host: node1, rank: 1, role: worker, fabric_address: 10.60.1.11}
"""
