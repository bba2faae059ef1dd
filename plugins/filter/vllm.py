# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""vLLM's command line from a mapping of flags: ``args | sparkfleet.cluster.vllm_cli_args``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
---
name: vllm_cli_args
short_description: Render a mapping of vLLM flags as an argument list
description:
  - Keys are flag names without the leading dashes (C(max-model-len)). C(true) gives C(--flag), C(false) gives
    C(--no-flag) (vLLM's boolean flags take both forms), a list gives the flag followed by each item, a mapping
    gives the flag followed by its JSON (C(--speculative-config), C(--hf-overrides)), C(null) leaves the flag out.
  - Keys are rendered in sorted order, so the same mapping always gives the same command line.
version_added: 0.2.0
options:
  _input:
    description: Flag name to value.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Show the command line
  ansible.builtin.debug:
    msg: "{{ {'max-model-len': 512, 'enforce-eager': true} | sparkfleet.cluster.vllm_cli_args }}"
"""

RETURN = r"""
_value:
  description: The arguments, e.g. C(["--enforce-eager", "--max-model-len", "512"]).
  type: list
  elements: str
"""


def vllm_cli_args(args: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for key in sorted(args):
        value = args[key]
        name = str(key)
        if name.startswith("-") or not name or " " in name:
            raise AnsibleFilterError(f"vllm_cli_args: found the flag name {name!r}; expected a name without "
                                     "dashes in front, such as max-model-len; fix: write it as in vLLM's --help "
                                     "without the leading --")
        if value is None:
            continue
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            argv.append(f"--no-{name}")
        elif isinstance(value, Mapping):
            argv += [f"--{name}", json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            argv += [f"--{name}", *[str(item) for item in value]]
        else:
            argv += [f"--{name}", str(value)]
    return argv


class FilterModule:
    def filters(self):
        return {"vllm_cli_args": vllm_cli_args}
