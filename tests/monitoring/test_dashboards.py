"""The dashboards load, every query is valid PromQL (promtool checks it as a rule), and every series a query reads
is one the rules record or sparkfleet's code writes; the vLLM and node_exporter series they read are listed by
dashboard_series() for the lab test, which finds each of them in the lab's Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "roles/monitoring/files/dashboards").glob("*.json"))
RULES = ROOT / "roles/monitoring/files/rules/sparkfleet.rules.yml"
# Where sparkfleet's own series are written (the collector, the verification, the scrub, the watchdog).
WRITERS = [ROOT / "plugins/module_utils/node_metrics.py", ROOT / "plugins/module_utils/verification.py",
           ROOT / "roles/vllm_service/files/sparkfleet-verify", ROOT / "roles/node_memory/files/sparkfleet-watchdog"]
SERIES = re.compile(r"(?<![\w:\"])([a-zA-Z_:][\w:]*)(?=\s*(?:\{|\[|\)|$|\s*[<>=!*/+-]))")
PROMQL_WORDS = {"sum", "max", "min", "avg", "rate", "increase", "by", "without", "on", "and", "or", "unless",
                "histogram_quantile", "le", "time", "changes", "label_values", "count", "bool"}


def queries() -> list[tuple[str, str, str]]:
    found = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                found.append((path.name, panel["title"], target["expr"]))
    return found


def expressions() -> list[str]:
    return [expr for _board, _title, expr in queries()]


def series_of(expr: str) -> set[str]:
    text = re.sub(r"\{[^}]*\}", "{}", expr)  # label matchers are not series
    text = re.sub(r"\b(by|without|on)\s*\([^)]*\)", "", text)  # nor are grouping labels
    return {name for name in SERIES.findall(text) if name not in PROMQL_WORDS}


def recorded() -> set[str]:
    return {rule["record"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
            if "record" in rule}


def scraped(names) -> set[str]:
    return {name for name in names if name.startswith(("vllm:", "node_")) or name == "up"}


def dashboard_series() -> set[str]:
    """The series the dashboards read from vLLM and node_exporter."""
    return scraped(name for expr in expressions() for name in series_of(expr))


def rule_series() -> set[str]:
    """The series the rules read from vLLM and node_exporter."""
    return scraped(name for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
                   for name in series_of(rule["expr"]))


def test_every_dashboard_loads_with_a_uid_a_datasource_variable_and_queries():
    assert [path.name for path in DASHBOARDS] == ["sparkfleet-cluster.json", "sparkfleet-vllm.json"]
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] and board["title"] and board["panels"], path.name
        assert "datasource" in [variable["name"] for variable in board["templating"]["list"]]
        assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"]), path.name
        for panel in board["panels"]:
            assert panel["targets"], (path.name, panel["title"])
            assert panel["datasource"]["uid"] == "${datasource}", (path.name, panel["title"])


def test_every_query_is_promql_that_promtool_accepts(tmp_path):
    rules = [{"record": f"dashboard:query:{n}", "expr": expr.replace("$node", ".*")}
             for n, expr in enumerate(expressions())]
    path = tmp_path / "queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    check = subprocess.run([str(ROOT / "scripts/promtool"), "check", "rules", str(path)], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    # and promtool does refuse a broken query, so the check above can fail
    broken = {"groups": [{"name": "d", "rules": [{"record": "a:b", "expr": "sum(rate(x[5m])"}]}]}
    path.write_text(yaml.safe_dump(broken))
    assert subprocess.run([str(ROOT / "scripts/promtool"), "check", "rules", str(path)], capture_output=True,
                          check=False).returncode != 0


def test_every_series_a_query_reads_is_recorded_written_by_sparkfleet_or_scraped():
    written = "\n".join(path.read_text() for path in WRITERS)
    problems = []
    for board, title, expr in queries():
        for name in series_of(expr):
            if name.startswith("sparkfleet:"):
                ok = name in recorded()
            elif name.startswith("sparkfleet_"):
                ok = re.search(rf"\b{re.escape(name)}\b", written) is not None
            else:
                ok = name in dashboard_series()
            if not ok:
                problems.append(f"{board} / {title}: {name}")
    assert not problems, problems
    assert {"sparkfleet:decode_tokens:rate1m", "sparkfleet_kv_pool_tokens", "node_memory_MemAvailable_bytes",
            "sparkfleet_gpu_utilization_ratio"} <= {name for expr in expressions() for name in series_of(expr)}
    assert series_of('sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{node=~"$node"}[5m]))') == {
        "vllm:e2e_request_latency_seconds_bucket"}  # a histogram's series, as Prometheus stores it
