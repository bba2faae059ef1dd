"""make fleet: two serving groups behind one vllm-router (docs/fleet.md), on two 2-node labs (TP2 each).

Group a's head also runs the router; group b's management network is a second Docker network, which the router's
container joins (as a router host with a leg in each group's network would), and group b lets that address in.
Every client request goes through the router from this machine. What is measured: the fleet's throughput against
one group's alone, how soon the router stops sending to a group whose head engine is killed under load (and that
it takes the group back once it has healed itself and verified), and a fleet upgrade under load that loses no
request. Not part of make test (two serving groups beside the serving lab's drills would not fit its time).
"""

import json
import os
import re
import secrets
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml
from conftest import NOTES, ROOT, api_key, container, lab_hosts, on_node, output, run_playbook, wait_until

SITE = os.path.join(ROOT, "site.yml")
FLEET = os.path.join(ROOT, "playbooks/fleet.yml")
FLEET_UPGRADE = os.path.join(ROOT, "playbooks/fleet_upgrade.yml")
ROUTER_PORT = 30000
API_PORT = 8888
MODEL = "tiny-cpu"
# what the router role's defaults set: vllm-router's own health checks, and the membership agent's poll
HEALTH_CHECK_INTERVAL = 5
MEMBERS_POLL = 1.0
# Bypasses any proxy this machine's environment names: every request goes to a lab address.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def figure(line):
    print(f"\n{line}")
    NOTES.append(line)


def head_url(lab):
    return f"http://{lab_hosts(lab)['node0']['ansible_host']}:{API_PORT}"


def get_json(url, timeout=10):
    with OPENER.open(url, timeout=timeout) as response:
        return json.load(response)


def workers(router):
    """The router's worker URLs, as its own /list_workers says (None while it does not answer)."""
    try:
        return sorted(get_json(f"{router}/list_workers")["urls"])
    except (OSError, ValueError, KeyError):
        return None


def main_pid(lab, node):
    return on_node(lab, node, "systemctl", "show", "sparkfleet-vllm.service", "-p", "MainPID").stdout.strip()


def group_state(lab):
    text = on_node(lab, "node0", "cat", "/var/lib/sparkfleet/group/state.json", check=False).stdout
    return json.loads(text) if text.strip() else {}


def start_status(lab):
    text = on_node(lab, "node0", "cat", "/var/lib/sparkfleet/verify/status.json", check=False).stdout
    return json.loads(text) if text.strip() else {}


