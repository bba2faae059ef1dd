"""The known-answer canary and the per-start verification (module_utils/known_answer.py, verification.py and the
node's files/sparkfleet-verify), against a stand-in vLLM server on loopback that answers in vLLM's formats and
fails the ways broken servers were seen to (empty text, NaN log-probabilities, another answer)."""

import hashlib
import json
import math
import os
import subprocess
import sys

import pytest
from fake_vllm import MAX_MODEL_LEN, FakeVllm

from ansible_collections.sparkfleet.cluster.plugins.module_utils import known_answer as ka
from ansible_collections.sparkfleet.cluster.plugins.module_utils import prometheus_text as prom
from ansible_collections.sparkfleet.cluster.plugins.module_utils import verification
from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_status as vs
from ansible_collections.sparkfleet.cluster.plugins.module_utils import weights as w

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERIFY = os.path.join(ROOT, "roles/vllm_service/files/sparkfleet-verify")
IDENTITY = {"revision": "a" * 40, "image": "sha256:1", "profile": "tiny", "args": "x"}
KEY = "sk-test"


@pytest.fixture
def server():
    with FakeVllm(api_key=KEY) as fake:
        yield fake


def test_the_first_answer_is_recorded_and_the_same_answer_matches(server, tmp_path):
    first = ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    assert first["known_answer"] == "recorded"
    with open(first["known_answer_record"], encoding="utf-8") as handle:
        record = json.load(handle)
    assert record["identity"] == IDENTITY and len(record["answers"]) == len(ka.PROMPTS)
    assert all(len(a["tokens"]) == ka.MAX_TOKENS == len(a["logprobs"]) for a in record["answers"])
    sent = server.requests[-1]
    assert sent["temperature"] == 0.0 and sent["logprobs"] == 2 and sent["prompt"] == list(ka.PROMPTS)
    assert all(margin == 1.0 for a in record["answers"] for margin in a["margins"])
    assert ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)["known_answer"] == "matched"


def test_another_identity_gets_a_record_of_its_own(server, tmp_path):
    ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    server.mode = "wrong"  # a new image computes other answers: recorded anew, not compared with the old one
    assert ka.verify(server.url, KEY, "tiny-llama", str(tmp_path),
                     dict(IDENTITY, image="sha256:2"))["known_answer"] == "recorded"
    assert len(list(tmp_path.glob("known-answer-*.json"))) == 2


@pytest.mark.parametrize(("mode", "says"), [
    ("wrong", "a wrong known answer: prompt 1 ('The capital of France is') answered"),
    ("drift", "log-probability"),
])
def test_another_answer_later_fails_naming_the_prompt(server, tmp_path, mode, says):
    ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    server.mode = mode
    with pytest.raises(ka.WrongAnswerError) as err:
        ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    assert says in str(err.value) and "fix: " in str(err.value) and "scrub" in str(err.value)


def test_a_drift_within_the_tolerance_matches(server, tmp_path):
    ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    server.mode = "drift"  # every log-probability 0.5 nats off
    assert ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY, tolerance=0.6)["known_answer"] == \
        "matched"


@pytest.mark.parametrize(("mode", "says"), [("nan", "non-finite log-probabilities"), ("empty", "an empty answer")])
def test_broken_answers_fail_and_are_never_recorded(server, tmp_path, mode, says):
    server.mode = mode
    with pytest.raises(ka.WrongAnswerError, match=says):
        ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    assert not list(tmp_path.iterdir())  # nothing broken becomes the known answer


@pytest.mark.parametrize("bad", [None, float("inf"), "-0.5", True])
def test_what_counts_as_finite(bad):
    answer = {"prompt": "p", "text": " x", "tokens": [" x"], "logprobs": [bad]}
    with pytest.raises(ka.KnownAnswerError, match="non-finite"):
        ka.check_sane([answer])
    ka.check_sane([dict(answer, logprobs=[-0.5])])


def test_missing_logprobs_fail(server, tmp_path):
    answer = {"prompt": "p", "text": " x y", "tokens": [" x", " y"], "logprobs": [-0.1]}
    with pytest.raises(ka.KnownAnswerError, match="non-finite"):
        ka.check_sane([answer])


def test_without_record_rights_nothing_is_written(server, tmp_path):
    assert ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY, record=False)["known_answer"] == \
        "unrecorded"
    assert not list(tmp_path.iterdir())


def test_an_unreadable_record_fails_with_the_fix(server, tmp_path):
    path = ka.record_path(str(tmp_path), IDENTITY)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("{broken")
    with pytest.raises(ka.KnownAnswerError, match=f"remove {path}"):
        ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)


