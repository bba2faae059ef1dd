# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Benchmarks of a serving group: the grid a profile asks for, llama-benchy's results read back as rows, the
Markdown tables of a run, the comparison with published figures and with another run, and the long-context
retrieval check (a needle in a generated haystack).

llama-benchy measures; this module only lays out what it measured. Stdlib only: the plots, which need matplotlib,
are drawn by the bench_report module in the benchmark's own virtualenv.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import SparkfleetError

# The grid's keys: llama-benchy's options of the same names (--runs is one number, the others lists).
GRID_LISTS = ("pp", "tg", "depth", "concurrency")
GRID_KEYS = (*GRID_LISTS, "runs")
# The metrics a published figure or a plot can name, and the llama-benchy value each one reads.
METRICS = {"prefill": "t_s", "decode": "t_s", "ttft": "e2e_ttft"}


class BenchError(SparkfleetError):
    """A benchmark that cannot run or cannot be read: what was found, what was expected, what to do."""


# ---- the grid -------------------------------------------------------------------------------------------------


def _positive_ints(value: Any, allow_zero: bool = False) -> bool:
    low = 0 if allow_zero else 1
    return (isinstance(value, list) and bool(value)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= low for v in value))


def grid_problems(grid: Any, max_model_len: int | None = None) -> list[str]:
    """What is wrong with one grid (empty when it can run): every key there and well-formed, and the longest
    request (deepest context + longest prompt + longest answer) within the served max_model_len."""
    if not isinstance(grid, Mapping):
        return [f"a {type(grid).__name__} instead of a mapping of {', '.join(GRID_KEYS)}"]
    problems = []
    unknown = sorted(set(grid) - set(GRID_KEYS))
    if unknown:
        problems.append(f"unknown key(s) {', '.join(map(str, unknown))} (the keys are {', '.join(GRID_KEYS)})")
    for key in GRID_LISTS:
        if key not in grid:
            problems.append(f"no {key}")
        elif not _positive_ints(grid[key], allow_zero=key == "depth"):
            kind = "non-negative" if key == "depth" else "positive"
            problems.append(f"{key}={grid[key]!r} (a non-empty list of {kind} whole numbers)")
    runs = grid.get("runs")
    if not (isinstance(runs, int) and not isinstance(runs, bool) and runs >= 1):
        problems.append(f"runs={runs!r} (a whole number of at least 1)")
    if not problems and max_model_len:
        longest = max(grid["depth"]) + max(grid["pp"]) + max(grid["tg"])
        if longest > max_model_len:
            problems.append(f"a longest request of {longest:,} tokens (depth {max(grid['depth']):,} + pp "
                            f"{max(grid['pp']):,} + tg {max(grid['tg']):,}) over max_model_len {max_model_len:,}")
    return problems


def grid_of(profile: Mapping, name: str, override: Any = None) -> dict:
    """The named grid of a profile's `bench.grids` (or the override, a grid given in full), checked against the
    profile's max_model_len; a BenchError names what is wrong."""
    grids = (profile.get("bench") or {}).get("grids") or {}
    if override:
        grid, where = override, "bench_grid"
    elif name in grids:
        grid, where = grids[name], f"the profile's bench.grids.{name}"
    else:
        raise BenchError(f"no grid {name!r} in profile {profile.get('name')}",
                         f"one of {', '.join(sorted(grids)) or 'the grids a profile names under bench.grids'}",
                         "choose another bench_grid_name, or give bench_grid in full", key="bench_grid_name")
    problems = grid_problems(grid, profile.get("max_model_len"))
    if problems:
        raise BenchError(f"{'; '.join(problems)} in {where}",
                         "pp, tg, depth and concurrency (lists) and runs, the longest request within max_model_len",
                         "correct the grid", key="bench_grid")
    return {key: grid[key] for key in GRID_KEYS}


NEEDLE_ANSWER_TOKENS = 32
# Room for the chat template around the haystack and the question.
NEEDLE_TEMPLATE_TOKENS = 16


