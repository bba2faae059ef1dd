"""A stand-in for a vLLM OpenAI server on loopback, for the unit tests of what reads one (the per-start
verification, the known-answer canary). It answers what vLLM 0.32's CPU build answers, in the same formats:
/health, /metrics (a real capture of that server), /v1/models and /v1/completions with logprobs. Greedy
answers are a fixed function of the prompt; `mode` makes it fail the way broken servers were seen to: a
corrupted shard's empty text and NaN log-probabilities, or another answer.
"""

import hashlib
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

METRICS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unit/data/vllm/cpu-0.32.0-llama.metrics")
MODEL, MAX_MODEL_LEN = "tiny-llama", 512  # what the captured server served (its pool: 51,200 tokens)


def greedy(prompt, count, shift=0):
    """count tokens and their log-probabilities, a fixed function of the prompt (shift: another model)."""
    digest = hashlib.sha256(f"{shift}:{prompt}".encode()).digest()
    tokens = [f" t{digest[i] % 50}" for i in range(count)]
    logprobs = [-round(digest[i + 8] / 64, 4) for i in range(count)]
    return tokens, logprobs


class FakeVllm:
    """mode: ok | wrong (other tokens) | drift (log-probabilities 0.5 off) | nan | empty | dead (HTTP 500)."""

    def __init__(self, api_key=None):
        self.mode, self.api_key, self.requests = "ok", api_key, []
        with open(METRICS, encoding="utf-8") as handle:
            self.metrics = handle.read()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self, status, body, kind="application/json"):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def authorized(self):
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self.answer(401, {"error": "Unauthorized"})
                    return False
                return True

            def do_GET(self):
                if self.path == "/health":
                    self.answer(200, b"", "text/plain")
                elif self.path == "/metrics":
                    self.answer(200, fake.metrics.encode(), "text/plain; version=0.0.4")
                elif self.path == "/v1/models" and self.authorized():
                    self.answer(200, {"object": "list", "data": [
                        {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": MAX_MODEL_LEN}]})
                elif not self.path.startswith("/v1/"):
                    self.answer(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                fake.requests.append(body)
                if self.path != "/v1/completions" or not self.authorized():
                    return
                if fake.mode == "dead":
                    self.answer(500, {"error": "EngineDeadError"})
                    return
                prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
                choices = []
                for index, prompt in enumerate(prompts):
                    tokens, logprobs = greedy(prompt, body.get("max_tokens", 16), 1 if fake.mode == "wrong" else 0)
                    if fake.mode == "drift":
                        logprobs = [value - 0.5 for value in logprobs]
                    if fake.mode == "nan":
                        logprobs = [float("nan")] * len(tokens)
                    if fake.mode == "empty":
                        tokens, logprobs = [""] * len(tokens), [-0.01] * len(tokens)
                    choice = {"index": index, "text": "".join(tokens), "finish_reason": "length",
                              "stop_reason": None, "prompt_logprobs": None, "logprobs": None}
                    if body.get("logprobs") is not None:
                        choice["logprobs"] = {"text_offset": list(range(len(tokens))), "token_logprobs": logprobs,
                                              "tokens": tokens,
                                              # the chosen token and a runner-up a clear 1 nat below
                                              "top_logprobs": [{t: v, t + "~": v - 1.0}
                                                               for t, v in zip(tokens, logprobs, strict=True)]}
                    choices.append(choice)
                # Python's json writes NaN as NaN, as a server that does not refuse non-finite floats does.
                self.answer(200, {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": MODEL,
                                  "choices": choices, "usage": {"prompt_tokens": 4, "total_tokens": 12,
                                                                "completion_tokens": 8}})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
