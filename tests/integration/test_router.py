"""The fleet's membership agent (roles/router/files/sparkfleet-fleet-members) against the real vllm-router 0.1.17
(its pinned wheel, in a venv of its own) and the real group agents (roles/vllm_service/files/sparkfleet-group agent,
answering from the state file a rank's supervisor writes), all on loopback, no lab.

The two workers stand in for a group head's vLLM API: the router asks them /health and forwards the chat requests,
and they say which group answered. The fleet lab runs the same agent in front of real vLLM groups."""

import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEMBERS = os.path.join(ROOT, "roles/router/files/sparkfleet-fleet-members")
GROUP = os.path.join(ROOT, "roles/vllm_service/files/sparkfleet-group")
DEFAULTS = os.path.join(ROOT, "roles/router/defaults/main.yml")  # router_requirements: what the role installs
# The agent imports the collection's module_utils from the directory holding ansible_collections/, as on a node.
ENV = dict(os.environ, SPARKFLEET_PYTHONPATH=os.path.join(ROOT, "collections"))
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

WORKER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
name, port = sys.argv[1], int(sys.argv[2])
class Handler(BaseHTTPRequestHandler):
    def answer(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.answer({})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.answer({"id": "x", "object": "chat.completion", "model": "m", "choices": [{"index": 0,
                     "message": {"role": "assistant", "content": name}, "finish_reason": "stop"}]})
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def vllm_router():
    """The vllm-router command of a venv holding the router role's router_requirements, made once and reused."""
    with open(DEFAULTS, encoding="utf-8") as handle:
        requirements = yaml.safe_load(handle)["router_requirements"]
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    venv = os.path.expanduser(f"~/.cache/sparkfleet/venvs/router-{digest}")
    command = os.path.join(venv, "bin", "vllm-router")
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(venv, ".installed")):
            shutil.rmtree(venv, ignore_errors=True)
            for argv in ([sys.executable, "-m", "venv", venv],
                         [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", *requirements]):
                proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
                assert proc.returncode == 0, f"{' '.join(argv[:4])}: {(proc.stderr or proc.stdout)[-1500:]}"
            open(os.path.join(venv, ".installed"), "w").close()
    return command


class Processes:
    """Processes this test started, each in its own session, ended by PID at the end."""

    def __init__(self):
        self.procs = []

    def start(self, argv, log, env=None):
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.procs.append(proc)
        return proc

    def end(self, proc):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def end_all(self):
        for proc in self.procs:
            self.end(proc)


def wait_for(ready, what, limit=30.0):
    deadline = time.monotonic() + limit
    while not ready():
        assert time.monotonic() < deadline, f"waited {limit:.0f} s for {what}"
        time.sleep(0.2)


def get(url):
    try:
        with DIRECT.open(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return None, ""


def ask(router):
    request = urllib.request.Request(f"{router}/v1/chat/completions", method="POST", headers={
        "Content-Type": "application/json"}, data=json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "hi"}]}).encode())
    try:
        with DIRECT.open(request, timeout=10) as response:
            return json.load(response)["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"


def start_router(procs, log, vllm_router, port):
    proc = procs.start([vllm_router, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                        "--health-check-interval-secs", "1"], log)
    wait_for(lambda: get(f"http://127.0.0.1:{port}/list_workers")[0] == 200, "the router to answer")
    return proc


@pytest.fixture
def fleet_scene(vllm_router, tmp_path):
    """Two groups (a stand-in head API and a real group agent each), a real vllm-router with no worker, and the
    membership agent's configuration; every process ended by PID afterwards."""
    procs = Processes()
    with open(tmp_path / "processes.log", "w", encoding="utf-8") as log:
        try:
            groups, agents = {}, {}
            for name in ("a", "b"):
                worker_port, agent_port = free_port(), free_port()
                procs.start([sys.executable, "-c", WORKER, name, str(worker_port)], log)
                state = tmp_path / f"{name}-state.json"
                config = tmp_path / f"{name}-agent.json"
                config.write_text(json.dumps({"rank": 0, "port": agent_port, "bind": "127.0.0.1",
                                              "state_file": str(state), "unit": None}))
                agents[name] = (procs.start([sys.executable, GROUP, "agent", "--config", str(config)], log), state)
                groups[name] = {"worker": f"http://127.0.0.1:{worker_port}",
                                "state": f"http://127.0.0.1:{agent_port}/state"}
            router_port = free_port()
            router_proc = start_router(procs, log, vllm_router, router_port)
            for name, group in groups.items():
                wait_for(lambda url=group["state"]: get(url)[0] == 200, f"group {name}'s agent")
            status_file, hold = tmp_path / "members.json", tmp_path / "hold"
            hold.mkdir()
            config = tmp_path / "members.json.config"
            listing = [{"name": name, **group} for name, group in groups.items()]
            config.write_text(json.dumps({"router": f"http://127.0.0.1:{router_port}", "groups": listing,
                                          "hold_dir": str(hold), "status_file": str(status_file),
                                          "textfile": str(tmp_path / "fleet.prom"), "http_timeout": 2,
                                          "poll": 0.3}))
            yield {"procs": procs, "log": log, "groups": groups, "agents": agents, "router_port": router_port,
                   "router": f"http://127.0.0.1:{router_port}", "router_proc": router_proc, "config": config,
                   "status_file": status_file, "hold": hold}
        finally:
            procs.end_all()


def test_the_router_sends_requests_only_to_verified_groups_not_held_out(fleet_scene, tmp_path):
    scene = fleet_scene
    procs, groups, agents, router = scene["procs"], scene["groups"], scene["agents"], scene["router"]
    router_proc, config, status_file, hold = (scene["router_proc"], scene["config"], scene["status_file"],
                                              scene["hold"])

    def members_once():
        proc = subprocess.run([sys.executable, MEMBERS, "--config", str(config), "--once"], capture_output=True,
                              text=True, timeout=60, check=False, env=ENV)
        return proc, json.loads(status_file.read_text())

    def listed():
        return sorted(json.loads(get(f"{router}/list_workers")[1])["urls"])

    def publish(name, phase, epoch):
        agents[name][1].write_text(json.dumps({"phase": phase, "epoch": epoch}))

    # a verified, b still verifying its start: only a serves
    publish("a", "ready", 11)
    publish("b", "verifying", 21)
    proc, status = members_once()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert listed() == [groups["a"]["worker"]]
    assert status["groups"]["b"] == {"url": groups["b"]["worker"], "member": False, "phase": "verifying",
                                     "epoch": 21, "why": "its head is verifying (epoch 21)"}
    assert "group a serves: verified (epoch 11)" in proc.stdout
    assert {ask(router) for attempt in range(6)} == {"a"}

    # b verified: both serve, in turn
    publish("b", "ready", 21)
    assert members_once()[0].returncode == 0
    assert listed() == sorted(group["worker"] for group in groups.values())
    answers = [ask(router) for attempt in range(6)]
    assert sorted(set(answers)) == ["a", "b"], answers
    assert 'sparkfleet_fleet_member{group="b"} 1' in (tmp_path / "fleet.prom").read_text()

    # a fleet upgrade holds a out: it leaves at once, b takes every request
    (hold / "a").touch()
    proc, status = members_once()
    assert listed() == [groups["b"]["worker"]] and status["groups"]["a"]["why"] == "held out by a fleet upgrade"
    assert {ask(router) for attempt in range(6)} == {"b"}

    # a released; b's agent stops answering (its node went away): a back, b out
    (hold / "a").unlink()
    procs.end(agents["b"][0])
    proc, status = members_once()
    assert listed() == [groups["a"]["worker"]], proc.stdout
    assert status["groups"]["b"]["why"] == "its head's group agent did not answer"
    assert {ask(router) for attempt in range(4)} == {"a"}

    # a's start failed its verification (the group gave up): no group serves, the router says so
    publish("a", "gave-up", 11)
    members_once()
    assert listed() == []
    assert ask(router) == "HTTP 503"

    # the router gone: nothing can be changed, and the agent says so (exit 1, router_ok false)
    procs.end(router_proc)
    proc, status = members_once()
    assert proc.returncode == 1 and status["router_ok"] is False
    assert status["groups"]["a"]["why"] == "its head is gave-up (epoch 11); the router does not answer"
    assert "does not answer /list_workers" in proc.stdout
    assert "sparkfleet_fleet_router_up 0" in (tmp_path / "fleet.prom").read_text()


def test_the_running_agent_keeps_the_router_to_the_fleet_through_strangers_and_a_router_restart(fleet_scene,
                                                                                                vllm_router):
    """The agent as its unit runs it (a loop every 0.3 s): a worker someone adds through the router's open
    /add_worker is taken away; a router restarted empty gets the verified groups back; a group whose head
    stops being ready leaves within a round or two."""
    scene = fleet_scene
    router, groups = scene["router"], scene["groups"]
    for name in ("a", "b"):
        scene["agents"][name][1].write_text(json.dumps({"phase": "ready", "epoch": 5}))

    def listed():
        found = get(f"{router}/list_workers")
        return sorted(json.loads(found[1])["urls"]) if found[0] == 200 else None

    both = sorted(group["worker"] for group in groups.values())
    agent = scene["procs"].start([sys.executable, MEMBERS, "--config", str(scene["config"])], scene["log"], ENV)
    wait_for(lambda: listed() == both, "the agent to add both verified groups", limit=20)
    port = free_port()  # a worker of no group, added by someone who reached the router's port
    stranger = f"http://127.0.0.1:{port}"
    scene["procs"].start([sys.executable, "-c", WORKER, "stranger", str(port)], scene["log"])
    wait_for(lambda: get(f"{stranger}/health")[0] == 200, "the stranger to answer")
    request = urllib.request.Request(f"{router}/add_worker?url={stranger}", data=b"", method="POST")
    with DIRECT.open(request, timeout=20) as response:
        assert response.status == 200
    wait_for(lambda: listed() == both, "the agent to take the stranger away", limit=10)
    assert "stranger" not in {ask(router) for attempt in range(4)}
    scene["procs"].end(scene["router_proc"])
    start_router(scene["procs"], scene["log"], vllm_router, scene["router_port"])
    wait_for(lambda: listed() == both, "the agent to give the restarted router both groups again", limit=20)
    scene["agents"]["b"][1].write_text(json.dumps({"phase": "forming", "epoch": 6}))
    wait_for(lambda: listed() == [groups["a"]["worker"]], "group b to leave once its head is forming", limit=10)
    assert agent.poll() is None  # still running
    assert stranger not in json.dumps(json.loads(scene["status_file"].read_text()))


def test_a_bad_configuration_is_refused_in_one_line(tmp_path):
    config = tmp_path / "members.json"
    config.write_text(json.dumps({"router": "http://127.0.0.1:1", "groups": [{"name": "a", "worker": "http://x"}]}))
    proc = subprocess.run([sys.executable, MEMBERS, "--config", str(config), "--once"], capture_output=True,
                          text=True, timeout=60, check=False, env=ENV)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"sparkfleet-fleet-members: cannot read {config}: groups[0]: needs name, "
                                   "worker and state (strings)")
