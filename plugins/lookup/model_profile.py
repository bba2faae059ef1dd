# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Read a model profile by name, from the user's profile directories first, then the collection's."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: model_profile
short_description: A sparkfleet model profile by name
description:
  - Returns the profile C(<name>.yml) from the first of O(paths) that has it, else from the collection's
    C(profiles/), checked for the keys every profile needs (the same loader the preflight uses).
version_added: 0.1.0
options:
  _terms:
    description: The profile name.
    required: true
    type: list
    elements: str
  paths:
    description: Extra profile directories; relative ones are taken from O(base).
    type: list
    elements: str
    default: []
  base:
    description: Directory relative paths start from (the inventory's directory).
    type: str
    default: ""
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Load the cluster's profile
  ansible.builtin.set_fact:
    profile: "{{ lookup('sparkfleet.cluster.model_profile', sparkfleet_model_profile,
                        paths=sparkfleet_profile_paths, base=inventory_dir) }}"
"""

RETURN = r"""
_raw:
  description: The profile mapping.
  type: list
  elements: dict
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import profiles


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        base = self.get_option("base") or os.getcwd()
        dirs = [os.path.join(base, os.path.expanduser(d)) for d in self.get_option("paths") or []]
        found = []
        for name in terms:
            try:
                found.append(profiles.load(name, [*dirs, profiles.collection_profile_dir()]))
            except profiles.ProfileError as err:
                raise AnsibleLookupError(f"sparkfleet_model_profile: {err}") from err
        return found
