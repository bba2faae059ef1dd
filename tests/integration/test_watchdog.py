"""The memory watchdog against real processes on this machine (no lab needed).

The threshold sits above the machine's MemAvailable, so the watchdog trips at its first reading. The
serving processes carry a title prefix unique to this test run: the lab's real vLLM processes, visible from
the host, are never candidates.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WATCHDOG = os.path.join(ROOT, "roles/node_memory/files/sparkfleet-watchdog")
VICTIM = os.path.join(ROOT, "tests/integration/watchdog_victim.py")
GRACE = 1.0
INTERVAL = 1.0  # seconds between the daemon's MemAvailable readings (its default is 0.2)


def mem_available_kib():
    with open("/proc/meminfo", encoding="ascii") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("MemAvailable:"))


def spawn(title, record, mode):
    """A victim whose argv[0] is `title`, as setproctitle would make it (exec -a)."""
    return subprocess.Popen(["bash", "-c", f'exec -a "$0" {sys.executable} {VICTIM} "$1" "$2"', title, record, mode],
                            start_new_session=True)


def wait_ready(path, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and "ready" in Path(path).read_text(encoding="ascii"):
            return
        time.sleep(0.02)
    pytest.fail(f"{path} never became ready")


def events(path):
    with open(path, encoding="ascii") as handle:
        return {kind: float(stamp) for kind, stamp in (line.split() for line in handle)}


@pytest.fixture
def processes():
    """The processes a test starts; whatever is still running at its end is ended, by PID."""
    started = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_term_then_kill_only_the_one_that_ignored_it(tmp_path, processes):
    prefix = f"SFTEST{uuid.uuid4().hex[:8]}::"
    obedient, stubborn, bystander = (str(tmp_path / name) for name in ("obedient", "stubborn", "bystander"))
    victims = {"obedient": spawn(prefix + "EngineCore", obedient, "obey"),
               "stubborn": spawn(prefix + "Worker_TP0", stubborn, "ignore"),
               "bystander": spawn("bystander-" + prefix, bystander, "ignore")}
    processes.extend(victims.values())
    for path in (obedient, stubborn, bystander):
        wait_ready(path)
    threshold = mem_available_kib() + 4 * 2 ** 20  # 4 GiB above what the machine has: trips at once
    textfile = tmp_path / "watchdog.prom"
    daemon = subprocess.Popen([sys.executable, WATCHDOG, "--threshold-kib", str(threshold), "--grace", str(GRACE),
                               "--interval", str(INTERVAL),
                               "--min-trip-interval", "60", "--title-prefix", prefix, "--cgroup", "none",
                               "--textfile", str(textfile)], stdout=subprocess.PIPE, text=True)
    processes.append(daemon)
    victims["obedient"].wait(timeout=10)
    victims["stubborn"].wait(timeout=10)
    os.kill(daemon.pid, signal.SIGTERM)
    log = daemon.communicate(timeout=10)[0]

    armed = float(log.split("armed", 1)[1].split(" at ")[1].split()[0])
    obedient_term, stubborn_term = events(obedient)["term"], events(stubborn)["term"]
    # The first reading is the crossing: both are signalled before a second reading could have been taken (a
    # reading interval long enough that a busy machine's scheduling delays do not blur the two).
    assert obedient_term - armed < INTERVAL, log
    assert stubborn_term - armed < INTERVAL, log
    assert victims["obedient"].returncode == 0  # it exited on TERM by itself
    assert victims["stubborn"].returncode == -signal.SIGKILL
    assert f"SIGKILL to [{victims['stubborn'].pid}]" in log
    assert "term" not in events(bystander) and victims["bystander"].poll() is None
    assert "TRIPPED MemAvailable=" in log and log.count("TRIPPED") == 1  # rate-limited
    metrics = textfile.read_text()
    assert "sparkfleet_watchdog_trips_total 1\n" in metrics
    assert 'sparkfleet_watchdog_signals_total{signal="TERM"} 2\n' in metrics
    assert 'sparkfleet_watchdog_signals_total{signal="KILL"} 1\n' in metrics


def test_no_trip_while_memory_is_plentiful(tmp_path, processes):
    prefix = f"SFTEST{uuid.uuid4().hex[:8]}::"
    record = str(tmp_path / "victim")
    victim = spawn(prefix + "EngineCore", record, "obey")
    processes.append(victim)
    wait_ready(record)
    daemon = subprocess.Popen([sys.executable, WATCHDOG, "--threshold-kib", "1024", "--title-prefix", prefix,
                               "--cgroup", "none"], stdout=subprocess.PIPE, text=True)
    processes.append(daemon)
    time.sleep(1.5)
    os.kill(daemon.pid, signal.SIGTERM)
    log = daemon.communicate(timeout=10)[0]
    assert "TRIPPED" not in log and "watchdog stopped" in log
    assert victim.poll() is None and "term" not in events(record)
