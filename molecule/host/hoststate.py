#!/usr/bin/env python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Snapshot and restore what the node_memory role changes on a real host, for the opt-in host scenario.

  hoststate.py snapshot DIR   record the live sysctls, the zram device, the role's files and packages
  hoststate.py restore DIR    put all of it back, end the detached watchdog, and prove the result equals
                              the snapshot (exit 1 naming every difference)
  hoststate.py compare DIR    after teardown.yml's role ran: exit 1 naming every difference from the snapshot in
                              what teardown puts back (the sysctls, zram's swap and size, the role's files and
                              directories but the logs it keeps); changes nothing
  hoststate.py show           print the state as JSON

Only what the role touches is recorded: the files it writes (restored with their mode, owner and content, or
removed), the directories it may create (removed only when they did not exist before), the zram device and its
module, two sysctls and the generator package. Restore ends only the watchdog whose PID the role's pidfile
names. A host run by systemd is refused: there the role's watchdog is a unit this script does not undo.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time

SYSCTLS = ["vm.swappiness", "vm.watermark_scale_factor"]
ZRAM = "zram0"
PACKAGES = ["systemd-zram-generator"]
# Exactly the files the role writes (restored byte for byte, or removed) ...
FILES = [
    "/etc/sysctl.d/90-sparkfleet-memory.conf",
    "/etc/systemd/zram-generator.conf",
    "/etc/systemd/system/sparkfleet-watchdog.service",
    "/etc/systemd/system/sparkfleet-zram.service",
    "/usr/local/libexec/sparkfleet/watchdog",
    "/usr/local/libexec/sparkfleet/memory-gate",
    "/usr/local/libexec/sparkfleet/reclaim",
    "/usr/local/libexec/sparkfleet/zram",
    "/var/lib/prometheus/node-exporter/sparkfleet_watchdog.prom",
    "/run/sparkfleet/watchdog.pid",
    "/var/log/sparkfleet/watchdog.log",
    "/var/lib/sparkfleet/node/before.json",
    "/etc/systemd/logind.conf.d/90-sparkfleet.conf",
]
# ... and the directories it may create: removed afterwards only when they did not exist before, deepest first.
DIRECTORIES = [
    "/usr/local/libexec/sparkfleet",
    "/var/lib/prometheus/node-exporter",
    "/var/lib/prometheus",
    "/run/sparkfleet",
    "/var/log/sparkfleet",
    "/var/lib/sparkfleet/node",
    "/var/lib/sparkfleet",
    "/etc/systemd/logind.conf.d",
]
PIDFILE = "/run/sparkfleet/watchdog.pid"
WATCHDOG = "/usr/local/libexec/sparkfleet/watchdog"


def read(path, default=""):
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return default


def zram_state():
    block = f"/sys/block/{ZRAM}"
    if not os.path.isdir(block):
        return None
    algorithm = next((word[1:-1] for word in read(f"{block}/comp_algorithm").split() if word.startswith("[")), None)
    swap = None
    for line in read("/proc/swaps").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == f"/dev/{ZRAM}":
            swap = {"priority": int(fields[4])}
    return {"disksize": int(read(f"{block}/disksize", "0")), "algorithm": algorithm, "swap": swap}


def package_installed(name):
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True, check=False)
    return result.returncode == 0 and result.stdout.startswith("install ok installed")


def file_state(path):
    """None when absent; else mode, owner and sha256 (what an exact restore must bring back)."""
    if not os.path.lexists(path):
        return None
    info = os.lstat(path)
    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    return {"mode": oct(info.st_mode), "uid": info.st_uid, "gid": info.st_gid, "sha256": digest}


def state():
    if os.path.isdir("/run/systemd/system"):
        raise SystemExit("this host is run by systemd: the host scenario is made for machines whose PID 1 is not "
                         "systemd (CI's VMs), where node_memory runs the watchdog detached and restore can end it; "
                         "run it on such a machine")
    return {
        "sysctl": {key: read("/proc/sys/" + key.replace(".", "/")) for key in SYSCTLS},
        "zram": zram_state(),
        "zram_module": os.path.isdir("/sys/module/zram"),
        "files": {path: file_state(path) for path in FILES},
        "directories": {path: os.path.isdir(path) for path in DIRECTORIES},
        "packages": {name: package_installed(name) for name in PACKAGES},
    }


def snapshot(directory):
    os.makedirs(directory, exist_ok=True)
    current = state()
    with tarfile.open(os.path.join(directory, "files.tar"), "w") as archive:
        for path, found in current["files"].items():
            if found:
                archive.add(path, recursive=False)
    with open(os.path.join(directory, "state.json"), "w", encoding="utf-8") as handle:
        json.dump(current, handle, indent=1)
    print(json.dumps(current))


def end_watchdog():
    pid = read(PIDFILE)
    if not pid.isdigit():
        return
    cmdline = read(f"/proc/{pid}/cmdline").split("\0")
    if WATCHDOG not in cmdline:
        return
    os.kill(int(pid), signal.SIGTERM)
    for _i in range(100):
        if not os.path.exists(f"/proc/{pid}"):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the watchdog (PID {pid}) did not stop within 10 s of SIGTERM")


def write(path, value):
    with open(path, "w", encoding="ascii") as handle:
        handle.write(f"{value}\n")


