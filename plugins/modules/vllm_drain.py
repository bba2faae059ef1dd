#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Drain the head's vLLM server and stop its rank: vLLM's own drain, watched from its /metrics."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_drain
short_description: Stop a vLLM head rank after its in-flight requests finish, and say how many were cut
description:
  - Reads C(vllm:num_requests_running) and C(vllm:num_requests_waiting) from the server's C(/metrics), then stops
    the rank's systemd unit without waiting (C(systemctl stop --no-block)). The stop sends SIGTERM; a vLLM started
    with C(--shutdown-timeout) then drains. It admits no new request (each is answered as aborted), lets the
    running and waiting ones finish, and exits once none is left or its timeout has passed (then it aborts the
    rest).
  - While the unit stops, the module polls C(/metrics) twice a second and reports how many requests were in flight
    when the drain began, how long the drain took, and how many were still in flight when the server went away
    (cut, counted from the last answer of C(/metrics); 0 when the drain completed, or when the server exited
    before its timeout, which vLLM does only once nothing is left).
  - The workers are not touched. A tensor-parallel engine needs every rank to finish its requests, so stop
    them after this module returns.
  - In check mode nothing is stopped; the module reports the requests in flight and that it would drain.
version_added: 0.1.0
options:
  url:
    description: Base URL of the vLLM server (its C(/metrics) is not behind the API key).
    type: str
    required: true
  unit:
    description: The systemd unit of the rank (its stop is the SIGTERM that starts vLLM's drain).
    type: str
    required: true
  drain_timeout:
    description: The C(--shutdown-timeout) the server runs with, in seconds.
    type: int
    default: 300
  stop_timeout:
    description: Seconds the unit may take to stop after the drain (the engine's teardown) before this fails.
    type: int
    default: 120
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would drain without stopping anything.
    support: full
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Drain the head, then stop it
  sparkfleet.cluster.vllm_drain:
    url: http://10.0.0.1:8000
    unit: sparkfleet-vllm.service
    drain_timeout: 300
  become: true
  register: drained
"""

RETURN = r"""
in_flight:
  description: Requests running and waiting when the drain began (null if C(/metrics) did not answer).
  returned: always
  type: dict
  sample: {running: 3, waiting: 1}
drained_seconds:
  description: Seconds from the stop until no request was left in flight (or the server went away).
  returned: changed
  type: float
stopped_seconds:
  description: Seconds from the stop until the unit was inactive.
  returned: changed
  type: float
cut:
  description: Requests still in flight when the server went away (its timeout passed, or it died); null when
    C(/metrics) never answered.
  returned: changed
  type: int
active_before:
  description: Whether the unit was active when the module ran (an inactive unit is left as it is).
  returned: always
  type: bool
"""

import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_api as api
from ansible_collections.sparkfleet.cluster.plugins.module_utils.drain import in_flight
from ansible_collections.sparkfleet.cluster.plugins.module_utils.prometheus_text import MetricsParseError


def unit_state(module, unit):
    result = subprocess.run(["systemctl", "show", unit, "-p", "ActiveState", "--value"], capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def counts(url):
    """The requests in flight, or None while /metrics does not answer with vLLM's gauges."""
    text = api.get_metrics(url, timeout=5.0)
    try:
        return None if text is None else in_flight(text)
    except MetricsParseError:
        return None


def main():
    module = AnsibleModule(
        argument_spec={"url": {"type": "str", "required": True}, "unit": {"type": "str", "required": True},
                       "drain_timeout": {"type": "int", "default": 300},
                       "stop_timeout": {"type": "int", "default": 120}},
        supports_check_mode=True,
    )
    url, unit = module.params["url"], module.params["unit"]
    state = unit_state(module, unit)
    before = counts(url) if state == "active" else None
    result = {"in_flight": before, "active_before": state == "active"}
    if state != "active":
        module.exit_json(changed=False, **result)
    if module.check_mode:
        module.exit_json(changed=True, **result)

    started = time.monotonic()
    stop = subprocess.run(["systemctl", "stop", "--no-block", unit], capture_output=True, text=True, check=False)
    if stop.returncode != 0:
        module.fail_json(msg=f"systemctl stop {unit} failed: {stop.stderr.strip()}", **result)
    last = before
    drained = None
    deadline = started + module.params["drain_timeout"] + module.params["stop_timeout"] + 30
    while True:
        state = unit_state(module, unit)
        if state in ("inactive", "failed"):
            break
        now = counts(url)
        if now is not None:
            last = now
            if drained is None and now["running"] + now["waiting"] == 0:
                drained = time.monotonic() - started
        if time.monotonic() > deadline:
            module.fail_json(msg=(f"{unit} was still {state} {deadline - started:.0f} s after its stop (drain "
                                  f"timeout {module.params['drain_timeout']} s, stop timeout "
                                  f"{module.params['stop_timeout']} s); expected it stopped; fix: read the "
                                  "rank's log and journal (systemd kills it at its own TimeoutStopSec)"), **result)
        time.sleep(0.5)
    stopped = time.monotonic() - started
    # vLLM exits before its timeout only once nothing is left to do, so a stop quicker than the timeout drained
    # everything even where the last poll, up to half a second before, still saw requests.
    if drained is None and stopped < module.params["drain_timeout"]:
        drained = stopped
    # Unknown (null) when /metrics never answered.
    cut = 0 if drained is not None else (last["running"] + last["waiting"] if last else None)
    module.exit_json(changed=True, drained_seconds=round(drained if drained is not None else stopped, 1),
                     stopped_seconds=round(stopped, 1), cut=cut, **result)


if __name__ == "__main__":
    main()
