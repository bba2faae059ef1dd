# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Model weights in the Hugging Face cache layout: manifests, verification, the verified marker, progress.

The layout is the one huggingface_hub writes and vLLM reads offline (HF_HUB_OFFLINE=1):

    <cache_dir>/models--<org>--<name>/blobs/<etag>
    <cache_dir>/models--<org>--<name>/snapshots/<revision>/<path>  -> ../../blobs/<etag>
    <cache_dir>/models--<org>--<name>/refs/main                    (the pinned revision)

and sparkfleet adds `.sparkfleet-verified.json` beside them: the revision, the manifest hash and the file
list with each file's stat record (size, mtime_ns, ctime_ns, inode, device), written only after every file's
checksum matched. A later run with the same revision and manifest reads only that marker and stats the files:
no network, no hashing, unless a file is no longer the one verified.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import SparkfleetError

COMMIT = re.compile(r"[0-9a-f]{40}")  # used with fullmatch: "$" would accept a trailing newline
MARKER = ".sparkfleet-verified.json"
CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Entry:
    """One file of a checkpoint: its path in the repo, size, and the checksum it must have."""

    path: str
    size: int
    sha256: str | None = None  # LFS files and SHA256SUMS entries
    git_sha1: str | None = None  # small files the Hub keeps in git: the git blob id

    @property
    def etag(self) -> str:
        """The blob name huggingface_hub uses: the sha256 for LFS files, the git blob id otherwise."""
        return self.sha256 or self.git_sha1 or ""


class WeightsError(SparkfleetError):
    """What was found, what was expected, what to do."""


# ---------------------------------------------------------------------------------------------- manifests

def check_revision(revision: str | None, allow_branch: bool) -> None:
    """A pinned commit, unless the user explicitly accepts a moving branch."""
    if revision and COMMIT.fullmatch(revision):
        return
    if revision and allow_branch:
        return
    raise WeightsError(
        repr(revision) if revision else "no revision",
        "a pinned 40-hex commit hash (a branch or tag can change under you between nodes and runs)",
        "set checkpoint.revision in the profile to the commit you verified, or set "
        "model_weights_allow_branch: true to accept a branch",
    )


def select(paths: Iterable[str], allow: list[str] | None, ignore: list[str] | None) -> list[str]:
    """Paths matching any allow pattern (all when none) and no ignore pattern, as huggingface_hub filters."""
    chosen = []
    for path in paths:
        if allow and not any(fnmatch.fnmatch(path, pattern) for pattern in allow):
            continue
        if ignore and any(fnmatch.fnmatch(path, pattern) for pattern in ignore):
            continue
        chosen.append(path)
    return sorted(chosen)


def parse_sha256sums(text: str) -> dict[str, str]:
    """`sha256sum` output (text or binary mode) as {path: hex}."""
    sums = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.match(r"^([0-9a-fA-F]{64}) [ *](.+)$", line)
        if not match:
            raise WeightsError(f"line {number} of SHA256SUMS: {line[:80]!r}", "'<64 hex>  <path>' lines",
                               "regenerate the file with sha256sum")
        sums[match.group(2).removeprefix("./")] = match.group(1).lower()
    return sums


