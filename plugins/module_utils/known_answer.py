# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The known-answer canary: fixed prompts, answered greedily, recorded once per (weights revision, image,
profile), and reproduced on every later start.

A one-token completion proves the engine answers; it does not prove the answer is right. Weights that were
corrupted on disk, a kernel that reads the wrong rows or a worker that loaded another shard still answer, with
garbage. Greedy decoding of the same prompts by the same weights, image and arguments gives the same tokens on
every start, so the first verified start records them with their log-probabilities, and every later one must
give the same tokens exactly and each log-probability within a stated tolerance. Empty text and non-finite
log-probabilities (a NaN the server sends as NaN, null or a missing value) always fail, the first time too:
nothing broken is ever recorded as the known answer.

Pure Python (stdlib only): it runs in the kv_pool module on the head and in the node's per-start verification.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_api as api
from ansible_collections.sparkfleet.cluster.plugins.module_utils.vllm_status import KvPoolError

# Short prompts with one obvious continuation each; what matters is that they are fixed, not what they say.
PROMPTS = ("The capital of France is", "1, 2, 3, 4, 5,", "def add(a, b):\n    return")
MAX_TOKENS = 8
# Per token, in nats. Greedy decoding on the same image and hardware is deterministic up to the order of float
# reductions, which moves a log-probability by far less than this; a wrong weight or kernel moves it by more, or
# changes the token outright.
LOGPROB_TOLERANCE = 0.1
RECORD_VERSION = 1


class KnownAnswerError(KvPoolError):
    """The known-answer canary could not be asked or held to its record (no answer, an HTTP error, a record that
    cannot be read or written): a fault of the moment or of the node, not evidence against the weights."""


class WrongAnswerError(KnownAnswerError):
    """An answer that is empty, non-finite or not the recorded one: the model computes something else."""


def identity_key(identity: dict[str, Any]) -> str:
    """The record's name: a digest of what the answer depends on (weights revision, image, profile and args) and of
    the question itself (other prompts are another record, never a wrong answer)."""
    question = {"identity": identity, "prompts": list(PROMPTS), "max_tokens": MAX_TOKENS}
    return hashlib.sha256(json.dumps(question, sort_keys=True).encode()).hexdigest()[:16]


def record_path(directory: str, identity: dict[str, Any]) -> str:
    return os.path.join(directory, f"known-answer-{identity_key(identity)}.json")


def ask(url: str, api_key: str | None, model: str, prompts: tuple[str, ...] = PROMPTS,
        max_tokens: int = MAX_TOKENS, timeout: float = 300.0,
        clock: Callable[[], float] = time.perf_counter) -> tuple[list[dict[str, Any]], float]:
    """Greedy completions of the prompts with each token's log-probability; (answers, latency in s)."""
    body = {"model": model, "prompt": list(prompts), "max_tokens": max_tokens, "temperature": 0.0, "seed": 0,
            "logprobs": 2}
    started = clock()
    try:
        response = api.request(api.join(url, "/v1/completions"), method="POST", body=body, api_key=api_key,
                               timeout=timeout)
    except api.Unreachable as err:
        raise KnownAnswerError(f"the known-answer canary getting no answer ({err.reason})",
                               f"{len(prompts)} greedy completions",
                               "the engine may have died on the request: read the head's log") from err
    latency = round(clock() - started, 3)
    if response.status == 401:
        raise api.api_key_refused(url, "/v1/completions")
    if response.status != 200:
        raise KnownAnswerError(f"the known-answer canary answering HTTP {response.status}: "
                               f"{response.body[:200].decode('utf-8', 'replace')}",
                               f"{len(prompts)} greedy completions", "read the head's log (every rank)")
    try:
        choices = sorted(response.json()["choices"], key=lambda c: c.get("index", 0))
        answers = []
        for prompt, choice in zip(prompts, choices, strict=True):
            logprobs = choice.get("logprobs") or {}
            answer = {"prompt": prompt, "text": choice.get("text"), "tokens": list(logprobs.get("tokens") or []),
                      "logprobs": list(logprobs.get("token_logprobs") or [])}
            answer["margins"] = margins(answer, logprobs.get("top_logprobs") or [])
            answers.append(answer)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise KnownAnswerError(f"the known-answer canary answering without {len(prompts)} choices with "
                               f"logprobs ({response.body[:200]!r})", "choices[].logprobs.tokens and "
                               "token_logprobs", "check that the server is vLLM's OpenAI server") from err
    return answers, latency


