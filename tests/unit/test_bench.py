"""module_utils/bench.py: the grid a profile asks for (refused with the key and the limit it breaks), llama-benchy's
JSON read back as its own table's rows, the published figures matched to the tests that measured them, two runs
side by side, the needle's haystack and the controller's own corpus; and the bench filters' one-line refusals."""

import json
import os
import sysconfig

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from conftest import ROOT

from ansible_collections.sparkfleet.cluster.plugins.filter.bench import (
    bench_grid,
    bench_headline,
    bench_needle,
    bench_published,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils import bench
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import profiles

# A llama-benchy 0.4.0 result (--format json) of the lab's quick grid against the tiny model, as it wrote it.
RAW = os.path.join(ROOT, "tests/unit/data/bench/llama-benchy-tiny-quick.json")
PROFILES = [os.path.join(ROOT, "profiles")]


def profile(name):
    return profiles.load(name, PROFILES)


# ---- the grid -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny-cpu", "glm-5.3-flash-nvfp4-tp2", "glm-5.3-flash-nvfp4-tp3",
                                  "glm-5.3-flash-fp8-tp4"])
def test_every_shipped_profile_has_a_quick_and_a_full_grid_that_fit_its_context(name):
    loaded = profile(name)
    for grid_name in ("quick", "full"):
        grid = bench.grid_of(loaded, grid_name)
        assert bench.grid_points(grid) >= 1
        assert max(grid["depth"]) + max(grid["pp"]) + max(grid["tg"]) <= loaded["max_model_len"]
    assert bench.needle_of(loaded)["judge"] == ("placement" if name == "tiny-cpu" else "answer")


def test_the_tp3_full_grid_is_the_recipes_published_one():
    grid = bench.grid_of(profile("glm-5.3-flash-nvfp4-tp3"), "full")
    assert grid["pp"] == [2048] and grid["tg"] == [512] and grid["depth"] == [6144, 63488, 161792]
    assert grid["concurrency"] == [1, 2, 3]
    assert 471813 in bench.needle_of(profile("glm-5.3-flash-nvfp4-tp3"))["tokens"]


@pytest.mark.parametrize(("grid", "found"), [
    ({"pp": [64], "tg": [16], "depth": [0, 480], "concurrency": [1], "runs": 1},
     "a longest request of 560 tokens (depth 480 + pp 64 + tg 16) over max_model_len 512"),
    ({"pp": [64], "tg": [16], "depth": [0], "concurrency": [0], "runs": 1}, "concurrency=[0]"),
    ({"pp": [64], "tg": [16], "depth": [-1], "concurrency": [1], "runs": 1}, "depth=[-1]"),
    ({"pp": [64], "tg": [16], "depth": [0], "concurrency": [1], "runs": 0}, "runs=0"),
    ({"pp": 64, "tg": [16], "depth": [0], "concurrency": [1], "runs": 1}, "pp=64"),
    ({"pp": [64], "tg": [True], "depth": [0], "concurrency": [1], "runs": 1}, "tg=[True]"),
    ({"tg": [16], "depth": [0], "concurrency": [1], "runs": 1, "speed": "fast"}, "unknown key(s) speed"),
])
def test_a_bad_grid_is_refused_with_the_key_and_what_it_breaks(grid, found):
    with pytest.raises(AnsibleFilterError) as refused:
        bench_grid(profile("tiny-cpu"), "quick", grid)
    message = str(refused.value)
    assert message.startswith("bench_grid: found ") and found in message, message
    assert "expected pp, tg, depth and concurrency (lists) and runs" in message and "fix: correct the grid" in message


def test_an_unknown_grid_name_lists_the_profiles_grids():
    with pytest.raises(AnsibleFilterError, match=r"bench_grid_name: found no grid 'huge' in profile tiny-cpu; "
                                                 r"expected one of full, quick"):
        bench_grid(profile("tiny-cpu"), "huge")


def test_the_override_replaces_the_named_grid():
    grid = {"pp": [32], "tg": [8], "depth": [0], "concurrency": [1, 2, 3], "runs": 2}
    assert bench_grid(profile("tiny-cpu"), "quick", grid) == grid
    assert bench_grid(profile("tiny-cpu"), "quick", {}) == bench.grid_of(profile("tiny-cpu"), "quick")