def test_a_dead_engine_and_a_refused_key_fail(server, tmp_path):
    with pytest.raises(vs.KvPoolError, match="401"):
        ka.verify(server.url, "wrong-key", "tiny-llama", str(tmp_path), IDENTITY)
    server.mode = "dead"
    with pytest.raises(ka.KnownAnswerError, match="HTTP 500") as err:
        ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    assert not isinstance(err.value, ka.WrongAnswerError)


# ------------------------------------------------------------------------------------------ the verification

def expected(**changes):
    return {"expected_tokens": 51200, "min_tokens": None, "tolerance": 0.05, "max_model_len": MAX_MODEL_LEN,
            **changes}


def test_one_verification_holds_the_pool_length_and_known_answer(server, tmp_path):
    params = dict(expected(), url=server.url, api_key=KEY,
                  known_answer={"path": str(tmp_path), "identity": IDENTITY})
    result = verification.verify(params, {}, vs.Findings())
    assert result["kv_cache_tokens"] == 51200 and result["canary_ok"] and result["known_answer"] == "recorded"
    with pytest.raises(vs.KvPoolError, match="a KV pool of 51,200 tokens"):
        verification.verify(dict(params, expected_tokens=80000), {}, vs.Findings())


def test_the_status_and_textfile_say_what_was_found(server, tmp_path):
    result = verification.verify(dict(expected(), url=server.url, api_key=KEY), {}, vs.Findings())
    context = {"epoch": 7, "time_to_ready_s": 42.5, "starts": 2}
    status = verification.status_document(result, None, expected(), context, wall=1000.0)
    assert status["ok"] and status["found"]["kv_cache_tokens"] == 51200 and status["expected"]["pool_tokens"] == 51200
    samples = {s.name: s.value for s in prom.parse_prometheus(verification.textfile(status))}
    assert samples == {"sparkfleet_verify_ok": 1, "sparkfleet_verify_timestamp_seconds": 1000.0,
                       "sparkfleet_kv_pool_expected_tokens": 51200, "sparkfleet_kv_pool_tokens": 51200,
                       "sparkfleet_canary_latency_seconds": result["canary_latency_s"],
                       "sparkfleet_time_to_ready_seconds": 42.5, "sparkfleet_group_starts": 2,
                       "sparkfleet_group_epoch": 7}
    failed = verification.status_document({}, ka.WrongAnswerError("x", "y", "z"), expected(), {})
    assert failed["ok"] is False and failed["failed"] == "known_answer" and "found x" in failed["why"]
    assert "sparkfleet_verify_ok 0" in verification.textfile(failed)
    assert "sparkfleet_kv_pool_tokens" not in verification.textfile(failed)  # unknown is left out, not 0


# --------------------------------------------------------------------------------- files/sparkfleet-verify

def node_config(tmp_path, server_url, **changes):
    config = {"url": server_url, "wait_timeout": 5, "expect": expected(),
              "known_answer": {"path": str(tmp_path / "verify"), "identity": IDENTITY, "record": True},
              "status_file": str(tmp_path / "verify/status.json"), "textfile_dir": str(tmp_path / "metrics"),
              "scrub_status_file": str(tmp_path / "verify/scrub.json"),
              "history_file": str(tmp_path / "history.json"), **changes}
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(config))
    return path


def run_verify(mode, config, **env):
    python_path = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, VERIFY, mode, "--config", str(config)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=python_path, SPARKFLEET_PYTHONPATH="/nonexistent",
                                   VLLM_API_KEY=KEY, **env), timeout=60, check=False)


