#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Lay out a benchmark run: its tables, its plots, and the comparison with published figures or another run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_report
short_description: Write a benchmark run's tables and plots, beside published figures or another run
description:
  - Reads llama-benchy's JSON result (C(llama-benchy.json)) in O(run_dir) and writes there C(run.json) (the
    O(record) of what was measured and the rows), C(results.md) (the record, llama-benchy's own table with its
    own test names and values, the comparison with O(published) and the O(needle) check) and three PNG plots
    drawn with matplotlib - decode tok/s against depth for each concurrency (C(decode.png)), prefill tok/s against
    depth (C(prefill.png)) and time to first token against depth (C(ttft.png)).
  - With O(compare_to), instead puts two runs side by side - each test's t/s in both and the ratio, and every
    recorded setting that differs (image, weights, vLLM flags, plan) - in C(compare.md) in O(run_dir).
  - Runs on the controller, in the benchmark's virtualenv (matplotlib). In check mode it writes nothing.
version_added: 0.1.0
options:
  run_dir:
    description: The run's directory, holding C(llama-benchy.json).
    type: path
    required: true
  record:
    description: What was measured - cluster, profile, plan, image, weights revision, vLLM flags, node power and
      clocks - stored with the run so that two runs can be compared.
    type: dict
    default: {}
  published:
    description:
      - Published points for the same profile. Each has C(metric) (C(decode), C(prefill) or C(ttft)), C(value)
        (a number, or C([low, high])), C(source), and optionally C(prompt), C(response), C(depth) and
        C(concurrency) (the test it was measured at) and C(note).
    type: list
    elements: dict
    default: []
  needle:
    description: The long-context retrieval check's result (M(sparkfleet.cluster.bench_needle)), shown with the run.
    type: dict
  headline:
    description:
      - The headline figures to tabulate against the published ones (C(validate.yml)) - C(published) (a list of
        C(figure), C(value), C(source) and, for C(allreduce_us), C(size_bytes)), C(pool_tokens) (what the
        verification found) and C(nccl) (each node's last NCCL probe record, or null). The one-stream decode and
        prefill come from the run's own tests.
    type: dict
  compare_to:
    description: Another run's directory; the report is then the two side by side (this run second).
    type: path
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), writing nothing.
    support: full
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Write the run's tables and plots
  sparkfleet.cluster.bench_report:
    run_dir: bench/spark/20261207T101500Z
    record: {cluster: spark, profile: glm-5.3-flash-nvfp4-tp2}
    published:
      - {metric: decode, value: 22.67, prompt: 2048, concurrency: 1, source: "a published llama-benchy run"}
  vars:
    ansible_python_interpreter: ~/.cache/sparkfleet/venvs/bench/bin/python

- name: Put two runs side by side
  sparkfleet.cluster.bench_report:
    run_dir: bench/spark/20261207T101500Z
    compare_to: bench/spark/20261201T090000Z
"""

RETURN = r"""
table:
  description: The run's results table (or, with O(compare_to), the side-by-side table) in Markdown.
  returned: always
  type: str
headline:
  description: Each headline figure with what was measured (or why nothing was), the published value and the ratio.
  returned: when O(headline) was given
  type: list
  elements: dict
comparison:
  description: Each published point with what this run measured there and the ratio.
  returned: when published points were given
  type: list
  elements: dict