def restore_zram(before, module_before):
    now = zram_state()
    if now is None or now == before:
        return
    block = f"/sys/block/{ZRAM}"
    if now["swap"] is not None:
        subprocess.run(["swapoff", f"/dev/{ZRAM}"], check=True)
    write(f"{block}/reset", 1)
    if before is None:  # the module was loaded for the scenario: unload it again
        if not module_before:
            subprocess.run(["modprobe", "-r", "zram"], check=True)
        return
    if before["algorithm"]:
        write(f"{block}/comp_algorithm", before["algorithm"])
    if before["disksize"]:
        write(f"{block}/disksize", before["disksize"])
        if before["swap"] is not None:
            subprocess.run(["mkswap", f"/dev/{ZRAM}"], check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["swapon", "--priority", str(before["swap"]["priority"]), f"/dev/{ZRAM}"], check=True)


def restore(directory):
    with open(os.path.join(directory, "state.json"), encoding="utf-8") as handle:
        before = json.load(handle)
    end_watchdog()
    restore_zram(before["zram"], before["zram_module"])
    for key, value in before["sysctl"].items():
        write("/proc/sys/" + key.replace(".", "/"), value)
    for path in before["files"]:
        if os.path.lexists(path):
            os.unlink(path)
    with tarfile.open(os.path.join(directory, "files.tar")) as archive:
        archive.extractall("/", filter="fully_trusted")  # our own archive: modes and owners exactly
    for path in DIRECTORIES:  # deepest first; only what did not exist before, and only what is ours
        if not before["directories"][path] and os.path.isdir(path):
            shutil.rmtree(path)
    for path in reversed(DIRECTORIES):  # an empty directory there before (an earlier install's) comes back
        if before["directories"][path] and not os.path.isdir(path):
            os.makedirs(path, mode=0o755)
    removed = [name for name, installed in before["packages"].items() if not installed and package_installed(name)]
    if removed:
        subprocess.run(["apt-get", "purge", "-y", "-qq", *removed], check=True, stdout=subprocess.DEVNULL,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    after = state()
    differences = [f"{section}: {key}: was {before[section][key]!r}, now {after[section][key]!r}"
                   for section in ("sysctl", "files", "directories", "packages") for key in before[section]
                   if before[section][key] != after[section][key]]
    for key in ("zram", "zram_module"):
        if before[key] != after[key]:
            differences.append(f"{key}: was {before[key]}, now {after[key]}")
    return verdict(differences, after, "host state not restored", "host state restored")


def verdict(differences, after, failed, passed):
    """Exit status 1 naming every difference, or 0 with the state found."""
    if differences:
        print(f"{failed}:\n  " + "\n  ".join(differences), file=sys.stderr)
        return 1
    print(f"{passed}: {json.dumps(after)}")
    return 0


# What teardown keeps on purpose (docs/day2.md): the logs, for a triage; the node exporter's directory; systemd's
# own drop-in directory for logind (empty once sparkfleet's drop-in is gone).
TEARDOWN_KEEPS = {"/var/log/sparkfleet/watchdog.log", "/var/log/sparkfleet", "/var/lib/prometheus/node-exporter",
                  "/var/lib/prometheus", "/etc/systemd/logind.conf.d"}


# What is sparkfleet's own outright: teardown removes it even where it was there before the scenario (left by an
# earlier install on this machine), so its absence after teardown is what teardown must do.
OWNED = ("/usr/local/libexec/sparkfleet", "/run/sparkfleet", "/var/lib/sparkfleet",
         "/etc/sysctl.d/90-sparkfleet-memory.conf", "/etc/systemd/system/sparkfleet-",
         "/etc/systemd/logind.conf.d/90-sparkfleet.conf")


def compare(directory):
    """The teardown role's work against the snapshot: what it must have put back, and nothing else."""
    with open(os.path.join(directory, "state.json"), encoding="utf-8") as handle:
        before = json.load(handle)
    after = state()
    differences, earlier = [], []
    for section in ("sysctl", "files", "directories"):
        for key in before[section]:
            was, now = before[section][key], after[section][key]
            if key in TEARDOWN_KEEPS or was == now:
                continue
            if section != "sysctl" and not now and key.startswith(OWNED):
                earlier.append(key)  # an earlier install's, removed: teardown's job
                continue
            differences.append(f"{section}: {key}: was {was!r}, now {now!r}")
    if earlier:
        print("removed what an earlier install left: " + ", ".join(earlier))
    # zram: back out of swap at its size before (a device teardown reset is left loaded, empty)
    was, now = before["zram"] or {"disksize": 0, "swap": None}, after["zram"] or {"disksize": 0, "swap": None}
    for key in ("disksize", "swap"):
        if was[key] != now[key]:
            differences.append(f"zram: {key}: was {was[key]!r}, now {now[key]!r}")
    return verdict(differences, after, "teardown did not put the host back", "teardown put the host back")


def main(argv):
    if argv[:1] == ["show"]:
        print(json.dumps(state()))
        return 0
    if len(argv) == 2 and argv[0] == "snapshot":
        snapshot(argv[1])
        return 0
    if len(argv) == 2 and argv[0] == "compare":
        return compare(argv[1])
    if len(argv) == 2 and argv[0] == "restore":
        if not os.path.exists(os.path.join(argv[1], "state.json")):
            print(f"no snapshot in {argv[1]}: nothing to restore")
            return 0
        code = restore(argv[1])
        if code == 0:
            os.unlink(os.path.join(argv[1], "state.json"))
        return code
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
