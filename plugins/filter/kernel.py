# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Kernel log lines that matter: ``lines | sparkfleet.cluster.xid_errors(ignored)``."""

from __future__ import annotations

from ansible_collections.sparkfleet.cluster.plugins.module_utils.gpu import xid_errors

DOCUMENTATION = r"""
---
name: xid_errors
short_description: The NVIDIA Xid error lines of a kernel log, less the benign codes
description:
  - "Picks the kernel's NVIDIA Xid lines (C(NVRM: Xid (PCI:...): <code>, ...)) and drops those whose code is in
    O(ignored) (codes in decimal, C(81), or hexadecimal, C(0x51))."
version_added: 0.2.0
options:
  _input:
    description: Kernel log lines.
    type: list
    elements: str
    required: true
  ignored:
    description: Benign Xid codes.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Xid errors of this boot
  ansible.builtin.debug:
    msg: "{{ kernel_lines | sparkfleet.cluster.xid_errors(['0x51']) }}"
"""

RETURN = r"""
_value:
  description: The Xid lines that are errors.
  type: list
  elements: str
"""


class FilterModule:
    def filters(self):
        return {"xid_errors": xid_errors}