def test_the_node_check_passes_records_and_writes_status_and_metrics(server, tmp_path):
    (tmp_path / "history.json").write_text(json.dumps([{"epoch": 11}, {"epoch": 12}]))
    config = node_config(tmp_path, server.url)
    done = run_verify("start", config, SPARKFLEET_EPOCH="12", SPARKFLEET_READY_S="33.5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verified epoch 12: a pool of 51,200 tokens (plan 51,200)" in done.stdout
    status = json.loads((tmp_path / "verify/status.json").read_text())
    assert status["ok"] and status["epoch"] == 12 and status["starts"] == 2 and status["time_to_ready_s"] == 33.5
    assert status["found"]["known_answer"] == "recorded"
    metrics = (tmp_path / "metrics/sparkfleet_verify.prom").read_text()
    samples = {s.name: s.value for s in prom.parse_prometheus(metrics)}
    assert samples["sparkfleet_verify_ok"] == 1 and samples["sparkfleet_time_to_ready_seconds"] == 33.5
    again = run_verify("start", config, SPARKFLEET_EPOCH="13")
    assert again.returncode == 0 and "known answer matched" in again.stdout


def test_the_node_check_exits_3_on_a_wrong_answer_and_1_on_a_wrong_pool(server, tmp_path):
    config = node_config(tmp_path, server.url)
    assert run_verify("start", config).returncode == 0
    server.mode = "wrong"
    done = run_verify("start", config)
    assert done.returncode == 3 and "a wrong known answer" in done.stdout
    status = json.loads((tmp_path / "verify/status.json").read_text())
    assert status["ok"] is False and status["failed"] == "known_answer"
    assert "sparkfleet_verify_ok 0" in (tmp_path / "metrics/sparkfleet_verify.prom").read_text()
    server.mode = "ok"
    wrong_pool = node_config(tmp_path, server.url, expect=expected(expected_tokens=90000))
    done = run_verify("start", wrong_pool)
    assert done.returncode == 1 and "expected 90,000 tokens" in done.stdout
    assert json.loads((tmp_path / "verify/status.json").read_text())["failed"] == "pool"


def test_the_node_check_never_prints_the_api_key(server, tmp_path):
    done = run_verify("start", node_config(tmp_path, server.url))
    everything = done.stdout + done.stderr + "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file()
                                                     and p.name != "verify.json")
    assert KEY not in everything


def test_an_unusable_configuration_exits_2(tmp_path):
    (tmp_path / "verify.json").write_text("[]")
    assert run_verify("start", tmp_path / "verify.json").returncode == 2
    (tmp_path / "verify.json").write_text("{}")
    done = run_verify("start", tmp_path / "verify.json")
    assert done.returncode == 2 and "found no usable" in done.stdout and "Traceback" not in done.stderr


def test_the_node_check_without_the_known_answer_verifies_the_rest(server, tmp_path):
    config = node_config(tmp_path, server.url, known_answer=None)
    done = run_verify("start", config, SPARKFLEET_EPOCH="5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "known answer not asked" in done.stdout and not list((tmp_path / "verify").glob("known-answer-*"))


def test_a_check_on_demand_is_of_the_groups_current_start(server, tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"phase": "ready", "epoch": 77}))
    config = node_config(tmp_path, server.url, state_file=str(tmp_path / "state.json"))
    assert run_verify("start", config, SPARKFLEET_EPOCH="77", SPARKFLEET_READY_S="12.5").returncode == 0
    assert run_verify("start", config).returncode == 0  # the verify unit: no epoch from a supervisor
    status = json.loads((tmp_path / "verify/status.json").read_text())
    assert status["epoch"] == 77 and status["time_to_ready_s"] == 12.5


def test_a_transient_fault_is_not_a_wrong_answer(server, tmp_path):
    config = node_config(tmp_path, server.url)
    assert run_verify("start", config).returncode == 0
    server.mode = "dead"  # the engine died under the check: not evidence against the weights, no scrub
    done = run_verify("start", config)
    assert done.returncode == 1
    assert json.loads((tmp_path / "verify/status.json").read_text())["failed"] == "pool"


def test_an_answer_wrong_only_once_is_asked_again(server, tmp_path):
    ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    answers = iter(["wrong", "ok"])
    original = ka.ask

    def flaky(*args, **kwargs):
        server.mode = next(answers)
        return original(*args, **kwargs)
    ka.ask = flaky
    try:
        assert ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)["known_answer"] == "matched"
    finally:
        ka.ask = original


def test_a_damaged_record_is_not_a_wrong_answer(server, tmp_path):
    ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    path = ka.record_path(str(tmp_path), IDENTITY)
    with open(path, encoding="utf-8") as handle:
        record = json.load(handle)
    del record["answers"][0]["tokens"]
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    with pytest.raises(ka.KnownAnswerError, match="damaged") as err:
        ka.verify(server.url, KEY, "tiny-llama", str(tmp_path), IDENTITY)
    assert not isinstance(err.value, ka.WrongAnswerError)


# ---------------------------------------------------------------------------------- weights: fast path, scrub

