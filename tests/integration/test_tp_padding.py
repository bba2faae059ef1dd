"""Tensor-parallel padding is exact, on real vLLM servers (the CPU build) on 127.0.0.1: a tiny model whose heads,
KV heads, MLP width and vocabulary do not divide by 3 (profiles/tiny-cpu-padded.yml) gives at TP3, padded through
the roles' own path, the very tokens it gives unpadded at TP1, with logprobs within float rounding; at TP2 it
divides and nothing is padded. Without the group's padding switch the same TP3 start fails instead of serving.

The path is the roles': the planner's arguments (its --hf-overrides and SPARKFLEET_TP_PADDING) rendered by the
vllm_cli_args filter, the padded view of the checkpoint as the weights stage's module writes it, and the loader
seams applied with `python -m sparkfleet_vllm apply --padding` (to a linked copy of the shared CPU vLLM, so the
copy other tests use stays stock). The ranks of a group run on this one machine here; tests/integration/test_tp3.py
serves the same model over three lab nodes. Both run in `make tp3` (minutes of CPU that `make test`'s serving
drills would otherwise share).
"""

import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import tp_proof
import yaml
from conftest import NOTES, ROOT, tiny_model_generator, wait_until
from test_kv_pool import descendants, free_port

from ansible_collections.sparkfleet.cluster.plugins.filter.vllm import vllm_cli_args
from ansible_collections.sparkfleet.cluster.plugins.module_utils import kv_capacity, tp_padding

PROFILE = "tiny-cpu-padded"
BOOT_LIMIT = 600


