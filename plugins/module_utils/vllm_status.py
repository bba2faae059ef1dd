# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""What a booted vLLM server reports about its KV pool, read from its log, /metrics and the OpenAI API.

Pure Python (stdlib only) so the same code runs in an Ansible module on the head node and in unit tests. This
module holds the pool's figures from /metrics and the verdict; the sources are read by vllm_log (the log),
prometheus_text (the metrics text) and vllm_api (HTTP).

Sources, newest vLLM first:

- the log line ``GPU KV cache size: 2,049,230 tokens, Maximum concurrency for 900,000 tokens per request:
  2.28x`` (older vLLM: the two halves on two lines; ``CPU`` or ``GPU + host`` instead of ``GPU``; a process
  prefix such as ``(EngineCore_DP0 pid=1234) INFO 11-30 12:00:01 [kv_cache_utils.py:1234]``; ANSI colours);
- ``vllm:cache_config_info{...} 1.0`` on /metrics, whose labels are every CacheConfig field as a string
  ("None" when unset): ``kv_cache_size_tokens`` when the server has it, else ``num_gpu_blocks x block_size``
  (older vLLM; wrong for hybrid models, whose headline is group-aware);
- ``process_start_time_seconds`` on /metrics: a log file last written before the server started is from an
  earlier start and is not used;