def needle_of(profile: Mapping) -> dict | None:
    """The profile's bench.needle ({tokens: [...], judge: answer|placement}) checked, or None without one: every
    length leaves room for the answer within max_model_len."""
    needle = (profile.get("bench") or {}).get("needle")
    if not needle:
        return None
    where = f"the profile's bench.needle ({profile.get('name')})"
    tokens, judge = needle.get("tokens") if isinstance(needle, Mapping) else None, None
    if isinstance(needle, Mapping):
        judge = needle.get("judge", "answer")
    longest = (profile.get("max_model_len") or 0) - NEEDLE_ANSWER_TOKENS - NEEDLE_TEMPLATE_TOKENS
    if not _positive_ints(tokens) or judge not in ("answer", "placement") or max(tokens) > longest:
        raise BenchError(f"{needle!r} in {where}",
                         f"tokens: a list of lengths of at most {longest:,} (max_model_len less room for the "
                         "answer), judge: answer or placement", "correct the profile", key="bench.needle")
    return {"tokens": list(tokens), "judge": judge}


def grid_points(grid: Mapping) -> int:
    """How many tests llama-benchy runs for a grid (each of them `runs` times)."""
    return math.prod(len(grid[key]) for key in GRID_LISTS)


def llama_benchy_argv(grid: Mapping, base_url: str, model: str, tokenizer: str, book_url: str, result: str,
                      progress: str) -> list[str]:
    """llama-benchy's arguments for a grid, without the API key (the caller hands that over out of argv).
    Generation latency mode (prefill speeds closest to the server's own), the prompt adapted to the chat
    template, results as JSON, and its progress events as JSON lines."""
    argv = ["--base-url", base_url, "--model", model, "--served-model-name", model, "--tokenizer", tokenizer,
            "--book-url", book_url, "--latency-mode", "generation", "--format", "json", "--save-result", result,
            "--emit-progress", progress, "--runs", str(grid["runs"]), "--exit-on-first-fail"]
    for key in GRID_LISTS:
        argv += [f"--{key}", *(str(value) for value in grid[key])]
    return argv


# ---- llama-benchy's results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    mean: float
    std: float

    def text(self) -> str:
        """As llama-benchy prints it."""
        return f"{self.mean:.2f} ± {self.std:.2f}"


@dataclass(frozen=True)
class Row:
    """One line of llama-benchy's table: a prefill (pp) or decode (tg) test at a depth and concurrency."""

    test: str
    kind: str  # "prefill" or "decode"
    prompt: int
    response: int
    depth: int
    concurrency: int
    values: Mapping[str, Metric | None] = field(default_factory=dict)

    def value(self, metric: str) -> Metric | None:
        return self.values.get(METRICS.get(metric, metric))


def _metric(value: Any) -> Metric | None:
    if not isinstance(value, Mapping) or value.get("mean") is None:
        return None
    return Metric(float(value["mean"]), float(value.get("std") or 0.0))


def rows(raw: Mapping) -> list[Row]:
    """llama-benchy's JSON (its --format json) as the rows of its own Markdown table, in its order and with its
    test names (a concurrency suffix only when the suite ran more than one level)."""
    runs = raw.get("benchmarks")
    if not isinstance(runs, list):
        raise BenchError("a result without a benchmarks list", "llama-benchy's --format json result",
                         "run the benchmark again")
    several = int(raw.get("max_concurrency") or 1) > 1
    found = []
    for run in runs:
        depth, concurrency = int(run["context_size"]), int(run["concurrency"])
        ctx = run.get("is_context_prefill_phase")
        suffix = (f" @ d{depth}" if depth > 0 or ctx else "") + (f" (c{concurrency})" if several else "")
        pp_name = f"ctx_pp{suffix}" if ctx else f"pp{run['prompt_size']}{suffix}"
        tg_name = f"ctx_tg{suffix}" if ctx else f"tg{run['response_size']}{suffix}"
        common = {"prompt": int(run["prompt_size"]), "response": int(run["response_size"]), "depth": depth,
                  "concurrency": concurrency}
        if _metric(run.get("pp_throughput")):
            found.append(Row(pp_name, "prefill", values={
                "t_s": _metric(run.get("pp_throughput")), "t_s_req": _metric(run.get("pp_req_throughput")),
                "ttfr": _metric(run.get("ttfr")), "est_ppt": _metric(run.get("est_ppt")),
                "e2e_ttft": _metric(run.get("e2e_ttft"))}, **common))
        if _metric(run.get("tg_throughput")) or _metric(run.get("peak_throughput")):
            found.append(Row(tg_name, "decode", values={
                "t_s": _metric(run.get("tg_throughput")), "t_s_req": _metric(run.get("tg_req_throughput")),
                "peak_ts": _metric(run.get("peak_throughput")),
                "peak_ts_req": _metric(run.get("peak_req_throughput"))}, **common))
    return found


