"""The group supervisor (roles/vllm_service/files/sparkfleet-group) as real processes on loopback: one agent and
one supervisor per rank, stand-in engines (a head that serves /health when told to, workers that only live),
real signals. What is asserted is what a node's agent answers, the history and the marker on disk."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROUP = os.path.join(ROOT, "roles/vllm_service/files/sparkfleet-group")

# A stand-in engine: writes its pid and epoch, serves /health (200 unless the flag file says 'sick') on the head.
ENGINE = r"""
import http.server, json, os, signal, sys, threading, time
workdir, port = sys.argv[1], int(sys.argv[2])
def drain(_signum, _frame):  # vLLM with --shutdown-timeout: finish what is in flight (drain-seconds), then exit
    path = os.path.join(workdir, "drain-seconds")
    time.sleep(float(open(path).read()) if os.path.exists(path) else 0)
    open(os.path.join(workdir, "drained"), "w").close()
    os._exit(0)
signal.signal(signal.SIGTERM, drain)
with open(os.path.join(workdir, "engine.json"), "w") as handle:
    json.dump({"pid": os.getpid(), "epoch": os.environ["SPARKFLEET_EPOCH"]}, handle)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        sick = os.path.exists(os.path.join(workdir, "sick"))
        self.send_response(503 if sick else 200)
        self.end_headers()
    def log_message(self, *args):
        pass
if port:
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Health).serve_forever()
else:
    threading.Event().wait()
"""


# A stand-in for sparkfleet-verify start: does what the flag file in its rank's directory says.
VERIFY = r"""
import json, os, sys, time
workdir = sys.argv[1]
with open(os.path.join(workdir, "verified-epochs"), "a") as handle:
    handle.write(os.environ["SPARKFLEET_EPOCH"] + "\n")
flag = open(os.path.join(workdir, "verify-flag")).read().strip() if os.path.exists(
    os.path.join(workdir, "verify-flag")) else "ok"
if flag == "slow-fail":  # fails once the test has broken the group (it creates the file then)
    while not os.path.exists(os.path.join(workdir, "release")):
        time.sleep(0.1)
if flag == "hang":
    time.sleep(600)
if flag == "stopped":  # the rank is stopped while the check runs (docker's ExecStop comes first): the check fails
    os.kill(os.getppid(), 15)
if flag == "engine-dies":  # the engine dies under the check, which fails; the next start is verified
    os.kill(json.load(open(os.path.join(workdir, "engine.json")))["pid"], 9)
    open(os.path.join(workdir, "verify-flag"), "w").write("ok")
with open(os.path.join(workdir, "status.json"), "w") as handle:
    json.dump({"ok": flag == "ok", "epoch": int(os.environ["SPARKFLEET_EPOCH"]),
               "why": "found a wrong known answer: prompt 1 ...; expected the recorded one"}, handle)
sys.exit({"ok": 0, "wrong": 3}.get(flag, 1))
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def state(port):
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/state", timeout=2) as response:
            return json.load(response)
    except OSError:
        return None


def wait(predicate, what, limit=30.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"waited {limit:.0f} s for {what}")


