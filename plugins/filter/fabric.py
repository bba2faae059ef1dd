# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The fabric for plays (each filter is documented in its own ``<name>.yml`` beside this file).

- ``setting | sparkfleet.cluster.fabric_topology(node_count)``: the topology, ``auto`` resolved by node count.
- ``nodes | sparkfleet.cluster.fabric_plan(topology, ...)``: every node's fabric interfaces.
- ``nodes | sparkfleet.cluster.fabric_plan_problem(...)``: the line fabric_plan would fail with, or ''.
- ``node | sparkfleet.cluster.fabric_plan_line(sparkfleet_fabric_plan)``: one line of the preflight's plan.
- ``plan | sparkfleet.cluster.fabric_hosts(node)``: the node's /etc/hosts lines for its and its peers' fabric
  addresses.
- ``interfaces | sparkfleet.cluster.fabric_netplan(renderer)``: the netplan document for those interfaces.
- ``plan | sparkfleet.cluster.fabric_nftables(node, cluster_sources, service_ports, api_port, api_sources)``:
  the node's nftables table (module_utils/fabric.py nft_ruleset says what it accepts).
- ``plan | sparkfleet.cluster.fabric_problems(others, live, rendezvous, topology)``: duplicate addresses, fabric
  subnets overlapping a node's other networks, MTUs that differ between the ends of a cable, and (triangle,
  ring) a rendezvous address inside the fabric; one line each.
- ``interfaces | sparkfleet.cluster.nccl_rank_env(roce, gid_indexes, topology, management, overrides)``: the
  rank's NCCL / Gloo environment (module_utils/nccl.py).
- ``stdout | sparkfleet.cluster.nccl_probe``: the NCCL probe's result from rank 0's output.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.sparkfleet.cluster.plugins.module_utils import fabric, nccl


def _fail(err: Exception):
    raise AnsibleFilterError(str(err)) from err


def fabric_plan(nodes: list[str], topology: str, rails: int = 1, supernet: str = "10.100.0.0/16", cage: int = 1,
                mtu: int = 9000, pinned: dict[str, str] | None = None, prefix: int = 24,
                subnets: list[str] | None = None) -> dict[str, Any]:
    try:
        return fabric.plan(list(nodes), topology, int(rails), supernet, int(cage), int(mtu),
                           {k: str(v) for k, v in (pinned or {}).items()} or None, int(prefix),
                           [str(s) for s in subnets or []] or None)
    except (fabric.FabricError, ValueError) as err:
        _fail(err)


def fabric_plan_problem(nodes: list[str], **kwargs: Any) -> str:
    """The one line fabric_plan would fail with, or '' when the plan can be made (for an assert's message)."""
    try:
        fabric_plan(nodes, **kwargs)
    except AnsibleFilterError as err:
        return str(err)
    return ""


def fabric_plan_line(node: str, fabric_plan: dict[str, Any]) -> str:
    """'  node0: enp1s0f1np1 10.100.0.1/24 MTU 9000 -> node1 10.100.0.2' for the preflight's plan."""
    parts = [f"{i['netdev']} {i['address']}/{i['prefix']} MTU {i['mtu']} -> "
             + ", ".join(f"{p['node']} {p['address']}" for p in i["peers"])
             for i in fabric_plan["interfaces"].get(node, [])]
    return f"  {node}: " + "; ".join(parts)


def fabric_hosts(plan: dict[str, Any], node: str) -> list[str]:
    return fabric.hosts_entries(plan, node)


def fabric_netplan(interfaces: list[dict[str, Any]], renderer: str = "networkd") -> dict[str, Any]:
    try:
        return fabric.netplan_config(interfaces, renderer)
    except fabric.FabricError as err:
        _fail(err)


