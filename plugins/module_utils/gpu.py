# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""What nvidia-smi and the kernel say about a node's GPU, parsed once for every role and filter.

- ``parse_query`` reads ``nvidia-smi --query-gpu=... --format=csv`` (with its header line, so every value
  is matched to its field by name, never by position): numbers lose their unit, ``[N/A]`` and
  ``[Not Supported]`` (GB10 reports its unified memory so) become None.
- ``parse_xid`` / ``xid_errors`` read NVIDIA Xid lines from ``journalctl -k`` or ``dmesg`` output.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import threading
import time
from collections.abc import Iterable
from typing import Any

MISSING = {"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", ""}
NUMBER = re.compile(r"^(-?\d+(?:\.\d+)?)(?:\s*(MHz|MiB|W|%|C))?$")

# Fields the gpu role asks for; persistence and clocks steer it, the rest goes into the facts.
QUERY_FIELDS = (
    "index", "name", "uuid", "pci.bus_id", "driver_version", "persistence_mode", "clocks.current.sm",
    "clocks.max.sm", "clocks.applications.graphics", "temperature.gpu", "power.draw", "utilization.gpu",
    "memory.total", "memory.used",
)

XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+), "
    r"(?:pid=(?P<pid>'?[^,']*'?), name=(?P<name>[^,]*), )?(?P<message>.*)$")


def _value(text: str) -> Any:
    text = text.strip()
    if text in MISSING:
        return None
    match = NUMBER.match(text)
    if match:
        number = match.group(1)
        return float(number) if "." in number else int(number)
    return text


def parse_query(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=a,b --format=csv`` -> [{a: ..., b: ...}] (units and ' [MHz]' suffixes dropped)."""
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        return []
    header = [re.sub(r"\s*\[[^\]]*\]$", "", name.strip()) for name in rows[0]]
    gpus = []
    for row in rows[1:]:
        if len(row) != len(header):
            raise ValueError(f"nvidia-smi row has {len(row)} values for {len(header)} fields: {row!r}")
        gpus.append({name: _value(value) for name, value in zip(header, row, strict=True)})
    return gpus


def driver_branch(version: str | None) -> int | None:
    """'580.159.03' -> 580."""
    match = re.match(r"^(\d+)\.", version or "")
    return int(match.group(1)) if match else None


def parse_xid(line: str) -> dict[str, Any] | None:
    """One kernel line -> {code, pci, pid, name, message, line}, or None when it is not an Xid line."""
    match = XID.search(line)
    if not match:
        return None
    pid = (match.group("pid") or "").strip("'")
    name = (match.group("name") or "").strip()
    return {
        "code": int(match.group("code")),
        "pci": match.group("pci"),
        "pid": int(pid) if pid.isdigit() else None,
        "name": None if name in ("", "<unknown>") else name,
        "message": match.group("message").strip(),
        "line": line.rstrip("\n"),
    }


def xid_errors(lines: Iterable[str], ignored: Iterable[str | int] = ()) -> list[str]:
    """The Xid lines whose code is not in ``ignored`` (decimal ``81`` or hexadecimal ``0x51``)."""
    skip = {int(str(code), 0) for code in ignored}
    return [xid["line"] for xid in map(parse_xid, lines) if xid is not None and xid["code"] not in skip]


def clock_verdict(samples_mhz: list[int], min_mhz: int) -> tuple[bool, str]:
    """Did the SM clock reach ``min_mhz`` under load? The peak decides; the message carries the figures."""
    if not samples_mhz:
        return False, "no SM clock reading came from nvidia-smi during the load"
    peak = max(samples_mhz)
    median = sorted(samples_mhz)[len(samples_mhz) // 2]
    figures = f"peak {peak} MHz over {len(samples_mhz)} readings (median {median} MHz)"
    if peak >= min_mhz:
        return True, f"SM clock reached {figures}, expected at least {min_mhz} MHz"
    return False, (f"SM clock stayed low under load: {figures}, expected at least {min_mhz} MHz. A GB10 held at "
                   "600-700 MHz is in a power-delivery lock that only a cold power cycle clears: shut the node "
                   "down, unplug it for 30 s, start it again, then converge")


def query(fields: Iterable[str] = QUERY_FIELDS, smi: str = "nvidia-smi") -> list[dict[str, Any]]:
    """Run nvidia-smi's query and parse it (RuntimeError with its output when it fails)."""
    try:
        result = subprocess.run([smi, f"--query-gpu={','.join(fields)}", "--format=csv"], capture_output=True,
                                text=True, check=False, timeout=60)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"{smi} did not answer within 60 s: a hung nvidia-smi is a sign of a wedged GPU or "
                           "driver; check dmesg for NVRM/Xid lines, then power-cycle the node") from err
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        raise RuntimeError(f"{smi} failed with exit code {result.returncode}: {detail}")
    return parse_query(result.stdout)


def clocks_under_load(load_argv: list[str], seconds: float, interval: float = 0.5, smi: str = "nvidia-smi",
                      ready_marker: str = "gpu burn: loaded", ready_timeout: float = 180.0) -> dict[str, Any]:
    """Start the load, wait for it to say ``ready_marker`` (PyTorch and CUDA take seconds to start), read every
    GPU's SM clock each ``interval`` for ``seconds``, then end the load.

    Returns {samples: {gpu index: [MHz, ...]}, load_rc, load_output, ready} - a load that fails or never gets
    going is reported as such, not mistaken for a slow clock.
    """
    load = subprocess.Popen(load_argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def collect():
        for line in load.stdout:
            lines.append(line)
            if ready_marker in line:
                ready.set()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    samples: dict[int, list[int]] = {}
    error = None
    try:
        started = time.monotonic()
        while not ready.is_set() and load.poll() is None and time.monotonic() - started < ready_timeout:
            ready.wait(0.2)
        deadline = time.monotonic() + seconds
        while ready.is_set() and time.monotonic() < deadline and load.poll() is None:
            try:
                readings = query(("index", "clocks.current.sm"), smi)
            except (RuntimeError, ValueError) as err:
                error = str(err)
                break
            for gpu in readings:
                if isinstance(gpu["clocks.current.sm"], int):
                    samples.setdefault(gpu["index"], []).append(gpu["clocks.current.sm"])
            time.sleep(interval)
    finally:
        if load.poll() is None:
            load.terminate()
        try:
            load.wait(timeout=30)
        except subprocess.TimeoutExpired:
            load.kill()
            load.wait()
        reader.join(timeout=5)
    return {"samples": samples, "load_rc": load.returncode, "load_output": "".join(lines)[-2000:],
            "ready": ready.is_set(), "error": error}