class Group:
    """Two or three ranks on this machine, each with its own directory, agent and supervisor."""

    def __init__(self, base, size=2, **timing):
        self.base = base
        self.ports = [free_port() for _rank in range(size)]
        self.health = free_port()
        (base / "engine.py").write_text(ENGINE)
        (base / "verify.py").write_text(VERIFY)
        members = [{"host": f"node{r}", "address": "127.0.0.1", "port": port} for r, port in enumerate(self.ports)]
        self.dirs, self.configs = [], []
        for rank in range(size):
            workdir = base / f"rank{rank}"
            workdir.mkdir()
            config = {"rank": rank, "members": members, "port": self.ports[rank], "bind": "127.0.0.1",
                      "state_file": str(workdir / "run" / "state.json"),
                      "history_file": str(workdir / "group-history.json"), "marker": str(workdir / "gave-up"),
                      "log": str(workdir / "engine.log"),
                      "health_url": f"http://127.0.0.1:{self.health}/health",
                      "poll": 0.1, "grace": 1.0, "form_timeout": 10.0, "ready_timeout": 10.0, "burst": 3,
                      "interval": 3600.0, "stop_timeout": 5.0, "http_timeout": 1.0,
                      "verify": [sys.executable, str(base / "verify.py"), str(workdir)] if rank == 0 else None,
                      "verify_status": str(workdir / "status.json"), "verify_timeout": 20.0,
                      "scrub": ["/usr/bin/touch", str(workdir / "scrub-requested")], **timing}
            (workdir / "engine.log").write_text("engine log line\n")
            (workdir / "group.json").write_text(json.dumps(config))
            self.dirs.append(workdir)
            self.configs.append(config)
        self.agents = [self.start("agent", rank) for rank in range(size)]
        for port in self.ports:
            wait(lambda port=port: state(port), "an agent to answer")
        self.supervisors = [None] * size

    def start(self, mode, rank):
        argv = [sys.executable, GROUP, mode, "--config", str(self.dirs[rank] / "group.json")]
        if mode == "run":
            argv += ["--", sys.executable, str(self.base / "engine.py"), str(self.dirs[rank]),
                     str(self.health if rank == 0 else 0)]
        out = open(self.dirs[rank] / f"{mode}.out", "a", encoding="utf-8")  # noqa: SIM115 - the process keeps it
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def run(self, *ranks):
        for rank in ranks or range(len(self.ports)):
            self.supervisors[rank] = self.start("run", rank)

    def state(self, rank):
        return state(self.ports[rank]) or {}

    def engine(self, rank):
        path = self.dirs[rank] / "engine.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def whole(self):
        """The epoch when the head serves and every worker runs in it, else None."""
        head = self.state(0)
        if head.get("phase") != "ready":
            return None
        workers = [self.state(r) for r in range(1, len(self.ports))]
        if all(w.get("phase") == "running" and w.get("epoch") == head["epoch"] for w in workers):
            engines = [self.engine(r) for r in range(len(self.ports))]
            if all(e.get("epoch") == str(head["epoch"]) for e in engines):
                return head["epoch"]
        return None

    def whole_after(self, epoch):
        """The epoch when the group is whole again in one later than `epoch`, else None."""
        now = self.whole()
        return now if now and now > epoch else None

    def history(self):
        return json.loads((self.dirs[0] / "group-history.json").read_text())

    def output(self):
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for d in self.dirs for p in sorted(d.glob("*.out")))

    def close(self):
        for proc in [*self.supervisors, *self.agents]:
            if proc and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.supervisors, *self.agents]:
            if proc:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for rank in range(len(self.ports)):  # no stand-in engine outlives the test
            pid = self.engine(rank).get("pid")
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def group(tmp_path):
    made = []

    def make(**kwargs):
        made.append(Group(tmp_path, **kwargs))
        return made[-1]
    yield make
    for each in made:
        each.close()


def test_the_group_forms_in_one_epoch(group):
    g = group(size=3)
    g.run(2, 1)  # workers first: they wait for the head's epoch
    wait(lambda: all(g.state(r).get("phase") == "waiting" for r in (1, 2)), "the workers to wait")
    g.run(0)
    epoch = wait(g.whole, "the group to form")
    assert [e["epoch"] for e in g.history()] == [epoch]


def test_a_killed_head_engine_restarts_the_whole_group_in_a_new_epoch(group):
    g = group()
    g.run()
    first = wait(g.whole, "the group to form")
    worker_engine = g.engine(1)["pid"]
    os.kill(g.engine(0)["pid"], signal.SIGKILL)
    second = wait(lambda: g.whole_after(first), "the group in a new epoch")
    assert g.engine(1)["pid"] != worker_engine  # the worker's engine was started again, not left behind
    ended = g.history()[0]
    assert ended["epoch"] == first and ended["rank"] == 0 and "the engine exited with status -9" in ended["why"]
    assert g.history()[-1]["epoch"] == second


def test_a_worker_that_dies_ends_the_epoch_and_the_group_forms_again(group):
    g = group()
    g.run()
    first = wait(g.whole, "the group to form")
    head_engine = g.engine(0)["pid"]
    os.kill(g.engine(1)["pid"], signal.SIGKILL)
    wait(lambda: g.whole_after(first), "the group in a new epoch")
    assert g.engine(0)["pid"] != head_engine
    assert g.history()[0]["rank"] == 1 and "left epoch" in g.history()[0]["why"]


def test_a_whole_worker_node_going_away_and_back_rejoins(group):
    g = group()
    g.run()
    first = wait(g.whole, "the group to form")
    # The worker's node goes down: its agent and supervisor with it (SIGKILL: no goodbye).
    for proc in (g.supervisors[1], g.agents[1]):
        proc.kill()
        proc.wait()
    os.kill(g.engine(1)["pid"], signal.SIGKILL)
    wait(lambda: g.state(0).get("phase") == "forming", "the head to end the epoch and form a new one")
    g.agents[1] = g.start("agent", 1)  # the node boots again
    g.run(1)
    assert wait(lambda: g.whole_after(first), "the group whole again") > first
    assert "its agent does not answer" in g.history()[0]["why"]


