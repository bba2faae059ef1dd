# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""What a node has: read from /proc, /sys and /etc, never assumed.

Every reader takes the filesystem root so tests can point it at a tree shaped like a real node
(a GB10 with its ConnectX-7 devices, or a lab container with neither).
"""

from __future__ import annotations

import os
import platform
import re
from typing import Any


def read_text(root: str, path: str) -> str | None:
    """A file below root, or None where it cannot be read."""
    try:
        with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def list_dir(root: str, path: str) -> list[str]:
    """A directory's entries below root, sorted; [] where there is none."""
    try:
        return sorted(os.listdir(os.path.join(root, path.lstrip("/"))))
    except OSError:
        return []


def meminfo(root: str = "/") -> dict[str, int]:
    """/proc/meminfo as {field: kB}."""
    fields = {}
    for line in (read_text(root, "/proc/meminfo") or "").splitlines():
        match = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)", line)
        if match:
            fields[match.group(1)] = int(match.group(2))
    return fields


def os_release(root: str = "/") -> dict[str, str]:
    values = {}
    for line in (read_text(root, "/etc/os-release") or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    return values


def nvidia_gpus(root: str = "/") -> list[dict[str, str]]:
    """GPUs the NVIDIA kernel driver has bound (/proc/driver/nvidia/gpus/<bus id>/information)."""
    gpus = []
    for bus_id in list_dir(root, "/proc/driver/nvidia/gpus"):
        info = read_text(root, f"/proc/driver/nvidia/gpus/{bus_id}/information") or ""
        model = re.search(r"^Model:\s*(.+)$", info, re.M)
        gpus.append({"bus_id": bus_id, "model": model.group(1).strip() if model else "unknown"})
    return gpus


def rdma_devices(root: str = "/") -> list[dict[str, Any]]:
    """RDMA devices (/sys/class/infiniband) with the netdevs of their PCI function."""
    devices = []
    for name in list_dir(root, "/sys/class/infiniband"):
        base = f"/sys/class/infiniband/{name}"
        devices.append({
            "name": name,
            "netdevs": list_dir(root, f"{base}/device/net"),
            "ports": list_dir(root, f"{base}/ports"),
        })
    return devices


def container_kind(root: str = "/") -> str | None:
    """The container manager systemd reports; else docker by its marker file, but only where the kernel's
    settings are mounted read-only as Docker does (a VM built from a container image keeps a stale
    /.dockerenv and owns its kernel); None on bare metal or a VM."""
    kind = (read_text(root, "/run/systemd/container") or "").strip()
    if kind:
        return kind
    if os.path.exists(os.path.join(root, ".dockerenv")) and _proc_sys_read_only(root):
        return "docker"
    return None


def _proc_sys_read_only(root: str) -> bool:
    for line in (read_text(root, "/proc/mounts") or "").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "/proc/sys":
            return "ro" in fields[3].split(",")
    return False


def init_system(root: str = "/") -> str:
    """'systemd' when systemd runs the node (its sd_booted test: /run/systemd/system exists), else PID 1's name."""
    if os.path.isdir(os.path.join(root, "run/systemd/system")):
        return "systemd"
    return (read_text(root, "/proc/1/comm") or "unknown").strip() or "unknown"


def node_facts(root: str = "/") -> dict[str, Any]:
    memory = meminfo(root)
    release = os_release(root)
    gpus = nvidia_gpus(root)
    rdma = rdma_devices(root)
    return {
        "architecture": platform.machine() if root == "/" else "unknown",
        "os": {"id": release.get("ID", "unknown"), "version_id": release.get("VERSION_ID", "unknown"),
               "pretty_name": release.get("PRETTY_NAME", "unknown")},
        "memory": {"total_kib": memory.get("MemTotal", 0), "available_kib": memory.get("MemAvailable", 0),
                   "swap_total_kib": memory.get("SwapTotal", 0)},
        "accelerator": {"kind": "nvidia" if gpus else "none", "count": len(gpus), "devices": gpus},
        "rdma": {"present": bool(rdma), "devices": rdma},
        "container": container_kind(root),
        "init": init_system(root),
    }