def load_raw(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError) as err:
        raise BenchError(f"{path} unreadable ({err})", "llama-benchy's JSON result",
                         "run the benchmark again") from None
    if not isinstance(raw, dict):
        raise BenchError(f"{path} holding a {type(raw).__name__}", "llama-benchy's JSON result (a mapping)",
                         "run the benchmark again")
    return raw


# ---- tables ---------------------------------------------------------------------------------------------------


def table(header: list[str], body: Iterable[list[str]], right: Iterable[int] = ()) -> str:
    """A Markdown pipe table (columns in `right` right-aligned)."""
    right = set(right)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if i in right else ":---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |" for line in body]
    return "\n".join(lines)


def results_table(found: list[Row], several: bool) -> str:
    """llama-benchy's own columns: t/s (total and per request when the suite ran several levels), peak t/s,
    time to first response, estimated prompt processing time and end-to-end time to first token (ms)."""
    def cell(row: Row, key: str) -> str:
        metric = row.values.get(key)
        return metric.text() if metric else ""
    if several:
        header = ["test", "t/s (total)", "t/s (req)", "peak t/s", "peak t/s (req)", "ttfr (ms)", "est_ppt (ms)",
                  "e2e_ttft (ms)"]
        keys = ["t_s", "t_s_req", "peak_ts", "peak_ts_req", "ttfr", "est_ppt", "e2e_ttft"]
    else:
        header = ["test", "t/s", "peak t/s", "ttfr (ms)", "est_ppt (ms)", "e2e_ttft (ms)"]
        keys = ["t_s", "peak_ts", "ttfr", "est_ppt", "e2e_ttft"]
    return table(header, ([row.test, *(cell(row, key) for key in keys)] for row in found),
                 right=range(1, len(header)))


# ---- published figures ----------------------------------------------------------------------------------------


PUBLISHED_FIELDS = ("prompt", "response", "depth", "concurrency")


def published_problems(points: Any) -> list[str]:
    """What is wrong with a profile's list of published points (empty when every one is usable)."""
    if not isinstance(points, list):
        return [f"a {type(points).__name__} instead of a list of points"]
    problems = []
    for index, point in enumerate(points):
        if not isinstance(point, Mapping):
            problems.append(f"point {index + 1}: a {type(point).__name__} instead of a mapping")
            continue
        if point.get("metric") not in METRICS:
            problems.append(f"point {index + 1}: metric={point.get('metric')!r} (one of {', '.join(METRICS)})")
        problems += _value_and_source(point, f"point {index + 1}")
        for key in PUBLISHED_FIELDS:
            if key in point and not (isinstance(point[key], int) and not isinstance(point[key], bool)):
                problems.append(f"point {index + 1}: {key}={point[key]!r} (a whole number)")
    return problems


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _value_and_source(point: Mapping, name: str) -> list[str]:
    """What is wrong with a published point's or figure's value (a number, or [low, high]) and its source."""
    problems = []
    value = point.get("value")
    if not (_is_number(value) or (isinstance(value, list) and len(value) == 2 and all(map(_is_number, value))
                                  and value[0] <= value[1])):
        problems.append(f"{name}: value={value!r} (a number, or [low, high])")
    if not isinstance(point.get("source"), str) or not point["source"].strip():
        problems.append(f"{name}: no source (who published it, where)")
    return problems


def _matches(point: Mapping, row: Row) -> bool:
    if row.kind != ("prefill" if point["metric"] in ("prefill", "ttft") else "decode"):
        return False
    return all(getattr(row, key) == point[key] for key in PUBLISHED_FIELDS if key in point)


def _describe_point(point: Mapping) -> str:
    parts = [point["metric"]]
    names = {"prompt": "pp", "response": "tg", "depth": "d", "concurrency": "c"}
    parts += [f"{names[key]}{point[key]}" for key in PUBLISHED_FIELDS if key in point]
    return " ".join(parts)


