# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The tensor-parallel padding of a profile alone: ``profile | sparkfleet.cluster.tp_layout(tp)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkfleet.cluster.plugins.module_utils import tp_padding

DOCUMENTATION = r"""
---
name: tp_layout
short_description: How a model profile's split dimensions land on the ranks, padded where the profile allows it
description:
  - The same layout as the capacity plan's C(tp_padding) (C(sparkfleet.cluster.kv_plan)), for a role that needs
    the padding but not a KV plan (the weights stage run on its own, with a profile that has no C(capacity)).
  - A profile without a C(tensor_parallel) section pads nothing.
  - See C(docs/tp-padding.md).
version_added: 0.9.0
options:
  _input:
    description: A model profile (the C(sparkfleet.cluster.model_profile) lookup).
    type: dict
    required: true
  tensor_parallel_size:
    description: Ranks the model is split over.
    type: int
    required: true
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Show whether TP3 pads the profile
  ansible.builtin.debug:
    msg: "{{ (profile | sparkfleet.cluster.tp_layout(3)).padded }}"
"""

RETURN = r"""
_value:
  description: C(padded), C(dimensions), C(vocab), C(env), C(problems), C(config_sections), C(hf_overrides).
  type: dict
"""


def tp_layout(profile: Mapping[str, Any], tensor_parallel_size: int) -> dict[str, Any]:
    try:
        return tp_padding.layout(profile, int(tensor_parallel_size))
    except tp_padding.PaddingError as err:
        raise AnsibleFilterError(f"tp_layout: profile {profile.get('name')!r}: {err}") from err


class FilterModule:
    def filters(self):
        return {"tp_layout": tp_layout}
