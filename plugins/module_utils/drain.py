# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""What a vLLM server still has to do, from its /metrics: the requests a drain waits for.

Pure Python (stdlib only), for the vllm_drain module on the head node.
"""

from __future__ import annotations

from ansible_collections.sparkfleet.cluster.plugins.module_utils.prometheus_text import parse_prometheus

# vLLM's gauges, one sample per engine (label engine=...): requests being decoded, and admitted but not started.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def in_flight(text: str) -> dict[str, int] | None:
    """The running and waiting requests a /metrics text reports, summed over engines; None when it has neither
    gauge (not a vLLM server, or one still starting)."""
    found: dict[str, int] = {}
    for sample in parse_prometheus(text):
        key = {RUNNING: "running", WAITING: "waiting"}.get(sample.name)
        if key:
            found[key] = found.get(key, 0) + int(sample.value)
    if not found:
        return None
    return {"running": found.get("running", 0), "waiting": found.get("waiting", 0)}