def test_llama_benchy_gets_every_grid_value_and_no_key():
    grid = {"pp": [64, 128], "tg": [16], "depth": [0, 128], "concurrency": [1, 2], "runs": 3}
    argv = bench.llama_benchy_argv(grid, "http://h:8888/v1", "tiny", "/t", "http://127.0.0.1:1/c.txt", "/r.json",
                                   "/p.jsonl")
    assert argv[argv.index("--pp") + 1:argv.index("--pp") + 3] == ["64", "128"]
    assert argv[argv.index("--concurrency") + 1:argv.index("--concurrency") + 3] == ["1", "2"]
    assert argv[argv.index("--runs") + 1] == "3" and argv[argv.index("--format") + 1] == "json"
    assert argv[argv.index("--latency-mode") + 1] == "generation"
    assert "--api-key" not in argv
    assert bench.grid_points(grid) == 8


def test_a_needle_longer_than_the_context_allows_is_refused():
    tiny = dict(profile("tiny-cpu"), bench={"needle": {"tokens": [500], "judge": "placement"}})
    with pytest.raises(AnsibleFilterError, match=r"bench.needle: found .* expected tokens: a list of lengths of at "
                                                 r"most 464 \(max_model_len less room for the answer\)"):
        bench_needle(tiny)
    assert bench_needle(dict(tiny, bench={})) is None


# ---- llama-benchy's result ------------------------------------------------------------------------------------


def test_the_result_reads_back_as_llama_benchys_own_rows():
    raw = bench.load_raw(RAW)
    found = bench.rows(raw)
    grid = bench.grid_of(profile("tiny-cpu"), "quick")
    # one prefill and one decode row per test, in llama-benchy's order (depth, pp, tg, concurrency)
    assert len(found) == 2 * bench.grid_points(grid)
    assert [row.test for row in found[:4]] == ["pp64 (c1)", "tg16 (c1)", "pp64 (c2)", "tg16 (c2)"]
    assert found[-1].test == "tg16 @ d128 (c2)" and found[-1].depth == 128 and found[-1].concurrency == 2
    for row, run in zip(found[::2], raw["benchmarks"], strict=True):
        assert row.kind == "prefill" and row.values["t_s"].mean == run["pp_throughput"]["mean"]
        assert row.values["e2e_ttft"].mean == run["e2e_ttft"]["mean"]
    for row, run in zip(found[1::2], raw["benchmarks"], strict=True):
        assert row.kind == "decode" and row.values["t_s"].mean == run["tg_throughput"]["mean"]
        assert row.values["t_s"].text() == f"{run['tg_throughput']['mean']:.2f} ± {run['tg_throughput']['std']:.2f}"


def test_the_table_has_llama_benchys_columns_and_values():
    raw = bench.load_raw(RAW)
    text = bench.results_table(bench.rows(raw), several=True)
    lines = text.splitlines()
    assert lines[0] == ("| test | t/s (total) | t/s (req) | peak t/s | peak t/s (req) | ttfr (ms) | est_ppt (ms) "
                        "| e2e_ttft (ms) |")
    first = raw["benchmarks"][0]
    assert lines[2].startswith(f"| pp64 (c1) | {first['pp_throughput']['mean']:.2f} ± ")
    single = bench.results_table(bench.rows(dict(raw, max_concurrency=1)), several=False)
    assert single.splitlines()[0] == "| test | t/s | peak t/s | ttfr (ms) | est_ppt (ms) | e2e_ttft (ms) |"
    assert "| pp64 |" in single  # no concurrency suffix when the suite ran one level


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"no": "benchmarks"}'])
def test_an_unreadable_result_is_one_line(tmp_path, content):
    path = tmp_path / "llama-benchy.json"
    path.write_text(content)
    with pytest.raises(bench.BenchError, match=r"found .*; expected llama-benchy's"):
        bench.rows(bench.load_raw(str(path)))


# ---- published figures ----------------------------------------------------------------------------------------


def row(test, kind, prompt=64, depth=0, concurrency=1, mean=10.0, key="t_s"):
    return bench.Row(test, kind, prompt, 16, depth, concurrency, {key: bench.Metric(mean, 0.5)})


def test_each_published_point_meets_the_tests_that_measured_it():
    found = [row("pp2048", "prefill", prompt=2048, mean=700.0), row("tg128", "decode", prompt=2048, mean=22.0),
             row("pp2048 @ d8192", "prefill", prompt=2048, depth=8192, mean=600.0)]
    points = [{"metric": "decode", "value": 22.67, "prompt": 2048, "depth": 0, "concurrency": 1, "source": "a"},
              {"metric": "prefill", "value": [680, 705], "depth": 0, "source": "b"},
              {"metric": "prefill", "value": 591.2, "concurrency": 4, "source": "c"}]
    compared = bench.comparison(found, points)
    assert [(c["test"], c["within"]) for c in compared] == [("tg128 after pp2048", False), ("pp2048", True), ("", None)]
    assert compared[0]["ratio"] == pytest.approx(22.0 / 22.67)
    assert compared[1]["ratio"] == pytest.approx(700.0 / 692.5) and compared[1]["published"] == "680.0-705.0"
    text = bench.comparison_table(compared)
    assert "| decode pp2048 d0 c1 (tg128 after pp2048) | 22.00 | 22.67 | 0.97x | a |" in text
    assert "(within the range)" in text and "| prefill c4 |  | 591.2 | not measured by this grid | c |" in text
    low, high = ({"metric": "prefill", "value": [710, 800], "depth": 0, "source": "d"},
                 {"metric": "prefill", "value": [600, 650], "depth": 0, "source": "e"})
    text = bench.comparison_table(bench.comparison(found, [low, high]))
    assert "| 700.0 | 710.0-800.0 | 0.93x (below the range) | d |" in text
    assert "| 700.0 | 600.0-650.0 | 1.12x (above the range) | e |" in text


