# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Filters that render the cluster plan for people."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _gib(kib: int) -> str:
    return f"{kib / 1024 / 1024:.1f} GiB"


def plan_lines(plan: Mapping[str, Any], hostvars: Mapping[str, Any]) -> list[str]:
    """The plan returned by cluster_validate, one line per node, with what node_facts found on each."""
    profile = plan["profile"]
    lines = [
        f"profile {profile['name']}: {profile['description']}",
        f"tensor parallel {plan['sparkfleet_tensor_parallel_size']} over {len(plan['nodes'])} node(s); "
        f"served as {profile['served_model_name']}, max_model_len {profile['max_model_len']}",
    ]
    for node in plan["nodes"]:
        host = hostvars[node["host"]]
        facts = host.get("sparkfleet_node") or {}
        accelerator = facts.get("accelerator") or {}
        rdma = facts.get("rdma") or {}
        described = [
            f"rank {node['rank']} {node['role']:<6} {node['host']}",
            f"mgmt {host.get('ansible_host', node['host'])}",
            f"rendezvous {node['fabric_address']}",
        ]
        if facts:
            described += [
                facts.get("architecture", "?"),
                f"{_gib(facts['memory']['total_kib'])} memory ({_gib(facts['memory']['available_kib'])} available)",
                "GPU " + (", ".join(d["model"] for d in accelerator.get("devices", [])) or "none"),
                "RDMA " + (", ".join(d["name"] for d in rdma.get("devices", [])) or "none"),
            ]
            if facts.get("container"):
                described.append(f"in a {facts['container']} container")
        lines.append(" | ".join(described))
    return lines


class FilterModule:
    def filters(self):
        return {"plan_lines": plan_lines}