def _number_text(value: float) -> str:
    if abs(value) >= 1000 and float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.1f}"


def comparison(found: list[Row], points: list[Mapping]) -> list[dict]:
    """Each published point beside what this run measured at the same test (prompt, answer, depth and
    concurrency where the point names them): the measured mean, the published value or range and the ratio
    (measured over the published value, or over the middle of the range). A point no test of the grid matches
    is listed as not measured."""
    compared = []
    for point in points:
        value = point["value"]
        low, high = (value, value) if _is_number(value) else value
        middle = (low + high) / 2
        matched = [row for row in found if _matches(point, row) and row.value(point["metric"])]
        base = {"point": _describe_point(point), "published": _number_text(low) if low == high else
                f"{_number_text(low)}-{_number_text(high)}", "low": low, "high": high,
                "source": point["source"].strip(),
                "note": point.get("note", "")}
        if not matched:
            compared.append(dict(base, test="", measured=None, ratio=None, within=None))
        for row in matched:
            measured = row.value(point["metric"]).mean
            compared.append(dict(base, test=label(row), measured=measured,
                                 ratio=measured / middle if middle else None, within=low <= measured <= high))
    return compared


def _ratio_text(item: Mapping) -> str:
    """The ratio cell: measured over the published value; against a range, also where the measurement falls."""
    ratio = f"{item['ratio']:.2f}x" if item["ratio"] is not None else ""
    if item["low"] == item["high"]:
        return ratio
    where = ("within" if item["within"] else "below" if item["measured"] < item["low"] else "above")
    return f"{ratio} ({where} the range)".strip()


def comparison_table(compared: list[dict]) -> str:
    def line(item: dict) -> list[str]:
        if item["measured"] is None:
            return [item["point"], "", item["published"], "not measured by this grid", item["source"]]
        return [f"{item['point']} ({item['test']})", _number_text(item["measured"]), item["published"],
                _ratio_text(item), item["source"]]
    return table(["published point (this run's test)", "measured", "published", "ratio", "source"],
                 (line(item) for item in compared), right=(1, 2, 3))


# ---- the headline figures (validate.yml) ----------------------------------------------------------------------

# figure -> (what it is, unit)
HEADLINE = {
    "kv_pool_tokens": ("KV pool (tokens)", ""),
    "decode_c1": ("decode, one stream, no context (tok/s)", ""),
    "prefill_c1": ("prefill, one stream, no context (tok/s)", ""),
    "allreduce_us": ("all-reduce latency (us)", ""),
    "bus_bandwidth_gbs": ("NCCL all-reduce bus bandwidth (GB/s)", ""),
}


def headline_problems(points: Any) -> list[str]:
    if not isinstance(points, list):
        return [f"a {type(points).__name__} instead of a list of figures"]
    problems = []
    for index, point in enumerate(points):
        if not isinstance(point, Mapping) or point.get("figure") not in HEADLINE:
            problems.append(f"figure {index + 1}: {point!r} (figure one of {', '.join(HEADLINE)})")
            continue
        problems += _value_and_source(point, f"figure {index + 1}")
        if point["figure"] == "allreduce_us" and not isinstance(point.get("size_bytes"), int):
            problems.append(f"figure {index + 1}: an all-reduce latency without size_bytes")
    return problems