def profile():
    with open(os.path.join(ROOT, "profiles", f"{PROFILE}.yml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    arch = profile()["architecture"]
    out = tmp_path_factory.mktemp("padded-model") / "snapshot"
    tiny_model_generator().generate(str(out), hidden_size=arch["hidden_size"], layers=arch["num_hidden_layers"],
                                    heads=arch["num_attention_heads"], kv_heads=arch["num_key_value_heads"],
                                    vocab_size=arch["vocab_size"], intermediate_size=arch["intermediate_size"])
    return out


@pytest.fixture(scope="module")
def seamed_vllm(cpu_vllm_python, tmp_path_factory):
    """PYTHONPATH entries that put a copy of the CPU vLLM with the padding seams, and sparkfleet_vllm, first."""
    site = subprocess.run([cpu_vllm_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    overlay = tmp_path_factory.mktemp("seamed-vllm")
    subprocess.run(["cp", "-al", os.path.join(site, "vllm"), str(overlay / "vllm")], check=True)
    files = os.path.join(ROOT, "files")
    argv = [cpu_vllm_python, "-m", "sparkfleet_vllm", "apply", "--padding", "--vllm-dir", str(overlay / "vllm")]
    applied = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=files), check=False)
    assert applied.returncode == 0, applied.stderr
    assert "vLLM 0.32.0" in applied.stdout and "3 seams applied; 3 files written" in applied.stdout
    # apply writes a new file in place of the link: the shared venv's own file is untouched
    assert "sparkfleet:" not in Path(site, "vllm/model_executor/parameter.py").read_text()
    return f"{overlay}{os.pathsep}{files}"


def serve(python, pythonpath, model_dir, tp, env_extra=None, expect_failure=False):
    """Start a group of `tp` ranks on this machine with the planner's arguments for that size; return its greedy
    completions (or, with expect_failure, the log of a start that must not come up)."""
    plan = kv_capacity.plan(profile(), tp)
    args = dict(plan["vllm_args"], port=free_port(), **{"max-model-len": plan["max_model_len"]})
    args.pop("master-port", None)
    if tp > 1:
        args.update({"tensor-parallel-size": tp, "distributed-executor-backend": "mp"})
    work = Path(tempfile.mkdtemp(prefix=f"sf-pad-tp{tp}-", dir="/tmp"))  # short ZeroMQ socket paths
    (work / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", tp_padding.ENV)}
    env.update(profile().get("vllm_env") or {})
    env.update(plan["tp_padding"]["env"])
    env.update(env_extra or {})
    # (the ranks share this machine's one NUMA node: no automatic thread binding, one OpenMP thread each)
    env.update(PYTHONPATH=pythonpath, VLLM_HOST_IP="127.0.0.1", GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1",
               VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1", TMPDIR=str(work / "tmp"),
               VLLM_CACHE_ROOT=str(work / "cache"))
    api_key = secrets.token_hex(8)
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
            "--served-model-name", PROFILE, "--api-key", api_key, *vllm_cli_args(args)]
    log_path = work / "vllm.log"
    url = f"http://127.0.0.1:{args['port']}"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=work,
                                env=env, start_new_session=True)
    family = []

    def up():
        family[:] = sorted(set(family) | set(descendants(proc.pid)))
        if proc.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        wait_until(up, f"vLLM at TP{tp} to answer /health or exit", limit=BOOT_LIMIT, stall=BOOT_LIMIT, poll=1)
        text = log_path.read_text(errors="replace")
        if expect_failure:
            assert proc.poll() not in (None, 0), "the start came up:\n" + text[-3000:]
            return text
        assert proc.poll() is None, f"vLLM at TP{tp} exited {proc.returncode}:\n" + text[-4000:]
        boot = time.monotonic() - started
        answers = tp_proof.greedy(url, PROFILE, api_key)
        NOTES.append(f"tp padding: TP{tp} ({'padded' if plan['tp_padding']['padded'] else 'unpadded'}) up in "
                     f"{boot:.0f} s, {len(answers)} prompts x {tp_proof.MAX_TOKENS} tokens")
        return answers
    finally:
        family[:] = sorted(set(family) | set(descendants(proc.pid)))
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        for pid in family:  # ranks the server started that outlived it (by PID; each boot has its own TMPDIR)
            try:
                if f"TMPDIR={work / 'tmp'}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture(scope="module")
def reference(cpu_vllm_python, seamed_vllm, model):
    return serve(cpu_vllm_python, seamed_vllm, model, 1)


def padded_view(model, tp):
    """The padded view the weights stage's module makes beside a snapshot (here beside the generated model)."""
    split = kv_capacity.plan(profile(), tp)["tp_padding"]
    view = Path(tp_padding.view_dir(str(model.parent), "local", tp))
    text = json.dumps(tp_padding.padded_config(json.loads((model / "config.json").read_text()), split), indent=2)
    tp_padding.sync_view(str(view), tp_padding.view_entries(str(model), str(view), text), "{}\n")
    return view


def test_padded_tp3_gives_the_tokens_and_logprobs_of_unpadded_tp1(cpu_vllm_python, seamed_vllm, model, reference):
    view = padded_view(model, 3)
    config = json.loads((view / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]) == (12, 12, 1008)
    assert json.loads((view / "config.json.orig").read_text())["num_attention_heads"] == 10
    padded = serve(cpu_vllm_python, seamed_vllm, view, 3)
    problems, largest = tp_proof.differences(reference, padded)
    NOTES.append(f"tp padding: TP3 padded vs TP1: {sum(len(a['tokens']) for a in padded)} tokens identical, "
                 f"largest logprob difference {largest:.2e}")
    assert not problems, "\n".join(problems)
    assert all(len(answer["tokens"]) == tp_proof.MAX_TOKENS for answer in padded)


def test_tp2_divides_pads_nothing_and_gives_the_same_tokens(cpu_vllm_python, seamed_vllm, model, reference):
    assert kv_capacity.plan(profile(), 2)["tp_padding"] == dict(kv_capacity.plan(profile(), 2)["tp_padding"],
                                                                padded=False, env={})
    problems, largest = tp_proof.differences(reference, serve(cpu_vllm_python, seamed_vllm, model, 2))
    NOTES.append(f"tp padding: TP2 (unpadded) vs TP1: largest logprob difference {largest:.2e}")
    assert not problems, "\n".join(problems)


def test_without_the_groups_padding_switch_a_padded_start_fails_instead_of_serving(
        cpu_vllm_python, seamed_vllm, model):
    """The seams are in, the config is padded, but the rank's environment does not say the group pads: the loader
    must not fill the checkpoint's missing rows, and the start fails where stock vLLM would."""
    log = serve(cpu_vllm_python, seamed_vllm, padded_view(model, 3), 3, env_extra={tp_padding.ENV: ""},
                expect_failure=True)
    assert "exceeds dimension size" in log or "is not divisible by" in log, log[-3000:]