def fabric_nftables(plan: dict[str, Any], node: str, cluster_sources: list[str], service_ports: list[int],
                    api_port: int | None = None, api_sources: list[str] | None = None,
                    watch_ports: list[int] | None = None, watch_sources: list[str] | None = None,
                    state_port: int | None = None, router_sources: list[str] | None = None) -> str:
    interfaces = plan.get(node, [])
    try:
        return fabric.nft_ruleset(sorted({i["netdev"] for i in interfaces}),
                                  sorted({i["subnet"] for ifaces in plan.values() for i in ifaces}),
                                  [str(s) for s in cluster_sources], [int(p) for p in service_ports],
                                  int(api_port) if api_port else None, [str(s) for s in api_sources or []],
                                  [int(p) for p in watch_ports or []], [str(s) for s in watch_sources or []],
                                  int(state_port) if state_port else None, [str(s) for s in router_sources or []])
    except ValueError as err:
        _fail(ValueError(f"fabric firewall: {err}; expected IPv4 addresses or networks in "
                         "sparkfleet_api_allowed_sources, sparkfleet_monitoring_allowed_sources and "
                         "sparkfleet_router_addresses; fix: correct the list"))


def fabric_problems(plan: dict[str, Any], others: dict[str, list[str]] | None = None,
                    live: dict[str, Any] | None = None, rendezvous: dict[str, str] | None = None,
                    topology: str = "") -> list[str]:
    problems = fabric.duplicates(plan) + fabric.overlaps(plan, others or {})
    problems += fabric.rendezvous_inside(plan, rendezvous or {}, topology)
    for node, interfaces in sorted(plan.items()):
        problems += fabric.mtu_mismatches(node, interfaces, live or {}) if live else []
    return problems


def nccl_rank_env(interfaces: list[dict[str, Any]], roce: list[dict[str, Any]], gid_indexes: dict[str, int],
                  topology: str, management: dict[str, str] | None = None,
                  overrides: dict[str, Any] | None = None) -> dict[str, str]:
    hcas = {(device["cage"], device["twin"]): device["name"] for device in roce or [] if device.get("cage") is not None}
    try:
        return nccl.rank_env(list(interfaces), hcas, {k: int(v) for k, v in (gid_indexes or {}).items()}, topology,
                             management, overrides)
    except ValueError as err:
        _fail(ValueError(f"nccl: {err}; fix: run the fabric stage and check its discovery output"))


def nccl_probe(stdout: str) -> dict[str, Any]:
    try:
        return nccl.parse_probe(stdout or "")
    except ValueError as err:
        _fail(ValueError(f"nccl probe: {err}; expected rank 0's result line; fix: read the probe's output above "
                         "(a rank that could not reach the head's rendezvous address times out)"))


def ipv4_of(name: Any) -> str:
    """An IPv4 address as it is, a name as the controller resolves it (getaddrinfo, as Ansible's SSH does); ''
    for a name that does not resolve, or resolves to loopback (no use as a firewall's source)."""
    text = str(name or "")
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(text, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ""
    addresses = [info[4][0] for info in infos if not ipaddress.IPv4Address(info[4][0]).is_loopback]
    return addresses[0] if addresses else ""


def fabric_topology(setting: str | None, size: int) -> str:
    return fabric.resolved_topology(setting, int(size))


def nccl_probe_skip(nodes: list[dict[str, Any]], setting: str, image: str, record: str,
                    check_mode: bool = False) -> str:
    return nccl.probe_skip_reason([dict(node or {}) for node in nodes], setting, image, record, bool(check_mode))


class FilterModule:
    def filters(self):
        return {"fabric_topology": fabric_topology, "fabric_plan": fabric_plan,
                "fabric_plan_problem": fabric_plan_problem,
                "fabric_plan_line": fabric_plan_line, "fabric_hosts": fabric_hosts,
                "fabric_netplan": fabric_netplan, "fabric_nftables": fabric_nftables,
                "fabric_problems": fabric_problems, "nccl_rank_env": nccl_rank_env, "nccl_probe": nccl_probe,
                "nccl_probe_skip": nccl_probe_skip, "ipv4_of": ipv4_of}
