# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""What a node's sparkfleet collector publishes for node_exporter's textfile collector, built from plain inputs.

The collector (roles/monitoring/files/sparkfleet-node-metrics) runs as root on a timer and hands this module what it
read: nvidia-smi's query, the kernel's Xid lines of this boot, each zram device's mm_stat and disksize, and the
NCCL probe's last record. Everything here is pure, so the unit tests feed it real output.

GB10 reports its unified memory as "[N/A]": a figure nvidia-smi does not give is left out, never published as 0
(memory on GB10 comes from node_exporter's MemAvailable).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils import gpu
from ansible_collections.sparkfleet.cluster.plugins.module_utils.prometheus_text import Textfile

# The nvidia-smi fields the collector asks for.
GPU_FIELDS = ("index", "uuid", "power.draw", "clocks.current.sm", "temperature.gpu", "utilization.gpu",
              "memory.used", "memory.total")

# nvidia-smi field -> (metric, help, factor to the base unit).
GPU_GAUGES = (
    ("power.draw", "sparkfleet_gpu_power_watts", "Board power draw (nvidia-smi power.draw)", 1.0),
    ("clocks.current.sm", "sparkfleet_gpu_sm_clock_hertz", "Current SM clock", 1e6),
    ("temperature.gpu", "sparkfleet_gpu_temperature_celsius", "GPU temperature", 1.0),
    ("utilization.gpu", "sparkfleet_gpu_utilization_ratio",
     "Share of time a kernel ran (0-1); high at low power is a spin-wait, not work", 0.01),
    ("memory.used", "sparkfleet_gpu_memory_used_bytes", "GPU memory in use (absent where the GPU reports none)",
     2.0**20),
    ("memory.total", "sparkfleet_gpu_memory_total_bytes", "GPU memory (absent where the GPU reports none)", 2.0**20),
)

# /sys/block/zramN/mm_stat's first columns (the kernel's Documentation/admin-guide/blockdev/zram.rst).
MM_STAT = ("orig_data_size", "compr_data_size", "mem_used_total", "mem_limit", "mem_used_max", "same_pages",
           "pages_compacted", "huge_pages")
ZRAM_GAUGES = (
    ("orig_data_size", "sparkfleet_zram_original_bytes", "Data stored in zram before compression"),
    ("compr_data_size", "sparkfleet_zram_compressed_bytes", "Data stored in zram after compression"),
    ("mem_used_total", "sparkfleet_zram_memory_used_bytes", "Memory zram uses, with its overhead"),
)


def gpu_samples(out: Textfile, query_text: str | None, error: str | None = None) -> None:
    """nvidia-smi's CSV (with its header) -> per-GPU gauges; a failed query is published as such."""
    if query_text is None:
        out.add("sparkfleet_gpu_query_ok", "1 when nvidia-smi answered the collector's last query", 0)
        return
    try:
        gpus = gpu.parse_query(query_text)
    except ValueError:
        gpus, error = [], "unparsable"
    out.add("sparkfleet_gpu_query_ok", "1 when nvidia-smi answered the collector's last query", int(error is None))
    for row in gpus:
        labels = {"gpu": row.get("index"), "uuid": row.get("uuid") or ""}
        for field, name, help_text, factor in GPU_GAUGES:
            value = row.get(field)
            if isinstance(value, int | float):
                out.add(name, help_text, value * factor, labels)


def xid_counts(lines: Iterable[str]) -> Counter:
    """Xid events of this boot by code (the kernel's NVRM lines)."""
    return Counter(str(xid["code"]) for xid in map(gpu.parse_xid, lines) if xid is not None)


def merge_counts(seen: Mapping[str, Any] | None, now: Mapping[str, int]) -> Counter:
    """The larger count of each code: within a boot the kernel's Xid count only grows, even when journald's vacuum
    or a wrapped ring buffer forgets old lines (a count that fell would read as a counter reset and a new event)."""
    merged = Counter({str(code): int(count) for code, count in (seen or {}).items()
                      if isinstance(count, int) and count >= 0})
    for code, count in now.items():
        merged[code] = max(merged[code], count)
    return merged


def xid_samples(out: Textfile, counts: Mapping[str, int] | None) -> None:
    """A counter per code, and code="any" for all of them (0 on a clean boot, so that increase() sees the first).
    counts None: the kernel log could not be read; the counters are left out, not published as 0."""
    out.add("sparkfleet_gpu_kernel_log_ok", "1 when the collector could read this boot's kernel log",
            int(counts is not None))
    if counts is None:
        return
    help_text = "NVIDIA Xid events in the kernel log since boot, by code"
    out.add("sparkfleet_gpu_xid_events_total", help_text, sum(counts.values()), {"code": "any"}, kind="counter")
    for code, count in sorted(counts.items()):
        out.add("sparkfleet_gpu_xid_events_total", help_text, count, {"code": code}, kind="counter")


def parse_mm_stat(text: str) -> dict[str, int]:
    """One mm_stat line -> {column: value}; ValueError when it does not hold the columns every kernel has."""
    values = text.split()
    if len(values) < 5 or not all(re.fullmatch(r"\d+", value) for value in values):
        raise ValueError(f"found mm_stat {text.strip()!r}; expected at least 5 integer columns")
    return dict(zip(MM_STAT, (int(value) for value in values), strict=False))


def zram_samples(out: Textfile, devices: Mapping[str, Mapping[str, str]]) -> None:
    """devices: name -> {'disksize': text, 'mm_stat': text}; an unreadable device is skipped."""
    for device, files in sorted(devices.items()):
        try:
            stats = parse_mm_stat(files.get("mm_stat", ""))
        except ValueError:
            continue
        labels = {"device": device}
        disksize = (files.get("disksize") or "").strip()
        if disksize.isdigit():
            out.add("sparkfleet_zram_disksize_bytes", "Size of the zram device", int(disksize), labels)
        for column, name, help_text in ZRAM_GAUGES:
            out.add(name, help_text, stats[column], labels)


def nccl_samples(out: Textfile, record: Mapping[str, Any] | None) -> None:
    """The NCCL all-reduce probe's last record (written by the nccl role, pass or fail) -> its figures."""
    if not record:
        return
    out.add("sparkfleet_nccl_probe_bus_bandwidth_gbytes_per_second",
            "Bus bandwidth of the last NCCL all-reduce probe", record.get("bus_bandwidth_gbs"))
    out.add("sparkfleet_nccl_probe_floor_gbytes_per_second", "The bus bandwidth the probe must reach",
            record.get("floor_gbs"))
    out.add("sparkfleet_nccl_probe_timestamp_seconds", "When the last NCCL probe ran", record.get("checked_at"))


def render(query_text: str | None, query_error: str | None, xids: Mapping[str, int] | None,
           zram: Mapping[str, Mapping[str, str]], nccl_record: Mapping[str, Any] | None, now: float,
           has_gpu: bool, group_epoch: Any = None) -> str:
    """The whole textfile: GPU and Xid counts by code (on NVIDIA nodes; xids None: the kernel log was unreadable),
    zram, the NCCL probe, the group agent's current epoch, and when it was written."""
    out = Textfile()
    if has_gpu:
        gpu_samples(out, query_text, query_error)
        xid_samples(out, xids)
    zram_samples(out, zram)
    nccl_samples(out, nccl_record)
    out.add("sparkfleet_group_current_epoch", "The group start (epoch) the node's agent is in; every start opens one",
            group_epoch)
    out.add("sparkfleet_node_metrics_timestamp_seconds", "When the sparkfleet collector last wrote this file", now)
    return out.render()
