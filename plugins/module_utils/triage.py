# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Forensics before remediation: one node's triage bundle (playbooks/triage.yml), every secret redacted.

Pure Python (stdlib and the collection's module_utils), for the triage_bundle module on each node and the unit
tests. It only reads: files, and commands that report (systemctl, journalctl, ip, nft, docker inspect, nvidia-smi).
Every item is best-effort: what cannot be read is recorded with the reason (``missing``: expected here and not
found; ``skipped``: does not apply to this node, such as nvidia-smi without a GPU), never raised. Each member goes
through the redaction (module_utils/redaction.py) before it is written, and the tar holds nothing else. Logs,
journals and command outputs keep their last ``tail_bytes``; the vLLM per-start logs of a node together at most
``logs_max_bytes`` (this boot's newest first, then the previous boot's).

The bundle is ``<name>.tar.gz`` holding ``<name>/...`` (see MEMBERS in docs/day2.md) with ``MANIFEST.json`` (every
member: its source, bytes kept and in all, whether cut, redactions; every item missing or skipped, and why) and
``summary.json`` (the figures SUMMARY.md shows) last.
"""

from __future__ import annotations

import calendar
import contextlib
import fnmatch
import glob
import io
import json
import os
import re
import selectors
import stat as stat_mode
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.gpu import xid_errors
from ansible_collections.sparkfleet.cluster.plugins.module_utils.prometheus_text import (
    MetricsParseError,
    parse_prometheus,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.redaction import Redactor, harvest
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights import human_bytes

MIB = 1024 * 1024
# Read before a tail's first kept byte, so that a secret the cut falls into is seen whole and dropped with it.
MARGIN = 64 * 1024
# What a command's standard error may add to a reason, and what a summary cell quotes of a text.
ERROR_KEEP = 64 * 1024
CELL = 200
# The launcher's per-start logs (roles/vllm_service/templates/vllm-launch.j2): vllm-boot<boot, UTC>-<start>.log.
LOG_NAME = re.compile(r"^vllm-boot(\d{8}T\d{6}Z)-(.+)\.log$")
BOOT_FORMAT = "%Y%m%dT%H%M%SZ"
# A boot's name may be a second or two off between reads of /proc/stat's btime.
BOOT_SLACK = 5
TRIPPED = b"TRIPPED MemAvailable"
KERNEL_LINE = re.compile(rb"NVRM|Xid")
# The memory lines the summary shows, and the zram device's mm_stat columns (Documentation/admin-guide/blockdev/
# zram.rst).
MM_STAT = ("orig_data_size", "compr_data_size", "mem_used_total", "mem_limit", "mem_used_max", "same_pages",
           "pages_compacted", "huge_pages", "huge_pages_since")
PSI_RESOURCES = ("memory", "cpu", "io")
COMMAND_ENV = {"LC_ALL": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "PAGER": "cat", "COLUMNS": "250",
               "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# The rows of SUMMARY.md, in order (the play lays them out, one column per node).
ROWS = ("bundle", "units", "group", "last verify", "weights scrub", "give-up marker", "MemAvailable",
        "PSI some avg10", "zram", "watchdog trips", "Xid", "GPU", "image", "weights", "vLLM logs", "redacted",
        "missing", "skipped")

DEFAULTS: dict[str, Any] = {
    "tail_bytes": 8 * MIB,
    "logs_max_bytes": 64 * MIB,
    "timeout": 60,
    "log_dir": "/var/log/sparkfleet/vllm",
    "marker": "/var/lib/sparkfleet/vllm/gave-up",
    "verify_dir": "/var/lib/sparkfleet/verify",
    "group_dir": "/var/lib/sparkfleet/group",
    "textfile_dirs": ["/var/lib/sparkfleet/metrics"],
    "config_files": ["/etc/sparkfleet/vllm.env", "/etc/sparkfleet/nccl.env", "/etc/sparkfleet/group.json",
                     "/etc/sparkfleet/verify.json", "/etc/sparkfleet/firewall.nft"],
    "state_files": ["/var/lib/sparkfleet/nccl-probe.json", "/var/lib/sparkfleet/gpu/xid-baseline.json"],
    "watchdog_textfile": "/var/lib/prometheus/node-exporter/sparkfleet_watchdog.prom",
    "watchdog_log": "/var/log/sparkfleet/watchdog.log",
    "watchdog_unit": "sparkfleet-watchdog.service",
    "sysctl_file": "/etc/sysctl.d/90-sparkfleet-memory.conf",
    "hub_cache": "/var/lib/sparkfleet/hf/hub",
    "venv": "/opt/sparkfleet/vllm",
    "images": ["sparkfleet/vllm:current", "sparkfleet/vllm:previous"],
    "netplan_file": "/etc/netplan/40-sparkfleet-fabric.yaml",
    "nft_table": "inet sparkfleet",
    "unit_pattern": "sparkfleet-*",
    "ignored_xids": ["0x51"],
}

# ------------------------------------------------------------------------------------------------ commands


@dataclass
class Output:
    """A command's result: rc None when it did not run to its end (why says so); data is the kept tail of its
    standard output, total how many bytes it wrote; lines, when asked for, the lines of the whole output that
    matched (up to the same size)."""

    rc: int | None
    data: bytes = b""
    total: int = 0
    error: str = ""
    why: str = ""
    lines: list[bytes] = field(default_factory=list)
    not_found: bool = False


class _Tail:
    """The last `keep` bytes of a stream, and the lines of all of it that match `grep`."""

    def __init__(self, keep: int, grep: re.Pattern[bytes] | None):
        self.keep, self.grep = keep, grep
        self.chunks: list[bytes] = []
        self.size = self.total = self.matched = 0
        self.lines: list[bytes] = []
        self.partial = b""

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.chunks.append(chunk)
        self.size += len(chunk)
        while self.chunks and self.size - len(self.chunks[0]) >= self.keep:
            self.size -= len(self.chunks.pop(0))
        if self.grep is not None:
            *whole, partial = (self.partial + chunk).split(b"\n")
            self.partial = partial[-ERROR_KEEP:]  # a line without end is matched by its last 64 KiB
            for line in whole:
                self._match(line)

    def _match(self, line: bytes) -> None:
        if self.grep.search(line) and self.matched + len(line) <= self.keep:
            self.lines.append(line)
            self.matched += len(line) + 1

    def value(self) -> bytes:
        if self.grep is not None and self.partial:
            self._match(self.partial)
            self.partial = b""
        data = b"".join(self.chunks)
        return data[-self.keep:] if len(data) > self.keep else data


def run_capped(argv: list[str], keep: int, timeout: float, grep: re.Pattern[bytes] | None = None) -> Output:
    """Run a reporting command with a deadline, keeping the last `keep` bytes of what it prints (a journal can
    be large): never raises."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=COMMAND_ENV)
    except FileNotFoundError:
        return Output(None, why=f"no {argv[0]} on this node", not_found=True)
    except OSError as err:
        return Output(None, why=f"{argv[0]} could not start ({err.strerror})")
    out, err = _Tail(keep, grep), _Tail(ERROR_KEEP, None)
    deadline = time.monotonic() + timeout
    timed_out = False
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _events in selector.select(min(left, 1.0)):
                chunk = os.read(key.fd, 1024 * 1024)
                if chunk:
                    key.data.feed(chunk)
                else:
                    selector.unregister(key.fileobj)
    if timed_out:
        proc.kill()
    rc = proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    error = err.value().decode("utf-8", "replace").strip()
    if timed_out:
        return Output(None, out.value(), out.total, error, f"{' '.join(argv)} did not finish within {timeout:g} s",
                      out.lines)
    return Output(rc, out.value(), out.total, error, "", out.lines)


# ------------------------------------------------------------------------------------------------ parsing


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as {field: kB}."""
    fields = {}
    for line in text.splitlines():
        match = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)", line)
        if match:
            fields[match.group(1)] = int(match.group(2))
    return fields


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """/proc/pressure/<resource>: {"some": {"avg10": .., "avg60": .., "avg300": .., "total": ..}, "full": {..}}."""
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, _sep, rest = line.strip().partition(" ")
        if kind not in ("some", "full"):
            continue
        values = {}
        for pair in rest.split():
            name, _sep, value = pair.partition("=")
            try:
                values[name] = float(value)
            except ValueError:
                continue
        found[kind] = values
    return found


def parse_mm_stat(text: str) -> dict[str, int]:
    """A zram device's mm_stat: its columns by name (older kernels have fewer)."""
    values = {}
    for name, value in zip(MM_STAT, text.split(), strict=False):
        try:
            values[name] = int(value)
        except ValueError:
            break
    return values


def parse_json(data: bytes) -> tuple[Any, str]:
    """(the document, "") or (None, what is wrong with it)."""
    try:
        return json.loads(data.decode("utf-8")), ""
    except (UnicodeDecodeError, ValueError) as err:
        return None, f"not JSON ({err})"


def parse_properties(text: str) -> dict[str, str]:
    """systemctl show's Key=Value lines."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def watchdog_trips(text: str) -> int | None:
    """The watchdog's trip counter from its textfile (since the watchdog last started)."""
    try:
        samples = parse_prometheus(text)
    except MetricsParseError:
        return None
    for sample in samples:
        if sample.name == "sparkfleet_watchdog_trips_total":
            return int(sample.value)
    return None


def boots(text: str) -> list[int]:
    """The boot offsets journalctl --list-boots lists (0 this boot, -1 the one before, ...)."""
    found = []
    for line in text.splitlines():
        first = line.split(None, 1)[0] if line.strip() else ""
        if re.fullmatch(r"-?\d+", first):
            found.append(int(first))
    return found


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def utc(seconds: float | None) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def cell(text: Any, limit: int = CELL) -> str:
    """A Markdown table cell: one line, no bar, at most `limit` characters."""
    flat = re.sub(r"(?<!\\)\|", r"\\|", " ".join(str(text).split()))  # once, however often a text is a cell
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def boot_logs(names: Iterable[str], btime: float) -> tuple[list[str], list[str], list[str]]:
    """(this boot's, the previous boot's, older boots') per-start logs, newest first, from their names."""
    by_boot: dict[str, list[str]] = {}
    for name in names:
        match = LOG_NAME.match(name)
        if match:
            by_boot.setdefault(match.group(1), []).append(name)
    this, earlier = [], []
    for boot in sorted(by_boot, reverse=True):
        try:
            started = calendar.timegm(time.strptime(boot, BOOT_FORMAT))
        except ValueError:
            continue
        (this if started >= btime - BOOT_SLACK else earlier).append(boot)
    previous = earlier[:1]
    older = earlier[1:]

    def files(group: list[str]) -> list[str]:
        return [name for boot in group for name in sorted(by_boot[boot], reverse=True)]
    return files(this), files(previous), files(older)


# ------------------------------------------------------------------------------------------------ the bundle


@dataclass
class Item:
    """One member of the bundle as the manifest lists it."""

    member: str
    source: str
    bytes: int
    total: int
    truncated: bool
    redacted: int


class Bundle:
    """A tar.gz being written: every member redacted on its way in, the manifest and summary last."""

    def __init__(self, name: str, path: str, redactor: Redactor, settings: dict[str, Any],
                 runner: Callable[..., Output] = run_capped, root: str = "/", clock: Callable[[], float] = time.time):
        self.name, self.path, self.redactor, self.settings = name, path, redactor, settings
        self.runner, self.root, self.clock = runner, root, clock
        self.items: list[Item] = []
        self.missing: list[dict[str, str]] = []
        self.skipped: list[dict[str, str]] = []
        self.facts: dict[str, Any] = {}
        self.hung: set[str] = set()
        self.tail = int(settings["tail_bytes"])
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._file = os.fdopen(fd, "wb")
        # open for the bundle's whole life: close() or abort() ends it
        self.tar = tarfile.open(fileobj=self._file, mode="w:gz", compresslevel=6)  # noqa: SIM115

    # -- where things are (tests point root at a tree shaped like a node)
    def local(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def glob(self, pattern: str) -> list[str]:
        """Paths as the node names them (root stripped), sorted."""
        prefix = self.local("/")
        return sorted("/" + found[len(prefix):].lstrip("/") for found in glob.glob(self.local(pattern)))

    # -- what was not collected
    def note_missing(self, item: str, why: str) -> None:
        self.missing.append({"item": item, "why": self.redactor.clean(why)})

    def note_skipped(self, item: str, why: str) -> None:
        self.skipped.append({"item": item, "why": self.redactor.clean(why)})

    # -- members
    def add(self, member: str, data: bytes, source: str, kind: str = "text", cut: int = 0, total: int | None = None,
            truncated: bool = False) -> bytes:
        """Redact data and write it as <name>/<member>; returns what was written."""
        clean, count = self.redactor.redact(data, kind, cut)
        info = tarfile.TarInfo(f"{self.name}/{member}")
        info.size, info.mtime, info.mode = len(clean), int(self.clock()), 0o600
        self.tar.addfile(info, io.BytesIO(clean))
        self.items.append(Item(member, source, len(clean), len(data) if total is None else total, truncated, count))
        return clean

    def add_file(self, member: str, path: str, kind: str = "text", absent: str | None = "missing",
                 why: str = "", tail: int | None = None) -> bytes | None:
        """A file's last tail_bytes (or `tail`); an absent file is noted as `absent` says (missing, skipped, or
        None: not at all), with why."""
        local = self.local(path)
        tail = self.tail if tail is None else tail
        try:
            virtual = path.startswith(("/proc/", "/sys/"))
            with open(local, "rb") as handle:
                stat = os.fstat(handle.fileno())
                if not virtual and not stat_mode.S_ISREG(stat.st_mode):
                    self.note_missing(member, f"{path}: not a regular file")
                    return None
                size = stat.st_size
                keep = tail + MARGIN
                if size > keep:
                    handle.seek(size - keep)
                    data = handle.read(keep)
                else:
                    data = handle.read(keep + 1) if virtual else handle.read()
                    size = max(size, len(data))
        except FileNotFoundError:
            if absent == "missing":
                self.note_missing(member, f"{path}: absent" + (f" ({why})" if why else ""))
            elif absent == "skipped":
                self.note_skipped(member, f"{path}: absent" + (f" ({why})" if why else ""))
            return None
        except OSError as err:
            self.note_missing(member, f"{path}: {err.strerror or err}")
            return None
        cut = max(0, len(data) - tail)
        return self.add(member, data, path, kind, cut=cut, total=size, truncated=bool(cut))

    def run(self, argv: list[str], grep: re.Pattern[bytes] | None = None) -> Output:
        """A command, unless its program already hung in this run (a wedged systemd or GPU would make every later
        call wait its whole timeout too)."""
        timeout = float(self.settings["timeout"])
        if argv[0] in self.hung:
            return Output(None, why=f"not run: {argv[0]} did not finish within {timeout:g} s earlier in this run")
        result = self.runner(argv, self.tail + MARGIN, timeout, grep=grep)
        if result.rc is None and not result.not_found and "did not finish" in result.why:
            self.hung.add(argv[0])
        return result

    def add_command(self, member: str, argv: list[str], kind: str = "text", ok: Iterable[int] = (0,),
                    absent: str = "missing", why: str = "", output: Output | None = None) -> bytes | None:
        """A reporting command's output (its last tail_bytes). A command the node lacks is noted as `absent` says;
        one that fails, with its standard error, as missing."""
        shown = " ".join(argv)
        result = output if output is not None else self.run(argv)
        if result.rc is None and result.not_found:
            (self.note_skipped if absent == "skipped" else self.note_missing)(
                member, result.why + (f" ({why})" if why else ""))
            return None
        if result.rc is None or result.rc not in tuple(ok):
            error = first_line(result.error) or f"exit status {result.rc}"
            self.note_missing(member, f"{shown}: {result.why or error}")
            if not result.data:
                return None
        cut = max(0, len(result.data) - self.tail)
        return self.add(member, result.data, shown, kind, cut=cut, total=result.total, truncated=bool(cut))

    def close(self, summary: dict[str, Any], manifest: dict[str, Any]) -> int:
        """Write the manifest and the summary, finish the archive; returns its size in bytes."""
        manifest = dict(manifest, members=[vars(item) for item in self.items], missing=self.missing,
                        skipped=self.skipped)
        self.add("MANIFEST.json", (json.dumps(manifest, indent=1) + "\n").encode(), "(this bundle)", "json")
        self.add("summary.json", (json.dumps(summary, indent=1) + "\n").encode(), "(this bundle)", "json")
        self.tar.close()
        self._file.close()
        return os.path.getsize(self.path)

    def abort(self) -> None:
        with contextlib.suppress(OSError, tarfile.TarError):
            self.tar.close()
        self._file.close()


# ------------------------------------------------------------------------------------------------ sections


def _system(bundle: Bundle) -> None:
    boot_id = (_read(bundle, "/proc/sys/kernel/random/boot_id") or "").strip()
    btime = None
    for line in (_read(bundle, "/proc/stat") or "").splitlines():
        if line.startswith("btime "):
            btime = int(line.split()[1])
    bundle.facts["boot"] = {"id": boot_id, "btime": btime,
                            "name": time.strftime(BOOT_FORMAT, time.gmtime(btime)) if btime else None}
    bundle.add("system/boot.txt", (f"boot id {boot_id or '?'}\nbooted {utc(btime)} (btime {btime}, log name "
                                   f"vllm-boot{bundle.facts['boot']['name']}-*)\ncollected {utc(bundle.clock())}\n"
                                   ).encode(), "/proc/stat, /proc/sys/kernel/random/boot_id")
    bundle.add_file("system/uptime.txt", "/proc/uptime")
    bundle.add_file("system/os-release.txt", "/etc/os-release")
    bundle.add_command("system/uname.txt", ["uname", "-a"])
    bundle.add_command("system/df.txt", ["df", "-P", "-h"])
    # comm, not args: other programs' command lines are none of this bundle's business
    bundle.add_command("system/ps.txt", ["ps", "-eo", "pid,ppid,user,rss,vsz,etimes,stat,comm", "--sort=-rss"])


def _read(bundle: Bundle, path: str) -> str | None:
    try:
        with open(bundle.local(path), encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _units(bundle: Bundle) -> None:
    pattern = bundle.settings["unit_pattern"]
    names: set[str] = set()
    for member, argv in (("units/list-units.txt", ["systemctl", "list-units", "--all", "--no-legend", "--no-pager",
                                                   "--plain", "--full", pattern]),
                         ("units/list-unit-files.txt", ["systemctl", "list-unit-files", "--no-legend", "--no-pager",
                                                        "--plain", pattern])):
        text = bundle.add_command(member, argv)
        for line in (text or b"").decode("utf-8", "replace").splitlines():
            first = line.split(None, 1)[0] if line.strip() else ""
            if fnmatch.fnmatch(first, pattern) and "@" not in first:
                names.add(first)
    bundle.add_command("units/failed.txt", ["systemctl", "list-units", "--failed", "--no-pager", "--plain", "--full"])
    states = []
    for unit in sorted(names):
        bundle.add_command(f"units/{unit}.status.txt", ["systemctl", "status", "--no-pager", "--full", "-n", "30",
                                                        unit], ok=(0, 1, 2, 3))
        shown = bundle.add_command(f"units/{unit}.show.txt", ["systemctl", "show", "--no-pager", unit], kind="env")
        bundle.add_command(f"units/{unit}.cat.txt", ["systemctl", "cat", "--no-pager", unit], kind="env", ok=(0, 1))
        props = parse_properties((shown or b"").decode("utf-8", "replace"))
        states.append({"unit": unit, "load": props.get("LoadState"), "active": props.get("ActiveState"),
                       "sub": props.get("SubState"), "result": props.get("Result"),
                       "restarts": int(props["NRestarts"]) if props.get("NRestarts", "").isdigit() else None})
    if not names:
        bundle.note_missing("units", f"no unit matching {pattern} (the serve stage has not installed the ranks here, "
                                     "or systemctl did not answer)")
    bundle.facts["units"] = states


def _journal(bundle: Bundle) -> None:
    pattern = bundle.settings["unit_pattern"]
    boots_argv = ["journalctl", "--list-boots", "--no-pager"]
    boots_result = bundle.run(boots_argv)
    listed = bundle.add_command("journal/boots.txt", boots_argv, output=boots_result)
    bundle.add_command("journal/sparkfleet-this-boot.txt", ["journalctl", "-b", "-u", pattern, "--no-pager",
                                                            "-o", "short-iso"])
    watchdog = bundle.add_command("journal/watchdog-this-boot.txt", ["journalctl", "-b", "-u",
                                                                     bundle.settings["watchdog_unit"], "--no-pager",
                                                                     "-o", "short-iso"])
    bundle.facts["watchdog_journal_trips"] = None if watchdog is None else watchdog.count(TRIPPED)
    if listed is None or boots_result.rc != 0:
        return
    if -1 in boots(listed.decode("utf-8", "replace")):
        bundle.add_command("journal/sparkfleet-previous-boot.txt", ["journalctl", "-b", "-1", "-u", pattern,
                                                                    "--no-pager", "-o", "short-iso"])
    else:
        bundle.note_skipped("journal/sparkfleet-previous-boot.txt",
                            "the journal holds no earlier boot (a volatile journal under /run keeps only this one; "
                            "Storage=persistent in journald.conf keeps them)")


def _kernel(bundle: Bundle) -> None:
    source = "journalctl -k -b"
    result = bundle.run(["journalctl", "-k", "-b", "--no-pager", "-o", "short-iso", "-q"], grep=KERNEL_LINE)
    journal_why = result.why or first_line(result.error) or "no kernel line for this boot"
    if result.rc != 0 or result.total == 0:
        source = "dmesg"
        result = bundle.run(["dmesg", "--time-format", "iso"], grep=KERNEL_LINE)
        if result.rc not in (None, 0) and not result.data:
            result = bundle.run(["dmesg"], grep=KERNEL_LINE)
    if result.rc != 0 or (result.total == 0 and source == "dmesg"):
        bundle.note_missing("kernel", f"journalctl -k -b: {journal_why} (a container's journal holds none: the kernel "
                                      f"is the host's); dmesg: {result.why or first_line(result.error) or 'no line'}")
        bundle.facts["xid"] = {"source": None}
        return
    bundle.add_command("kernel/kernel-this-boot.txt", [source], output=result)
    lines = b"\n".join(result.lines) + (b"\n" if result.lines else b"")
    header = f"# the NVRM/Xid lines of this boot's kernel log, from {source}: {len(result.lines)}\n".encode()
    clean = bundle.add("kernel/nvrm-xid.txt", header + lines, source)
    text = [line for line in clean.decode("utf-8", "replace").splitlines()[1:] if line]
    bundle.facts["xid"] = {"source": source, "nvrm_lines": len(text), "xid": len(xid_errors(text)),
                           "errors": len(xid_errors(text, bundle.settings["ignored_xids"]))}


def _memory(bundle: Bundle) -> None:
    meminfo = bundle.add_file("memory/meminfo.txt", "/proc/meminfo")
    bundle.facts["meminfo"] = parse_meminfo((meminfo or b"").decode("utf-8", "replace"))
    psi = {}
    for resource in PSI_RESOURCES:
        text = bundle.add_file(f"memory/pressure-{resource}.txt", f"/proc/pressure/{resource}", absent="skipped",
                               why="a kernel without PSI, psi=0 on its command line, or a container that hides it")
        psi[resource] = parse_psi(text.decode("utf-8", "replace")) if text is not None else None
    bundle.facts["psi"] = psi
    zram = []
    for device in bundle.glob("/sys/block/zram*"):
        dev = os.path.basename(device)
        mm = bundle.add_file(f"memory/{dev}/mm_stat.txt", f"{device}/mm_stat")
        for name in ("disksize", "comp_algorithm", "io_stat"):
            bundle.add_file(f"memory/{dev}/{name}.txt", f"{device}/{name}", absent=None)
        zram.append({"device": dev, **parse_mm_stat((mm or b"").decode("utf-8", "replace"))})
    if not zram:
        bundle.note_skipped("memory/zram", "no /sys/block/zram* device (node_memory makes zram0 on a node; a lab "
                                           "container shares the host's kernel and has none)")
    bundle.facts["zram"] = zram
    bundle.add_command("memory/zramctl.txt", ["zramctl"], absent="skipped")
    bundle.add_command("memory/swapon.txt", ["swapon", "--show", "--bytes"])
    bundle.add_file("memory/swaps.txt", "/proc/swaps")
    sysctls = []
    for name in ("swappiness", "watermark_scale_factor", "min_free_kbytes", "overcommit_memory"):
        value = _read(bundle, f"/proc/sys/vm/{name}")
        sysctls.append(f"vm.{name} = {value.strip() if value is not None else '(unreadable)'}")
    bundle.add("memory/vm-sysctls.txt", ("\n".join(sysctls) + "\n").encode(), "/proc/sys/vm")
    bundle.add_file("memory/sysctl.conf", bundle.settings["sysctl_file"])
    prom = bundle.add_file("memory/watchdog.prom", bundle.settings["watchdog_textfile"],
                           why="the node stage's watchdog writes it when it starts")
    bundle.facts["watchdog_trips"] = watchdog_trips(prom.decode("utf-8", "replace")) if prom is not None else None
    bundle.add_file("memory/watchdog.log", bundle.settings["watchdog_log"], absent=None)


def _gpu(bundle: Bundle) -> None:
    result = bundle.run(["nvidia-smi", "-q"])
    if result.not_found:
        bundle.note_skipped("gpu/nvidia-smi-q.txt", "no nvidia-smi on this node (no NVIDIA driver: a node without a "
                                                    "GPU, such as a lab node)")
        bundle.facts["gpu"] = "none (no nvidia-smi)"
        return
    data = bundle.add_command("gpu/nvidia-smi-q.txt", ["nvidia-smi", "-q"], output=result)
    if data is None or result.rc != 0:
        bundle.facts["gpu"] = "nvidia-smi failed: " + (result.why or first_line(result.error) or f"exit {result.rc}")
        return
    text = data.decode("utf-8", "replace")
    names = re.findall(r"(?m)^\s*Product Name\s*:\s*(.+?)\s*$", text)
    driver = re.search(r"(?m)^\s*Driver Version\s*:\s*(\S+)", text)
    bundle.facts["gpu"] = (f"{len(names)} x {names[0] if names else '?'}, driver "
                           f"{driver.group(1) if driver else '?'}")


def _config(bundle: Bundle) -> None:
    for path in bundle.settings["config_files"]:
        kind = "env" if path.endswith(".env") else "json" if path.endswith(".json") else "text"
        bundle.add_file(f"config/{os.path.basename(path)}", path, kind=kind,
                        why="the stage that writes it has not run on this node")


def _state(bundle: Bundle) -> None:
    verify_dir, group_dir = bundle.settings["verify_dir"], bundle.settings["group_dir"]
    found: dict[str, Any] = {}
    for name in ("status.json", "scrub.json"):
        data = bundle.add_file(f"state/verify/{name}", f"{verify_dir}/{name}", kind="json", absent=None)
        found[name] = parse_json(data) if data is not None else (None, "absent")
    for path in bundle.glob(f"{verify_dir}/known-answer-*.json"):
        bundle.add_file(f"state/verify/{os.path.basename(path)}", path, kind="json")
    if os.path.exists(bundle.local(f"{verify_dir}/scrub-requested")):
        bundle.add("state/verify/scrub-requested", b"", f"{verify_dir}/scrub-requested")
    for path in bundle.glob(f"{group_dir}/*.json"):
        data = bundle.add_file(f"state/group/{os.path.basename(path)}", path, kind="json")
        if os.path.basename(path) == "state.json" and data is not None:
            found["group"] = parse_json(data)
    marker = bundle.add_file("state/gave-up", bundle.settings["marker"], absent=None)
    bundle.facts["gave_up"] = first_line(marker.decode("utf-8", "replace")) if marker is not None else None
    for directory in bundle.settings["textfile_dirs"]:
        for path in bundle.glob(f"{directory}/*.prom"):
            bundle.add_file(f"state/metrics/{os.path.basename(path)}", path)
    for path in bundle.settings["state_files"]:
        bundle.add_file(f"state/{os.path.basename(path)}", path, kind="json" if path.endswith(".json") else "text",
                        absent=None)
    status, why = found["status.json"]
    bundle.facts["verify"] = status if isinstance(status, dict) else {"absent": why}
    scrub, why = found["scrub.json"]
    bundle.facts["scrub"] = scrub if isinstance(scrub, dict) else {"absent": why}
    group, why = found.get("group", (None, "absent"))
    bundle.facts["group"] = group if isinstance(group, dict) else {"absent": why}


def _gids(bundle: Bundle) -> bytes:
    """The RoCE GID table's non-zero entries: device, port, index, GID, type, netdev."""
    lines = []
    for gid_path in bundle.glob("/sys/class/infiniband/*/ports/*/gids/*"):
        gid = (_read(bundle, gid_path) or "").strip()
        if not gid or set(gid.replace(":", "")) <= {"0"}:
            continue
        parts = gid_path.split("/")
        device, port, index = parts[4], parts[6], parts[8]
        base = f"/sys/class/infiniband/{device}/ports/{port}/gid_attrs"
        kind = (_read(bundle, f"{base}/types/{index}") or "?").strip() or "?"
        netdev = (_read(bundle, f"{base}/ndevs/{index}") or "?").strip() or "?"
        lines.append(f"{device} port {port} index {index} {gid} {kind} {netdev}")
    return ("\n".join(lines) + "\n").encode() if lines else b""


def _fabric(bundle: Bundle) -> None:
    bundle.add_command("fabric/ip-link.txt", ["ip", "-d", "link", "show"])
    bundle.add_command("fabric/ip-link-stats.txt", ["ip", "-s", "link", "show"])
    bundle.add_command("fabric/ip-addr.txt", ["ip", "addr", "show"])
    bundle.add_command("fabric/ip-route.txt", ["ip", "route", "show"])
    if bundle.glob("/sys/class/infiniband/*"):
        bundle.add("fabric/rdma-gids.txt", _gids(bundle), "/sys/class/infiniband/*/ports/*/gids/*")
        for device in bundle.glob("/sys/class/infiniband/*/ports/*"):
            parts = device.split("/")
            for name in ("state", "phys_state", "rate", "link_layer"):
                bundle.add_file(f"fabric/rdma/{parts[4]}-port{parts[6]}-{name}.txt", f"{device}/{name}", absent=None)
        bundle.add_command("fabric/rdma-link.txt", ["rdma", "link", "show"], absent="skipped")
        bundle.add_command("fabric/ibv_devinfo.txt", ["ibv_devinfo"], absent="skipped")
    else:
        bundle.note_skipped("fabric/rdma", "no /sys/class/infiniband device (no RDMA: a lab node, or the ConnectX "
                                           "driver not loaded)")
    netplan = bundle.settings["netplan_file"]
    bundle.add_file(f"fabric/{os.path.basename(netplan)}", netplan, why="the fabric stage writes it")
    bundle.add_command("fabric/nft-table.txt", ["nft", "list", "table", *bundle.settings["nft_table"].split()])
    bundle.add_file("fabric/hosts", "/etc/hosts")


def _image(bundle: Bundle) -> None:
    found = []
    docker = bundle.run(["docker", "version", "--format", "{{.Server.Version}}"])
    if not docker.not_found:
        bundle.add_command("image/docker-version.txt", ["docker", "version", "--format", "{{.Server.Version}}"],
                           output=docker)
        for ref in bundle.settings["images"]:
            member = "image/docker-" + re.sub(r"[^A-Za-z0-9._-]+", "_", ref) + ".json"
            data = bundle.add_command(member, ["docker", "image", "inspect", ref], kind="env")
            inspected, _why = parse_json(data) if data is not None else (None, "")
            if isinstance(inspected, list) and inspected and isinstance(inspected[0], dict):
                labels = (inspected[0].get("Config") or {}).get("Labels") or {}
                fingerprint = labels.get("io.sparkfleet.fingerprint") or ""
                found.append(f"{ref} {str(inspected[0].get('Id', '?'))[:19]}"
                             + (f" (fingerprint {fingerprint[:12]})" if fingerprint else ""))
        bundle.add_command("image/docker-ps.txt", ["docker", "ps", "-a", "--no-trunc", "--filter", "name=sparkfleet"])
    venv = bundle.settings["venv"]
    if os.path.isdir(bundle.local(venv)):
        marker = bundle.add_file("image/venv-installed.txt", f"{venv}/.sparkfleet-installed")
        dists = sorted(os.path.basename(path)[:-len(".dist-info")]
                       for path in bundle.glob(f"{venv}/lib/python*/site-packages/*.dist-info"))
        bundle.add("image/venv-distributions.txt", ("\n".join(dists) + "\n").encode(),
                   f"{venv}/lib/python*/site-packages/*.dist-info")
        vllm = [name for name in dists if re.match(r"(?i)vllm([_-]cpu)?-\d", name)]
        found.append("native " + (", ".join(vllm) or "(no vllm distribution)")
                     + ("" if marker is not None else ", no install marker"))
    if docker.not_found and not os.path.isdir(bundle.local(venv)):
        bundle.note_missing("image", f"neither docker nor the virtualenv {venv} on this node (the serve stage has not "
                                     "installed a runtime here)")
    bundle.facts["image"] = found


def _weights(bundle: Bundle) -> None:
    hub = bundle.settings["hub_cache"]
    markers = []
    for path in bundle.glob(f"{hub}/models--*/.sparkfleet-verified.json") + \
            bundle.glob(f"{hub}/models--*/.sparkfleet-scrub-failed.json"):
        repo = os.path.basename(os.path.dirname(path))
        data = bundle.add_file(f"weights/{repo}{os.path.basename(path)}", path, kind="json")
        marker, _why = parse_json(data) if data is not None else (None, "")
        if isinstance(marker, dict):
            markers.append({"repo": repo.removeprefix("models--").replace("--", "/"),
                            "revision": str(marker.get("revision") or "?"), "files": len(marker.get("files") or []),
                            "scrub_failed": path.endswith("scrub-failed.json")})
    if not markers:
        bundle.note_missing("weights", f"no .sparkfleet-verified.json under {hub}/models--* (the weights stage has "
                                       "not verified a checkpoint on this node)")
    bundle.facts["weights"] = markers


def _logs(bundle: Bundle) -> None:
    log_dir = bundle.settings["log_dir"]
    try:
        names = os.listdir(bundle.local(log_dir))
    except OSError as err:
        bundle.note_missing("logs/vllm", f"{log_dir}: {err.strerror or err} (no rank has started here)")
        bundle.facts["logs"] = {"this": [], "previous": [], "older": 0, "current": None}
        return
    try:
        current = os.readlink(bundle.local(f"{log_dir}/current.log"))
    except OSError:
        current = None
    this, previous, older = boot_logs(names, bundle.facts["boot"]["btime"] or 0)
    budget = int(bundle.settings["logs_max_bytes"])
    kept: dict[str, list[str]] = {"this": [], "previous": []}
    for group, files in (("this", this), ("previous", previous)):
        for name in files:
            try:
                size = os.stat(bundle.local(f"{log_dir}/{name}")).st_size
            except OSError:
                size = 0
            # a file goes in whole, or as a tail of at least 64 KiB: never a few lines of a large one
            if budget < min(size, MARGIN) or budget <= 0:
                bundle.note_missing(f"logs/vllm/{name}", f"left out: the node's vLLM logs reached their cap of "
                                                         f"{human_bytes(bundle.settings['logs_max_bytes'])}")
                continue
            data = bundle.add_file(f"logs/vllm/{name}", f"{log_dir}/{name}", tail=min(bundle.tail, budget))
            if data is not None:
                budget -= len(data)
                kept[group].append(name)
    if not this:
        bundle.note_missing("logs/vllm (this boot)", f"no vllm-boot{bundle.facts['boot']['name']}-*.log in {log_dir} "
                                                     "(no rank started since this boot)")
    bundle.facts["logs"] = {"this": kept["this"], "previous": kept["previous"], "older": len(older),
                            "current": current}


SECTIONS: tuple[tuple[str, Callable[[Bundle], None]], ...] = (
    ("system", _system), ("config", _config), ("units", _units), ("journal", _journal), ("kernel", _kernel),
    ("memory", _memory), ("gpu", _gpu), ("state", _state), ("fabric", _fabric), ("image", _image),
    ("weights", _weights), ("logs", _logs))


# ------------------------------------------------------------------------------------------------ the summary


def _units_row(states: list[dict[str, Any]]) -> str:
    if not states:
        return "none installed"
    shown = []
    for state in states:
        name = state["unit"].removeprefix("sparkfleet-").removesuffix(".service")
        text = f"{name} {state.get('active') or '?'}" + (f" ({state['sub']})" if state.get("sub") else "")
        if state.get("result") not in (None, "success"):
            text += f", result {state['result']}"
        if state.get("restarts"):
            text += f", {state['restarts']} restarts"
        shown.append(cell(text, 80))
    return "<br>".join(shown)


def _verify_row(status: dict[str, Any], rank: Any) -> str:
    if "absent" in status:
        return ("none (a worker: the head verifies)" if rank not in (None, 0)
                else f"none (status.json {status['absent']})")
    when = utc(status.get("checked_at"))
    if status.get("ok"):
        return f"ok, epoch {status.get('epoch')}, {when}"
    return cell(f"FAILED ({status.get('failed') or '?'}), epoch {status.get('epoch')}, {when}: {status.get('why')}")


def _psi_row(psi: dict[str, Any]) -> str:
    if all(value is None for value in psi.values()):
        return "n/a (no /proc/pressure)"
    parts = []
    for resource in PSI_RESOURCES:
        some = (psi.get(resource) or {}).get("some") or {}
        parts.append(f"{resource} {some['avg10']:.2f}" if "avg10" in some else f"{resource} n/a")
    return ", ".join(parts)


def _zram_row(zram: list[dict[str, Any]]) -> str:
    if not zram:
        return "none"
    return ", ".join(f"{z['device']} {human_bytes(z.get('orig_data_size', 0))} stored in "
                     f"{human_bytes(z.get('mem_used_total', 0))}" if "orig_data_size" in z
                     else f"{z['device']} (mm_stat unreadable)" for z in zram)


def _xid_row(xid: dict[str, Any], gpu: str) -> str:
    if not xid.get("source"):
        return "n/a (no kernel log)"
    benign = xid["xid"] - xid["errors"]
    text = f"{xid['errors']} error(s)" + (f" + {benign} benign" if benign else "") + f" ({xid['source']})"
    return text + (", no GPU" if gpu.startswith("none") else "")


def summary_rows(facts: dict[str, Any], size: int, members: int, missing: list[dict[str, str]],
                 skipped: list[dict[str, str]], redactions: dict[str, int], settings: dict[str, Any]) -> dict[str, str]:
    """SUMMARY.md's cells for one node, by row (ROWS)."""
    group = facts.get("group") or {}
    meminfo = facts.get("meminfo") or {}
    watchdog = facts.get("watchdog_trips")
    journal_trips = facts.get("watchdog_journal_trips")
    logs = facts.get("logs") or {}
    rows = {
        "bundle": f"{human_bytes(size)}, {members} files",
        "units": _units_row(facts.get("units") or []),
        "group": (f"{group.get('phase')}"
                  + (f", epoch {group['epoch']}" if group.get("epoch") is not None else "")  # none once it gave up
                  + f", rank {group.get('rank')}"
                  + (f": {group['why']}" if group.get("why") else "") if "absent" not in group
                  else f"no state.json ({group['absent']})"),
        "last verify": _verify_row(facts.get("verify") or {"absent": "absent"}, group.get("rank")),
        "weights scrub": ("none" if "absent" in (facts.get("scrub") or {"absent": 1}) else
                          f"{'ok' if facts['scrub'].get('ok') else 'FAILED'}, {utc(facts['scrub'].get('checked_at'))}"),
        "give-up marker": facts.get("gave_up") or "none",
        "MemAvailable": (f"{human_bytes(meminfo['MemAvailable'] * 1024)} of "
                         f"{human_bytes(meminfo.get('MemTotal', 0) * 1024)}" if "MemAvailable" in meminfo else "n/a"),
        "PSI some avg10": _psi_row(facts.get("psi") or {}),
        "zram": _zram_row(facts.get("zram") or []),
        "watchdog trips": (f"{'?' if watchdog is None else watchdog} (textfile), "
                           f"{'?' if journal_trips is None else journal_trips} this boot (journal)"),
        "Xid": _xid_row(facts.get("xid") or {}, facts.get("gpu") or ""),
        "GPU": facts.get("gpu") or "?",
        "image": "<br>".join(cell(line, 90) for line in facts.get("image") or []) or "none",
        "weights": "<br>".join(f"{w['repo']}@{w['revision'][:12]}, {w['files']} files"
                               + (" (SCRUB FAILED)" if w["scrub_failed"] else "") for w in facts.get("weights") or [])
                   or "no verified marker",
        "vLLM logs": (f"{len(logs.get('this') or [])} this boot, {len(logs.get('previous') or [])} previous boot"
                      + (f", {logs['older']} older not taken" if logs.get("older") else "")
                      + f" (last {human_bytes(settings['tail_bytes'])} each, "
                        f"{human_bytes(settings['logs_max_bytes'])} in all)"),
        "redacted": (f"{sum(redactions.values())} in {', '.join(sorted(redactions))}" if redactions
                     else "nothing found"),
        "missing": str(len(missing)),
        "skipped": str(len(skipped)),
    }
    return {row: cell(rows[row], 400) if "<br>" not in rows[row] else rows[row] for row in ROWS}


# ------------------------------------------------------------------------------------------------ collect


def collect(name: str, directory: str, secrets: Iterable[str], settings: dict[str, Any] | None = None,
            runner: Callable[..., Output] = run_capped, root: str = "/",
            clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Write <directory>/<name>.tar.gz; returns what the module returns (path, size, members, missing,
    skipped_items, summary, rows, redacted; not "skipped", which Ansible reads as the task's own state). A section
    that fails in a way nobody foresaw is noted as missing, never raised."""
    settings = dict(DEFAULTS, **{key: value for key, value in (settings or {}).items() if value is not None})
    redactor = Redactor(secrets)
    # Secret-named values of the env files (the head's API key as the service has it now) are redacted everywhere.
    for path in settings["config_files"]:
        if path.endswith(".env"):
            try:
                with open(os.path.join(root, path.lstrip("/")), "rb") as handle:
                    for value in harvest(handle.read(1024 * 1024)):
                        redactor.add(value)
            except OSError:
                pass
    path = os.path.join(directory, f"{name}.tar.gz")
    bundle = Bundle(name, path, redactor, settings, runner=runner, root=root, clock=clock)
    try:
        bundle.facts["boot"] = {"id": "", "btime": None, "name": None}
        for section, function in SECTIONS:
            try:
                function(bundle)
            except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
                bundle.note_missing(section, f"the {section} section stopped with {type(err).__name__}: {err}")
        redactions = {item.member: item.redacted for item in bundle.items if item.redacted}
        caps = {"tail_bytes": settings["tail_bytes"], "logs_max_bytes": settings["logs_max_bytes"],
                "timeout_s": settings["timeout"]}
        manifest = {"node": name, "collected_at": utc(clock()), "caps": caps, "boot": bundle.facts["boot"]}
        # The summary is made of the redacted members only (a verdict or marker quoting a secret stays redacted).
        summary = dict(bundle.facts, node=name, caps=caps, missing=bundle.missing, skipped=bundle.skipped,
                       redacted=redactions)
        members = len(bundle.items) + 2
        size = bundle.close(summary, manifest)
    except BaseException:
        bundle.abort()
        raise
    rows = summary_rows(bundle.facts, size, members, bundle.missing, bundle.skipped, redactions, settings)
    return {"path": path, "size": size, "members": members, "missing": bundle.missing, "skipped_items": bundle.skipped,
            "summary": summary, "rows": rows, "redacted": sum(redactions.values())}
