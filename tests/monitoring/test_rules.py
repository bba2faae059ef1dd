"""The alert and recording rules under promtool test rules (the distribution's promtool, scripts/promtool).

Each case gives series the way node_exporter and vLLM publish them, and says which alerts fire (labels) at which
time, and which stay silent before their 'for' runs out or when the condition is healthy. promtool compares
labels and annotations in full: the expected annotations are the rule's own texts with the alert's labels put in.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "roles/monitoring/files/rules/sparkfleet.rules.yml"
PROMTOOL = ROOT / "scripts/promtool"
HEAD = {"job": "vllm", "instance": "10.0.0.1:8000", "node": "spark1"}
NODE = {"job": "node", "instance": "10.0.0.1:9100", "node": "spark1"}
WORKER = {"job": "node", "instance": "10.0.0.2:9100", "node": "spark2"}
ROUTER = {"job": "router", "instance": "10.0.0.1:29000", "node": "spark1"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule}


def expected(alert: str, labels: dict[str, str], value: str = "") -> dict:
    """The alert as promtool reports it: the rule's labels on top of the series', its annotations expanded."""
    rule = alerts()[alert]
    merged = {**labels, **rule.get("labels", {})}

    def expand(text: str) -> str:
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: merged.get(m.group(1), ""), text)
        return text.replace("{{ $value }}", value)

    return {"exp_labels": merged, "exp_annotations": {k: expand(v) for k, v in rule["annotations"].items()}}


# (alert, input series, [(eval time, [(labels, $value)])]) - an empty list at a time: silent then.
CASES = [
    ("SparkfleetVerificationFailed", [series("sparkfleet_verify_ok", NODE, "1 1 0 0")],
     [("1m", []), ("3m", [(NODE, "0")])]),
    ("SparkfleetKVPoolBelowPlan",
     [series("sparkfleet_kv_pool_tokens", NODE, "43648 43648 40000"),
      series("sparkfleet_kv_pool_expected_tokens", NODE, "43648 43648 43648")],
     [("1m", []), ("2m", [(NODE, "40000")])]),
    ("SparkfleetServingDown", [series("up", HEAD, "1 1 0 0 0 0 1")],
     [("2m", []), ("3m", [(HEAD, "0")]), ("6m", [])]),
    ("SparkfleetGroupRestarting",
     [series("up", HEAD, "1 0 0 1"),
      series("node_systemd_unit_state", {**NODE, "name": "sparkfleet-vllm.service", "state": "active",
                                         "type": "notify"}, "1 1 1 1"),
      series("node_systemd_unit_state", {**NODE, "name": "sparkfleet-vllm.service", "state": "activating",
                                         "type": "notify"}, "0 0 0 0")],
     [("0m", []), ("1m", [(HEAD, "0")]), ("3m", [])]),
    ("SparkfleetGroupRestartLoop", [series("sparkfleet_group_current_epoch", NODE, "1 1 2 2 3 3 4 4")],
     [("5m", []), ("7m", [(NODE, "3")])]),
    ("SparkfleetNodeExporterDown", [series("up", NODE, "1 0 0 0 0")],
     [("2m", []), ("3m", [(NODE, "0")])]),
    ("SparkfleetRouterDown", [series("up", ROUTER, "1 0 0 0 0 1")],
     [("2m", []), ("3m", [(ROUTER, "0")]), ("5m", [])]),
    ("SparkfleetFleetGroupOut", [series("sparkfleet_fleet_member", {**NODE, "group": "b"}, "1 0x40")],
     [("20m", []), ("32m", [({**NODE, "group": "b"}, "0")])]),
    ("SparkfleetWatchdogTripped", [series("sparkfleet_watchdog_trips_total", NODE, "0 0 0 1 1")],
     [("2m", []), ("4m", [(NODE, "1")])]),
    ("SparkfleetMemAvailableLow",
     [series("node_memory_MemAvailable_bytes", NODE, "8e9 8e9 1e9 1e9 1e9"),
      series("sparkfleet_watchdog_threshold_bytes", NODE, "805306368x4")],
     [("2m", []), ("3m", [(NODE, "1e+09")])]),
    ("SparkfleetNewXid",
     [series("sparkfleet_gpu_xid_events_total", {**NODE, "code": "any"}, "0 0 0 1 1"),
      series("sparkfleet_gpu_xid_events_total", {**NODE, "code": "31"}, "_ _ _ 1 1")],
     [("2m", []), ("4m", [({**NODE, "code": "any"}, "1")])]),
    ("SparkfleetPowerLowUnderLoad",
     [series("sparkfleet_gpu_utilization_ratio", {**NODE, "gpu": "0"}, "0.96x6"),
      series("sparkfleet_gpu_power_watts", {**NODE, "gpu": "0"}, "90 90 22 22 22 22 22")],
     [("3m", []), ("4m", [({**NODE, "gpu": "0"}, "0.96")])]),
    ("SparkfleetNCCLBelowFloor",  # recorded on every node, one alert
     [series("sparkfleet_nccl_probe_bus_bandwidth_gbytes_per_second", NODE, "21.5 3.1"),
      series("sparkfleet_nccl_probe_floor_gbytes_per_second", NODE, "18 18"),
      series("sparkfleet_nccl_probe_bus_bandwidth_gbytes_per_second", WORKER, "21.5 3.1"),
      series("sparkfleet_nccl_probe_floor_gbytes_per_second", WORKER, "18 18")],
     [("0m", []), ("1m", [({"job": "node"}, "3.1")])]),
    ("SparkfleetGPUNotReadable",
     [series("sparkfleet_gpu_query_ok", NODE, "1 0 0 0 0"), series("sparkfleet_gpu_kernel_log_ok", WORKER, "1x4")],
     [("2m", []), ("3m", [(NODE, "0")])]),
    ("SparkfleetWeightsScrubMismatch", [series("sparkfleet_weights_scrub_ok", NODE, "1 0")],
     [("0m", []), ("1m", [(NODE, "0")])]),
    ("SparkfleetNodeMetricsStale", [series("sparkfleet_node_metrics_timestamp_seconds", NODE, "0+60x10")],
     [("5m", [])]),
]


def run_promtool(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    case = tmp_path / "rules.test.yml"
    case.write_text(yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([str(PROMTOOL), "test", "rules", str(case)], capture_output=True, text=True, check=False)


def test_every_alert_has_a_case_and_the_rules_pass_promtools_check():
    assert sorted(alerts()) == sorted(case[0] for case in CASES)
    check = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    count = sum(len(group["rules"]) for group in yaml.safe_load(RULES.read_text())["groups"])
    assert f"SUCCESS: {count} rules found" in check.stdout


@pytest.mark.parametrize(("alert", "inputs", "checks"), CASES, ids=[case[0] for case in CASES])
def test_the_alert_fires_when_it_should_and_only_then(tmp_path, alert, inputs, checks):
    tests = [{"interval": "1m", "input_series": inputs,
              "alert_rule_test": [{"eval_time": when, "alertname": alert,
                                   "exp_alerts": [expected(alert, labels, value) for labels, value in fired]}
                                  for when, fired in checks]}]
    result = run_promtool(tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_stale_collector_alerts_and_a_wrong_expectation_fails_promtool(tmp_path):
    """The test above can fail: promtool rejects a case that expects silence where the alert fires."""
    inputs = [series("sparkfleet_node_metrics_timestamp_seconds", NODE, "0x10")]
    wrong = [{"interval": "1m", "input_series": inputs,
              "alert_rule_test": [{"eval_time": "6m", "alertname": "SparkfleetNodeMetricsStale", "exp_alerts": []}]}]
    result = run_promtool(tmp_path, wrong)
    assert result.returncode != 0 and "SparkfleetNodeMetricsStale" in result.stdout + result.stderr
    right = [{**wrong[0], "alert_rule_test": [{"eval_time": "6m", "alertname": "SparkfleetNodeMetricsStale",
                                              "exp_alerts": [expected("SparkfleetNodeMetricsStale", NODE)]}]}]
    assert run_promtool(tmp_path, right).returncode == 0


def test_throughput_latency_and_memory_are_recorded_from_vllm_and_node_series(tmp_path):
    vllm = {**HEAD, "model_name": "tiny", "engine": "0"}
    buckets = [series("vllm:time_to_first_token_seconds_bucket", {**vllm, "le": le}, f"0+{n}x10")
               for le, n in (("0.1", 6), ("0.5", 30), ("1", 60), ("+Inf", 60))]
    inputs = [
        series("vllm:generation_tokens_total", vllm, "0+600x10"),
        series("vllm:prompt_tokens_total", vllm, "0+1200x10"),
        series("node_memory_MemAvailable_bytes", NODE, "32e9x10"),
        series("node_memory_MemTotal_bytes", NODE, "128e9x10"),
        series("sparkfleet_gpu_power_watts", {**NODE, "gpu": "0"}, "60x10"),
        *buckets,
    ]
    expectations = [
        ("sparkfleet:decode_tokens:rate1m", '{model_name="tiny",node="spark1"}', 10),
        ("sparkfleet:prefill_tokens:rate1m", '{model_name="tiny",node="spark1"}', 20),
        ("sparkfleet:ttft_seconds:p50", '{model_name="tiny",node="spark1"}', 0.5),
        ("sparkfleet:node_memory_available:ratio", '{node="spark1"}', 0.25),
        ("sparkfleet:node_power_watts:sum", '{node="spark1"}', 60),
    ]
    checks = [{"expr": expr, "eval_time": "5m", "exp_samples": [{"labels": expr + labels, "value": value}]}
              for expr, labels, value in expectations]
    tests = [{"interval": "1m", "input_series": inputs, "promql_expr_test": checks}]
    result = run_promtool(tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr
