# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The capacity planner for templates and plays: ``profile | sparkfleet.cluster.kv_plan(tp, ...)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkfleet.cluster.plugins.module_utils import errors, kv_capacity
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import trace

DOCUMENTATION = r"""
---
name: kv_plan
short_description: Plan the KV-cache pool of one tensor-parallel rank from a model profile
description:
  - Bytes per token per rank, the expected pool in tokens, the concurrency at max_model_len and the lanes
    (sessions of 200K, 500K and 1M tokens that fit), from the profile's C(capacity) figures and its vLLM
    arguments with O(vllm_args) on top.
  - The result's C(problems) lists, one line each, why the plan cannot work (a pin larger than the node
    holds after weights and a safety floor, max_model_len above the model's limit); C(lines) is the plan
    for people.
version_added: 0.2.0
options:
  _input:
    description: A model profile (the C(sparkfleet.cluster.model_profile) lookup).
    type: dict
    required: true
  tensor_parallel_size:
    description: Ranks the model is split over.
    type: int
    required: true
  vllm_args:
    description: vLLM arguments over the profile's (a null value removes one).
    type: dict
    default: {}
  node_memory_bytes:
    description: Memory of the smallest node; the profile's C(capacity.memory.node_memory_bytes) when omitted.
    type: int
"""

EXAMPLES = r"""
- name: Plan the pool
  ansible.builtin.debug:
    msg: "{{ (profile | sparkfleet.cluster.kv_plan(2)).pool_tokens }}"
"""

RETURN = r"""
_value:
  description: The plan (pool_tokens, kv_bytes_per_token, max_concurrency, lanes, problems, lines, ...).
  type: dict
"""


def kv_plan(profile: Mapping[str, Any], tensor_parallel_size: int, vllm_args: Mapping[str, Any] | None = None,
            node_memory_bytes: int | None = None) -> dict[str, Any]:
    trace.event("plan", str(profile.get("name")))
    try:
        result = kv_capacity.plan(profile, int(tensor_parallel_size), vllm_args or {}, node_memory_bytes)
    except kv_capacity.PlanError as err:
        raise AnsibleFilterError(f"kv_plan: profile {profile.get('name')!r}: {err}") from err
    except (KeyError, TypeError, ValueError) as err:
        raise AnsibleFilterError(
            f"kv_plan: profile {profile.get('name')!r}: found capacity figures that do not fit ({type(err).__name__}: "
            f"{err}); expected capacity.block_size, capacity.token_layers.<kind>.layers and bytes_per_token, and "
            "numbers where numbers belong (see profiles/tiny-cpu.yml); fix: correct the profile's capacity section"
        ) from err
    result["problems"] = [errors.line(found, expected, fix, f"sparkfleet_vllm_args: {key}", "sparkfleet_cluster")
                          for key, found, expected, fix in kv_capacity.problems(result, profile)]
    result["lines"] = kv_capacity.lines(result)
    return result


class FilterModule:
    def filters(self):
        return {"kv_plan": kv_plan}
