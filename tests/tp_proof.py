"""The padding proof's prompts, requests and comparison, shared by the controller's test (test_tp_padding) and the
lab's (test_tp3): greedy completions with the chosen tokens' ids and logprobs, compared token for token."""

import json
import urllib.request

# Fixed prompts; greedy, so every run of the same model gives the same tokens.
PROMPTS = ("The quick brown fox", "Hello world, this is", "1 2 3 4 5 6", "Once upon a time in a land far away",
           "sparkfleet pads heads with zeros", "<|user|> why is the sky blue?")
MAX_TOKENS = 16
# float32 end to end: the sums of three ranks and of one differ by rounding alone (measured: at most ~2e-6).
LOGPROB_TOLERANCE = 1e-4


def greedy(url, model, api_key=None, timeout=300):
    """Each prompt's completion: the chosen tokens (as vLLM's token_id:N) and their logprobs."""
    out = []
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    for prompt in PROMPTS:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                           "logprobs": 1, "return_tokens_as_token_ids": True, "ignore_eos": True}).encode()
        request = urllib.request.Request(f"{url}/v1/completions", body, headers)
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            choice = json.load(answer)["choices"][0]
        out.append({"prompt": prompt, "tokens": choice["logprobs"]["tokens"],
                    "logprobs": choice["logprobs"]["token_logprobs"]})
    return out


def differences(reference, candidate, tolerance=LOGPROB_TOLERANCE):
    """What differs between two runs' completions (empty: the same tokens, logprobs within the tolerance), and the
    largest logprob difference seen."""
    problems, largest = [], 0.0
    for ref, got in zip(reference, candidate, strict=True):
        if ref["tokens"] != got["tokens"]:
            problems.append(f"{ref['prompt']!r}: tokens {got['tokens']} instead of {ref['tokens']}")
            continue
        for step, (want, have) in enumerate(zip(ref["logprobs"], got["logprobs"], strict=True)):
            largest = max(largest, abs(want - have))
            if abs(want - have) > tolerance:
                problems.append(f"{ref['prompt']!r}: token {step} logprob {have} instead of {want}")
    return problems, largest