def measured_headline(found: list[Row], pool_tokens: int | None, nccl: Mapping[str, Any]) -> dict:
    """What this run measured of the headline figures, each with why it is missing where it is: the pool the
    verification found, the one-stream decode and prefill at no context (the largest prompt's prefill), and the
    slowest node's NCCL probe record (latency by message size, bus bandwidth)."""
    measured: dict[str, Any] = {}
    missing: dict[str, str] = {}
    if pool_tokens:
        measured["kv_pool_tokens"] = pool_tokens
    else:
        missing["kv_pool_tokens"] = "the verification found no pool"
    single = [row for row in found if row.concurrency == 1 and row.depth == 0 and row.value("t_s")]
    decode = [row for row in single if row.kind == "decode"]
    prefill = sorted((row for row in single if row.kind == "prefill"), key=lambda row: row.prompt)
    for key, rows_ in (("decode_c1", decode), ("prefill_c1", prefill[-1:])):
        if rows_:
            measured[key] = rows_[0].value("t_s").mean
        else:
            missing[key] = "the grid has no test at concurrency 1 and depth 0"
    records = [record for record in nccl.values() if isinstance(record, Mapping) and record.get("latency_us")]
    if records:
        latency: dict[int, float] = {}
        for record in records:
            for size, micros in record["latency_us"].items():
                latency[int(size)] = max(latency.get(int(size), 0.0), float(micros))
        measured["allreduce_us"] = latency
        bandwidth = [float(r["bus_bandwidth_gbs"]) for r in records if r.get("bus_bandwidth_gbs") is not None]
        if bandwidth:
            measured["bus_bandwidth_gbs"] = min(bandwidth)
    else:
        why = "no NCCL probe record on any node (the probe runs on NVIDIA nodes, in the fabric stage)"
        missing["allreduce_us"] = missing["bus_bandwidth_gbs"] = why
    return {"measured": measured, "missing": missing}


def headline(found: dict, points: list[Mapping]) -> list[dict]:
    """Each published headline figure beside what was measured (or why nothing was), with the ratio."""
    lines = []
    for point in points:
        figure = point["figure"]
        what = HEADLINE[figure][0] + (f", {point['size_bytes']:,} B" if figure == "allreduce_us" else "")
        value = point["value"]
        low, high = (value, value) if _is_number(value) else value
        published = _number_text(low) if low == high else f"{_number_text(low)}-{_number_text(high)}"
        measured = found["measured"].get(figure)
        if figure == "allreduce_us" and isinstance(measured, Mapping):
            measured = measured.get(point["size_bytes"])
            why = f"the probe measured no {point['size_bytes']:,} B all-reduce" if measured is None else ""
        else:
            why = found["missing"].get(figure, "")
        line = {"figure": what, "published": published, "source": point["source"].strip(), "measured": measured,
                "ratio": None, "within": None, "why": why, "low": low, "high": high}
        if measured is not None:
            middle = (low + high) / 2
            line.update(ratio=measured / middle if middle else None, within=low <= measured <= high)
        lines.append(line)
    return lines


def headline_table(lines: list[dict]) -> str:
    def cells(line: dict) -> list[str]:
        if line["measured"] is None:
            return [line["figure"], "", line["published"], f"not measured: {line['why']}", line["source"]]
        return [line["figure"], _number_text(line["measured"]), line["published"], _ratio_text(line),
                line["source"]]
    return table(["figure", "measured", "published", "ratio", "source"], (cells(line) for line in lines),
                 right=(1, 2, 3))


# ---- two runs side by side ------------------------------------------------------------------------------------


def label(row: Row) -> str:
    """A row's name, unique within a run: llama-benchy's test name, and for a decode row the prompt it followed
    (two decode tests of one grid can share a name, tg128 after pp2048 and after pp8192)."""
    return row.test + (f" after pp{row.prompt}" if row.kind == "decode" else "")


def _identity(row: Row) -> tuple:
    return (row.kind, row.prompt, row.response, row.depth, row.concurrency)


def side_by_side(first: list[Row], second: list[Row]) -> list[dict]:
    """The tests both runs measured (the same kind, prompt, answer, depth and concurrency), each one's mean t/s
    and the second's ratio to the first; then the tests only one of them ran."""
    by_test = {_identity(row): row for row in second}
    lines = []
    for row in first:
        other = by_test.pop(_identity(row), None)
        a, b = row.value("t_s"), other.value("t_s") if other else None
        lines.append({"test": label(row), "first": a.mean if a else None, "second": b.mean if b else None,
                      "ratio": b.mean / a.mean if a and b and a.mean else None})
    lines += [{"test": label(row), "first": None, "second": row.value("t_s").mean if row.value("t_s") else None,
               "ratio": None} for row in by_test.values()]
    return lines


def side_by_side_table(lines: list[dict], first: str, second: str) -> str:
    def text(value: float | None) -> str:
        return "" if value is None else _number_text(value)
    return table(["test (t/s)", first, second, "second / first"],
                 ([line["test"], text(line["first"]), text(line["second"]),
                   f"{line['ratio']:.2f}x" if line["ratio"] is not None else "not in both"] for line in lines),
                 right=(1, 2, 3))