def manifest_hash(entries: Iterable[Entry]) -> str:
    canonical = json.dumps([asdict(e) for e in sorted(entries, key=lambda e: e.path)], sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def total_bytes(entries: Iterable[Entry]) -> int:
    return sum(e.size for e in entries)


def entries_from_dicts(items: Iterable[dict[str, Any]]) -> list[Entry]:
    return [Entry(path=i["path"], size=int(i["size"]), sha256=i.get("sha256"), git_sha1=i.get("git_sha1"))
            for i in items]


def local_manifest(directory: str, allow: list[str] | None = None, ignore: list[str] | None = None) -> list[Entry]:
    """The manifest of a local checkpoint: its SHA256SUMS, with sizes from the files themselves."""
    sums_path = os.path.join(directory, "SHA256SUMS")
    if not os.path.isfile(sums_path):
        raise WeightsError(f"no SHA256SUMS in {directory}", "a local checkpoint with its SHA256SUMS manifest",
                           "create it with `sha256sum $(find . -type f ! -name SHA256SUMS) > SHA256SUMS` there")
    with open(sums_path, encoding="utf-8") as handle:
        sums = parse_sha256sums(handle.read())
    entries = []
    for path in select(sums, allow, ignore):
        full = os.path.join(directory, path)
        if not os.path.isfile(full):
            raise WeightsError(f"{path} listed in SHA256SUMS but missing from {directory}",
                               "every listed file present", "copy the complete checkpoint")
        entries.append(Entry(path, os.path.getsize(full), sha256=sums[path]))
    if not entries:
        raise WeightsError(f"no file of {directory} matches the patterns", "at least one file",
                           "check model_weights_allow_patterns / ignore_patterns")
    return entries


def local_revision(directory: str) -> str:
    """A stable 40-hex name for a local checkpoint's snapshot: the sha1 of its SHA256SUMS."""
    with open(os.path.join(directory, "SHA256SUMS"), "rb") as handle:
        return hashlib.sha1(handle.read()).hexdigest()


def cache_manifest(source_cache: str, repo_id: str, revision: str, allow: list[str] | None = None,
                   ignore: list[str] | None = None) -> list[Entry]:
    """The manifest of a snapshot already in a Hugging Face cache, read from the cache itself: each file is a
    link to a blob named by its checksum (the sha256 for LFS files, the git blob id for the others)."""
    snapshot = snapshot_dir(source_cache, repo_id, revision)
    if not os.path.isdir(snapshot):
        raise WeightsError(f"no snapshot {revision} of {repo_id} under {source_cache}",
                           "a populated Hugging Face cache (models--org--name/snapshots/<revision>)",
                           "download it there first (hf download REPO --revision REVISION), or use source huggingface")
    found = {}
    for directory, _dirs, files in os.walk(snapshot):
        for name in files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, snapshot)] = path
    entries = []
    for relative in select(found, allow, ignore):
        blob = os.path.basename(os.path.realpath(found[relative]))
        size = os.path.getsize(found[relative])
        if re.fullmatch(r"[0-9a-f]{64}", blob):
            entries.append(Entry(relative, size, sha256=blob))
        elif COMMIT.fullmatch(blob):
            entries.append(Entry(relative, size, git_sha1=blob))
        else:
            raise WeightsError(f"{relative} in {snapshot} pointing at {blob!r}",
                               "a link to a blob named by its checksum",
                               "use a cache written by huggingface_hub, or a local source with SHA256SUMS")
    if not entries:
        raise WeightsError(f"no file of {snapshot} matches the patterns", "at least one file",
                           "check model_weights_allow_patterns / ignore_patterns")
    return entries


# ------------------------------------------------------------------------------------------- cache layout

def repo_dir(cache_dir: str, repo_id: str) -> str:
    return os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))


def snapshot_dir(cache_dir: str, repo_id: str, revision: str) -> str:
    return os.path.join(repo_dir(cache_dir, repo_id), "snapshots", revision)


def write_ref(cache_dir: str, repo_id: str, revision: str, ref: str = "main") -> bool:
    """Point refs/<ref> at the revision so offline loaders that ask for the default branch find it."""
    path = os.path.join(repo_dir(cache_dir, repo_id), "refs", ref)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            if handle.read().strip() == revision:
                return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, revision)
    return True


def place_blob(cache_dir: str, repo_id: str, revision: str, entry: Entry, source: str) -> None:
    """Copy a local file into blobs/ (hashing as it copies) and link it from the snapshot."""
    blob = os.path.join(repo_dir(cache_dir, repo_id), "blobs", entry.etag)
    os.makedirs(os.path.dirname(blob), exist_ok=True)
    partial = blob + ".incomplete"
    if entry.sha256:
        algorithm, expected, digest = "sha256", entry.sha256, hashlib.sha256()
    else:
        algorithm, expected, digest = "git_sha1", entry.git_sha1, hashlib.sha1()
        digest.update(b"blob %d\0" % os.path.getsize(source))
    with open(source, "rb") as src, open(partial, "wb") as dst:
        for chunk in iter(lambda: src.read(CHUNK), b""):
            digest.update(chunk)
            dst.write(chunk)
    if digest.hexdigest() != expected:
        os.unlink(partial)
        raise WeightsError(f"{algorithm} {digest.hexdigest()} for {entry.path} in the source {source}",
                           f"{expected} as the manifest says", "the source itself is damaged: replace it")
    os.replace(partial, blob)
    link_snapshot(cache_dir, repo_id, revision, entry)


