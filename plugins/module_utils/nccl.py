# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The per-rank NCCL / Gloo environment from the fabric plan and what discovery found on the node.

Defaults follow docs/field-facts.md §5 per topology; every key can be overridden (a None removes it).
- direct / switch: sockets and VLLM_HOST_IP on the rail-0 fabric interface; the HCAs of the cabled cage
  (both twins with two rails); the GID index pinned when every HCA used has its RoCE v2 IPv4 GID at the same
  index, else left to NCCL with NCCL_IB_ADDR_FAMILY=AF_INET.
- no RoCE device at all (the lab's veth fabric): NCCL over TCP sockets (NCCL_NET=Socket, IB disabled).
- triangle / ring: no fabric address reaches every peer, so sockets and VLLM_HOST_IP use the management
  interface; every cabled HCA; subnet-aware routing, AF_INET, no GID pin; a ring also fixes 4 channels and
  allows cross-NIC traffic.
"""

from __future__ import annotations

import json
from typing import Any

CORE = {
    "NCCL_NET": "IB",
    "NCCL_IB_DISABLE": "0",
    "NCCL_NET_PLUGIN": "none",
    "NCCL_IB_ROCE_VERSION_NUM": "2",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_IB_MERGE_NICS": "0",
    "NCCL_CROSS_NIC": "0",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
SOCKETS = {"NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1", "NCCL_IB_ROCE_VERSION_NUM": None}
MESH = {"NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_ADDR_FAMILY": "AF_INET"}
RING = {"NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "4", "NCCL_CROSS_NIC": "1"}


def rank_env(interfaces: list[dict[str, Any]], hcas: dict[tuple[int, str], str], gid_indexes: dict[str, int],
             topology: str, management: dict[str, str] | None = None,
             overrides: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment of one rank.

    interfaces: this node's part of fabric.plan() (cage, twin, address, netdev).
    hcas: {(cage, twin): RoCE device} found on the node.
    gid_indexes: {RoCE device: index of its RoCE v2 IPv4 GID}.
    management: {'ifname', 'address'} of the management port (needed for triangle and ring).
    """
    env = dict(CORE)
    used = [hcas[(i["cage"], i["twin"])] for i in interfaces if (i["cage"], i["twin"]) in hcas]
    missing = [i for i in interfaces if (i["cage"], i["twin"]) not in hcas]
    if not hcas:  # no RDMA at all (the lab's veth fabric): NCCL and Gloo over TCP sockets
        env.update(SOCKETS)
    elif missing:
        names = ", ".join(f"cage {i['cage']} twin {i['twin'] or '-'}" for i in missing)
        raise ValueError(f"no RoCE device found for {names}; expected one per planned fabric interface")
    if used:
        env["NCCL_IB_HCA"] = ",".join(dict.fromkeys(used))
    if topology in ("direct", "switch"):
        first = next(i for i in interfaces if i["rail"] == 0)
        env.update({"NCCL_SOCKET_IFNAME": first["netdev"], "GLOO_SOCKET_IFNAME": first["netdev"],
                    "TP_SOCKET_IFNAME": first["netdev"], "VLLM_HOST_IP": first["address"]})
        indexes = {gid_indexes[name] for name in used if name in gid_indexes}
        if used and len(indexes) == 1 and all(name in gid_indexes for name in used):
            env["NCCL_IB_GID_INDEX"] = str(indexes.pop())
        elif used:
            env["NCCL_IB_ADDR_FAMILY"] = "AF_INET"
    else:
        if not management or not management.get("ifname") or not management.get("address"):
            raise ValueError(f"a {topology} needs the management interface for sockets: no fabric address reaches "
                             "every peer")
        env.update({"NCCL_SOCKET_IFNAME": management["ifname"], "GLOO_SOCKET_IFNAME": management["ifname"],
                    "TP_SOCKET_IFNAME": management["ifname"], "VLLM_HOST_IP": management["address"]})
        if used:
            env.update(MESH)
        if topology == "ring":
            env.update(RING)
    env = {key: value for key, value in env.items() if value is not None}
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return dict(sorted(env.items()))


def parse_nccl_tests(text: str) -> dict[str, Any]:
    """nccl-tests' *_perf output -> {rows: [{size, count, type, time_us, algbw, busbw, in_place: {...}}],
    avg_busbw} (GB/s; both the current format with a root column and the older one)."""
    columns: list[str] = []
    rows = []
    avg = None
    for line in text.splitlines():
        stripped = line.strip().lstrip("#").strip()
        if stripped.startswith("size") and "busbw" in stripped:
            columns = stripped.split()
            continue
        if stripped.startswith("Avg bus bandwidth"):
            avg = float(stripped.split(":")[1])
            continue
        if line.lstrip().startswith("#") or not columns:
            continue
        fields = line.split()
        if len(fields) != len(columns) or not fields[0].isdigit():
            continue
        half = columns.index("time", columns.index("time") + 1)  # the in-place block starts at the second 'time'
        out_place = dict(zip(columns[:half], fields[:half], strict=True))
        in_place = dict(zip(columns[half:], fields[half:], strict=True))
        rows.append({"size": int(out_place["size"]), "count": int(out_place["count"]), "type": out_place["type"],
                     "time_us": float(out_place["time"]), "algbw": float(out_place["algbw"]),
                     "busbw": float(out_place["busbw"]),
                     "in_place": {"time_us": float(in_place["time"]), "algbw": float(in_place["algbw"]),
                                  "busbw": float(in_place["busbw"])}})
    return {"rows": rows, "avg_busbw": avg}


PROBE_PREFIX = "SPARKFLEET_NCCL_PROBE "


def parse_probe(text: str) -> dict[str, Any]:
    """The probe's JSON line (rank 0 prints 'SPARKFLEET_NCCL_PROBE {...}'); ValueError naming what was found."""
    lines = [line[len(PROBE_PREFIX):] for line in text.splitlines() if line.startswith(PROBE_PREFIX)]
    if not lines:
        tail = " | ".join(text.strip().splitlines()[-3:]) or "no output"
        raise ValueError(f"found no '{PROBE_PREFIX.strip()}' line in the probe's output ({tail})")
    result = json.loads(lines[-1])
    for key in ("latency_us", "bus_bandwidth_gbs", "world_size"):
        if key not in result:
            raise ValueError(f"found the probe's result without {key!r}: {sorted(result)}")
    return result


def probe_skip_reason(nodes: list[dict[str, Any]], setting: str, image: str, record: str, check_mode: bool) -> str:
    """Why the all-reduce probe does not run on this cluster, the same answer on every node; '' when it runs.

    nodes: one mapping per node - wanted (the node may probe: nccl_probe true, or auto on an NVIDIA GPU outside a
    container), serving
    (the vLLM unit is active), image (the probe's image is on the node), env_changed (this run rewrote the rank's
    NCCL environment), passed_before (a record of a passing probe exists).
    setting: nccl_probe (auto, true or false). The first reason that holds is given, in this order: a node that
    cannot probe, check mode, a serving engine, the image missing (auto), nothing changed since a pass (auto)."""
    if not nodes or not all(node.get("wanted") for node in nodes):
        return ("no NVIDIA GPU outside a container on every node (the lab runs vLLM on CPU over Gloo), or "
                "nccl_probe is false")
    if check_mode:
        return "not in --check"
    if any(node.get("serving") for node in nodes):
        return ("the vLLM unit is serving: a second CUDA process on unified memory can hang a node; stop the serve "
                "stage's unit (systemctl stop sparkfleet-vllm) to probe")
    if str(setting) == "auto" and not all(node.get("image") for node in nodes):
        return (f"the serving image {image} is not on every node yet; the image stage probes once it has shipped "
                "it")
    if str(setting) == "auto" and not any(node.get("env_changed") for node in nodes) and \
            all(node.get("passed_before") for node in nodes):
        return f"passed before ({record}) and no rank's environment changed; nccl_probe: true probes anyway"
    return ""