def test_a_head_that_never_serves_is_bounded_and_every_rank_stays_stopped_with_one_marker(group):
    g = group(ready_timeout=1.5, burst=2)
    (g.dirs[0] / "sick").write_text("")  # the head's API never answers 200: a rendezvous that never completes
    g.run()
    for proc in g.supervisors:
        assert proc.wait(timeout=60) == 75, g.output()
    assert len(g.history()) == 2  # the start limit counts group starts: two epochs, then it gave up
    marker = (g.dirs[0] / "gave-up").read_text()
    assert "hit the start limit of 2 starts" in marker
    assert "the first failure: rank 0 (node0): not serving within 2 s" in marker
    assert "fix: read the log; then run the serve stage again" in marker and "engine log line" in marker
    assert "the head gave up" in (g.dirs[1] / "gave-up").read_text()
    assert g.state(0)["phase"] == "gave-up" and g.state(1)["phase"] == "gave-up"
    # A start of the unit after that (a reboot, systemd) gives up again at once: the group stays stopped.
    g.run(0)
    assert g.supervisors[0].wait(timeout=20) == 75
    assert len(g.history()) == 2


def test_a_stop_stops_the_engine_and_says_so(group):
    g = group()
    g.run()
    wait(g.whole, "the group to form")
    engines = [g.engine(r)["pid"] for r in (0, 1)]
    for proc in g.supervisors:
        proc.send_signal(signal.SIGTERM)
    for proc in g.supervisors:
        assert proc.wait(timeout=20) == 0
    for pid in engines:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert g.state(0)["phase"] == "stopped" and g.state(1)["phase"] == "stopped"


def test_a_stopped_head_drains_while_the_workers_stay_in_its_epoch(group):
    """The head's rank is stopped while it serves: it says it drains, its engine is given the drain timeout on
    top of the stop timeout to finish (here 3 s, beyond the 1 s stop timeout), the worker stays in the epoch
    meanwhile (a tensor-parallel engine needs every rank to finish its requests), and leaves once the head has
    stopped."""
    g = group(stop_timeout=1.0, drain_timeout=10.0)
    g.run()
    epoch = wait(g.whole, "the group to form")
    (g.dirs[0] / "drain-seconds").write_text("3")
    g.supervisors[0].send_signal(signal.SIGTERM)
    assert wait(lambda: g.state(0).get("phase") == "draining", "the head to say it drains")
    assert g.state(0)["epoch"] == epoch
    time.sleep(2.0)  # past the stop timeout: the engine still drains, the worker still runs in the epoch
    assert g.state(1)["phase"] == "running" and g.state(1)["epoch"] == epoch
    assert g.supervisors[0].wait(timeout=20) == 0
    assert (g.dirs[0] / "drained").exists()  # the engine finished by itself: it was not killed
    assert g.state(0)["phase"] == "stopped"
    assert wait(lambda: g.state(1).get("phase") == "left", "the worker to leave the epoch") and \
        g.state(1)["epoch"] == epoch


def test_a_group_restart_after_a_failure_does_not_wait_for_the_drain(group):
    """An engine that would take its whole drain timeout is stopped after the stop timeout when the group restarts
    because a rank failed: requests that cannot finish are not waited for."""
    g = group(stop_timeout=1.0, drain_timeout=60.0)
    g.run()
    first = wait(g.whole, "the group to form")
    (g.dirs[0] / "drain-seconds").write_text("60")
    os.kill(g.engine(1)["pid"], signal.SIGKILL)
    assert wait(lambda: g.whole_after(first), "the group in a new epoch", limit=20) > first
    assert not (g.dirs[0] / "drained").exists()
    (g.dirs[0] / "drain-seconds").unlink()  # the last engine's stop, at the end, drains at once


def test_a_worker_never_joins_a_group_that_already_serves(group):
    g = group(grace=3.0)
    g.run()
    first = wait(g.whole, "the group to form")
    # The worker's rank restarts faster than the head's grace (systemd restarting a crashed supervisor): the new
    # worker finds an epoch already serving, which a group that formed without it cannot take in. It waits; the
    # head sees it outside the epoch and opens a new one, which it joins.
    g.supervisors[1].kill()
    g.supervisors[1].wait()
    os.kill(g.engine(1)["pid"], signal.SIGKILL)
    g.run(1)
    wait(lambda: g.state(1).get("phase") == "waiting", "the new worker to wait")
    assert g.state(0)["epoch"] == first and g.state(1).get("epoch") is None
    assert wait(lambda: g.whole_after(first), "a new epoch with the worker in it") > first


