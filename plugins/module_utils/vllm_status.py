# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""What a booted vLLM server reports about its KV pool, read from its log, /metrics and the OpenAI API.

Pure Python (stdlib only) so the same code runs in an Ansible module on the head node and in unit tests.

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

import http.client
import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import SparkfleetError

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

# ---------------------------------------------------------------------------------------------------- log

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


# ------------------------------------------------------------------------------------------------ metrics


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


class MetricsParseError(ValueError):
    pass


_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y\\"z"}` starting at line[pos] == "{"; returns the labels and the index after "}"."""
    labels: dict[str, str] = {}
    pos += 1
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        name = _NAME.match(line, pos)
        if not name:
            raise MetricsParseError(f"bad label name at column {pos}: {line[:120]!r}")
        pos = name.end()
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if line[pos: pos + 2] != '="':
            raise MetricsParseError(f'expected =" after label {name.group()!r}: {line[:120]!r}')
        pos += 2
        value = []
        while True:
            if pos >= len(line):
                raise MetricsParseError(f"unterminated value of label {name.group()!r}: {line[:120]!r}")
            char = line[pos]
            if char == "\\" and pos + 1 < len(line):
                value.append(_ESCAPES.get(line[pos + 1], "\\" + line[pos + 1]))
                pos += 2
            elif char == '"':
                pos += 1
                break
            else:
                value.append(char)
                pos += 1
        labels[name.group()] = "".join(value)
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos < len(line) and line[pos] == "}":
            return labels, pos + 1
        else:
            raise MetricsParseError(f"expected , or }} after label {name.group()!r}: {line[:120]!r}")


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (comments skipped; label values unescaped)."""
    samples = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name = _NAME.match(line)
        if not name:
            raise MetricsParseError(f"bad metric name: {line[:120]!r}")
        pos = name.end()
        labels: dict[str, str] = {}
        if pos < len(line) and line[pos] == "{":
            labels, pos = _parse_labels(line, pos)
        rest = line[pos:].split()
        if not rest:
            raise MetricsParseError(f"no value: {line[:120]!r}")
        try:
            value = float(rest[0])
        except ValueError as err:
            raise MetricsParseError(f"bad value {rest[0]!r}: {line[:120]!r}") from err
        samples.append(Sample(name.group(), labels, value))
    return samples


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


# --------------------------------------------------------------------------------------------------- HTTP

# Requests go straight to the head: a proxy from the environment has no business between a node and its server.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Response:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


class Unreachable(Exception):
    """No HTTP answer at all: refused, timed out, reset, name not resolved."""

    def __init__(self, reason: str, refused: bool = False):
        super().__init__(reason)
        self.reason, self.refused = reason, refused


def request(url: str, method: str = "GET", body: Any = None, api_key: str | None = None,
            timeout: float = 10.0) -> Response:
    """One HTTP request; any status is returned (not raised); no answer raises Unreachable."""
    data = None
    headers = {"Accept": "application/json, text/plain"}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        with _OPENER.open(req, timeout=timeout) as answer:
            return Response(answer.status, answer.read())
    except (ValueError, http.client.HTTPException) as err:  # never echo the request: it may carry the key
        raise Unreachable(f"{type(err).__name__} while sending the request (a header or the URL is malformed)"
                          ) from None
    except urllib.error.HTTPError as err:
        return Response(err.code, err.read() or b"")
    except urllib.error.URLError as err:
        reason = err.reason
        refused = isinstance(reason, ConnectionRefusedError)
        raise Unreachable("connection refused" if refused else f"{type(reason).__name__}: {reason}",
                          refused) from err
    except (TimeoutError, ConnectionError, OSError) as err:
        raise Unreachable(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__) from err


def join(base: str, path: str) -> str:
    return base.rstrip("/") + path


def _detail(response: Response) -> str:
    text = response.body.decode("utf-8", errors="replace").strip().replace("\n", " ")
    return f": {text[:200]}" if text else ""


def engine_dead_error(url: str, seconds: float | None = None) -> KvPoolError:
    waited = f" (after waiting {seconds:.0f} s)" if seconds is not None and seconds >= 1 else ""
    return KvPoolError(
        f"{join(url, '/health')} answering 503{waited}: the engine is dead (EngineDeadError) while the API server "
        "still runs",
        "/health 200 from a live engine",
        "read the head's log for the engine's exception (out of memory, a worker that died, an illegal memory "
        "access), then restart the service; a dead worker on another node takes the engine down too")


def wait_for_health(url: str, timeout: float, interval: float = 2.0, probe_timeout: float = 5.0,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> float:
    """Poll /health until it answers 200; returns the seconds waited.

    503 is what vLLM answers once its engine is dead (EngineDeadError). Launchers that answer 503 while still
    booting exist too, so a 503 fails at once only when /metrics shows an engine that had finished its start
    (the cache_config_info line), and otherwise at the deadline.
    """
    started = clock()
    deadline = started + timeout
    last = "no answer yet"
    statuses: set[int] = set()
    while True:
        try:
            status = request(join(url, "/health"), timeout=probe_timeout).status
        except Unreachable as err:
            status, last = None, err.reason
        if status == 200:
            return round(clock() - started, 3)
        if status is not None:
            statuses.add(status)
            last = f"HTTP {status}"
            if status == 503 and engine_was_up(url, probe_timeout):
                raise engine_dead_error(url, clock() - started)
        if clock() >= deadline:
            break
        sleep(max(0.0, min(interval, deadline - clock())))
    waited = clock() - started
    if last == "HTTP 503":
        raise engine_dead_error(url, waited)
    if last == "connection refused":
        raise KvPoolError(f"{join(url, '/health')} refusing connections for {waited:.0f} s",
                          "the vLLM API server listening and /health answering 200",
                          "check that the service runs on the head (systemctl status, docker ps), that url names "
                          "the head's address and port, and read its log for a failed boot (vLLM exits when its "
                          "engine dies unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1)")
    if last.startswith("HTTP "):
        return_codes = ", ".join(str(code) for code in sorted(statuses))
        raise KvPoolError(f"{join(url, '/health')} answering {last} (seen: {return_codes}) for {waited:.0f} s",
                          "/health 200 from vLLM",
                          "check that url points at the vLLM server itself (not a proxy or another service) "
                          "and read the head's log")
    raise KvPoolError(f"no answer from {join(url, '/health')} within {waited:.0f} s ({last})",
                      "/health 200 within wait_timeout",
                      "a boot can take minutes (weights, graph capture): raise wait_timeout, or check the "
                      "address, the port and any firewall between this node and the head")


def engine_was_up(url: str, timeout: float = 5.0) -> bool:
    """True when /metrics shows an engine that had finished its start (its cache config is published)."""
    try:
        response = request(join(url, "/metrics"), timeout=timeout)
    except Unreachable:
        return False
    return response.status == 200 and b"vllm:cache_config_info" in response.body


def get_metrics(url: str, timeout: float = 10.0) -> str | None:
    """/metrics as text; None when the server has no /metrics (404) or does not answer."""
    try:
        response = request(join(url, "/metrics"), timeout=timeout)
    except Unreachable:
        return None
    if response.status != 200:
        return None
    return response.body.decode("utf-8", errors="replace")


def api_key_refused(url: str, path: str) -> KvPoolError:
    return KvPoolError(f"{join(url, path)} answering 401: the API key was refused (401)",
                       "the key the server was started with (--api-key / VLLM_API_KEY)",
                       "pass the same api_key the service uses (from the vault), or none if it has no key")


def get_models(url: str, api_key: str | None, timeout: float = 10.0) -> tuple[str, int | None]:
    """The first served model's id and max_model_len from /v1/models."""
    try:
        response = request(join(url, "/v1/models"), api_key=api_key, timeout=timeout)
    except Unreachable as err:
        raise KvPoolError(f"no answer from {join(url, '/v1/models')} ({err.reason})", "the model list",
                          "check the server and rerun") from err
    if response.status == 401:
        raise api_key_refused(url, "/v1/models")
    if response.status != 200:
        raise KvPoolError(f"{join(url, '/v1/models')} answering HTTP {response.status}{_detail(response)}",
                          "HTTP 200 with the served model", "read the head's log")
    try:
        data = response.json()["data"][0]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise KvPoolError(f"{join(url, '/v1/models')} answering without a model ({response.body[:200]!r})",
                          "data[0].id and data[0].max_model_len", "check that url is a vLLM server") from err
    length = data.get("max_model_len")
    return str(data.get("id")), int(length) if isinstance(length, int | float) else None


def canary(url: str, api_key: str | None, model: str, timeout: float = 300.0,
           clock: Callable[[], float] = time.perf_counter) -> float:
    """A one-token completion through the head; returns its latency in seconds."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
    started = clock()
    try:
        response = request(join(url, "/v1/completions"), method="POST", body=body, api_key=api_key,
                           timeout=timeout)
    except Unreachable as err:
        raise KvPoolError(f"the 1-token canary completion getting no answer ({err.reason})",
                          "one generated token", "the engine may have died on its first request (a shape the "
                          "kernels do not support, out of memory): read the head's log and check /health") from err
    latency = clock() - started
    if response.status == 401:
        raise api_key_refused(url, "/v1/completions")
    if response.status != 200:
        dead = " (the engine is dead)" if response.status in (500, 503) else ""
        raise KvPoolError(f"the 1-token canary completion answering HTTP {response.status}{dead}{_detail(response)}",
                          "one generated token", "a dead worker can leave /health at 200: read the head's log "
                          "(every rank) and restart the service")
    try:
        choices = response.json()["choices"]
        if not choices:
            raise ValueError("no choices")
    except (ValueError, KeyError, TypeError) as err:
        raise KvPoolError(f"the canary completion answering without a choice ({response.body[:200]!r})",
                          "one generated token", "read the head's log") from err
    return round(latency, 3)


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
