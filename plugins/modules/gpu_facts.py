#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""What nvidia-smi says about the node's GPUs."""

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Read the node's NVIDIA GPUs through nvidia-smi
version_added: 0.3.0
description:
  - Runs C(nvidia-smi --query-gpu=... --format=csv) and publishes every GPU's fields by name (units dropped;
    C([N/A]) and C([Not Supported]), as GB10 reports its unified memory, become null), with the driver version
    and its branch.
  - Where nvidia-smi is missing the node has no NVIDIA GPU as far as sparkfleet is concerned - C(present) is
    false and nothing fails.
options:
  nvidia_smi:
    description: The nvidia-smi program.
    type: str
    default: nvidia-smi
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
- name: Read the GPUs
  sparkfleet.cluster.gpu_facts:

- name: Show the driver branch
  ansible.builtin.debug:
    msg: "{{ sparkfleet_gpu.driver_branch }}"
  when: sparkfleet_gpu.present
"""

RETURN = r"""
ansible_facts:
  description: Facts published for the node.
  returned: always
  type: dict
  contains:
    sparkfleet_gpu:
      description: The GPUs.
      type: dict
      returned: always
      sample:
        present: true
        driver_version: 580.159.03
        driver_branch: 580
        gpus:
          - {index: 0, name: NVIDIA GB10, persistence_mode: Enabled, clocks.current.sm: 2418, memory.total: null}
"""

import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils.gpu import driver_branch, query


def main():
    module = AnsibleModule(argument_spec={"nvidia_smi": {"type": "str", "default": "nvidia-smi"}},
                           supports_check_mode=True)
    smi = shutil.which(module.params["nvidia_smi"])
    facts = {"present": False, "driver_version": None, "driver_branch": None, "gpus": []}
    if smi:
        try:
            gpus = query(smi=smi)
        except (RuntimeError, ValueError, OSError) as err:
            module.fail_json(msg=f"nvidia-smi is installed but could not read the GPUs: {err}. Expected a loaded "
                                 "NVIDIA driver; check `nvidia-smi` and `dmesg | grep NVRM` on the node")
        version = gpus[0]["driver_version"] if gpus else None
        facts = {"present": bool(gpus), "driver_version": version, "driver_branch": driver_branch(version),
                 "gpus": gpus}
    module.exit_json(changed=False, ansible_facts={"sparkfleet_gpu": facts})


if __name__ == "__main__":
    main()