def checkout(tmp_path):
    """A verified checkout in the Hugging Face cache layout, with its marker."""
    cache, repo, revision = tmp_path / "hub", "org/tiny", "b" * 40
    data = {"config.json": b'{"a": 1}\n', "model.safetensors": os.urandom(256 * 1024)}
    entries = []
    for name, content in data.items():
        entry = w.Entry(name, len(content), sha256=hashlib.sha256(content).hexdigest())
        blob = tmp_path / "blob"
        blob.write_bytes(content)
        w.place_blob(str(cache), repo, revision, entry, str(blob))
        w.link_snapshot(str(cache), repo, revision, entry)
        entries.append(entry)
    w.write_marker(str(cache), repo, revision, entries, "test")
    snapshot = w.snapshot_dir(str(cache), repo, revision)
    return {"cache_dir": str(cache), "repo_id": repo, "revision": revision}, snapshot


def test_the_fast_path_refuses_a_file_changed_in_place_without_reading_it(tmp_path):
    weights, snapshot = checkout(tmp_path)
    config = node_config(tmp_path, "http://127.0.0.1:1", weights=weights)
    assert run_verify("weights", config).returncode == 0
    with open(os.path.join(snapshot, "model.safetensors"), "r+b") as handle:
        handle.seek(1000)
        handle.write(b"\0" * 100)
    done = run_verify("weights", config)
    assert done.returncode == 1
    assert "refusing to start" in done.stdout and "model.safetensors: mtime_ns, ctime_ns changed" in done.stdout


def test_a_scrub_passes_intact_weights_and_withdraws_the_marker_of_corrupt_ones(tmp_path):
    weights, snapshot = checkout(tmp_path)
    config = node_config(tmp_path, "http://127.0.0.1:1", weights=weights)
    done = run_verify("scrub", config)
    assert done.returncode == 0 and "scrub ok: 2 files" in done.stdout
    assert json.loads((tmp_path / "verify/scrub.json").read_text())["ok"] is True
    target = os.path.realpath(os.path.join(snapshot, "model.safetensors"))
    stat = os.stat(target)
    with open(target, "r+b") as handle:  # a bit flip that keeps size and mtime: only the hash sees it
        handle.seek(4096)
        byte = handle.read(1)
        handle.seek(4096)
        handle.write(bytes([byte[0] ^ 1]))
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    done = run_verify("scrub", config)
    assert done.returncode == 1 and "1 of 2 file(s) changed" in done.stdout
    scrubbed = json.loads((tmp_path / "verify/scrub.json").read_text())
    assert scrubbed["ok"] is False and scrubbed["bad"][0].startswith("model.safetensors: sha256")
    assert w.read_marker(weights["cache_dir"], weights["repo_id"]) is None  # no rank starts on them now
    assert run_verify("weights", config).returncode == 1
    metrics = (tmp_path / "metrics/sparkfleet_scrub.prom").read_text()
    samples = {s.name: s.value for s in prom.parse_prometheus(metrics)}
    assert samples["sparkfleet_weights_scrub_ok"] == 0 and samples["sparkfleet_weights_scrub_bad_files"] == 1
    assert math.isfinite(samples["sparkfleet_weights_scrub_seconds"])


def answer(tokens, margins, logprobs=None):
    return {"prompt": "p", "text": "".join(tokens), "tokens": tokens, "logprobs": logprobs or [-0.5] * len(tokens),
            "margins": margins}


def test_tokens_may_part_only_where_the_record_shows_a_near_tie():
    recorded = [answer([" a", " b", " c", " d"], [2.0, 0.05, 2.0, 2.0])]
    # parting at token 1, a near-tie in the record (0.05 nats): accepted, the rest is not compared
    assert ka.compare(recorded, [answer([" a", " x", " y", " z"], [2.0, 0.1, 1.0, 1.0])], 0.1) is None
    # parting at token 2, where the record's choice was clear: a wrong answer
    why = ka.compare(recorded, [answer([" a", " b", " x", " d"], [2.0, 0.05, 2.0, 2.0])], 0.1)
    assert "differ from token 2, where the record's choice was clear" in why
    # before the parting, the log-probabilities are held to the tolerance
    drifted = answer([" a", " x", " y", " z"], [2.0, 0.1, 1.0, 1.0], logprobs=[-0.9, -0.5, -0.5, -0.5])
    assert "token 0's log-probability" in ka.compare(recorded, [drifted], 0.1)
    # a record without margins (none reported) holds every token
    assert ka.compare([answer([" a", " b"], [None, None])], [answer([" a", " x"], [None, None])], 0.1)


def test_margins_come_from_the_runner_up():
    found = ka.margins({"tokens": [" a", " b"], "logprobs": [-0.1, -2.0]},
                       [{" a": -0.1, " q": -1.6}, {" b": -2.0}])
    assert found == [1.5, None]