class Load:
    """Clients sending completions of `tokens` tokens (ignore_eos: each decodes all of them) to `url`, one after
    the other, each client until `count` requests were sent in all or stop() is called; every request's outcome
    kept (a refused or unreachable one waits half a second before the next: a bounded load, not a spin)."""

    def __init__(self, url, key, clients=4, tokens=64, count=None):
        self.url, self.key, self.tokens, self.count = url, key, tokens, count
        self.requests, self.lock, self.stopping, self.sent = [], threading.Lock(), threading.Event(), 0
        self.threads = [threading.Thread(target=self.client, daemon=True) for _client in range(clients)]

    def take(self):
        with self.lock:
            if self.stopping.is_set() or (self.count is not None and self.sent >= self.count):
                return False
            self.sent += 1
            return True

    def client(self):
        while self.take():
            # each prompt a user's own: vllm-router's default policy (cache_aware) sends prompts that share a
            # prefix to the group that holds it, and balances the others by load
            body = json.dumps({"model": MODEL, "prompt": f"{secrets.token_hex(6)} Count on:", "max_tokens": self.tokens,
                               "ignore_eos": True, "temperature": 0}).encode()
            request = urllib.request.Request(f"{self.url}/v1/completions", body, {
                "Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
            began = time.time()
            try:
                with OPENER.open(request, timeout=120) as response:
                    answer = json.load(response)
                line = {"ok": True, "tokens": answer["usage"]["completion_tokens"],
                        "finish": answer["choices"][0]["finish_reason"]}
            except urllib.error.HTTPError as err:
                line = {"ok": False, "error": f"HTTP {err.code}"}
            except Exception as err:  # pylint: disable=broad-exception-caught  # (every failure is the figure)
                line = {"ok": False, "error": type(err).__name__}
            line.update(began=began, ended=time.time())
            with self.lock:
                self.requests.append(line)
            if not line["ok"]:
                time.sleep(0.5)

    def start(self):
        for thread in self.threads:
            thread.start()
        return self

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=180)
        return list(self.requests)

    def wait(self):
        for thread in self.threads:
            thread.join(timeout=900)
        return list(self.requests)


def whole(requests, tokens):
    """The answered requests that were cut short (an aborted one ends before its tokens)."""
    return [r for r in requests if r["ok"] and not (r["tokens"] == tokens and r["finish"] == "length")]


class Watch:
    """The router's worker list, read every `poll` seconds on a thread of its own: [(time, urls)] at each change."""

    def __init__(self, router, poll=0.2):
        self.router, self.poll, self.changes, self.stopping = router, poll, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stopping.is_set():
            now = workers(self.router)
            if not self.changes or self.changes[-1][1] != now:
                self.changes.append((time.time(), now))
            time.sleep(self.poll)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.thread.join(timeout=10)

    def first(self, predicate, after=0.0):
        return next((at for at, urls in self.changes if at >= after and urls is not None and predicate(urls)), None)


@pytest.fixture(scope="module")
def fleet(fleet_labs, tmp_path_factory):
    """The two groups serving, the router on group a's head with both as its workers (fleet.yml); returns a dict
    with the labs, the router's URL, the fleet inventory and fleet.yml's output."""
    group_a, group_b = fleet_labs
    base = tmp_path_factory.mktemp("fleet")
    router_container = container(group_a, "node0")
    network_b = f"{group_b['extravars']['lab_name']}-mgmt"
    joined = json.loads(subprocess.run(["docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}",
                                        router_container], capture_output=True, text=True, check=True).stdout)
    if network_b not in joined:
        subprocess.run(["docker", "network", "connect", network_b, router_container], check=True,
                       capture_output=True)
        joined = json.loads(subprocess.run(["docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}",
                                            router_container], capture_output=True, text=True, check=True).stdout)
    router_on_b = joined[network_b]["IPAddress"]
    router_address = lab_hosts(group_a)["node0"]["ansible_host"]
    # Group b lets the router in from both of its addresses (the one the fleet knows it by, and the one its packets
    # reach group b from), through its own firewall: preflight and fabric again, no rank restarted.
    group_vars = os.path.join(os.path.dirname(group_b["inventory"]), "group_vars", "sparkfleet_cluster.yml")
    os.makedirs(os.path.dirname(group_vars), exist_ok=True)
    settings = {"sparkfleet_router_addresses": [router_address, router_on_b]}
    with open(group_vars, "w", encoding="utf-8") as handle:
        yaml.safe_dump(settings, handle)
    ranks = {node: main_pid(group_b, node) for node in ("node0", "node1")}
    opened = run_playbook(base / "open-b", SITE, inventory=group_b["inventory"], cmdline="--tags preflight,fabric")
    assert opened.status == "successful", output(opened)[-4000:]
    assert {node: main_pid(group_b, node) for node in ("node0", "node1")} == ranks  # no rank restarted

    # The fleet inventory: the router host (group a's head, reached as group a reaches it) and the two groups.
    with open(group_a["inventory"], encoding="utf-8") as handle:
        cluster_a = yaml.safe_load(handle)["all"]["children"]["sparkfleet_cluster"]
    access = {key: cluster_a["vars"][key] for key in ("ansible_user", "ansible_ssh_private_key_file",
                                                      "ansible_ssh_common_args", "ansible_python_interpreter")}
    management = cluster_a["vars"]["sparkfleet_api_allowed_sources"]
    inventory = base / "inventory" / "hosts.yml"
    inventory.parent.mkdir()
    inventory.write_text(yaml.safe_dump({"all": {"children": {"sparkfleet_router": {"hosts": {"router": {
        "ansible_host": router_address, **access,
        "sparkfleet_fleet_groups": [{"name": "a", "inventory": group_a["inventory"]},
                                    {"name": "b", "inventory": group_b["inventory"]}],
        "router_allowed_sources": management}}}}}}, sort_keys=False), encoding="utf-8")
    runner = run_playbook(base / "fleet", FLEET, inventory=str(inventory))
    text = output(runner)
    assert runner.status == "successful", text[-5000:]
    router = f"http://{router_address}:{ROUTER_PORT}"
    urls = sorted([head_url(group_a), head_url(group_b)])
    wait_until(lambda: workers(router) == urls, "both groups in the router", stall=120)
    return {"a": group_a, "b": group_b, "router": router, "inventory": str(inventory), "base": base,
            "output": text, "urls": {"a": head_url(group_a), "b": head_url(group_b)}}


def scrape_targets(lab):
    """{(job, node): health} of the Prometheus on the lab's head (the watch stage's), None while it does not answer."""
    try:
        data = get_json(f"http://{lab_hosts(lab)['node0']['ansible_host']}:9090/api/v1/targets")["data"]
    except (OSError, ValueError, KeyError):
        return None
    return {(t["labels"]["job"], t["labels"].get("node")): t["health"] for t in data["activeTargets"]}


def test_both_verified_groups_are_the_routers_workers_and_a_second_run_changes_nothing(fleet):
    """fleet.yml made the router with both groups' heads as its workers (the agent put them in: each head's last
    start verified); group a's Prometheus (on the router host) scrapes the router's own metrics; a request through
    the router with the groups' key is answered, one without it is the group's 401; fleet.yml again changes
    nothing, and --check finds nothing to change."""
    both = sorted(fleet["urls"].values())
    wait_until(lambda: workers(fleet["router"]) == both, "both groups in the router's answer", stall=60)
    # (the targets as Prometheus lists them are the progress: a wait that fails shows the last of them)
    wait_until(lambda: (scrape_targets(fleet["a"]) or {}).get(("router", "router")) == "up",
               "group a's Prometheus scraping the router", progress=lambda: scrape_targets(fleet["a"]), stall=180)
    for name in ("a", "b"):
        assert start_status(fleet[name]).get("ok") and group_state(fleet[name]).get("phase") == "ready"
    requests = Load(fleet["router"], api_key(fleet["a"]), clients=2, tokens=8, count=4).start().wait()
    assert len(requests) == 4 and all(r["ok"] for r in requests) and not whole(requests, 8), requests
    refused = Load(fleet["router"], "not-the-key", clients=1, tokens=8, count=1).start().wait()
    assert refused[0]["error"] == "HTTP 401", refused
    for name, cmdline in (("again", None), ("check", "--check")):
        runner = run_playbook(fleet["base"] / name, FLEET, inventory=fleet["inventory"], cmdline=cmdline)
        text = output(runner)
        assert runner.status == "successful" and runner.stats["changed"] == {}, text[-4000:]


def answered_by(fleet):
    """How many requests each group's head has answered since its start (vLLM's own counter, from its /metrics)."""
    counts = {}
    for name, url in fleet["urls"].items():
        with OPENER.open(f"{url}/metrics", timeout=10) as response:
            text = response.read().decode()
        counts[name] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.startswith("vllm:request_success_total{"))
    return counts


