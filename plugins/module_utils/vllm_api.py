# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The HTTP side of a vLLM server: /health (200 up, 503 engine dead), /metrics, /v1/models (max_model_len) and a
one-token completion (the canary), each failure one line in the collection's error shape.

Pure Python (stdlib only), for the kv_pool module on the head node.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.vllm_status import KvPoolError

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
