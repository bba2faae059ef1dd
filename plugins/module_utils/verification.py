# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""One verification of a booted vLLM head, for both places that verify: the kv_pool module (the verify stage of
site.yml) and the node's own check after every start of the group (files/sparkfleet-verify), so that the two
can never judge differently.

It waits for /health, reads the pool from /metrics and this boot's log, reads max_model_len, optionally sends the
one-token canary and the known-answer canary, and holds the pool and max_model_len to the plan. What it found is
returned; what is wrong is raised as KvPoolError (a KnownAnswerError for the known answer). The per-start check
writes it as a status document and a Prometheus textfile, both built here.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils import known_answer as ka
from ansible_collections.sparkfleet.cluster.plugins.module_utils import prometheus_text as prom
from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_api as api
from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_status as vs

# What a check expects, with the kv_pool module's defaults.
DEFAULTS = {"url": None, "api_key": None, "log_path": None, "min_tokens": None, "expected_tokens": None,
            "tolerance": 0.05, "max_model_len": None, "wait_timeout": 900, "canary": True, "known_answer": None}


def verify(params: dict[str, Any], result: dict[str, Any], findings: vs.Findings) -> dict[str, Any]:
    """Verify the server at params["url"]; fills and returns result, raises KvPoolError on the first fault.

    params["known_answer"], when set: {"path": record directory, "identity": {...}, "logprob_tolerance": float,
    "record": bool}.
    """
    p = {**DEFAULTS, **params}
    url = p["url"].rstrip("/")
    result["health_wait_s"] = api.wait_for_health(url, p["wait_timeout"])
    text = api.get_metrics(url)
    if text is None:
        findings.warnings.append(f"{url}/metrics not available; the pool is read from the log only")
    else:
        try:
            findings.metrics = vs.parse_metrics(text)
        except prom.MetricsParseError as err:
            findings.warnings.append(f"{url}/metrics not parseable ({err}); the pool is read from the log only")
        if findings.metrics is None and text is not None:
            findings.warnings.append(f"no vllm:cache_config_info on {url}/metrics")
    vs.examine_log(findings, p["log_path"])
    model, findings.max_model_len = api.get_models(url, p["api_key"])
    result.update(max_model_len=findings.max_model_len, served_model=model, log_stale=findings.log_stale)
    verdict = vs.reconcile(findings)
    result.update(vs.summary(verdict, findings))
    if p["canary"]:
        result["canary_latency_s"] = api.canary(url, p["api_key"], model)
        result["canary_ok"] = True
    vs.judge(verdict.kv_cache_tokens, verdict.source, expected_tokens=p["expected_tokens"],
             tolerance=p["tolerance"], min_tokens=p["min_tokens"], max_model_len=findings.max_model_len,
             expected_max_model_len=p["max_model_len"])
    known = p["known_answer"]
    if known:
        result.update(ka.verify(url, p["api_key"], model, known["path"], known.get("identity") or {},
                                tolerance=float(known.get("logprob_tolerance", ka.LOGPROB_TOLERANCE)),
                                record=bool(known.get("record", True))))
    return result


# ------------------------------------------------------------------------------------------------ status

def status_document(result: dict[str, Any], error: Exception | None, expected: dict[str, Any],
                    context: dict[str, Any], wall: float | None = None) -> dict[str, Any]:
    """The status a start's verification leaves on the head (/var/lib/sparkfleet/verify/status.json). `failed`:
    None, "known_answer" (a wrong answer: the weights are suspect) or "pool" (any other check)."""
    kind = None
    if error is not None:
        kind = "known_answer" if isinstance(error, ka.WrongAnswerError) else "pool"
    return {
        "ok": error is None,
        "why": str(error) if error is not None else "",
        "failed": kind,
        "checked_at": round(time.time() if wall is None else wall, 3),
        **context,
        "expected": {"pool_tokens": expected.get("expected_tokens"), "min_tokens": expected.get("min_tokens"),
                     "tolerance": expected.get("tolerance"), "max_model_len": expected.get("max_model_len")},
        "found": {key: result.get(key) for key in ("kv_cache_tokens", "max_model_len", "served_model", "source",
                                                   "canary_latency_s", "health_wait_s", "known_answer",
                                                   "known_answer_latency_s", "known_answer_record")},
    }


def gauge(lines: list[str], name: str, help_text: str, value: Any) -> None:
    """One gauge of a textfile, appended to lines; an unknown (None, non-finite) value is left out."""
    number = prom.sample_value(value)
    if number is not None:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {number}"]


# The gauges of the textfile: name, help, and where in the status the value is (None: the status itself).
GAUGES = (
    ("sparkfleet_verify_ok", "1 when the last start of the group passed its verification", None, "ok"),
    ("sparkfleet_verify_timestamp_seconds", "When the last verification ran (Unix time)", None, "checked_at"),
    ("sparkfleet_kv_pool_expected_tokens", "The KV pool the plan expects, in tokens", "expected", "pool_tokens"),
    ("sparkfleet_kv_pool_tokens", "The KV pool the server reports, in tokens", "found", "kv_cache_tokens"),
    ("sparkfleet_canary_latency_seconds", "Latency of the one-token canary", "found", "canary_latency_s"),
    ("sparkfleet_known_answer_latency_seconds", "Latency of the known-answer canary", "found",
     "known_answer_latency_s"),
    ("sparkfleet_time_to_ready_seconds", "From the group's start (its epoch opening) to serving", None,
     "time_to_ready_s"),
    ("sparkfleet_group_starts", "Group starts since the serve stage last started the group", None, "starts"),
    ("sparkfleet_group_epoch", "The start (epoch) this verification is of", None, "epoch"),
)


def textfile(status: dict[str, Any]) -> str:
    """The status as Prometheus text for node_exporter's textfile collector (parsed back by the tests)."""
    lines: list[str] = []
    for name, help_text, part, key in GAUGES:
        gauge(lines, name, help_text, (status.get(part) or {} if part else status).get(key))
    return "\n".join(lines) + "\n"


def dumps(status: dict[str, Any]) -> str:
    return json.dumps(status, indent=1, sort_keys=True) + "\n"