def margins(answer: dict[str, Any], top: list[Any]) -> list[float | None]:
    """Per token, how far the chosen token's log-probability is above the runner-up's (None: no runner-up was
    reported). A greedy choice with a margin below the tolerance is a near-tie: numerical noise (another batch, a
    prefix-cache hit, another kernel) may pick the other token, which is no evidence against the model."""
    found: list[float | None] = []
    for index, chosen in enumerate(answer["tokens"]):
        alternatives = top[index] if index < len(top) and isinstance(top[index], dict) else {}
        chosen_lp = answer["logprobs"][index] if index < len(answer["logprobs"]) else None
        others = [value for token, value in alternatives.items() if token != chosen and finite(value)]
        found.append(round(chosen_lp - max(others), 6) if others and finite(chosen_lp) else None)
    return found


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_sane(answers: list[dict[str, Any]]) -> None:
    """Refuse an answer no model should give: empty text, no tokens, or a log-probability that is not a finite
    number (NaN, infinite, null or missing)."""
    for number, answer in enumerate(answers, 1):
        what = f"prompt {number} ({answer['prompt']!r})"
        if not (answer.get("text") or "").strip() or not answer.get("tokens"):
            raise WrongAnswerError(f"an empty answer to {what}: {answer.get('text')!r}",
                                   "a non-empty greedy completion",
                                   "the weights or the kernels are broken (a corrupted shard serves empty "
                                   "text): scrub the weights (sparkfleet-verify scrub) and read the log")
        bad = [i for i, value in enumerate(answer.get("logprobs") or []) if not finite(value)]
        if bad or len(answer.get("logprobs") or []) != len(answer["tokens"]):
            shown = [answer["logprobs"][i] if i < len(answer["logprobs"]) else "missing" for i in bad[:3]]
            raise WrongAnswerError(f"non-finite log-probabilities in the answer to {what} (token(s) "
                                   f"{bad[:3] or 'missing'}: {shown})", "a finite log-probability per token",
                                   "the weights or the kernels produce NaN: scrub the weights and read the log")


def compare(recorded: list[dict[str, Any]], answers: list[dict[str, Any]], tolerance: float) -> str | None:
    """Why the answers are not the recorded ones, or None: the same tokens, each log-probability within the
    tolerance. One exception: the tokens may part where the record shows a near-tie (the chosen token's margin
    over the runner-up within the tolerance, so numerical noise may pick either); the contexts are the same up to
    there, and the continuations after it cannot be compared."""
    if [a["prompt"] for a in recorded] != [a["prompt"] for a in answers]:
        return "the record holds other prompts"
    for number, (old, new) in enumerate(zip(recorded, answers, strict=True), 1):
        at = next((i for i, (a, b) in enumerate(zip(old["tokens"], new["tokens"], strict=False)) if a != b),
                  None if len(old["tokens"]) == len(new["tokens"]) else min(len(old["tokens"]), len(new["tokens"])))
        close = old.get("margins") or []
        margin = close[at] if at is not None and at < len(close) else None
        if at is not None and not (margin is not None and margin <= tolerance):
            return (f"prompt {number} ({old['prompt']!r}) answered {new['text']!r}, recorded {old['text']!r} "
                    f"(the tokens differ from token {at}, where the record's choice was clear)")
        limit = len(old["tokens"]) if at is None else at
        pairs = list(zip(old["logprobs"][:limit], new["logprobs"][:limit], strict=False))
        if not pairs:
            continue
        worst = max((abs(a - b), i) for i, (a, b) in enumerate(pairs))
        if worst[0] > tolerance:
            return (f"prompt {number} ({old['prompt']!r}): token {worst[1]}'s log-probability "
                    f"{new['logprobs'][worst[1]]:.4f}, recorded {old['logprobs'][worst[1]]:.4f} "
                    f"(|difference| {worst[0]:.4f} > tolerance {tolerance})")
    return None


