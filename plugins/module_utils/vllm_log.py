# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The KV pool as a vLLM server's log states it, and whether a log belongs to the running server.

Pure Python (stdlib only). The line ``GPU KV cache size: 2,049,230 tokens, Maximum concurrency for 900,000
tokens per request: 2.28x`` (older vLLM: the two halves on two lines; ``CPU`` or ``GPU + host`` instead of
``GPU``; a process prefix such as ``(EngineCore_DP0 pid=1234) INFO 11-30 12:00:01 [kv_cache_utils.py:1234]``;
ANSI colours). A log file last written before the server started is from an earlier start.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
POOL_LINE = re.compile(r"\b(?P<device>[A-Za-z]\w*(?: \+ [A-Za-z]\w*)*) KV cache size: (?P<tokens>\d[\d,]*) tokens")
CONCURRENCY_LINE = re.compile(r"Maximum concurrency for (?P<length>\d[\d,]*) tokens per request: "
                              r"(?P<factor>\d+(?:\.\d+)?)x")
BLOCK_SIZE_LINE = re.compile(r"Setting attention block size to (?P<size>\d[\d,]*) tokens")
AVAILABLE_LINE = re.compile(r"Available KV cache memory: (?P<gib>\d+(?:\.\d+)?) GiB")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass
class LogPool:
    """The KV pool one boot logged (the last one in the file)."""

    tokens: int
    device: str
    line: int  # 1-based line number of the pool line
    max_concurrency: float | None = None
    concurrency_len: int | None = None  # max_model_len of the server that logged the line
    attention_block_size: int | None = None
    available_gib: float | None = None
    text: str = ""  # the pool line, prefix and colours removed


def parse_log(text: str) -> LogPool | None:
    """The last KV pool line of a vLLM log (one-line or two-line form), with what surrounds it; None if absent.

    A log may hold several starts (retries): the block-size and available-memory lines are those of the start
    that logged the last pool line (seen after the previous pool line).
    """
    pool: LogPool | None = None
    block_size: int | None = None
    available: float | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = ANSI.sub("", raw)
        found = POOL_LINE.search(line)
        if found:
            pool = LogPool(tokens=_int(found.group("tokens")), device=found.group("device"), line=number,
                           attention_block_size=block_size, available_gib=available,
                           text=line[found.start():].strip())
            block_size = available = None
        concurrency = CONCURRENCY_LINE.search(line)
        if concurrency and pool is not None and (found or (pool.max_concurrency is None and number > pool.line)):
            pool.max_concurrency = float(concurrency.group("factor"))
            pool.concurrency_len = _int(concurrency.group("length"))
        match = BLOCK_SIZE_LINE.search(line)
        if match:
            block_size = _int(match.group("size"))
        match = AVAILABLE_LINE.search(line)
        if match:
            available = float(match.group("gib"))
    return pool


def read_log(path: str) -> tuple[str, float]:
    """The log's resolved path (a stable symlink names this boot's file) and its modification time."""
    resolved = os.path.realpath(path)
    return resolved, os.stat(resolved).st_mtime


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


# prometheus_client computes process_start_time_seconds as the whole-second boot time (/proc/stat btime, truncated)
# plus the process's start in clock ticks: up to one second EARLY, never late.
START_TIME_SLACK = 1.0


def log_is_stale(log_mtime: float, server_start: float | None) -> bool:
    """A log last written before the server process started belongs to an earlier start.

    The published start time may be up to a second early, so a log last written within that second (an earlier
    start that stopped just before this one began) counts as stale too. A log of this start cannot be that old:
    it was last written no earlier than its KV pool line, which comes after the model loaded, many seconds in.
    """
    return server_start is not None and log_mtime < server_start + START_TIME_SLACK