def differences(first: Mapping, second: Mapping, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """The keys where two runs' records differ (nested mappings flattened to dotted keys), sorted."""
    found = []
    for key in sorted(set(first) | set(second)):
        a, b = first.get(key), second.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            found += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append((f"{prefix}{key}", a, b))
    return found


# ---- the corpus -----------------------------------------------------------------------------------------------


def docstring_corpus(root: str, limit_bytes: int = 4 << 20) -> str:
    """English prose the controller already has, for prompts with no download: the docstrings of the Python
    standard library under root (read with ast, nothing imported), paragraphs of at least three sentences, in
    file order, up to limit_bytes. The same Python gives the same text."""
    import ast  # pylint: disable=import-outside-toplevel
    paragraphs, size = [], 0
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("test", "tests", "idlelib", "site-packages",
                                                            "dist-packages", "__pycache__"))
        for name in sorted(f for f in files if f.endswith(".py")):
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as handle:
                    tree = ast.parse(handle.read())
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
                continue
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                text = ast.get_docstring(node) or ""
                for paragraph in text.split("\n\n"):
                    flat = " ".join(paragraph.split())
                    if flat.count(". ") >= 2 and not flat.startswith((">>>", "..", "-", "*")):
                        paragraphs.append(flat)
                        size += len(flat) + 2
                        if size >= limit_bytes:
                            return "\n\n".join(paragraphs) + "\n"
    return "\n\n".join(paragraphs) + "\n"


# ---- the needle -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Haystack:
    text: str
    needle: str
    passphrase: str
    question: str


def haystack(corpus: str, count_tokens, tokens: int, fraction: float, seed: int, nonce: str = "") -> Haystack:
    """A haystack of about `tokens` tokens of the corpus's sentences (as counted by count_tokens, the served
    model's own tokenizer) with one needle sentence at `fraction` of the way in, and the question that asks for
    it. The passphrase is two random words and a number, so that no model can guess it. The text opens with the
    nonce, so that no two haystacks share a prefix (vLLM's prefix cache would make the longer one look fast)."""
    rng = random.Random(seed)
    sentences = [s.strip() + "." for s in corpus.replace("\n", " ").split(".") if len(s.split()) >= 4]
    if not sentences:
        raise BenchError("a corpus without sentences", "a text of sentences (the benchmark's corpus)",
                         "give bench_corpus a plain-text file")
    words = sorted({w.strip(",;:!?\"'()").lower() for s in sentences for w in s.split() if w.isalpha()})
    passphrase = f"{rng.choice(words)}-{rng.choice(words)}-{rng.randrange(1000, 9999)}"
    needle = f" The secret passphrase is {passphrase}. Remember it. "
    question = "What is the secret passphrase given in the text above? Answer with the passphrase only."
    opening = f"Record {nonce}. " if nonce else ""
    budget = tokens - count_tokens(needle) - count_tokens(question) - count_tokens(opening)
    if budget <= 0:
        raise BenchError(f"a haystack of {tokens:,} tokens", "more tokens than the needle and the question take",
                         "raise the needle's depth", key="bench_needle")
    parts, used, index = [], 0, 0
    while True:
        sentence = sentences[index % len(sentences)]
        cost = count_tokens(" " + sentence)
        if used + cost > budget:
            break
        parts.append(sentence)
        used += cost
        index += 1
    cut = round(len(parts) * fraction)
    text = opening + " ".join(parts[:cut]) + needle + " ".join(parts[cut:])
    return Haystack(text=text, needle=needle.strip(), passphrase=passphrase, question=question)


def find_subsequence(haystack_ids: list[int], needle_ids: list[int]) -> int:
    """Where needle_ids first occurs in haystack_ids, or -1."""
    if not needle_ids:
        return -1
    first = needle_ids[0]
    for start in range(len(haystack_ids) - len(needle_ids) + 1):
        if haystack_ids[start] == first and haystack_ids[start:start + len(needle_ids)] == needle_ids:
            return start
    return -1


def run_directory(base: str, cluster: str, stamp: str) -> str:
    """bench/<cluster>/<UTC timestamp>/ under the base directory."""
    return os.path.join(base, cluster, stamp)