def test_each_start_is_verified_before_the_group_says_it_serves(group):
    g = group()
    g.run()
    first = wait(g.whole, "the group to form")
    assert (g.dirs[0] / "verified-epochs").read_text().split() == [str(first)]
    os.kill(g.engine(1)["pid"], signal.SIGKILL)
    second = wait(lambda: g.whole_after(first), "the group in a new epoch")
    assert (g.dirs[0] / "verified-epochs").read_text().split() == [str(first), str(second)]
    assert not (g.dirs[0] / "scrub-requested").exists()


def test_a_start_that_fails_its_verification_stops_every_rank_and_scrubs_on_a_wrong_answer(group):
    g = group()
    (g.dirs[0] / "verify-flag").write_text("wrong")
    g.run()
    for proc in g.supervisors:
        assert proc.wait(timeout=60) == 75, g.output()
    assert len(g.history()) == 1  # a wrong answer is not retried: the next start would serve the same one
    marker = (g.dirs[0] / "gave-up").read_text()
    assert "failed its verification, so the group stops rather than serve it" in marker
    assert "a wrong known answer" in marker
    assert "the head gave up" in (g.dirs[1] / "gave-up").read_text()
    assert g.state(0)["phase"] == "gave-up" and g.state(0)["scrub"] is True
    # Every rank asks for a scrub of its own weights.
    assert (g.dirs[0] / "scrub-requested").exists() and (g.dirs[1] / "scrub-requested").exists()


def test_a_wrong_pool_stops_the_group_without_a_scrub(group):
    g = group()
    (g.dirs[0] / "verify-flag").write_text("pool")
    g.run()
    for proc in g.supervisors:
        assert proc.wait(timeout=60) == 75, g.output()
    assert not (g.dirs[0] / "scrub-requested").exists() and not (g.dirs[1] / "scrub-requested").exists()


def test_a_group_that_falls_apart_while_verified_restarts_instead_of_giving_up(group):
    g = group()
    (g.dirs[0] / "verify-flag").write_text("slow-fail")
    g.run()
    wait(lambda: g.state(0).get("phase") == "verifying", "the head to verify its start")
    first = g.state(0)["epoch"]
    wait(lambda: g.engine(1).get("epoch") == str(first), "the worker's engine in the epoch")
    os.kill(g.engine(1)["pid"], signal.SIGKILL)  # a worker dies while the verification runs (and so it fails)
    wait(lambda: g.state(1).get("phase") == "left", "the worker to leave the epoch")
    (g.dirs[0] / "verify-flag").write_text("ok")  # the next start verifies
    (g.dirs[0] / "release").write_text("")
    assert wait(lambda: g.whole_after(first), "the group whole in a new epoch") > first
    assert not (g.dirs[0] / "gave-up").exists()
    assert "left epoch" in g.history()[0]["why"]


def test_a_stop_during_the_verification_stops_the_rank_at_once(group):
    g = group(verify_timeout=900.0)  # the stop must end the check, not wait for its deadline
    (g.dirs[0] / "verify-flag").write_text("hang")
    g.run()
    wait(lambda: g.state(0).get("phase") == "verifying", "the head to verify its start")
    engine = g.engine(0)["pid"]
    g.supervisors[0].send_signal(signal.SIGTERM)
    assert g.supervisors[0].wait(timeout=60) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(engine, 0)
    assert g.state(0)["phase"] == "stopped"


def test_a_check_that_fails_because_the_rank_is_stopping_is_a_stop_not_a_verdict(group):
    g = group()
    (g.dirs[0] / "verify-flag").write_text("stopped")
    g.run()
    assert g.supervisors[0].wait(timeout=60) == 0, g.output()
    assert not (g.dirs[0] / "gave-up").exists() and g.state(0)["phase"] == "stopped"


def test_a_check_that_fails_because_the_engine_died_restarts_the_group(group):
    g = group()
    (g.dirs[0] / "verify-flag").write_text("engine-dies")
    g.run()
    epoch = wait(g.whole, "the group whole, in a start that passed its check")
    assert len(g.history()) == 2 and g.history()[0]["rank"] == 0 and g.history()[-1]["epoch"] == epoch
    assert not (g.dirs[0] / "gave-up").exists()