def test_the_shipped_published_figures_are_well_formed_and_name_their_source():
    with open(os.path.join(ROOT, "roles/bench/files/published.yml"), encoding="utf-8") as handle:
        figures = yaml.safe_load(handle)
    for name, points in figures.items():
        assert os.path.isfile(os.path.join(ROOT, "profiles", f"{name}.yml")), name
        assert bench_published(figures, name) == points and points
    assert bench_published(figures, "tiny-cpu") == []


@pytest.mark.parametrize(("point", "found"), [
    ({"metric": "speed", "value": 1, "source": "x"}, "metric='speed'"),
    ({"metric": "decode", "value": [5, 1], "source": "x"}, "value=[5, 1]"),
    ({"metric": "decode", "value": 1}, "no source"),
    ({"metric": "decode", "value": 1, "source": "x", "depth": "deep"}, "depth='deep'"),
])
def test_a_malformed_published_point_is_refused_by_number(point, found):
    with pytest.raises(AnsibleFilterError) as refused:
        bench_published({"tiny-cpu": [point]}, "tiny-cpu", "my.yml")
    assert f"bench_published_file: found point 1: {found}" in str(refused.value)
    assert "for tiny-cpu in my.yml" in str(refused.value)


# ---- two runs side by side ------------------------------------------------------------------------------------


def test_two_runs_side_by_side_and_what_differs():
    first = [row("pp64", "prefill", mean=100.0), row("tg16", "decode", mean=20.0)]
    second = [row("pp64", "prefill", mean=150.0), bench.Row("tg32", "decode", 64, 32, 0, 1,
                                                            {"t_s": bench.Metric(30.0, 0.0)})]
    lines = bench.side_by_side(first, second)
    assert [(line["test"], line["ratio"]) for line in lines] == \
        [("pp64", 1.5), ("tg16 after pp64", None), ("tg32 after pp64", None)]
    text = bench.side_by_side_table(lines, "a", "b")
    assert "| pp64 | 100.0 | 150.0 | 1.50x |" in text and "| tg16 after pp64 | 20.00 |  | not in both |" in text


def test_a_grids_decode_tests_that_share_a_name_are_each_put_beside_their_own():
    # the quick grid's two prompts give two "tg16 (c1)" rows (after pp64 and after pp128), and so on
    found = bench.rows(bench.load_raw(RAW))
    doubled = [bench.Row(r.test, r.kind, r.prompt, r.response, r.depth, r.concurrency,
                         {k: bench.Metric(v.mean * (2 if r.prompt == 64 else 3), v.std) if v else None
                          for k, v in r.values.items()}) for r in found]
    lines = bench.side_by_side(found, doubled)
    assert len(lines) == len(found) and all(line["ratio"] is not None for line in lines)
    for line, r in zip(lines, found, strict=True):
        assert line["ratio"] == pytest.approx(2 if r.prompt == 64 else 3), line
    assert len({line["test"] for line in lines}) == len(lines)  # every label names one test
    assert all(line["ratio"] == pytest.approx(1) for line in bench.side_by_side(found, found))
    assert bench.differences({"image": "x", "plan": {"pool": 1, "len": 2}}, {"image": "y", "plan": {"pool": 1}}) \
        == [("image", "x", "y"), ("plan.len", 2, None)]


# ---- the needle and the corpus --------------------------------------------------------------------------------