def throughput(url, key, requests=24, clients=4, tokens=64):
    started = time.monotonic()
    done = Load(url, key, clients=clients, tokens=tokens, count=requests).start().wait()
    seconds = time.monotonic() - started
    assert len(done) == requests and all(r["ok"] for r in done) and not whole(done, tokens), done
    return seconds, requests * tokens / seconds


def test_throughput_through_the_router_against_one_group_alone(fleet):
    """A benchmark, not an assertion on speed: the same bounded load (24 completions of 64 tokens, 4 clients) sent
    to group a's head alone, then through the router to both groups, with how many each group answered (its own
    counter). Each group's ranks compute on a core of their own of this machine (conftest's lab_vllm_cpus), as each
    group of a real fleet has Sparks of its own; everything else shares the machine."""
    key = api_key(fleet["a"])
    throughput(fleet["router"], key, requests=4)  # both groups warm (their first requests compile nothing later)
    alone, alone_rate = throughput(fleet["urls"]["a"], key)
    before = answered_by(fleet)
    routed, routed_rate = throughput(fleet["router"], key)
    after = answered_by(fleet)
    split = ", ".join(f"group {name} {after[name] - before[name]:.0f}" for name in sorted(after))
    assert sum(after.values()) - sum(before.values()) == 24, (before, after)  # every one answered by a group
    assert all(after[name] > before[name] for name in after), (before, after)  # the router used both
    figure(f"throughput, 24 completions x 64 tokens, 4 clients: group a alone {alone:.1f} s ({alone_rate:.1f} tok/s); "
           f"through the router to both groups {routed:.1f} s ({routed_rate:.1f} tok/s), "
           f"{routed_rate / alone_rate:.2f}x; answered: {split} (each group's ranks on a core of their own of this "
           f"machine's {os.cpu_count()})")