def read_record(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise KnownAnswerError(f"an unreadable known-answer record {path} ({err})", "the record a verified start "
                               "wrote", f"remove {path}: the next verified start records the answer again") from err
    try:
        if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
            raise ValueError("version")
        if [answer["prompt"] for answer in record["answers"]] != list(PROMPTS):
            raise ValueError("other prompts")
        check_sane(record["answers"])
    except (ValueError, KeyError, TypeError, AttributeError, WrongAnswerError) as err:
        raise KnownAnswerError(f"a known-answer record {path} of another format or damaged ({err})",
                               f"version {RECORD_VERSION} with sane answers",
                               f"remove {path}: the next verified start records the answer again") from None
    return record


def write_record(path: str, identity: dict[str, Any], answers: list[dict[str, Any]], tolerance: float) -> None:
    """Atomically, through a new file of its own (O_EXCL: a link planted in the directory is never followed)."""
    record = {"version": RECORD_VERSION, "identity": identity, "tolerance": tolerance,
              "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "answers": answers}
    partial = None
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        handle, partial = tempfile.mkstemp(prefix=".known-answer-", dir=os.path.dirname(path) or ".")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o644)
            json.dump(record, out, indent=1)
            out.write("\n")
        os.replace(partial, path)
    except OSError as err:
        if partial and os.path.exists(partial):
            os.unlink(partial)
        raise KnownAnswerError(f"the known-answer record {path} not writable ({err.strerror or err})",
                               "a directory the verification may write",
                               "run the check as the rank's user or root (become: true), or pass another path"
                               ) from None


def verify(url: str, api_key: str | None, model: str, directory: str, identity: dict[str, Any],
           tolerance: float = LOGPROB_TOLERANCE, record: bool = True, timeout: float = 300.0) -> dict[str, Any]:
    """Ask the canary and hold it to the record for this identity; record it when there is none (and `record`).

    Returns {"known_answer": "matched" | "recorded" | "unrecorded", "known_answer_record": path,
    "known_answer_latency_s": seconds}; raises WrongAnswerError when the answer is broken or not the recorded one
    (asked twice before that verdict), KnownAnswerError when it could not be asked or held to the record.
    """
    path = record_path(directory, identity)
    answers, latency = ask(url, api_key, model, timeout=timeout)
    try:
        check_sane(answers)
    except WrongAnswerError:  # once more before the verdict, as for a mismatch below
        answers, latency = ask(url, api_key, model, timeout=timeout)
        check_sane(answers)
    recorded = read_record(path)
    result = {"known_answer_record": path, "known_answer_latency_s": latency}
    if recorded is None:
        if record:
            write_record(path, identity, answers, tolerance)
        return dict(result, known_answer="recorded" if record else "unrecorded")
    why = compare(recorded["answers"], answers, tolerance)
    if why:
        # Once more before the verdict: a wrong answer stops the group, and it must be the model's, every time.
        answers, latency = ask(url, api_key, model, timeout=timeout)
        check_sane(answers)
        why = compare(recorded["answers"], answers, tolerance) and why
    if why:
        raise WrongAnswerError(
            f"a wrong known answer: {why}", f"the answer recorded at {recorded.get('recorded_at', '?')} for this "
            "weights revision, image and profile",
            "the model now computes something else with the same inputs: a corrupted weight file or a broken "
            "kernel. Scrub the weights (sparkfleet-verify scrub), read the log; if the change is intended, remove "
            f"{path} and restart")
    return dict(result, known_answer="matched")
