#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Run llama-benchy over a grid against a serving group's endpoint, offline, with its progress in a file."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_run
short_description: Run llama-benchy over a grid against the head's endpoint, with no internet access
description:
  - Runs L(llama-benchy,https://pypi.org/project/llama-benchy/) (its C(llama_benchy) package must be importable
    by the Python that runs this module - the benchmark's virtualenv) over O(grid) against O(base_url), and
    saves its JSON result as C(llama-benchy.json) and its output as C(llama-benchy.log) in O(out_dir).
  - llama-benchy would download a book for its prompts and a tokenizer from the Hugging Face hub. Here it reads
    the served model's own tokenizer from O(tokenizer) and the text of O(corpus), served to it on a loopback
    port for the run, so it needs no internet.
  - The API key reaches llama-benchy through its environment, never its command line (which any local user can
    read).
  - Output tokens are fixed at each test's C(tg) (C(--exact-tg)) and counted from the server's token IDs or its
    usage report; a run where llama-benchy fell back to counting tokens itself fails (under speculative
    decoding a chunk carries several tokens).
  - While it runs, O(progress_file) holds the test and run in progress (for M(sparkfleet.cluster.job_progress)).
  - Runs on the controller. In check mode nothing is sent or written; the result says what would run.
version_added: 0.1.0
options:
  base_url:
    description: The OpenAI-compatible base URL, for example C(http://10.0.0.1:8888/v1).
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
    description:
      - A plain-text file the prompts are cut from.
      - Without it, C(corpus.txt) is written in O(out_dir) from the docstrings of this Python's standard library
        (read, not imported), English prose every controller has.
    type: path
  grid:
    description:
      - The tests; C(pp), C(tg), C(depth) and C(concurrency) are lists (every combination runs), C(runs) how
        many times each runs after its warm-up.
    type: dict
    required: true
  coherence:
    description: Run llama-benchy's coherence question first (a model with random weights cannot answer it).
    type: bool
    default: true
  out_dir:
    description: Where the result and the log are written (made when missing).
    type: path
    required: true
  progress_file:
    description: JSON file rewritten with the test in progress while the run lasts.
    type: path
  timeout:
    description: Seconds the whole run may take before it is stopped and failed.
    type: int
    default: 14400
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
- name: Benchmark the head, in the background
  sparkfleet.cluster.bench_run:
    base_url: http://10.0.0.1:8888/v1
    api_key: "{{ sparkfleet_api_key }}"
    model: glm-5.3-flash
    tokenizer: bench/spark/20261207T101500Z/tokenizer
    grid: {pp: [2048], tg: [128], depth: [0, 8192], concurrency: [1, 4], runs: 3}
    out_dir: bench/spark/20261207T101500Z
    progress_file: bench/spark/20261207T101500Z/.progress.json
  async: 14400
  poll: 0
  register: bench_job
  vars:
    ansible_python_interpreter: ~/.cache/sparkfleet/venvs/bench/bin/python
"""

RETURN = r"""
result:
  description: The path of llama-benchy's JSON result.
  returned: success
  type: str
  sample: bench/spark/20261207T101500Z/llama-benchy.json
log:
  description: The path of llama-benchy's output.
  returned: always
  type: str
tests:
  description: How many tests the grid holds.
  returned: always
  type: int
  sample: 4
requests:
  description: How many benchmark requests were answered, and how many failed.
  returned: success
  type: dict
  sample: {answered: 24, failed: 0}
seconds:
  description: How long llama-benchy ran.
  returned: success
  type: float
corpus:
  description: The text the prompts were cut from.
  returned: success
  type: str
  sample: bench/spark/20261207T101500Z/corpus.txt
corpus_name:
  description: What that text is, with its SHA-256 (two runs on different texts are not quite comparable).
  returned: success
  type: str
version:
  description: llama-benchy's version.
  returned: success
  type: str
  sample: 0.4.0
"""

import hashlib
import http.server
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils.bench import (
    docstring_corpus,
    grid_points,
    grid_problems,
    llama_benchy_argv,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import line

# The child reads the key from its environment and appends it to its own sys.argv: /proc/<pid>/cmdline keeps the
# arguments it was started with, so the key never shows in a process listing.
CHILD = ("import os, sys; key = os.environ.pop('SPARKFLEET_BENCH_API_KEY', ''); "
         "sys.argv = ['llama-benchy', *sys.argv[1:]] + (['--api-key', key] if key else []); "
         "from llama_benchy.__main__ import main; main()")
# llama-benchy's warnings when neither token IDs nor a usage report came back: it then counts tokens itself
# (with the tokenizer, or one a stream chunk), which is not the server's count.
OWN_COUNTING = ("No token_ids or usage in response", "No token_ids, usage, or tokenizer")
# llama-benchy's lines when the tokenizer it was given does not load: it would go on with another one (gpt2, from
# the Hub), and every prompt would have another length than the grid's.
TOKENIZER_FALLBACK = ("Error loading tokenizer", "Falling back to 'gpt2'")


def serve_file(path):
    """A loopback HTTP server that answers every GET with the file (llama-benchy's --book-url wants a URL)."""
    with open(path, "rb") as handle:
        body = handle.read()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # pylint: disable=invalid-name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # pylint: disable=arguments-differ
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class Progress:
    """The test in progress, from llama-benchy's own progress events (a request starting names its test and run),
    written to the progress file as they come."""

    def __init__(self, path, tests, runs):
        self.path, self.tests, self.runs = path, tests, runs
        self.test, self.current, self.text = 0, None, "warming up"

    def event(self, event):
        if event.get("type") != "request_start":
            return
        key = tuple(event.get(name) for name in ("prompt_size", "response_size", "context_size", "concurrency"))
        if key != self.current:
            self.test, self.current = self.test + 1, key
        self.text = (f"test {self.test} of {self.tests}: pp{key[0]} tg{key[1]} depth {key[2]} c{key[3]}, "
                     f"run {event.get('run_index')}/{self.runs}")
        self.write()

    def write(self, phase="running"):
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump({"phase": phase, "text": self.text, "test": self.test, "tests": self.tests}, handle)
        os.replace(tmp, self.path)


def follow(path, progress, done):
    """Read llama-benchy's events file as it grows (whole lines only) until done is set."""
    position, partial = 0, ""
    while not done.wait(1.0) or position < (os.path.getsize(path) if os.path.exists(path) else 0):
        try:
            with open(path, encoding="utf-8") as handle:
                handle.seek(position)
                chunk = handle.read()
                position = handle.tell()
        except OSError:
            continue
        lines = (partial + chunk).split("\n")
        partial = lines.pop()
        for text in lines:
            try:
                progress.event(json.loads(text))
            except ValueError:
                continue


def count_requests(events_path):
    answered = failed = 0
    try:
        with open(events_path, encoding="utf-8") as handle:
            for text in handle:
                try:
                    event = json.loads(text)
                except ValueError:
                    continue
                if event.get("type") == "request_end":
                    if event.get("error"):
                        failed += 1
                    else:
                        answered += 1
    except OSError:
        pass
    return answered, failed


def main():
    module = AnsibleModule(
        argument_spec=dict(
            base_url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            model=dict(type="str", required=True),
            tokenizer=dict(type="path", required=True),
            corpus=dict(type="path"),
            grid=dict(type="dict", required=True),
            coherence=dict(type="bool", default=True),
            out_dir=dict(type="path", required=True),
            progress_file=dict(type="path"),
            timeout=dict(type="int", default=14400),
        ),
        supports_check_mode=True,
    )
    params = module.params
    grid = params["grid"]
    problems = grid_problems(grid)
    if problems:
        module.fail_json(msg=line("; ".join(problems), "pp, tg, depth and concurrency (lists) and runs",
                                  "correct the grid", key="grid"))
    tests = grid_points(grid)
    out_dir = params["out_dir"]
    log_path = os.path.join(out_dir, "llama-benchy.log")
    if module.check_mode:
        module.exit_json(changed=True, tests=tests, log=log_path,
                         msg=f"would run llama-benchy over {tests} test(s), {grid['runs']} run(s) each")
    try:
        import llama_benchy  # pylint: disable=import-outside-toplevel
        version = getattr(llama_benchy, "__version__", "unknown")
    except ImportError:
        module.fail_json(msg=line(f"no llama_benchy importable by {sys.executable}",
                                  "the benchmark's virtualenv as the interpreter",
                                  "run bench.yml, which makes that virtualenv (bench_venv) and runs this in it"))
    for key, fix in (("tokenizer", "run bench.yml, which fetches it from the head"),
                     ("corpus", "correct bench_corpus, or leave it empty for a text this Python has")):
        if params[key] and not os.path.exists(params[key]):
            module.fail_json(msg=line(f"no {params[key]}", f"the {key} the benchmark reads", fix, key=key))
    os.makedirs(out_dir, exist_ok=True)
    corpus = params["corpus"]
    if corpus:
        name = os.path.basename(corpus)
    else:
        corpus, stdlib = os.path.join(out_dir, "corpus.txt"), sysconfig.get_paths()["stdlib"]
        with open(corpus, "w", encoding="utf-8") as handle:
            handle.write(docstring_corpus(stdlib))
        name = f"docstrings of {stdlib}"
    with open(corpus, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    corpus_name = f"{name} (sha256 {digest[:16]})"
    result_path = os.path.join(out_dir, "llama-benchy.json")
    events_path = os.path.join(out_dir, "llama-benchy-events.jsonl")
    home = tempfile.mkdtemp(prefix=".home-", dir=out_dir)  # llama-benchy's cache, removed after the run
    server = serve_file(corpus)
    progress = Progress(params["progress_file"], tests, grid["runs"])
    progress.write()
    argv = llama_benchy_argv(grid, params["base_url"], params["model"], params["tokenizer"],
                             f"http://127.0.0.1:{server.server_address[1]}/corpus.txt", result_path, events_path)
    argv += ["--exact-tg"] + ([] if params["coherence"] else ["--skip-coherence"])
    # Straight to the head and to the loopback text, as every other request of the collection goes: no proxy of
    # the controller's environment between them (it would see the key and skew the timings).
    env = dict(HOME=home, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", NO_PROXY="*",
               no_proxy="*", HTTP_PROXY="", HTTPS_PROXY="", ALL_PROXY="", http_proxy="", https_proxy="",
               all_proxy="", SPARKFLEET_BENCH_API_KEY=params["api_key"] or "")
    started = time.monotonic()
    done = threading.Event()
    follower = threading.Thread(target=follow, args=(events_path, progress, done), daemon=True)
    follower.start()
    try:
        # (coreutils' timeout ends a run that hangs; its exit status 124 says so)
        code, out, err = module.run_command([module.get_bin_path("timeout", required=True), "--kill-after=30",
                                             str(params["timeout"]), sys.executable, "-c", CHILD, *argv],
                                            environ_update=env, cwd=out_dir)
    finally:
        done.set()
        follower.join(timeout=30)
        server.shutdown()
        shutil.rmtree(home, ignore_errors=True)
    # (124: timeout ended it; killed after its grace, 137, at the limit too - not an out-of-memory kill before it)
    timed_out = code == 124 or (code != 0 and time.monotonic() - started >= params["timeout"])
    output = out + err
    if params["api_key"]:  # (llama-benchy never prints it; should a later one, the log still holds no key)
        output = output.replace(params["api_key"], "<redacted>")
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(output)
    seconds = round(time.monotonic() - started, 1)
    answered, failed = count_requests(events_path)
    progress.write(phase="done" if code == 0 else "failed")
    tail = " | ".join(output.strip().splitlines()[-6:])
    if timed_out:
        module.fail_json(msg=line(f"llama-benchy still running after {params['timeout']} s (stopped)",
                                  "the grid to finish in time", "raise bench_timeout or choose a smaller grid",
                                  key="bench_timeout"), log=log_path, tests=tests)
    if code != 0 or not os.path.isfile(result_path):
        module.fail_json(msg=line(f"llama-benchy exit {code} ({tail})", "a finished run with its JSON result",
                                  f"read {log_path}"), log=log_path, tests=tests)
    if any(warning in output for warning in TOKENIZER_FALLBACK):
        module.fail_json(msg=line(f"the tokenizer {params['tokenizer']} refused by llama-benchy ({tail})",
                                  "the served model's own tokenizer.json", "check the files bench.yml fetched from "
                                  "the head", key="tokenizer"), log=log_path, tests=tests)
    if any(warning in output for warning in OWN_COUNTING):
        module.fail_json(msg=line("output tokens counted by llama-benchy (no token IDs and no usage report)",
                                  "the server's own token counts", "use vLLM's OpenAI server, which reports them"),
                         log=log_path, tests=tests)
    module.exit_json(changed=True, result=result_path, log=log_path, tests=tests, seconds=seconds, version=version,
                     requests={"answered": answered, "failed": failed}, corpus=corpus, corpus_name=corpus_name)


if __name__ == "__main__":
    main()
