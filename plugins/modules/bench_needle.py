#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The long-context retrieval check: a passphrase hidden in a generated haystack, asked for at the end."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_needle
short_description: Hide a passphrase in a long generated text and ask the served model for it
description:
  - For each length in O(tokens), builds a haystack of that many tokens (counted with the served model's own
    tokenizer, O(tokenizer)) from the sentences of O(corpus), with one sentence giving a random passphrase at
    O(fraction) of the way in, and asks the model for the passphrase at the end (temperature 0).
  - Before asking, the server's own tokenizer (vLLM's C(/tokenize)) reads the same messages, which gives the
    prompt's length and where the passphrase sentence lies in it.
  - With O(judge=answer) a length passes when the answer holds the passphrase. With O(judge=placement) (a model
    with random weights, as in the lab, cannot retrieve anything) it passes when the server read the whole prompt
    (its usage report counts the tokens C(/tokenize) counted) with the passphrase at the depth asked for; the
    answer is reported, not judged.
  - Writes C(needle.json) in O(out_dir). Runs on the controller, in the benchmark's virtualenv (C(tokenizers)).
    In check mode nothing is sent or written.
version_added: 0.1.0
options:
  base_url:
    description: The server's base URL without C(/v1), for example C(http://10.0.0.1:8888).
    type: str
    required: true
  api_key:
    description: The server's API key.
    type: str
  model:
    description: The served model name.
    type: str
    required: true
  tokenizer:
    description: A directory holding the served model's C(tokenizer.json) (or the file itself).
    type: path
    required: true
  corpus:
    description: A plain-text file the haystack's sentences come from.
    type: path
    required: true
  tokens:
    description: The haystack lengths to try, in tokens; each must leave room for the answer in C(max_model_len).
    type: list
    elements: int
    required: true
  fraction:
    description: Where the passphrase goes, as a fraction of the haystack (0 at the start, 1 at the end).
    type: float
    default: 0.5
  judge:
    description: C(answer) - the answer must hold the passphrase; C(placement) - the server must have read it at
      its place (for a model that cannot answer).
    type: str
    choices: [answer, placement]
    default: answer
  max_tokens:
    description: The longest answer.
    type: int
    default: 32
  timeout:
    description: Seconds one request may take.
    type: int
    default: 1800
  out_dir:
    description: Where C(needle.json) is written.
    type: path
    required: true
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), sending and writing nothing.
    support: full
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Find the needle at 64K and 131K tokens
  sparkfleet.cluster.bench_needle:
    base_url: http://10.0.0.1:8888
    api_key: "{{ sparkfleet_api_key }}"
    model: glm-5.3-flash
    tokenizer: bench/spark/20261207T101500Z/tokenizer
    corpus: bench/spark/20261207T101500Z/corpus.txt
    tokens: [65536, 131072]
    out_dir: bench/spark/20261207T101500Z
  vars:
    ansible_python_interpreter: ~/.cache/sparkfleet/venvs/bench/bin/python
"""

RETURN = r"""
passed:
  description: Whether every length passed.
  returned: success
  type: bool