- /health (200 up, 503 engine dead), /v1/models (max_model_len) and a one-token completion (the canary).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import SparkfleetError
from ansible_collections.sparkfleet.cluster.plugins.module_utils.prometheus_text import (
    parse_prometheus,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.vllm_log import (
    LogPool,
    log_is_stale,
    parse_log,
    read_log,
    read_text,
)

# ------------------------------------------------------------------------------------------------- errors


class KvPoolError(SparkfleetError):
    """What was found, what was expected, what to do (one line)."""


# The likely causes seen in the field, named in failure messages.
CAUSE_PIN_MISSING = ("the KV pin is missing (no --kv-cache-memory-bytes, so vLLM's auto-sizer sized the pool from "
                     "whatever memory was free)")
CAUSE_PIN_SMALL = "the KV pin (--kv-cache-memory-bytes) is smaller than planned"
CAUSE_MAX_LEN = ("max_model_len differs from the plan (for hybrid models the headline pool scales with "
                 "--max-model-len)")
CAUSE_WATERMARK = ("vm.watermark_scale_factor above 100 inflating reserved memory on unified memory (the "
                   "auto-sizer and the startup free-memory check see less)")
CAUSE_STALE_LOG = "a stale log from an earlier boot at log_path (point log_path at this boot's log)"
CAUSE_TWO_SERVERS = "two servers (log_path belongs to another server than url)"


# ------------------------------------------------------------------------------------------------ metrics

def _label_int(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None or value in ("None", ""):
        return None
    try:
        return int(value)
    except ValueError:
        number = float(value)
        return int(number) if math.isfinite(number) else None


def _label_float(labels: dict[str, str], key: str) -> float | None:
    value = labels.get(key)
    if value is None or value in ("None", ""):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


@dataclass
class MetricsPool:
    """The KV pool as /metrics reports it."""

    tokens: int | None
    num_gpu_blocks: int | None
    block_size: int | None
    fallback: bool  # tokens computed as num_gpu_blocks x block_size (no kv_cache_size_tokens label)
    max_concurrency: float | None = None
    kv_cache_memory_bytes: int | None = None
    cache_dtype: str | None = None
    start_time: float | None = None  # process_start_time_seconds of the API server
    engines: int = 1
    labels: dict[str, str] = field(default_factory=dict)


def parse_metrics(text: str) -> MetricsPool | None:
    """The pool from `vllm:cache_config_info` (engine 0 when there are several); None when the line is absent."""
    samples = parse_prometheus(text)
    start = next((s.value for s in samples if s.name == "process_start_time_seconds"), None)
    infos = [s for s in samples if s.name == "vllm:cache_config_info"]
    if not infos:
        return None
    infos.sort(key=lambda s: s.labels.get("engine", ""))
    labels = infos[0].labels
    blocks, block_size = _label_int(labels, "num_gpu_blocks"), _label_int(labels, "block_size")
    tokens = _label_int(labels, "kv_cache_size_tokens")
    fallback = tokens is None
    if fallback:
        tokens = blocks * block_size if blocks is not None and block_size is not None else None
    dtype = labels.get("cache_dtype")
    return MetricsPool(tokens=tokens, num_gpu_blocks=blocks, block_size=block_size, fallback=fallback,
                       max_concurrency=_label_float(labels, "kv_cache_max_concurrency"),
                       kv_cache_memory_bytes=_label_int(labels, "kv_cache_memory_bytes"),
                       cache_dtype=None if dtype in (None, "None") else dtype, start_time=start,
                       engines=len(infos), labels=dict(labels))


def fmt(tokens: int | None) -> str:
    return "none" if tokens is None else f"{tokens:,}"


# ------------------------------------------------------------------------------------------------- verdict


@dataclass
class Findings:
    """Everything read from one server, before judging it."""

    metrics: MetricsPool | None = None
    log: LogPool | None = None
    log_path: str | None = None  # the resolved file used, when used
    log_stale: bool = False
    max_model_len: int | None = None
    warnings: list[str] = field(default_factory=list)


def stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def examine_log(findings: Findings, log_path: str | None) -> None:
    """Read this boot's log unless it is missing or older than the server's start (then say why it is unused)."""
    if not log_path:
        return
    try:
        resolved, mtime = read_log(log_path)
        text = read_text(resolved)
    except OSError as err:
        findings.warnings.append(f"log_path {log_path}: {err.strerror or err}; the pool is read from /metrics only")
        return
    start = findings.metrics.start_time if findings.metrics else None
    if log_is_stale(mtime, start):
        findings.log_stale = True
        findings.warnings.append(
            f"log {resolved} (via {log_path}) is stale: last written {stamp(mtime)}, before the server started "
            f"({stamp(start)}); it is from an earlier start and was not used")
        return
    if start is None:
        findings.warnings.append(f"no process_start_time_seconds on /metrics: cannot tell whether {resolved} is "
                                 "from this start")
    pool = parse_log(text)
    if pool is None:
        findings.warnings.append(f"no 'KV cache size' line in {resolved} (is the boot finished, is it the head's "
                                 "log?); the pool is read from /metrics only")
        return
    findings.log, findings.log_path = pool, resolved


@dataclass
class Verdict:
    kv_cache_tokens: int
    source: str  # metrics, log or both
    num_gpu_blocks: int | None
    block_size: int | None
    max_concurrency: float | None
    fallback: bool


def reconcile(findings: Findings) -> Verdict:
    """One pool from /metrics and the log; raise when they disagree or when neither has one."""
    metrics, log = findings.metrics, findings.log
    have_metrics = metrics is not None and metrics.tokens is not None
    if metrics is not None and metrics.fallback:
        findings.warnings.append(
            "/metrics has no kv_cache_size_tokens (older vLLM): the pool from /metrics is num_gpu_blocks x "
            f"block_size = {fmt(metrics.num_gpu_blocks)} x {fmt(metrics.block_size)} = {fmt(metrics.tokens)} "
            "tokens, which is not the group-aware figure for hybrid models")
    if metrics is not None and metrics.engines > 1:
        findings.warnings.append(f"{metrics.engines} engines publish a cache config; engine 0's is reported")
    if not have_metrics and log is None:
        reason = "no vllm:cache_config_info on /metrics" if metrics is None else "cache_config_info without a pool"
        why = " and the log was stale" if findings.log_stale else ("" if findings.log_path else " and no usable log")
        raise KvPoolError(f"{reason}{why}", "the KV pool from /metrics or this boot's log line",
                          "pass log_path (this boot's head log), or check that /metrics is the vLLM server's")
    if log is not None and log.concurrency_len is not None and findings.max_model_len is not None and \
            log.concurrency_len != findings.max_model_len:
        raise KvPoolError(
            f"the log line {findings.log_path}:{log.line} written for max_model_len {fmt(log.concurrency_len)} "
            f"while the server serves {fmt(findings.max_model_len)}",
            "this server's log", f"likely causes: {CAUSE_STALE_LOG}; {CAUSE_TWO_SERVERS}")
    if have_metrics and log is not None:
        if metrics.tokens != log.tokens:
            if metrics.fallback:
                findings.warnings.append(
                    f"the log line says {fmt(log.tokens)} tokens and blocks x block_size {fmt(metrics.tokens)}: the "
                    "log's group-aware figure is used")
                return Verdict(log.tokens, "log", metrics.num_gpu_blocks, metrics.block_size,
                               metrics.max_concurrency or log.max_concurrency, metrics.fallback)
            raise KvPoolError(
                f"the log line {findings.log_path}:{log.line} saying {fmt(log.tokens)} tokens but /metrics "
                f"kv_cache_size_tokens {fmt(metrics.tokens)}",
                "the same pool in both (one server, this boot's log)",
                f"likely causes: {CAUSE_STALE_LOG}; {CAUSE_TWO_SERVERS}")
        concurrency = metrics.max_concurrency if metrics.max_concurrency is not None else log.max_concurrency
        return Verdict(metrics.tokens, "both", metrics.num_gpu_blocks, metrics.block_size, concurrency,
                       metrics.fallback)
    if have_metrics:
        return Verdict(metrics.tokens, "metrics", metrics.num_gpu_blocks, metrics.block_size,
                       metrics.max_concurrency, metrics.fallback)
    blocks = metrics.num_gpu_blocks if metrics else None
    block_size = metrics.block_size if metrics and metrics.block_size else log.attention_block_size
    return Verdict(log.tokens, "log", blocks, block_size, log.max_concurrency, False)


def judge(tokens: int, source: str, expected_tokens: int | None = None, tolerance: float = 0.05,
          min_tokens: int | None = None, max_model_len: int | None = None,
          expected_max_model_len: int | None = None) -> None:
    """Raise KvPoolError when the pool or max_model_len is not what the plan says; the message names causes."""
    where = {"both": "log and /metrics", "metrics": "/metrics", "log": "the log line"}.get(source, source)
    len_wrong = (expected_max_model_len is not None and max_model_len is not None
                 and max_model_len != expected_max_model_len)
    too_small = too_large = False
    if expected_tokens is not None:
        low, high = expected_tokens * (1 - tolerance), expected_tokens * (1 + tolerance)
        too_small, too_large = tokens < low, tokens > high
    below_min = min_tokens is not None and tokens < min_tokens
    if not (len_wrong or too_small or too_large or below_min):
        return
    found = [f"a KV pool of {fmt(tokens)} tokens ({where})"]
    expected = []
    if expected_tokens is not None:
        expected.append(f"{fmt(expected_tokens)} tokens ±{tolerance:.0%}")
    if min_tokens is not None:
        expected.append(f"at least {fmt(min_tokens)} tokens")
    if len_wrong:
        found.append(f"max_model_len {fmt(max_model_len)}")
        expected.append(f"max_model_len {fmt(expected_max_model_len)}")
    causes = []
    if len_wrong:
        direction = "lowered" if max_model_len < expected_max_model_len else "raised"
        causes.append(f"max_model_len {direction} to {fmt(max_model_len)} (the plan says "
                      f"{fmt(expected_max_model_len)}; for hybrid models the headline pool scales with it)")
    if too_large:
        share = tokens / expected_tokens - 1
        found[0] += f", {share:.0%} more than planned"
        causes.append(CAUSE_PIN_MISSING)
    elif too_small or below_min:
        if expected_tokens:
            found[0] += f", {1 - tokens / expected_tokens:.0%} less than planned"
        causes += [f"{CAUSE_PIN_MISSING} or {CAUSE_PIN_SMALL}", CAUSE_WATERMARK]
    if (too_small or too_large or below_min) and not len_wrong:
        causes.append(CAUSE_MAX_LEN)
    if source == "log":
        causes.append(CAUSE_STALE_LOG)
    fix = ("likely causes: " + "; ".join(causes)
           + "; check the unit's --kv-cache-memory-bytes and --max-model-len against the profile, then restart")
    raise KvPoolError(", ".join(found), " and ".join(expected), fix)


def summary(verdict: Verdict, findings: Findings) -> dict[str, Any]:
    return {
        "kv_cache_tokens": verdict.kv_cache_tokens,
        "num_gpu_blocks": verdict.num_gpu_blocks,
        "block_size": verdict.block_size,
        "max_concurrency": verdict.max_concurrency,
        "source": verdict.source,
        "log_path": findings.log_path,
        "log_stale": findings.log_stale,
        "metrics_fallback": verdict.fallback,
    }


def unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