def test_the_haystack_holds_one_needle_where_asked_within_the_budget():
    corpus = " ".join(f"Sentence number {i} tells of nothing in particular at all." for i in range(50))

    def count(text):
        return len(text.split())

    stack = bench.haystack(corpus, count, 400, 0.25, seed=3)
    assert stack.text.count("secret passphrase") == 1 and stack.passphrase in stack.needle
    assert count(stack.text) + count(stack.question) <= 400
    before = stack.text.split(stack.needle)[0]
    assert 0.2 < count(before) / count(stack.text) < 0.3
    assert bench.haystack(corpus, count, 400, 0.25, seed=3) == stack  # the same seed, the same passphrase
    assert bench.haystack(corpus, count, 400, 0.25, seed=4).passphrase != stack.passphrase
    # a nonce opens the text: two haystacks share no prefix for vLLM's cache to reuse
    opened = bench.haystack(corpus, count, 400, 0.25, seed=3, nonce="0123abcd")
    assert opened.text.startswith("Record 0123abcd. ") and count(opened.text) + count(opened.question) <= 400
    with pytest.raises(bench.BenchError, match="found a corpus without sentences"):
        bench.haystack("no", count, 400, 0.5, seed=1)
    assert bench.find_subsequence([5, 1, 2, 3, 1, 2], [1, 2]) == 1
    assert bench.find_subsequence([5, 1, 2], [2, 1]) == -1 and bench.find_subsequence([1], []) == -1


def test_the_controllers_own_corpus_is_prose_and_the_same_each_time():
    stdlib = sysconfig.get_paths()["stdlib"]
    text = bench.docstring_corpus(stdlib, limit_bytes=200_000)
    assert 200_000 <= len(text) < 220_000
    paragraphs = text.split("\n\n")
    assert all(paragraph.count(". ") >= 2 for paragraph in paragraphs)
    assert bench.docstring_corpus(stdlib, limit_bytes=200_000) == text
    assert json.dumps(text)  # plain text


# ---- the headline figures -------------------------------------------------------------------------------------


def test_headline_figures_beside_the_published_ones_or_why_they_are_missing():
    found = [row("pp512", "prefill", prompt=512, mean=650.0), row("pp2048", "prefill", prompt=2048, mean=700.0),
             row("tg128", "decode", prompt=2048, mean=22.0), row("tg128 (c4)", "decode", concurrency=4, mean=40.0)]
    nccl = {"node0": {"latency_us": {"4096": 40.0, "2097152": 300.0}, "bus_bandwidth_gbs": 22.0},
            "node1": {"latency_us": {"4096": 45.5, "2097152": 280.0}, "bus_bandwidth_gbs": 21.0}, "node2": None}
    measured = bench.measured_headline(found, 2_000_000, nccl)
    assert measured["measured"] == {"kv_pool_tokens": 2_000_000, "decode_c1": 22.0, "prefill_c1": 700.0,
                                    "allreduce_us": {4096: 45.5, 2097152: 300.0}, "bus_bandwidth_gbs": 21.0}
    points = [{"figure": "kv_pool_tokens", "value": 2049230, "source": "s1"},
              {"figure": "allreduce_us", "size_bytes": 2097152, "value": [232, 362], "source": "s2"},
              {"figure": "allreduce_us", "size_bytes": 10240, "value": [67, 77], "source": "s3"}]
    lines = bench.headline(measured, points)
    assert lines[0]["ratio"] == pytest.approx(2_000_000 / 2049230) and not lines[0]["within"]
    assert lines[1]["measured"] == 300.0 and lines[1]["within"]
    assert lines[2]["measured"] is None and lines[2]["why"] == "the probe measured no 10,240 B all-reduce"
    text = bench.headline_table(lines)
    assert "| KV pool (tokens) | 2,000,000 | 2,049,230 | 0.98x | s1 |" in text
    assert "| all-reduce latency (us), 2,097,152 B | 300.0 | 232.0-362.0 | 1.01x (within the range) | s2 |" in text
    # the lab: no GPU, so no probe record on any node
    lab = bench.headline(bench.measured_headline(found, 87296, {"node0": None, "node1": None}),
                         [{"figure": "bus_bandwidth_gbs", "value": 21.875, "source": "floor"}])
    assert lab[0]["measured"] is None and lab[0]["why"].startswith("no NCCL probe record on any node")


def test_the_shipped_headline_figures_are_well_formed():
    with open(os.path.join(ROOT, "roles/bench/files/headline.yml"), encoding="utf-8") as handle:
        figures = yaml.safe_load(handle)
    for name in figures:
        assert os.path.isfile(os.path.join(ROOT, "profiles", f"{name}.yml")), name
        assert bench_headline(figures, name)
    with pytest.raises(AnsibleFilterError, match=r"bench_headline_file: found figure 1: .*\(figure one of"):
        bench_headline({"x": [{"figure": "speed", "value": 1, "source": "s"}]}, "x")
    with pytest.raises(AnsibleFilterError, match="an all-reduce latency without size_bytes"):
        bench_headline({"x": [{"figure": "allreduce_us", "value": 1, "source": "s"}]}, "x")