def link_snapshot(cache_dir: str, repo_id: str, revision: str, entry: Entry) -> None:
    link = os.path.join(snapshot_dir(cache_dir, repo_id, revision), entry.path)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    target = os.path.relpath(os.path.join(repo_dir(cache_dir, repo_id), "blobs", entry.etag), os.path.dirname(link))
    if os.path.lexists(link):
        if os.path.islink(link) and os.readlink(link) == target:
            return
        os.unlink(link)
    os.symlink(target, link)


def remove_file(cache_dir: str, repo_id: str, revision: str, entry: Entry) -> None:
    """Delete one file of a snapshot and the blob it points to (a blob is named by its content, so another link
    to the same blob is equally damaged); other files are left alone."""
    link = os.path.join(snapshot_dir(cache_dir, repo_id, revision), entry.path)
    if os.path.islink(link):
        blob = os.path.realpath(link)
        if os.path.isfile(blob):
            os.unlink(blob)
    if os.path.lexists(link):
        os.unlink(link)


# ------------------------------------------------------------------------------------------- verification

def file_digest(path: str, algorithm: str, progress: Callable[[int], None] | None = None) -> str:
    """sha256 of the content, or the git blob id (sha1 of 'blob <size>\\0' + content)."""
    if algorithm == "git_sha1":
        digest = hashlib.sha1()
        digest.update(b"blob %d\0" % os.path.getsize(path))
    else:
        digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


def verify_entry(path: str, entry: Entry, progress: Callable[[int], None] | None = None) -> str | None:
    """None when the file matches the manifest, else a short reason naming the file."""
    if not os.path.isfile(path):
        return f"{entry.path}: missing"
    size = os.path.getsize(path)
    if size != entry.size:
        return f"{entry.path}: {size} bytes, expected {entry.size}"
    algorithm, expected = ("sha256", entry.sha256) if entry.sha256 else ("git_sha1", entry.git_sha1)
    if not expected:
        return None  # nothing to compare against: size only (the Hub gave no checksum)
    found = file_digest(path, algorithm, progress)
    return None if found == expected else f"{entry.path}: {algorithm} {found}, expected {expected}"


# ------------------------------------------------------------------------------------------------ marker