def test_a_killed_head_leaves_the_router_at_once_and_rejoins_verified_while_the_other_group_answers(fleet):
    """Under a load through the router, group b's head EngineCore is killed: the router stops sending to group b
    (measured from the kill to group b's URL leaving the worker list; the membership agent reads each head's state
    every second, vllm-router's own health check runs every 5 s), no request sent after that fails, group a answers
    meanwhile, group b heals itself (a new epoch, verified) and the router takes it back."""
    group_b, key = fleet["b"], api_key(fleet["a"])
    before = group_state(group_b)
    assert before.get("phase") == "ready", before
    engine = on_node(group_b, "node0", "pgrep", "-f", "VLLM::EngineCore").stdout.split()
    assert engine, "no EngineCore on group b's head"
    with Watch(fleet["router"]) as watch:
        load = Load(fleet["router"], key, clients=4, tokens=32).start()
        try:
            time.sleep(5)
            killed = time.time()
            on_node(group_b, "node0", "kill", "-KILL", *engine)
            removed = wait_until(lambda: watch.first(lambda urls: fleet["urls"]["b"] not in urls, killed),
                                 "group b out of the router", stall=60)
            wait_until(lambda: group_state(group_b).get("epoch") not in (None, before["epoch"])
                       and group_state(group_b).get("phase") == "ready" and start_status(group_b).get("ok"),
                       "group b verified again by itself", stall=300)
            back = wait_until(lambda: watch.first(lambda urls: fleet["urls"]["b"] in urls, removed),
                              "group b back in the router", stall=60)
        finally:
            requests = load.stop()
    failed = [r for r in requests if not r["ok"]]
    late = [r for r in failed if r["began"] > removed]
    during = [r for r in requests if r["ok"] and removed < r["began"] and r["ended"] < back]
    assert not late, late[:5]
    assert during, "group a answered nothing while group b was out"
    assert not whole(requests, 32)
    assert start_status(group_b)["found"]["known_answer"] == "matched"
    figure(f"group b's head EngineCore killed under load through the router: out of the router "
           f"{removed - killed:.1f} s after the kill (agent poll {MEMBERS_POLL:g} s, vllm-router health check every "
           f"{HEALTH_CHECK_INTERVAL} s); "
           f"back, verified, {back - killed:.1f} s after it; {len(requests)} requests: {len(failed)} failed "
           f"(all sent before group b was out), {len(during)} answered by group a while group b healed")


def test_a_fleet_upgrade_under_load_loses_no_request(fleet):
    """fleet_upgrade.yml to another max-num-seqs under a load through the router for the whole run: each group in
    turn leaves the router (the other answers), is drained, upgraded and verified by upgrade.yml, and comes back
    before the next one leaves; not one request fails or is cut short."""
    new_state = fleet["base"] / "new-state.yml"
    new_state.write_text(yaml.safe_dump({"sparkfleet_vllm_args": {"max-num-seqs": 6}}), encoding="utf-8")
    epochs = {name: start_status(fleet[name])["epoch"] for name in ("a", "b")}
    both = sorted(fleet["urls"].values())
    with Watch(fleet["router"]) as watch:
        load = Load(fleet["router"], api_key(fleet["a"]), clients=3, tokens=64).start()
        try:
            started = time.monotonic()
            runner = run_playbook(fleet["base"] / "upgrade", FLEET_UPGRADE, inventory=fleet["inventory"],
                                  extravars={"fleet_upgrade_vars_file": str(new_state)})
            seconds = time.monotonic() - started
            time.sleep(2)
        finally:
            requests = load.stop()
    text = output(runner)
    assert runner.status == "successful", text[-5000:]
    failed = [r for r in requests if not r["ok"]]
    assert requests and not failed, f"{len(failed)} of {len(requests)} requests failed: {failed[:5]}"
    assert not whole(requests, 64)
    # the worker list went: both, b alone, both, a alone, both (each group out while the other answered)
    lists = [urls for _at, urls in watch.changes if urls is not None]
    assert lists[0] == both and lists[-1] == both, watch.changes
    steps = [tuple(urls) for urls in lists]
    expected = [tuple(both), (fleet["urls"]["b"],), tuple(both), (fleet["urls"]["a"],), tuple(both)]
    assert [step for index, step in enumerate(steps) if index == 0 or step != steps[index - 1]] == expected, steps
    for name in ("a", "b"):
        status = start_status(fleet[name])
        assert status["ok"] and status["epoch"] != epochs[name], (name, status)
        launcher = on_node(fleet[name], "node0", "cat", "/usr/local/libexec/sparkfleet/vllm-launch").stdout
        assert re.search(r"--max-num-seqs[ =]'?6\b", launcher), launcher[-2000:]
    out = []  # (group, seconds out of the router) in the order they left
    for (at, urls), (later, _next) in zip(watch.changes, watch.changes[1:], strict=False):
        if urls is not None and len(urls) == 1:
            out.append(("a" if fleet["urls"]["b"] in urls else "b", later - at))
    figure(f"fleet_upgrade.yml (max-num-seqs 6) under load through the router: {seconds:.0f} s for both groups; "
           f"{len(requests)} requests, 0 failed, none cut short; out of the router in turn: "
           + ", ".join(f"group {name} {span:.0f} s" for name, span in out))
