#!/usr/bin/env python
"""Benchmark the memory watchdog under real memory pressure: reaction time and CPU use. Prints, asserts nothing.

A child titled like a serving process allocates (and touches) 64 MiB at a time until MemAvailable falls below
the watchdog's threshold, noting the moment it saw the crossing; the watchdog sends it SIGTERM, which it notes
too. The reaction time is the difference, over --trips trips. The watchdog's CPU use is read from /proc, while
idle (polling only) and over the whole run. The threshold is set --below-gib under the MemAvailable found at
start, so the machine never gets near real pressure; the title prefix is unique to the run, so no other process
is ever a candidate.

    .venv/bin/python scripts/bench_watchdog.py [--trips 20] [--below-gib 1.5] [--idle-seconds 10]
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WATCHDOG = os.path.join(ROOT, "roles/node_memory/files/sparkfleet-watchdog")
VICTIM = os.path.join(ROOT, "tests/integration/watchdog_victim.py")
TICKS = os.sysconf("SC_CLK_TCK")


def mem_available_kib():
    with open("/proc/meminfo", encoding="ascii") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("MemAvailable:"))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--trips", type=int, default=20)
    parser.add_argument("--below-gib", type=float, default=1.5)
    parser.add_argument("--idle-seconds", type=float, default=10)
    args = parser.parse_args()

    prefix = f"SFBENCH{uuid.uuid4().hex[:8]}::"
    start_kib = mem_available_kib()
    threshold = start_kib - int(args.below_gib * 2 ** 20)
    work = tempfile.mkdtemp(prefix="bench-watchdog-")
    daemon = subprocess.Popen([sys.executable, WATCHDOG, "--threshold-kib", str(threshold), "--grace", "3",
                               "--min-trip-interval", "0.5", "--title-prefix", prefix, "--cgroup", "none"],
                              stdout=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # started and polling
        idle_cpu, idle_start = cpu_seconds(daemon.pid), time.monotonic()
        time.sleep(args.idle_seconds)
        idle_share = (cpu_seconds(daemon.pid) - idle_cpu) / (time.monotonic() - idle_start)

        run_cpu, run_start = cpu_seconds(daemon.pid), time.monotonic()
        reactions = []
        early = 0  # SIGTERM arrived before the child's own next reading saw the crossing
        for trip in range(args.trips):
            while mem_available_kib() < threshold + 256 * 1024:  # let the last victim's memory come back
                time.sleep(0.1)
            record = os.path.join(work, f"victim-{trip}")
            victim = subprocess.Popen(["bash", "-c", f'exec -a "$0" {sys.executable} {VICTIM} "$1" obey "$2"',
                                       prefix + "EngineCore", record, str(threshold)])
            try:
                victim.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                print(f"trip {trip}: the watchdog did not end the victim within 60 s")
                continue
            stamps = {}
            with open(record, encoding="ascii") as handle:
                for line in handle:
                    kind, stamp = line.split()
                    stamps[kind] = float(stamp)
            if "crossed" in stamps and "term" in stamps:
                reactions.append(stamps["term"] - stamps["crossed"])
            elif "term" in stamps:
                early += 1
        run_share = (cpu_seconds(daemon.pid) - run_cpu) / (time.monotonic() - run_start)
    finally:
        os.kill(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=10)

    ms = [1000 * r for r in reactions]
    print(f"watchdog: threshold {threshold / 2 ** 20:.2f} GiB ({args.below_gib} GiB under MemAvailable "
          f"{start_kib / 2 ** 20:.2f} GiB at start), polling every 0.2 s")
    if ms:
        print(f"reaction (crossing seen by the allocating child -> SIGTERM received), {len(ms)} trips: "
              f"p50 {statistics.median(ms):.0f} ms, p99 {percentile(ms, 0.99):.0f} ms, max {max(ms):.0f} ms, "
              f"min {min(ms):.0f} ms"
              + (f"; in {early} more the SIGTERM came before the child saw the crossing" if early else ""))
    print(f"CPU: idle {100 * idle_share:.2f} % of one core over {args.idle_seconds:g} s; "
          f"{100 * run_share:.2f} % during the trips")


if __name__ == "__main__":
    main()