def read_marker(cache_dir: str, repo_id: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(repo_dir(cache_dir, repo_id), MARKER), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


# What stat() proves about a file without reading it: an in-place write moves mtime and ctime (and resetting mtime
# with touch moves ctime), a replaced file has another inode. Compared by the fast path instead of re-hashing.
# The device number is recorded but not compared: a remount or a reboot may renumber it with the file unchanged.
STAT_KEYS = ("size", "mtime_ns", "ctime_ns", "inode")


def stat_record(path: str) -> dict[str, int]:
    """The file's identity as the marker keeps it (of the blob a snapshot link points at)."""
    found = os.stat(path)
    return {"size": found.st_size, "mtime_ns": found.st_mtime_ns, "ctime_ns": found.st_ctime_ns,
            "inode": found.st_ino, "device": found.st_dev}


def stat_drift(snapshot: str, item: dict[str, Any]) -> str | None:
    """Why a file no longer is the one the marker verified ('' keys it lacks count as drift), or None."""
    path = os.path.join(snapshot, item["path"])
    try:
        now = stat_record(path)
    except OSError as err:
        return f"{item['path']}: {err.strerror.lower()}"
    recorded = item.get("stat") or {"size": item.get("size")}
    changed = [key for key in STAT_KEYS if recorded.get(key) != now[key]]
    return f"{item['path']}: {', '.join(changed)} changed since it was verified" if changed else None


def marker_drift(cache_dir: str, repo_id: str, revision: str, manifest_sha256: str | None = None,
                 selection: dict[str, Any] | None = None) -> list[str]:
    """Why the marker does not prove this checkout (one line each; empty when it does). Reads the marker and
    stats the files; never reads their content."""
    marker = read_marker(cache_dir, repo_id)
    if not marker:
        return ["no marker"]
    if marker.get("revision") != revision:
        return [f"the marker is for revision {marker.get('revision')}"]
    if manifest_sha256 and marker.get("manifest_sha256") != manifest_sha256:
        return ["the manifest changed"]
    if selection is not None and marker.get("selection") != selection:
        return ["the file selection changed"]
    snapshot = snapshot_dir(cache_dir, repo_id, revision)
    return [why for why in (stat_drift(snapshot, item) for item in marker.get("files", [])) if why]


def marker_valid(cache_dir: str, repo_id: str, revision: str, manifest_sha256: str | None = None,
                 selection: dict[str, Any] | None = None) -> bool:
    """The cheap check: the marker names this revision (and manifest, and file selection), and every file is
    the one that was verified: same size, mtime, ctime, inode and device (a marker written before these were
    recorded proves sizes only, so it is not valid: the files are hashed once more and it is rewritten). Reads
    the marker and stats files; never reads their content."""
    return not marker_drift(cache_dir, repo_id, revision, manifest_sha256, selection)


def write_marker(cache_dir: str, repo_id: str, revision: str, entries: list[Entry], source: str,
                 selection: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the verified checkout, with what stat() proves of each file (after every file's checksum matched)."""
    snapshot = snapshot_dir(cache_dir, repo_id, revision)
    marker = {
        "repo_id": repo_id,
        "revision": revision,
        "selection": selection or {},
        "manifest_sha256": manifest_hash(entries),
        "total_bytes": total_bytes(entries),
        "source": source,
        "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": [dict(asdict(e), stat=stat_record(os.path.join(snapshot, e.path)))
                  for e in sorted(entries, key=lambda e: e.path)],
    }
    atomic_write(os.path.join(repo_dir(cache_dir, repo_id), MARKER), json.dumps(marker, indent=1) + "\n")
    return marker


def atomic_write(path: str, text: str, mode: int | None = None) -> None:
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w", encoding="utf-8") as handle:
        handle.write(text)
    if mode is not None:
        os.chmod(partial, mode)
    os.replace(partial, path)


# ------------------------------------------------------------------------------------------------- space

def free_bytes(path: str) -> int:
    """Free bytes for an unprivileged writer on the filesystem that holds `path` (or its nearest parent)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    stats = os.statvfs(probe)
    return stats.f_bavail * stats.f_frsize


def missing_bytes(cache_dir: str, repo_id: str, revision: str, entries: Iterable[Entry]) -> int:
    """Bytes still to be written: files absent from the snapshot or of the wrong size."""
    snapshot = snapshot_dir(cache_dir, repo_id, revision)
    missing = 0
    for entry in entries:
        path = os.path.join(snapshot, entry.path)
        if not os.path.isfile(path) or os.path.getsize(path) != entry.size:
            missing += entry.size
    return missing


# ---------------------------------------------------------------------------------------------- progress

class Progress:
    """Bytes done out of a total, written to a JSON file at most twice a second for a watcher to read."""

    def __init__(self, path: str | None, total: int, phase: str, clock: Callable[[], float] = time.monotonic):
        self.path, self.total, self.phase, self.clock = path, total, phase, clock
        self.done = 0
        self.current = ""  # the file being transferred, for the watcher
        self.started = clock()
        self._written = 0.0

    def advance(self, count: int, current: str = "") -> None:
        self.done += count
        now = self.clock()
        if now - self._written >= 0.5:
            self.write(current)

    def rate(self) -> float:
        elapsed = self.clock() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def write(self, current: str = "") -> None:
        self._written = self.clock()
        if not self.path:
            return
        atomic_write(self.path, json.dumps({"phase": self.phase, "done_bytes": self.done, "total_bytes": self.total,
                                            "bytes_per_second": round(self.rate(), 1), "file": current}))


def human_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} TiB"