results:
  description: One entry per length - C(tokens) (the server's count), C(needle_at) (its token index),
    C(passphrase), C(answer), C(passed), C(judged) and C(seconds) (the request's time).
  returned: success
  type: list
  elements: dict
"""

import json
import os
import secrets
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_api
from ansible_collections.sparkfleet.cluster.plugins.module_utils.bench import (
    NEEDLE_TEMPLATE_TOKENS,
    BenchError,
    find_subsequence,
    haystack,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import line


def load_tokenizer(path):
    from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel
    return Tokenizer.from_file(os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path)


def post(params, path, body):
    try:
        answer = vllm_api.request(vllm_api.join(params["base_url"], path), "POST", body, params["api_key"],
                                  timeout=params["timeout"])
    except vllm_api.Unreachable as err:
        raise BenchError(f"no answer from {params['base_url']}{path} ({err.reason})", "the head serving",
                         "check the group (site.yml --tags verify)") from None
    if answer.status != 200:
        raise BenchError(f"HTTP {answer.status} from {path}: {answer.body[:300]!r}", "200",
                         "read the head's vLLM log")
    return answer.json()


def one(params, corpus, count, tokens, seed):
    stack = haystack(corpus, count, tokens, params["fraction"], seed, nonce=secrets.token_hex(8))
    messages = [{"role": "user", "content": f"{stack.text}\n\n{stack.question}"}]
    read = post(params, "/tokenize", {"model": params["model"], "messages": messages,
                                      "add_generation_prompt": True,
                                      "chat_template_kwargs": {"enable_thinking": False}})
    ids = read.get("tokens") or []
    marker = post(params, "/tokenize", {"model": params["model"], "prompt": " secret passphrase is",
                                        "add_special_tokens": False}).get("tokens") or []
    at = find_subsequence(ids, marker)
    started = time.monotonic()
    # A reasoning model (GLM's chat template) would spend the answer's tokens thinking: asked not to; what it
    # says in its reasoning counts too.
    answer = post(params, "/v1/chat/completions", {
        "model": params["model"], "messages": messages, "temperature": 0, "max_tokens": params["max_tokens"],
        "chat_template_kwargs": {"enable_thinking": False}})
    seconds = time.monotonic() - started
    message = (answer.get("choices") or [{}])[0].get("message") or {}
    text = " ".join(str(message.get(key) or "") for key in ("content", "reasoning_content", "reasoning")).strip()
    prompt_tokens = (answer.get("usage") or {}).get("prompt_tokens")
    # where the passphrase sentence starts by the local count; the server's count adds the chat template's opening
    wanted = count(stack.text.split(stack.needle, 1)[0])
    placed = 0 <= at - wanted <= NEEDLE_TEMPLATE_TOKENS and prompt_tokens == len(ids)
    retrieved = stack.passphrase.lower() in text.lower()
    passed = retrieved if params["judge"] == "answer" else placed
    return {"tokens": len(ids), "prompt_tokens": prompt_tokens, "needle_at": at, "needle_wanted": wanted,
            "passphrase": stack.passphrase, "answer": text.strip(), "retrieved": retrieved, "placed": placed,
            "judged": params["judge"], "passed": passed, "seconds": round(seconds, 2),
            "tokens_per_second": round(len(ids) / seconds, 1) if seconds else None}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            base_url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str", required=True),
            tokenizer=dict(type="path", required=True),
            corpus=dict(type="path", required=True),
            tokens=dict(type="list", elements="int", required=True, no_log=False),
            fraction=dict(type="float", default=0.5),
            judge=dict(type="str", choices=["answer", "placement"], default="answer"),
            max_tokens=dict(type="int", default=32, no_log=False),
            timeout=dict(type="int", default=1800),
            out_dir=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not 0 <= params["fraction"] <= 1:
        module.fail_json(msg=line(f"{params['fraction']}", "a fraction from 0 to 1", "correct it", key="fraction"))
    if module.check_mode:
        module.exit_json(changed=True, msg=f"would look for the needle at {params['tokens']} tokens")
    results = []
    try:
        tokenizer = load_tokenizer(params["tokenizer"])
        with open(params["corpus"], encoding="utf-8") as handle:
            corpus = handle.read()

        def count(text):
            return len(tokenizer.encode(text, add_special_tokens=False).ids)

        for index, tokens in enumerate(params["tokens"]):
            results.append(one(params, corpus, count, tokens, seed=index + 1))
    except BenchError as err:
        module.fail_json(msg=err.line(), results=results)
    except (ImportError, OSError, ValueError) as err:
        module.fail_json(msg=line(f"{type(err).__name__}: {err}", "the tokenizer and the corpus readable by the "
                                  "benchmark's virtualenv", "run it through bench.yml"), results=results)
    passed = all(item["passed"] for item in results)
    os.makedirs(params["out_dir"], exist_ok=True)
    with open(os.path.join(params["out_dir"], "needle.json"), "w", encoding="utf-8") as handle:
        json.dump({"judge": params["judge"], "fraction": params["fraction"], "passed": passed, "results": results},
                  handle, indent=2)
    module.exit_json(changed=True, passed=passed, results=results, judge=params["judge"])


if __name__ == "__main__":
    main()