files:
  description: The files written.
  returned: success
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils.bench import (
    BenchError,
    comparison,
    comparison_table,
    differences,
    headline,
    headline_problems,
    headline_table,
    load_raw,
    measured_headline,
    published_problems,
    results_table,
    rows,
    side_by_side,
    side_by_side_table,
    table,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import line

PLOTS = (("decode.png", "decode", "t_s", "decode tok/s"), ("prefill.png", "prefill", "t_s", "prefill tok/s"),
         ("ttft.png", "prefill", "e2e_ttft", "time to first token (ms)"))


def plot(found, path, kind, key, label, title):
    """One line per concurrency (and prompt/answer size when the grid has several) of `key` against depth, with
    the spread of the runs as error bars."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    series = {}
    sizes = {(row.prompt, row.response) for row in found if row.kind == kind}
    for row in found:
        metric = row.values.get(key)
        if row.kind != kind or metric is None:
            continue
        series.setdefault((row.concurrency, row.prompt, row.response), []).append((row.depth, metric.mean, metric.std))
    figure, axes = pyplot.subplots(figsize=(7, 4.2), dpi=110)
    for (concurrency, prompt, response), points in sorted(series.items()):
        points.sort()
        name = f"c{concurrency}" + (f" pp{prompt} tg{response}" if len(sizes) > 1 else "")
        axes.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                      capsize=3, label=name)
    axes.set_xlabel("context depth (tokens)")
    axes.set_ylabel(label)
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    if series:
        axes.legend(title="concurrency")
    else:
        axes.text(0.5, 0.5, "no test of this kind in the grid", ha="center", transform=axes.transAxes)
    figure.tight_layout()
    figure.savefig(path, format="png")
    pyplot.close(figure)


def gpu_text(gpus):
    """A node's GPUs as nvidia-smi read them: power, SM clock and temperature, or that it has none."""
    if not gpus:
        return "no NVIDIA GPU"
    return "; ".join(f"{gpu.get('name', 'GPU')} {gpu.get('power.draw', '?')} W, SM {gpu.get('clocks.current.sm', '?')} "
                     f"MHz, {gpu.get('temperature.gpu', '?')} C" for gpu in gpus)


def record_lines(record):
    def text(value, key=""):
        if key.startswith("gpus_") and isinstance(value, dict):
            return ", ".join(f"{node}: {gpu_text(gpus)}" for node, gpus in value.items()) or "-"
        if isinstance(value, dict):
            return ", ".join(f"{k} {text(v)}" for k, v in value.items()) or "-"
        if isinstance(value, list):
            return ", ".join(text(v) for v in value) or "-"
        return "-" if value in (None, "") else str(value)
    return table(["", ""], ([key, text(value, key)] for key, value in record.items()))


def printable(text):
    """A model's answer on one table line: what is not printable (a random model's stray bytes) as '?'."""
    return "".join(c if c.isprintable() and c != "\ufffd" else "?" for c in " ".join(str(text).split()))


def needle_lines(needle):
    body = []
    for item in needle.get("results", []):
        verdict = "PASS" if item.get("passed") else "FAIL"
        body.append([f"{item.get('tokens', 0):,}", f"{item.get('needle_at', -1):,}", verdict,
                     item.get("judged", ""), f"{item.get('seconds', 0):.1f}", printable(item.get("answer", ""))[:80]])
    return table(["prompt tokens", "needle at token", "result", "judged by", "seconds", "answer"], body,
                 right=(0, 1, 4))


def report(module, params):
    run_dir = params["run_dir"]
    raw = load_raw(os.path.join(run_dir, "llama-benchy.json"))
    found = rows(raw)
    several = int(raw.get("max_concurrency") or 1) > 1
    problems = published_problems(params["published"])
    if problems:
        raise BenchError("; ".join(problems), "published points with metric, value and source",
                         "correct the published figures file", key="published")
    compared = comparison(found, params["published"])
    results = results_table(found, several)
    record = dict(params["record"])
    stamp = raw.get("timestamp", "")
    title = f"{record.get('cluster', '')} {record.get('profile', '')} {stamp}".strip()
    shown = dict(record, llama_benchy=raw.get("version"), latency_ms=round(raw.get("latency_ms", 0), 2))
    parts = [f"# Benchmark {title}", "", record_lines(shown), "", "## llama-benchy", "", results, ""]
    if compared:
        parts += ["## Against the published figures", "", comparison_table(compared), ""]
    else:
        parts += ["## Against the published figures", "",
                  f"No published figures for profile {record.get('profile', '?')}.", ""]
    headlines = []
    if params["headline"] is not None:
        wanted = params["headline"].get("published") or []
        problems = headline_problems(wanted)
        if problems:
            raise BenchError("; ".join(problems), "headline figures with figure, value and source",
                             "correct the headline figures file", key="headline")
        headlines = headline(measured_headline(found, params["headline"].get("pool_tokens"),
                                               params["headline"].get("nccl") or {}), wanted)
        parts += ["## Headline figures", "", headline_table(headlines) if headlines else
                  f"No published headline figures for profile {record.get('profile', '?')}.", ""]
    if params["needle"]:
        parts += ["## Long-context retrieval (needle in a haystack)", "", needle_lines(params["needle"]), ""]
    parts += ["## Plots", ""] + [f"![{label}]({name})" for name, _kind, _key, label in PLOTS] + [""]
    files = []
    if not module.check_mode:
        for name, kind, key, label in PLOTS:
            plot(found, os.path.join(run_dir, name), kind, key, label, f"{label} - {title}")
            files.append(os.path.join(run_dir, name))
        with open(os.path.join(run_dir, "results.md"), "w", encoding="utf-8") as handle:
            handle.write("\n".join(parts))
        with open(os.path.join(run_dir, "run.json"), "w", encoding="utf-8") as handle:
            json.dump({"record": record, "rows": [row_dict(row) for row in found], "comparison": compared,
                       "needle": params["needle"], "headline": headlines}, handle, indent=2, sort_keys=True)
        files += [os.path.join(run_dir, "results.md"), os.path.join(run_dir, "run.json")]
    return {"table": results, "comparison": compared, "headline": headlines, "files": files}


def row_dict(row):
    return {"test": row.test, "kind": row.kind, "prompt": row.prompt, "response": row.response, "depth": row.depth,
            "concurrency": row.concurrency,
            "values": {k: ({"mean": v.mean, "std": v.std} if v else None) for k, v in row.values.items()}}


def recorded(run_dir):
    path = os.path.join(run_dir, "run.json")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle).get("record", {})
    except (OSError, ValueError):
        return {}


