#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Fetch, verify and record model weights in the Hugging Face cache layout."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_weights
short_description: Pinned, sha256-verified model weights in the Hugging Face cache layout
description:
  - Places one checkpoint revision under O(cache_dir) in the layout huggingface_hub writes and vLLM reads
    offline (C(models--org--name/blobs), C(snapshots/<revision>), C(refs/main)), verifies every file, and
    records the verified state in C(.sparkfleet-verified.json) beside it.
  - When that marker already names the pinned revision and file selection and every file is the one verified
    (the same size, mtime, ctime and inode as recorded), the module returns at once, without network
    I/O and without hashing; any difference (an in-place write, a replaced file) re-verifies every file.
  - O(source=huggingface) downloads with huggingface_hub (resumable) and checks each file against the Hub's
    LFS sha256 (or the repo's C(SHA256SUMS), or the git blob id of small files). A mismatch deletes only that
    file and fetches it once more; a second mismatch fails naming the file.
  - O(source=local) copies a checkpoint directory that carries a C(SHA256SUMS) manifest.
  - O(source=cache) takes a snapshot already in a Hugging Face cache on this node (O(local_dir), or O(cache_dir)
    itself); its blob names are the checksums, so every file is verified without the Hub.
  - O(source=peer) pulls the checkpoint from another node with rsync (over SSH or from a read-only rsync
    daemon), continuing partial transfers, then verifies every file against O(manifest).
  - O(plan=true) reports the manifest, the bytes still missing and the free space, and changes nothing.
version_added: 0.1.0
options:
  source:
    description: Where the files come from.
    type: str
    choices: [huggingface, local, cache, peer]
    required: true
  repo_id:
    description: Repository id (C(org/name)); names the cache directory for every source.
    type: str
    required: true
  revision:
    description:
      - Commit to place. Required for O(source=huggingface) and O(source=peer); a branch name is refused
        unless O(allow_branch=true).
      - For O(source=local) it defaults to the sha1 of the checkpoint's C(SHA256SUMS).
    type: str
  allow_branch:
    description: Accept a branch or tag name as O(revision) (resolved once, on this node).
    type: bool
    default: false
  allow_patterns:
    description: Only files matching one of these glob patterns.
    type: list
    elements: str
  ignore_patterns:
    description: Skip files matching one of these glob patterns.
    type: list
    elements: str
  cache_dir:
    description: The Hugging Face hub cache directory (C($HF_HOME/hub)).
    type: path
    required: true
  local_dir:
    description:
      - The checkpoint directory on this node, for O(source=local).
      - For O(source=cache), the hub cache directory that holds the snapshot; O(cache_dir) when omitted.
    type: path
  token:
    description: Hugging Face token, for gated or private repositories.
    type: str
  endpoint:
    description: Hub endpoint (C(HF_ENDPOINT)); the public Hub when empty.
    type: str
  manifest:
    description: The files and checksums to verify against, for O(source=peer) (the head's RV(manifest)).
    type: list
    elements: dict
  peer:
    description: The node to pull from, for O(source=peer).
    type: dict
    suboptions:
      address:
        description: Its fabric address.
        type: str
        required: true
      transport:
        description: C(ssh) (rsync over SSH to a forced rrsync command) or C(rsyncd) (a read-only daemon).
        type: str
        choices: [ssh, rsyncd]
        default: ssh
      user:
        description: SSH user on the peer.
        type: str
        default: root
      ssh_key:
        description: Private key for O(peer.transport=ssh).
        type: path
      known_hosts:
        description: known_hosts file holding the peer's host key.
        type: path
      port:
        description: rsync daemon port for O(peer.transport=rsyncd).
        type: int
        default: 873
      module:
        description: rsync daemon module serving the peer's cache directory.
        type: str
        default: sparkfleet-weights
      bwlimit_kib:
        description: Cap the pull at this many KiB/s (0 for no cap), to leave the fabric to a running service.
        type: int
        default: 0
  progress_file:
    description: Where to write progress (bytes done and total) for a watcher while the module runs async.
    type: path
  plan:
    description: Report what would be fetched and the free space; change nothing.
    type: bool
    default: false
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would change without changing it.
    support: full
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
requirements:
  - huggingface_hub for O(source=huggingface); rsync (and ssh) for O(source=peer)
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Fetch the pinned checkpoint on the head
  sparkfleet.cluster.model_weights:
    source: huggingface
    repo_id: local-inference-lab/GLM-5.3-Flash-NVFP4
    revision: 9c7121320000000000000000000000000000abcd
    cache_dir: /var/lib/sparkfleet/hf/hub
    token: "{{ vault_hf_token }}"
  no_log: true

- name: Pull it from the head over the fabric and verify
  sparkfleet.cluster.model_weights:
    source: peer
    repo_id: local-inference-lab/GLM-5.3-Flash-NVFP4
    revision: "{{ head.revision }}"
    manifest: "{{ head.manifest }}"
    cache_dir: /var/lib/sparkfleet/hf/hub
    peer: {address: 192.168.100.10, transport: rsyncd}
"""

RETURN = r"""
revision:
  description: The commit placed.
  returned: success
  type: str
manifest:
  description: The files with their size and checksum (sha256 or git_sha1).
  returned: success
  type: list
  elements: dict
manifest_sha256:
  description: Hash of the manifest, recorded in the marker.
  returned: success
  type: str
total_bytes:
  description: Size of the selected files.
  returned: success
  type: int
missing_bytes:
  description: Bytes not yet in place before this run.
  returned: success
  type: int
free_bytes:
  description: Free space at O(cache_dir) before this run.
  returned: success
  type: int
transferred_bytes:
  description: Bytes fetched or copied by this run.
  returned: success
  type: int
seconds:
  description: Time spent transferring.
  returned: success
  type: float
bytes_per_second:
  description: Achieved transfer rate.
  returned: success
  type: float
refetched:
  description: Files whose checksum did not match and were fetched again.
  returned: success
  type: list
  elements: str
snapshot:
  description: The snapshot directory vLLM loads from.
  returned: success
  type: str
cached:
  description: True when the marker showed everything verified and nothing was read or fetched.
  returned: success
  type: bool
"""

import os
import re
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils import tp_padding
from ansible_collections.sparkfleet.cluster.plugins.module_utils import weights as w


class Job:
    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.cache_dir = self.p["cache_dir"]
        self.repo_id = self.p["repo_id"]
        self.result = dict(changed=False, cached=False, refetched=[], transferred_bytes=0, seconds=0.0,
                           bytes_per_second=0.0)

    # -- manifests --------------------------------------------------------------------------------------

    def manifest(self):
        source = self.p["source"]
        if source == "local":
            directory = self.p["local_dir"]
            if not directory or not os.path.isdir(directory):
                raise w.WeightsError(f"local_dir {directory!r} is not a directory on this node",
                                     "the checkpoint directory", "copy the checkpoint there or correct the path")
            entries = w.local_manifest(directory, self.p["allow_patterns"], self.p["ignore_patterns"])
            return (self.p["revision"] or w.local_revision(directory)), entries
        if source == "cache":
            w.check_revision(self.p["revision"], allow_branch=False)
            return self.p["revision"], w.cache_manifest(self.p["local_dir"] or self.cache_dir, self.repo_id,
                                                        self.p["revision"], self.p["allow_patterns"],
                                                        self.p["ignore_patterns"])
        if source == "peer":
            w.check_revision(self.p["revision"], allow_branch=False)
            if not self.p["manifest"]:
                raise w.WeightsError("no manifest", "the head's manifest", "pass the head's result.manifest")
            return self.p["revision"], w.entries_from_dicts(self.p["manifest"])
        w.check_revision(self.p["revision"], self.p["allow_branch"])
        return hub_manifest(self)

    # -- run --------------------------------------------------------------------------------------------

    def selection(self):
        return {"allow": self.p["allow_patterns"] or [], "ignore": self.p["ignore_patterns"] or []}

    def verified_pin(self):
        """The pinned revision whose marker is valid here, read without network I/O or hashing; else None."""
        source, revision = self.p["source"], self.p["revision"]
        if source == "local" and not revision and self.p["local_dir"] and os.path.isfile(
                os.path.join(self.p["local_dir"], "SHA256SUMS")):
            revision = w.local_revision(self.p["local_dir"])
        if source == "peer" or not revision or not w.COMMIT.fullmatch(revision):
            return None  # a peer compares against the head's manifest; a branch must be resolved first
        if w.marker_valid(self.cache_dir, self.repo_id, revision, selection=self.selection()):
            return revision
        return None

    def describe(self, revision, entries, digest, missing):
        self.result.update(revision=revision, manifest=[e.__dict__ for e in entries], manifest_sha256=digest,
                           total_bytes=w.total_bytes(entries), missing_bytes=missing,
                           snapshot=w.snapshot_dir(self.cache_dir, self.repo_id, revision),
                           free_bytes=w.free_bytes(self.cache_dir))

    def run(self):
        pinned = self.verified_pin()
        if pinned:
            marker = w.read_marker(self.cache_dir, self.repo_id)
            self.describe(pinned, w.entries_from_dicts(marker["files"]), marker["manifest_sha256"], missing=0)
            self.result["cached"] = True
            return self.result
        revision, entries = self.manifest()
        digest = w.manifest_hash(entries)
        self.describe(revision, entries, digest,
                      missing=w.missing_bytes(self.cache_dir, self.repo_id, revision, entries))
        selection = self.selection() if self.p["source"] != "peer" else None
        if w.marker_valid(self.cache_dir, self.repo_id, revision, digest, selection):
            self.result["cached"] = True
            return self.result
        self.result["changed"] = True
        if self.p["plan"] or self.module.check_mode:
            return self.result
        if self.result["missing_bytes"] > self.result["free_bytes"]:
            raise w.WeightsError(f"{w.human_bytes(self.result['free_bytes'])} free at {self.cache_dir}",
                                 f"at least {w.human_bytes(self.result['missing_bytes'])} for the missing files",
                                 "free disk space or point model_weights_cache_dir at a larger filesystem")
        os.makedirs(self.cache_dir, exist_ok=True)
        started = time.monotonic()
        fetch = {"local": self.place_local, "cache": self.place_cached, "peer": self.pull_peer,
                 "huggingface": lambda *args: fetch_hub_files(self, *args)}[self.p["source"]]
        fetch(revision, entries)
        self.result["seconds"] = round(time.monotonic() - started, 3)
        if self.result["seconds"] > 0:
            self.result["bytes_per_second"] = round(self.result["transferred_bytes"] / self.result["seconds"], 1)
        w.write_ref(self.cache_dir, self.repo_id, revision)
        w.write_marker(self.cache_dir, self.repo_id, revision, entries, self.p["source"], self.selection())
        return self.result

    # -- sources ----------------------------------------------------------------------------------------

    def place_local(self, revision, entries):
        self.copy_unverified(self.p["local_dir"], revision, entries)

    def copy_unverified(self, source_dir, revision, entries):
        """Copy from source_dir (hashing as it copies) every file not already verified in our snapshot."""
        progress = w.Progress(self.p["progress_file"], w.total_bytes(entries), "copy")
        snapshot = w.snapshot_dir(self.cache_dir, self.repo_id, revision)
        for entry in entries:
            if w.verify_entry(os.path.join(snapshot, entry.path), entry) is None:
                continue
            w.place_blob(self.cache_dir, self.repo_id, revision, entry, os.path.join(source_dir, entry.path))
            progress.advance(entry.size, entry.path)
            self.result["transferred_bytes"] += entry.size
        progress.write()

    def place_cached(self, revision, entries):
        """Verify a snapshot in place, or copy it from another cache directory, checking every file."""
        source_snapshot = w.snapshot_dir(self.p["local_dir"] or self.cache_dir, self.repo_id, revision)
        snapshot = w.snapshot_dir(self.cache_dir, self.repo_id, revision)
        if os.path.realpath(source_snapshot) != os.path.realpath(snapshot):
            self.copy_unverified(source_snapshot, revision, entries)
            return
        bad = self.verify_all(snapshot, entries)
        if bad:
            raise w.WeightsError(f"{', '.join(e.path for e in bad)} not matching the checksum in its blob name",
                                 "an intact cache", "delete those files from the cache and download them again")

    def pull_peer(self, revision, entries):
        snapshot = w.snapshot_dir(self.cache_dir, self.repo_id, revision)
        progress = w.Progress(self.p["progress_file"], w.total_bytes(entries), "pull")
        self.result["transferred_bytes"] += rsync_pull(self, progress)
        bad = self.verify_all(snapshot, entries)
        if bad:
            # Same size and time but other bytes: rsync's quick check skipped them. Remove and pull once more.
            for entry in bad:
                w.remove_file(self.cache_dir, self.repo_id, revision, entry)
            self.result["refetched"] = [e.path for e in bad]
            self.result["transferred_bytes"] += rsync_pull(self, progress)
            still = self.verify_all(snapshot, bad)
            if still:
                raise w.WeightsError(f"{', '.join(e.path for e in still)} still not matching after a second pull",
                                     "the head's verified bytes", "re-verify the head (delete its marker) and rerun")

    def verify_all(self, snapshot, entries):
        progress = w.Progress(self.p["progress_file"], w.total_bytes(entries), "verify")
        bad = []
        for entry in entries:
            if w.verify_entry(os.path.join(snapshot, entry.path), entry,
                              lambda n, p=entry.path: progress.advance(n, p)) is not None:
                bad.append(entry)
        return bad


# ------------------------------------------------------------------------------------------------ the Hub

def hub_api(job):
    try:
        from huggingface_hub import HfApi
    except ImportError as err:
        raise w.WeightsError("no huggingface_hub for this node's Python", "the sparkfleet tools virtualenv",
                             "run the weights stage, which installs it from the controller's wheelhouse") from err
    return HfApi(endpoint=job.p["endpoint"] or None, token=job.p["token"] or False)


def hub_errors(job, err):
    """Translate huggingface_hub's exceptions into what/expected/fix."""
    from huggingface_hub import errors

    repo, revision = job.repo_id, job.p["revision"]
    if isinstance(err, errors.GatedRepoError):
        why = "token refused" if job.p["token"] else "no token given"
        return w.WeightsError(f"{repo} is gated and the request was refused ({why})",
                              "a token with access to the repository",
                              "accept the licence on the Hub and set model_weights_token (vault it)")
    if isinstance(err, errors.RevisionNotFoundError):
        return w.WeightsError(f"no revision {revision} in {repo}", "an existing commit of the repository",
                              "check checkpoint.revision against the repository's history")
    if isinstance(err, errors.RepositoryNotFoundError):
        return w.WeightsError(f"no repository {repo} (or it is private and the token does not reach it)",
                              "an existing repository id", "check checkpoint.repo_id, or set model_weights_token")
    if isinstance(err, errors.EntryNotFoundError):
        return w.WeightsError(f"a file listed for {repo}@{revision} is gone ({err})", "every listed file",
                              "rerun; if it persists the revision is broken on the Hub")
    return None


def hub_manifest(job):
    from huggingface_hub import errors

    api = hub_api(job)
    try:
        info = api.model_info(job.repo_id, revision=job.p["revision"], files_metadata=True)
    except errors.HfHubHTTPError as err:
        raise (hub_errors(job, err)
               or w.WeightsError(f"the Hub answering {err}", "the repository's file list",
                                 "check the endpoint and the network")) from err
    revision = info.sha
    siblings = {s.rfilename: s for s in info.siblings or []}
    sums = {}
    if "SHA256SUMS" in siblings:
        path = hub_download(job, "SHA256SUMS", revision)
        with open(path, encoding="utf-8") as handle:
            sums = w.parse_sha256sums(handle.read())
    entries = []
    for name in w.select(siblings, job.p["allow_patterns"], job.p["ignore_patterns"]):
        sibling = siblings[name]
        lfs = sibling.lfs
        sha256 = sums.get(name) or (lfs.sha256 if lfs else None)
        entries.append(w.Entry(name, int(sibling.size or 0), sha256=sha256,
                               git_sha1=None if lfs else sibling.blob_id))
    if not entries:
        raise w.WeightsError(f"no file of {job.repo_id}@{revision} matches the patterns", "at least one file",
                             "check model_weights_allow_patterns / ignore_patterns")
    return revision, entries


def hub_download(job, filename, revision, force=False, tqdm_class=None):
    from huggingface_hub import errors, hf_hub_download

    try:
        return hf_hub_download(job.repo_id, filename, revision=revision, cache_dir=job.cache_dir,
                               token=job.p["token"] or False, endpoint=job.p["endpoint"] or None,
                               force_download=force, tqdm_class=tqdm_class)
    except errors.HfHubHTTPError as err:
        raise (hub_errors(job, err)
               or w.WeightsError(f"{filename} failing to download ({err})", "the file",
                                 "rerun: files already verified are kept")) from err
    except w.WeightsError:  # a refusal of ours from inside the download (a ValueError too): as it is
        raise
    except (OSError, RuntimeError, ValueError) as err:
        raise w.WeightsError(f"the download of {filename} cut off ({type(err).__name__}: {err})",
                             "a complete transfer from the Hub",
                             "rerun: files already verified are kept and not fetched again") from err
    except Exception as err:  # the HTTP client's own transport errors (connection reset, protocol errors)
        if type(err).__module__.split(".", maxsplit=1)[0] not in ("httpx", "httpx2", "httpcore", "h11"):
            raise
        raise w.WeightsError(f"the connection cut off while fetching {filename} ({type(err).__name__}: {err})",
                             "a complete transfer from the Hub",
                             "rerun: files already verified are kept and not fetched again") from err


def counting_tqdm(progress):
    from huggingface_hub.utils import tqdm as hub_tqdm

    class Counting(hub_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if n:
                progress.advance(n, progress.current)
            return super().update(n)

    return Counting


def fetch_hub_files(job, revision, entries):
    snapshot = w.snapshot_dir(job.cache_dir, job.repo_id, revision)
    progress = w.Progress(job.p["progress_file"], w.total_bytes(entries), "download")
    tqdm_class = counting_tqdm(progress)
    for entry in entries:
        local = os.path.join(snapshot, entry.path)
        if w.verify_entry(local, entry) is None:
            progress.advance(entry.size, entry.path)
            continue
        before = progress.done
        progress.current = entry.path
        path = hub_download(job, entry.path, revision, tqdm_class=tqdm_class)
        problem = w.verify_entry(path, entry)
        if problem:
            job.result["refetched"].append(entry.path)
            w.remove_file(job.cache_dir, job.repo_id, revision, entry)
            path = hub_download(job, entry.path, revision, force=True, tqdm_class=tqdm_class)
            again = w.verify_entry(path, entry)
            if again:
                w.remove_file(job.cache_dir, job.repo_id, revision, entry)
                raise w.WeightsError(f"{again} on the second download too (first: {problem})",
                                     "the Hub's checksum", f"the Hub serves a damaged {entry.path}: report it, "
                                     "or pin another revision")
        job.result["transferred_bytes"] += max(progress.done - before, 0)
    progress.write()


# ------------------------------------------------------------------------------------------------ rsync

PROGRESS2 = re.compile(r"^\s*([\d,]+)\s+\d+%")
TRANSFERRED = re.compile(r"^Total transferred file size: ([\d,]+) bytes", re.M)


class LineFeed:
    """A pipe as run_command reads it (fileno, read, close) that also hands every line (ended by CR or LF) it
    has read to ``on_line``: rsync's progress while it runs, where run_command returns only at the end."""

    def __init__(self, pipe, on_line):
        self.pipe, self.on_line = pipe, on_line
        self.buffer = b""

    def fileno(self):
        return self.pipe.fileno()

    def read(self, size=-1):
        chunk = self.pipe.read(size)
        if chunk:
            self.buffer += chunk
            *lines, self.buffer = re.split(rb"[\r\n]", self.buffer)
            for raw in lines:
                self.on_line(raw.decode(errors="replace"))
        return chunk

    def close(self):
        self.pipe.close()


def rsync_pull(job, progress):
    """Pull the peer's repo directory into ours; returns the bytes rsync transferred."""
    peer = job.p["peer"] or {}
    name = os.path.basename(w.repo_dir(job.cache_dir, job.repo_id))
    dest = w.repo_dir(job.cache_dir, job.repo_id) + "/"
    os.makedirs(dest, exist_ok=True)
    argv = ["rsync", "-a", "--partial", "--append-verify", "--info=progress2", "--stats", "--no-inc-recursive",
            "--timeout=30", f"--exclude={w.MARKER}", "--exclude=*.incomplete",
            f"--exclude=/{tp_padding.VIEWS}/"]  # each node keeps its own padded view of what it verified
    if peer.get("bwlimit_kib"):
        argv.append(f"--bwlimit={peer['bwlimit_kib']}")
    if peer.get("transport") == "rsyncd":
        argv += ["--contimeout=10", f"rsync://{peer['address']}:{peer['port']}/{peer['module']}/{name}/", dest]
    else:
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10",
               "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        if peer.get("ssh_key"):
            ssh += ["-i", peer["ssh_key"]]
        if peer.get("known_hosts"):
            ssh += ["-o", f"UserKnownHostsFile={peer['known_hosts']}"]
        argv += ["-e", " ".join(ssh), f"{peer.get('user') or 'root'}@{peer['address']}:{name}/", dest]
    base = progress.done

    def on_line(line):
        match = PROGRESS2.match(line)
        if match:
            done = int(match.group(1).replace(",", ""))
            progress.advance(base + done - progress.done, "rsync")

    def stream(process):  # before run_command reads rsync's output: every chunk it reads moves the progress
        process.stdout = LineFeed(process.stdout, on_line)

    rc, stdout, stderr = job.module.run_command(argv, expand_user_and_vars=False, errors="replace",
                                                before_communicate_callback=stream, handle_exceptions=False)
    if rc != 0:
        raise w.WeightsError(f"rsync from {peer['address']} ({peer.get('transport', 'ssh')}) exiting "
                             f"{rc}: {stderr.strip()[-600:]}",
                             "a complete transfer over the fabric",
                             "check the peer is up and reachable on its fabric address; rerun to continue "
                             "(partial files are kept, verified files are never deleted)")
    stats = TRANSFERRED.search(stdout)
    return int(stats.group(1).replace(",", "")) if stats else 0


def main():
    module = AnsibleModule(
        argument_spec=dict(
            source=dict(type="str", choices=["huggingface", "local", "cache", "peer"], required=True),
            repo_id=dict(type="str", required=True),
            revision=dict(type="str"),
            allow_branch=dict(type="bool", default=False),
            allow_patterns=dict(type="list", elements="str"),
            ignore_patterns=dict(type="list", elements="str"),
            cache_dir=dict(type="path", required=True),
            local_dir=dict(type="path"),
            token=dict(type="str", no_log=True),
            endpoint=dict(type="str"),
            manifest=dict(type="list", elements="dict"),
            peer=dict(type="dict", options=dict(
                address=dict(type="str", required=True),
                transport=dict(type="str", choices=["ssh", "rsyncd"], default="ssh"),
                user=dict(type="str", default="root"),
                ssh_key=dict(type="path", no_log=False),
                known_hosts=dict(type="path"),
                port=dict(type="int", default=873),
                module=dict(type="str", default="sparkfleet-weights"),
                bwlimit_kib=dict(type="int", default=0),
            )),
            progress_file=dict(type="path"),
            plan=dict(type="bool", default=False),
        ),
        required_if=[("source", "local", ["local_dir"]), ("source", "peer", ["peer", "manifest", "revision"]),
                     ("source", "cache", ["revision"])],
        supports_check_mode=True,
    )
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    job = Job(module)
    try:
        module.exit_json(**job.run())
    except w.WeightsError as err:
        module.fail_json(msg=str(err), **job.result)


if __name__ == "__main__":
    main()
