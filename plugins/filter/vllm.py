# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""vLLM's command line from a mapping of flags (``args | sparkfleet.cluster.vllm_cli_args``), and where a rank runs.

Each filter is documented in the .yml file of its name beside this one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


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


def rank_runtime(setting: str, node: Mapping[str, Any] | None) -> str:
    """The serve stage's rule: a rank runs in Docker (the patched image) on an NVIDIA node, natively elsewhere,
    unless vllm_service_runtime says which."""
    if str(setting) in ("docker", "native"):
        return str(setting)
    accelerator = (node or {}).get("accelerator") or {}
    return "docker" if accelerator.get("kind") == "nvidia" else "native"


def docker_ranks(hosts: list[str], hostvars: Mapping[str, Any]) -> list[str]:
    """The hosts whose rank runs in Docker, by each host's vllm_service_runtime and discovered accelerator."""
    found = []
    for host in hosts:
        values = hostvars[host]
        if rank_runtime(values.get("vllm_service_runtime", "auto"), values.get("sparkfleet_node")) == "docker":
            found.append(host)
    return found


def group_members(hosts: list[str], hostvars: Mapping[str, Any], port: int) -> list[dict[str, Any]]:
    """The group supervisor's members in rank order: host, the address its agent answers on (the rendezvous
    address, sparkfleet_fabric_address, which every topology makes reachable from every rank) and the port."""
    members = []
    for host in hosts:
        values = hostvars[host]
        rank = int(values.get("sparkfleet_node_rank", -1))
        address = values.get("sparkfleet_fabric_address")
        if rank < 0 or not address:
            raise AnsibleFilterError(f"{host}: sparkfleet_node_rank or sparkfleet_fabric_address is missing; "
                                     "expected both for every rank; fix: set them in the inventory")
        members.append({"rank": rank, "host": str(host), "address": str(address), "port": int(port)})
    members.sort(key=lambda member: member["rank"])
    if [m["rank"] for m in members] != list(range(len(members))):
        raise AnsibleFilterError(f"found ranks {[m['rank'] for m in members]}; expected 0..{len(members) - 1}; "
                                 "fix: number the nodes' sparkfleet_node_rank from 0")
    return members


class FilterModule:
    def filters(self):
        return {"vllm_cli_args": vllm_cli_args, "rank_runtime": rank_runtime, "docker_ranks": docker_ranks,
                "group_members": group_members}
