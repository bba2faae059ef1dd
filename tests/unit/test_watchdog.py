"""The memory watchdog's decisions, on a made-up /proc and cgroup tree (roles/node_memory/files)."""

import os
import signal
import types

import pytest
import sourcefile


@pytest.fixture
def watchdog():
    return sourcefile.load("roles/node_memory/files/sparkfleet-watchdog", "sparkfleet_watchdog")


def fake_proc(root, titles):
    for pid, title in titles.items():
        os.makedirs(root / str(pid))
        (root / str(pid) / "cmdline").write_bytes(title.encode() + b"\0--some\0args\0")
    (root / "self").mkdir()  # not a pid
    return str(root)


def test_victims_are_titled_or_in_a_serving_cgroup_never_init_or_itself(watchdog, tmp_path):
    proc = fake_proc(tmp_path / "proc", {
        1: "VLLM::init-impostor", 200: "VLLM::EngineCore", 201: "VLLM::Worker_TP0", 300: "/usr/sbin/sshd",
        301: "python3", watchdog.SELF: "VLLM::watchdog-impostor"})
    unit = tmp_path / "cg" / "memory" / "system.slice" / "sparkfleet-vllm.service" / "sub"
    unit.mkdir(parents=True)
    (unit / "cgroup.procs").write_text("301\n")
    other = tmp_path / "cg" / "memory" / "system.slice" / "ssh.service"
    other.mkdir(parents=True)
    (other / "cgroup.procs").write_text("300\n")
    found = watchdog.victims(["VLLM::"], ["system.slice/sparkfleet-vllm.service"], proc, str(tmp_path / "cg"))
    assert found == [200, 201, 301]


def test_inside_a_container_the_units_cgroups_are_below_the_containers(watchdog, tmp_path):
    own = tmp_path / "cgroup"
    own.write_text("12:memory:/docker/96189fb7/system.slice/sparkfleet-watchdog.service\n"
                   "0::/docker/96189fb7/system.slice/sparkfleet-watchdog.service\n")
    assert watchdog.node_cgroup_prefix(str(own)) == "/docker/96189fb7"
    own.write_text("0::/system.slice/sparkfleet-watchdog.service\n")
    assert watchdog.node_cgroup_prefix(str(own)) == ""
    # Docker's systemd cgroup driver puts the container itself in the host's system.slice.
    own.write_text("0::/system.slice/docker-96189fb7.scope/system.slice/sparkfleet-watchdog.service\n")
    assert watchdog.node_cgroup_prefix(str(own)) == "/system.slice/docker-96189fb7.scope"
    unit = tmp_path / "cg" / "memory" / "docker" / "96189fb7" / "system.slice" / "sparkfleet-vllm.service"
    unit.mkdir(parents=True)
    (unit / "cgroup.procs").write_text("4242\n")
    assert watchdog.cgroup_pids(["system.slice/sparkfleet-vllm.service"], str(tmp_path / "cg"),
                                "/docker/96189fb7") == {4242}


def test_default_arguments_follow_the_field(watchdog):
    args = watchdog.parse([])
    assert args.threshold_kib == 786432 and args.interval == 0.2 and args.grace == 3.0
    assert args.title_prefix == ["VLLM::"] and args.cgroup == ["system.slice/sparkfleet-vllm.service"]
    assert watchdog.parse(["--cgroup", "none"]).cgroup == []


class Recorder:
    def __init__(self, alive_after_term, available_after):
        self.sent, self.alive_after_term, self.available_after = [], set(alive_after_term), available_after
        self.now = 0.0

    def send(self, pids, sig):
        self.sent.append((sig, list(pids)))
        return list(pids)

    def alive(self, pid):
        return pid in self.alive_after_term

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def run_trip(watchdog, monkeypatch, tmp_path, targets, alive_after_term, available_after):
    recorder = Recorder(alive_after_term, available_after)
    monkeypatch.setattr(watchdog, "victims", lambda *a: targets)
    monkeypatch.setattr(watchdog, "send", recorder.send)
    monkeypatch.setattr(watchdog, "alive", recorder.alive)
    monkeypatch.setattr(watchdog, "mem_available_kib", lambda path: available_after)
    args = types.SimpleNamespace(threshold_kib=786432, grace=3.0, interval=0.2, title_prefix=["VLLM::"],
                                 cgroup=[], cgroup_prefix="", proc="/proc", cgroup_root="/sys/fs/cgroup",
                                 meminfo="/proc/meminfo")
    metrics = watchdog.Metrics(str(tmp_path / "watchdog.prom"))
    watchdog.trip(args, 500000, metrics, clock=recorder.clock, sleep=recorder.sleep)
    return recorder, metrics


def test_term_first_then_kill_only_what_ignored_it_while_memory_is_still_short(watchdog, monkeypatch, tmp_path):
    recorder, metrics = run_trip(watchdog, monkeypatch, tmp_path, [200, 201], alive_after_term=[201],
                                 available_after=400000)
    assert recorder.sent == [(signal.SIGTERM, [200, 201]), (signal.SIGKILL, [201])]
    assert recorder.now >= 3.0  # the whole grace passed before the KILL
    assert metrics.signals == {"TERM": 2, "KILL": 1} and metrics.trips == 1
    text = (tmp_path / "watchdog.prom").read_text()
    assert "sparkfleet_watchdog_trips_total 1\n" in text
    assert 'sparkfleet_watchdog_signals_total{signal="KILL"} 1\n' in text
    assert "sparkfleet_watchdog_trip_mem_available_bytes 512000000\n" in text


def test_no_kill_once_memory_recovered(watchdog, monkeypatch, tmp_path):
    recorder, metrics = run_trip(watchdog, monkeypatch, tmp_path, [200, 201], alive_after_term=[201],
                                 available_after=4000000)
    assert recorder.sent == [(signal.SIGTERM, [200, 201])]
    assert metrics.signals == {"TERM": 2, "KILL": 0}


def test_the_grace_ends_early_when_everything_exited(watchdog, monkeypatch, tmp_path):
    recorder, _metrics = run_trip(watchdog, monkeypatch, tmp_path, [200], alive_after_term=[], available_after=400000)
    assert recorder.sent == [(signal.SIGTERM, [200])]
    assert recorder.now < 0.5


def test_a_trip_with_nothing_to_end_is_counted_and_said(watchdog, monkeypatch, tmp_path, capsys):
    recorder, metrics = run_trip(watchdog, monkeypatch, tmp_path, [], alive_after_term=[], available_after=1)
    assert recorder.sent == [] and metrics.trips == 1
    assert "no serving process to end" in capsys.readouterr().out


def test_a_textfile_that_cannot_be_written_is_said_once_and_not_fatal(watchdog, tmp_path, capsys):
    metrics = watchdog.Metrics(str(tmp_path / "missing" / "watchdog.prom"))
    (tmp_path / "missing").write_text("a file where a directory should be")
    metrics.write(786432)
    metrics.write(786432)
    assert capsys.readouterr().out.count("cannot write") == 1