def compare(module, params):
    first_dir, second_dir = params["compare_to"], params["run_dir"]
    first = rows(load_raw(os.path.join(first_dir, "llama-benchy.json")))
    second = rows(load_raw(os.path.join(second_dir, "llama-benchy.json")))
    names = (os.path.basename(os.path.normpath(first_dir)), os.path.basename(os.path.normpath(second_dir)))
    text = side_by_side_table(side_by_side(first, second), *names)
    changed = differences(recorded(first_dir), recorded(second_dir))
    settings = table(["setting", names[0], names[1]], ([key, json.dumps(a), json.dumps(b)] for key, a, b in changed)
                     ) if changed else "Every recorded setting is the same in both runs."
    page = "\n".join([f"# {names[0]} and {names[1]}", "", text, "", "## What differs", "", settings, ""])
    files = []
    if not module.check_mode:
        path = os.path.join(second_dir, "compare.md")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(page)
        files.append(path)
    return {"table": text, "files": files, "differences": [{"setting": k, "first": a, "second": b}
                                                           for k, a, b in changed]}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            record=dict(type="dict", default={}),
            published=dict(type="list", elements="dict", default=[]),
            needle=dict(type="dict"),
            headline=dict(type="dict"),
            compare_to=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = compare(module, params) if params["compare_to"] else report(module, params)
    except BenchError as err:
        module.fail_json(msg=err.line())
    except ImportError as err:
        module.fail_json(msg=line(f"{err} in the interpreter that runs this", "matplotlib (the benchmark's "
                                  "virtualenv)", "run it through bench.yml, which makes that virtualenv"))
    module.exit_json(changed=bool(result["files"]), **result)


if __name__ == "__main__":
    main()
