#!/usr/bin/env python
"""A local stand-in for the Hugging Face Hub, for tests (standard library only).

It answers the calls huggingface_hub makes to download a model, so that the real client code runs unchanged
against ``HF_ENDPOINT=http://HOST:PORT`` (or ``endpoint=`` / ``HfApi(endpoint=...)``):

* ``GET /api/models/<org>/<name>[/revision/<rev>][?blobs=true]``   model_info / repo_info (siblings, sha, ...)
* ``GET /api/models/<org>/<name>/tree/<rev>[/<path>]?recursive=..``  list_repo_tree (paginated with a Link header)
* ``POST /api/models/<org>/<name>/paths-info/<rev>``                 get_paths_info
* ``GET /api/models/<org>/<name>/refs``                              list_repo_refs
* ``HEAD|GET /<org>/<name>/resolve/<rev>/<path>``                    hf_hub_download / snapshot_download

Repositories come from a directory tree::

    ROOT/<org>/<name>/<40-hex commit>/<files...>
    ROOT/<org>/<name>/refs.json          optional: {"main": "<commit>", "dev": "<commit>", ...}

Without refs.json, "main" names the repository's only commit (when it has exactly one).

Files of ``lfs_threshold`` bytes or more, and files with a weights suffix (``LFS_SUFFIXES``: .safetensors, .bin,
...), are LFS files: their ``lfs`` metadata carries the sha256, their blob id is the git id of their LFS pointer, and
the resolve answer carries ``ETag``/``X-Linked-Etag`` = sha256 and ``X-Linked-Size``. Other files have the git blob
sha1 as ETag. Every resolve answer carries ``X-Repo-Commit``. With ``cdn=True`` an LFS resolve answers 302 to a
signed URL on a second port (another origin, as cdn-lfs.hf.co is), so the client sends its GET (and any Range
resume) there, without its Authorization header, exactly as with the real Hub.

Errors carry ``X-Error-Code`` / ``X-Error-Message`` and a JSON ``{"error": ...}`` body like the Hub's:
RepoNotFound (404), RevisionNotFound (404), EntryNotFound (404, with X-Repo-Commit), GatedRepo (401 without a token,
403 with a token that is not the gate's; model_info and the tree stay public, as on the Hub), private repos
(RepoNotFound 401/404).

Faults (Python API, or a JSON file given with ``--faults``): ``interrupt_once``, ``corrupt_once``, ``gate``,
``ungate``, ``make_private``, ``go_away``, ``come_back``, ``throttle``. The file is a JSON list of objects naming the
method and its arguments, e.g. ``[{"op": "interrupt_once", "repo_id": "org/name", "path": "model.safetensors",
"after_bytes": 1048576, "mode": "close"}, {"op": "gate", "repo_id": "org/name", "token": "hf_x"}]``; it is read at
start and again whenever it changes (checked on each request), every entry being applied again then.

Request log: ``hub.requests`` (LoggedRequest(method, path, range) tuples), ``hub.log`` (dicts with query, status,
authorization, cdn, fault/aborted), ``hub.bytes_sent`` (Counter of file-body bytes per (repo_id, path)),
``hub.total_bytes_sent`` (every body byte), ``hub.reset_log()``; standalone: ``--request-log F`` (JSON lines).

Standalone::

    python tests/fakehub/server.py --root DIR --host 10.x.y.1 --port 0 --port-file F [--faults F] [--cdn]

writes the bound port to F and serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

DEFAULT_LFS_THRESHOLD = 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".pkl")
CHUNK_SIZE = 64 * 1024
CORRUPT_SPAN = 16
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
RANGE_RE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", re.IGNORECASE)
LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"


class LoggedRequest(NamedTuple):
    """One request as the server saw it: method, URL path (percent-encoded, no query) and Range header."""

    method: str
    path: str
    range: str | None


class FileEntry(NamedTuple):
    """One file of a repository at one commit."""

    path: str  # repo-relative, "/"-separated
    abspath: str
    size: int
    blob_id: str  # git blob id (of the LFS pointer for LFS files)
    sha256: str | None  # LFS files only
    pointer_size: int | None  # LFS files only

    @property
    def is_lfs(self) -> bool:
        return self.sha256 is not None

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


class HubError(Exception):
    """An error answer: status, message (X-Error-Message and JSON body) and X-Error-Code."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


def git_blob_id(data: bytes) -> str:
    """The id git gives a blob: sha1 of b"blob <size>\\0" + content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return LFS_POINTER.format(sha256=sha256, size=size).encode()


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) for a single satisfiable byte range; None to serve the whole file; 416 otherwise."""
    if not header or "," in header:
        return None
    match = RANGE_RE.fullmatch(header)
    if not match:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    unsatisfiable = HubError(416, "Requested Range Not Satisfiable", headers={"Content-Range": f"bytes */{size}"})
    if not first:
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise unsatisfiable
        return max(size - suffix, 0), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if start >= size or end < start:
        raise unsatisfiable
    return start, min(end, size - 1)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _not_found(what: str = "Repository not found", status: int = 404) -> HubError:
    return HubError(status, what, "RepoNotFound")


class _Repo:
    """One repository directory: ROOT/<org>/<name>."""

    def __init__(self, hub: FakeHub, repo_id: str, directory: str):
        self.hub = hub
        self.repo_id = repo_id
        self.directory = directory

    def commits(self) -> list[str]:
        return sorted(
            name
            for name in os.listdir(self.directory)
            if COMMIT_RE.fullmatch(name) and os.path.isdir(os.path.join(self.directory, name))
        )

    def refs(self) -> dict[str, str]:
        path = os.path.join(self.directory, "refs.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                refs = json.load(handle)
            return {str(name): str(commit) for name, commit in refs.items()}
        commits = self.commits()
        return {"main": commits[0]} if len(commits) == 1 else {}

    def resolve(self, revision: str) -> str:
        commits = self.commits()
        if revision in commits:
            return revision
        refs = self.refs()
        name = revision.removeprefix("refs/heads/").removeprefix("refs/tags/")
        target = refs.get(revision, refs.get(name))
        if target in commits:
            return target
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def files(self, commit: str) -> dict[str, FileEntry]:
        base = os.path.join(self.directory, commit)
        found = {}
        for folder, dirs, names in os.walk(base, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d != ".git")
            for name in names:
                abspath = os.path.join(folder, name)
                if not os.path.isfile(abspath):
                    continue
                rel = os.path.relpath(abspath, base).replace(os.sep, "/")
                found[rel] = self.hub._entry(rel, abspath)
        return dict(sorted(found.items()))

    def file(self, commit: str, path: str) -> FileEntry:
        base = os.path.realpath(os.path.join(self.directory, commit))
        abspath = os.path.realpath(os.path.join(base, *path.split("/")))
        parts = path.split("/")
        if not path or ".." in parts or "" in parts or not abspath.startswith(base + os.sep):
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit})
        if not os.path.isfile(abspath):
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit})
        return self.hub._entry(path, abspath)

    def modified(self, commit: str) -> float:
        return os.stat(os.path.join(self.directory, commit)).st_mtime


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], hub: FakeHub, is_cdn: bool):
        self.hub = hub
        self.is_cdn = is_cdn
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host name (getfqdn), which can stall without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakehub/1.0"
    server: _Server

    # ------------------------------------------------------------------ plumbing

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.hub.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        hub = self.server.hub
        hub._poll_faults_file()
        split = urlsplit(self.path)
        self._body = b""
        if self.command == "POST":
            self._body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._record = hub._log_start(self, split)
        self._headers_done = False
        try:
            if hub._gone:
                self._go_away()
                return
            if self.server.is_cdn:
                self._cdn(split)
            else:
                self._route(split)
        except HubError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as err:  # a bug in the fake: answer 500 rather than hang the client
            if self._headers_done:
                self.close_connection = True
            else:
                self._send_error(HubError(500, f"fakehub internal error: {err!r}"))
            raise
        finally:
            hub._log_end(self._record)

    def _go_away(self) -> None:
        hub = self.server.hub
        self._record["status"] = None
        if hub._gone == "hang":
            hub._back.wait()
        self._abort("close")

    def _abort(self, mode: str) -> None:
        """End the connection without finishing the answer: a FIN ("close") or a TCP RST ("reset")."""
        self.close_connection = True
        try:
            if mode == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        headers = {"X-Request-Id": f"Root={uuid.uuid4()}", **headers, "Content-Length": str(len(body))}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self._headers_done = True
        self._record["status"] = status
        if self.command != "HEAD" and body:
            self.wfile.write(body)
            self.server.hub._count(None, len(body))

    def _send_json(self, data: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self._send(200, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, body)

    def _send_error(self, err: HubError) -> None:
        if self.server.is_cdn:
            code = "AccessDenied" if err.status == 403 else "NoSuchKey"
            body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code></Error>'.encode()
            self._send(err.status, {"Content-Type": "application/xml", **err.headers}, body)
            return
        headers = {"Content-Type": "application/json; charset=utf-8", **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message.encode("ascii", "replace").decode()
        self._send(err.status, headers, json.dumps({"error": err.message}).encode())

    def _token(self) -> str | None:
        value = self.headers.get("Authorization") or ""
        return value[len("Bearer ") :].strip() if value.startswith("Bearer ") else None

    def _host_name(self) -> str:
        host = self.headers.get("Host")
        name = urlsplit(f"//{host}").hostname if host else None
        return name or self.server.hub.host

    # ------------------------------------------------------------------ routes

    def _route(self, split) -> None:
        hub = self.server.hub
        parts = [unquote(part) for part in split.path.split("/")[1:]]
        query = parse_qs(split.query)
        if len(parts) >= 4 and parts[0] == "api":
            if parts[1] != "models":  # only model repositories are hosted here
                raise _not_found()
            repo = hub._repo(f"{parts[2]}/{parts[3]}")
            self._check_private(repo)
            rest = parts[4:]
            if not rest and self.command in ("GET", "HEAD"):
                return self._model_info(repo, "main", query)
            if len(rest) >= 2 and rest[0] == "revision" and self.command in ("GET", "HEAD"):
                return self._model_info(repo, "/".join(rest[1:]), query)
            if len(rest) >= 2 and rest[0] == "tree" and self.command in ("GET", "HEAD"):
                return self._tree(repo, rest[1], "/".join(rest[2:]), query, split.path)
            if len(rest) == 2 and rest[0] == "paths-info" and self.command == "POST":
                return self._paths_info(repo, rest[1])
            if rest == ["refs"] and self.command in ("GET", "HEAD"):
                return self._refs(repo, query)
        elif len(parts) >= 5 and parts[2] == "resolve" and self.command in ("GET", "HEAD"):
            if parts[0] in ("datasets", "spaces", "kernels"):
                raise _not_found()
            repo = hub._repo(f"{parts[0]}/{parts[1]}")
            self._check_private(repo)
            return self._resolve(repo, parts[3], "/".join(parts[4:]))
        raise HubError(404, "Sorry, we can't find the page you are looking for.")

    def _check_private(self, repo: _Repo) -> None:
        token = self.server.hub._private.get(repo.repo_id)
        if token is not None and self._token() != token:
            raise _not_found(status=401 if self._token() is None else 404)

    def _check_gate(self, repo: _Repo) -> None:
        token = self.server.hub._gates.get(repo.repo_id)
        if token is None or self._token() == token:
            return
        if self._token() is None:
            raise HubError(
                401,
                f"Access to model {repo.repo_id} is restricted. You must have access to it and be authenticated "
                "to access it. Please log in.",
                "GatedRepo",
            )
        raise HubError(
            403,
            f"Access to model {repo.repo_id} is restricted and you are not in the authorized list. "
            f"Visit {self.server.hub.url}/{repo.repo_id} to ask for access.",
            "GatedRepo",
        )

    def _model_info(self, repo: _Repo, revision: str, query: dict) -> None:
        commit = repo.resolve(revision)
        files = repo.files(commit)
        blobs = query.get("blobs", ["false"])[-1].lower() in ("1", "true")
        siblings = []
        for entry in files.values():
            sibling: dict[str, Any] = {"rfilename": entry.path}
            if blobs:
                sibling.update(size=entry.size, blobId=entry.blob_id)
                if entry.is_lfs:
                    sibling["lfs"] = {"sha256": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
            siblings.append(sibling)
        org = repo.repo_id.split("/")[0]
        modified = _iso(repo.modified(commit))
        self._send_json(
            {
                "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "author": org,
                "sha": commit,
                "lastModified": modified,
                "createdAt": modified,
                "private": repo.repo_id in self.server.hub._private,
                "gated": "manual" if repo.repo_id in self.server.hub._gates else False,
                "disabled": False,
                "downloads": 0,
                "likes": 0,
                "tags": [],
                "siblings": siblings,
                "spaces": [],
                "usedStorage": sum(entry.size for entry in files.values()),
            }
        )

    @staticmethod
    def _file_json(entry: FileEntry) -> dict[str, Any]:
        data: dict[str, Any] = {"type": "file", "oid": entry.blob_id, "size": entry.size, "path": entry.path}
        if entry.is_lfs:
            data["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
        return data

    @staticmethod
    def _folder_json(path: str, files: dict[str, FileEntry]) -> dict[str, Any]:
        listing = "\n".join(f"{p} {e.blob_id}" for p, e in files.items() if p.startswith(path + "/"))
        return {"type": "directory", "oid": hashlib.sha1(listing.encode()).hexdigest(), "size": 0, "path": path}

    def _tree(self, repo: _Repo, revision: str, path: str, query: dict, url_path: str) -> None:
        commit = repo.resolve(revision)
        files = repo.files(commit)
        path = path.strip("/")
        folders = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
        if path and path not in folders:
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit})
        recursive = query.get("recursive", ["false"])[-1].lower() in ("1", "true")
        expand = query.get("expand", ["false"])[-1].lower() in ("1", "true")
        prefix = f"{path}/" if path else ""

        def wanted(candidate: str) -> bool:
            if not candidate.startswith(prefix):
                return False
            return recursive or "/" not in candidate[len(prefix) :]

        entries = [self._folder_json(f, files) for f in sorted(folders) if wanted(f)]
        entries += [self._file_json(e) for p, e in files.items() if wanted(p)]
        entries.sort(key=lambda item: item["path"])
        cursor = int(query.get("cursor", ["0"])[-1] or 0)
        page_size = self.server.hub.tree_page_size if not expand else min(self.server.hub.tree_page_size, 50)
        page = entries[cursor : cursor + page_size]
        headers = {}
        if cursor + page_size < len(entries):
            params = {key: values[-1] for key, values in query.items()}
            params["cursor"] = str(cursor + page_size)
            origin = f"http://{self.headers.get('Host') or self.server.hub._netloc(self.server.server_port)}"
            headers["Link"] = f'<{origin}{url_path}?{urlencode(params)}>; rel="next"'
        self._send_json(page, headers)

    def _paths_info(self, repo: _Repo, revision: str) -> None:
        commit = repo.resolve(revision)
        files = repo.files(commit)
        form = parse_qs(self._body.decode())
        answer = []
        for path in form.get("paths", []):
            path = path.strip("/")
            if path in files:
                answer.append(self._file_json(files[path]))
            elif any(p.startswith(path + "/") for p in files):
                answer.append(self._folder_json(path, files))
        self._send_json(answer)

    def _refs(self, repo: _Repo, query: dict) -> None:
        refs = repo.refs()
        branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c} for n, c in sorted(refs.items())]
        data: dict[str, Any] = {"branches": branches, "converts": [], "tags": []}
        if query.get("include_prs"):
            data["pullRequests"] = []
        self._send_json(data)

    def _resolve(self, repo: _Repo, revision: str, path: str) -> None:
        hub = self.server.hub
        self._check_gate(repo)
        commit = repo.resolve(revision)
        entry = repo.file(commit, path)
        headers = {
            "X-Repo-Commit": commit,
            "ETag": f'"{entry.etag}"',
            "Accept-Ranges": "bytes",
            "Vary": "Origin",
            "Access-Control-Expose-Headers": "X-Repo-Commit,X-Linked-Etag,X-Linked-Size,X-Error-Code,"
            "X-Error-Message,ETag,Link,Accept-Ranges,Content-Range",
        }
        if entry.is_lfs:
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
            headers["X-Linked-Size"] = str(entry.size)
            if hub.cdn:
                location = hub._cdn_location(self._host_name(), repo.repo_id, commit, entry)
                body = f"Found. Redirecting to {location}".encode()
                self._send(302, {**headers, "Location": location, "Content-Type": "text/plain; charset=utf-8"}, body)
                return
        self._send_file(repo.repo_id, entry, headers)

    def _cdn(self, split) -> None:
        """GET|HEAD /repos/<org>/<name>/<sha256>?path=..&commit=..&Signature=.. on the CDN port."""
        hub = self.server.hub
        parts = [unquote(part) for part in split.path.split("/")[1:]]
        query = {key: values[-1] for key, values in parse_qs(split.query).items()}
        if len(parts) != 4 or parts[0] != "repos" or self.command not in ("GET", "HEAD"):
            raise HubError(404, "NoSuchKey")
        repo_id, sha256 = f"{parts[1]}/{parts[2]}", parts[3]
        path, commit = query.get("path", ""), query.get("commit", "")
        expected = hub._sign(repo_id, commit, path, sha256)
        if not hmac.compare_digest(expected, query.get("Signature", "")):
            raise HubError(403, "AccessDenied")
        try:
            entry = hub._repo(repo_id).file(commit, path)
        except HubError:
            raise HubError(404, "NoSuchKey") from None
        if entry.sha256 != sha256:
            raise HubError(404, "NoSuchKey")
        self._send_file(repo_id, entry, {"ETag": f'"{sha256}"', "Accept-Ranges": "bytes"})

    def _send_file(self, repo_id: str, entry: FileEntry, headers: dict[str, str]) -> None:
        hub = self.server.hub
        size = entry.size
        span = parse_range(self.headers.get("Range"), size)
        start, end = span if span else (0, size - 1)
        length = end - start + 1 if size else 0
        name = entry.path.rsplit("/", 1)[-1]
        headers = {
            **headers,
            "Content-Type": "application/octet-stream",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}; filename=\"{quote(name)}\";",
            "Last-Modified": self.date_time_string(os.stat(entry.abspath).st_mtime),
        }
        if span:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        fault = hub._take_fault(repo_id, entry.path) if self.command == "GET" else None
        if fault:
            self._record["fault"] = fault["op"]
        self.send_response(206 if span else 200)
        headers = {"X-Request-Id": f"Root={uuid.uuid4()}", **headers, "Content-Length": str(length)}
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self._headers_done = True
        self._record["status"] = 206 if span else 200
        if self.command == "HEAD":
            return
        limit, corrupt = None, None
        if fault and fault["op"] == "interrupt_once":
            limit = fault["after_bytes"]
        elif fault and fault["op"] == "corrupt_once":
            corrupt = range(length // 2, min(length // 2 + CORRUPT_SPAN, length))
        if limit is not None and limit <= 0:
            self._abort(fault["mode"])
            return
        sent = 0
        with open(entry.abspath, "rb") as handle:
            handle.seek(start)
            while sent < length:
                if hub._gone:
                    self._record["aborted"] = "go_away"
                    self._abort("close")
                    return
                chunk = handle.read(min(CHUNK_SIZE, length - sent))
                if not chunk:
                    raise OSError(f"{entry.abspath} shrank while being served")
                if corrupt is not None:
                    lo, hi = max(corrupt.start, sent), min(corrupt.stop, sent + len(chunk))
                    if lo < hi:
                        data = bytearray(chunk)
                        for index in range(lo - sent, hi - sent):
                            data[index] ^= 0xFF
                        chunk = bytes(data)
                if limit is not None and sent + len(chunk) >= limit:
                    chunk = chunk[: limit - sent]
                    self.wfile.write(chunk)
                    hub._count((repo_id, entry.path), len(chunk))
                    self._record["aborted"] = f"interrupt_once:{fault['mode']}"
                    self._abort(fault["mode"])
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
                hub._count((repo_id, entry.path), len(chunk))
                if hub._rate:
                    time.sleep(len(chunk) / hub._rate)


class FakeHub:
    """A local Hugging Face Hub serving the repositories under ``root``.

    ``FakeHub(root, host="127.0.0.1", port=0, *, lfs_threshold=1 MiB, lfs_suffixes=LFS_SUFFIXES, cdn=False,
    cdn_port=0, tree_page_size=1000, faults_file=None, request_log=None, verbose=False)``

    Use as a context manager, or ``start()`` / ``stop()``. ``url`` is the endpoint to give the client.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        lfs_threshold: int = DEFAULT_LFS_THRESHOLD,
        lfs_suffixes: tuple[str, ...] = LFS_SUFFIXES,
        cdn: bool = False,
        cdn_port: int = 0,
        tree_page_size: int = 1000,
        faults_file: str | os.PathLike | None = None,
        request_log: str | os.PathLike | None = None,
        verbose: bool = False,
    ):
        self.root = os.fspath(root)
        self.host = host
        self.lfs_threshold = lfs_threshold
        self.lfs_suffixes = tuple(lfs_suffixes)
        self.cdn = cdn
        self.tree_page_size = tree_page_size
        self.verbose = verbose
        self.faults_file = os.fspath(faults_file) if faults_file else None
        self.request_log = os.fspath(request_log) if request_log else None
        self._port, self._cdn_port = port, cdn_port
        self._server: _Server | None = None
        self._cdn_server: _Server | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.RLock()
        self._hashes: dict[tuple, tuple[str, str]] = {}
        self._secret = secrets.token_bytes(16)
        self._gates: dict[str, str] = {}
        self._private: dict[str, str] = {}
        self._faults: list[dict[str, Any]] = []
        self._faults_stamp: tuple | None = None
        self._gone: str | None = None
        self._back = threading.Event()
        self._rate: float | None = None
        self.requests: list[LoggedRequest] = []
        self.log: list[dict[str, Any]] = []
        self.bytes_sent: Counter = Counter()
        self.total_bytes_sent = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeHub:
        self._server = _Server((self.host, self._port), self, is_cdn=False)
        servers = [self._server]
        if self.cdn:
            self._cdn_server = _Server((self.host, self._cdn_port), self, is_cdn=True)
            servers.append(self._cdn_server)
        for server in servers:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._poll_faults_file()
        return self

    def stop(self) -> None:
        self._back.set()
        for server in (self._server, self._cdn_server):
            if server is not None:
                server.shutdown()
                server.drop_connections()
                server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _netloc(self, port: int, host: str | None = None) -> str:
        host = host or self.host
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the hub first"
        return self._server.server_address[1]

    @property
    def cdn_port(self) -> int | None:
        return self._cdn_server.server_address[1] if self._cdn_server else None

    @property
    def url(self) -> str:
        return f"http://{self._netloc(self.port)}"

    @property
    def cdn_url(self) -> str | None:
        return f"http://{self._netloc(self.cdn_port)}" if self._cdn_server else None

    # ------------------------------------------------------------------ access control and faults

    def gate(self, repo_id: str, token: str) -> None:
        """Downloads from repo_id need ``Authorization: Bearer <token>``: 401 GatedRepo without one, 403 otherwise."""
        with self._lock:
            self._gates[repo_id] = token

    def ungate(self, repo_id: str) -> None:
        with self._lock:
            self._gates.pop(repo_id, None)

    def make_private(self, repo_id: str, token: str) -> None:
        """Every call about repo_id without this token answers RepoNotFound (401 anonymous, 404 other token)."""
        with self._lock:
            self._private[repo_id] = token

    def interrupt_once(self, repo_id: str, path: str, after_bytes: int, *, mode: str = "close") -> None:
        """The next GET of the file sends ``after_bytes`` body bytes then ends the connection.

        mode "close": a clean FIN before Content-Length is reached (httpx2.RemoteProtocolError on the client);
        mode "reset": a TCP RST (httpx2.ReadError on the client).
        """
        if mode not in ("close", "reset"):
            raise ValueError(f"mode must be 'close' or 'reset', not {mode!r}")
        with self._lock:
            fault = {"op": "interrupt_once", "repo_id": repo_id, "path": path, "after_bytes": int(after_bytes)}
            self._faults.append({**fault, "mode": mode})

    def corrupt_once(self, repo_id: str, path: str) -> None:
        """The next GET of the file sends the full length with 16 bytes flipped in the middle of the body."""
        with self._lock:
            self._faults.append({"op": "corrupt_once", "repo_id": repo_id, "path": path})

    def go_away(self, mode: str = "drop") -> None:
        """Stop answering: "drop" closes every request (and cuts transfers in flight) without an answer;
        "hang" holds new requests open, unanswered, until come_back() or stop(). stop() refuses connections."""
        if mode not in ("drop", "hang"):
            raise ValueError(f"mode must be 'drop' or 'hang', not {mode!r}")
        self._back.clear()
        self._gone = mode

    def come_back(self) -> None:
        self._gone = None
        self._back.set()

    def throttle(self, bytes_per_sec: float | None) -> None:
        """Serve file bodies at about this rate (None: full speed)."""
        self._rate = float(bytes_per_sec) if bytes_per_sec else None

    def pending_faults(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(fault) for fault in self._faults]

    def apply(self, spec: dict[str, Any]) -> None:
        """Apply one fault/configuration entry, as found in a --faults file: {"op": "<method name>", ...args}."""
        spec = dict(spec)
        op = spec.pop("op")
        actions = {
            "interrupt_once": self.interrupt_once,
            "corrupt_once": self.corrupt_once,
            "gate": self.gate,
            "ungate": self.ungate,
            "make_private": self.make_private,
            "go_away": self.go_away,
            "come_back": self.come_back,
            "throttle": self.throttle,
        }
        if op not in actions:
            raise ValueError(f"unknown fault op {op!r}; known: {', '.join(sorted(actions))}")
        actions[op](**spec)

    def load_faults(self, path: str | os.PathLike) -> None:
        """Apply every entry of a JSON file: a list of {"op": ...} objects (or {"faults": [...]})."""
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        for spec in data.get("faults", []) if isinstance(data, dict) else data:
            self.apply(spec)

    def _poll_faults_file(self) -> None:
        if not self.faults_file:
            return
        try:
            st = os.stat(self.faults_file)
        except FileNotFoundError:
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            if stamp == self._faults_stamp:
                return
            self._faults_stamp = stamp
            try:
                self.load_faults(self.faults_file)
            except (OSError, ValueError, KeyError, TypeError) as err:
                print(f"fakehub: ignoring faults file {self.faults_file}: {err}", file=sys.stderr)

    def _take_fault(self, repo_id: str, path: str) -> dict[str, Any] | None:
        with self._lock:
            for index, fault in enumerate(self._faults):
                if fault["op"] in ("interrupt_once", "corrupt_once") and (fault["repo_id"], fault["path"]) == (
                    repo_id,
                    path,
                ):
                    return self._faults.pop(index)
        return None

    # ------------------------------------------------------------------ request log

    def reset_log(self) -> None:
        with self._lock:
            self.requests.clear()
            self.log.clear()
            self.bytes_sent.clear()
            self.total_bytes_sent = 0

    def file_requests(self, method: str | None = None) -> list[LoggedRequest]:
        """The logged requests that fetched file content (resolve and CDN), optionally of one method."""
        return [
            r
            for r in self.requests
            if ("/resolve/" in r.path or r.path.startswith("/repos/")) and (method is None or r.method == method)
        ]

    def _log_start(self, handler: _Handler, split) -> dict[str, Any]:
        record = {
            "method": handler.command,
            "path": split.path,
            "query": split.query,
            "range": handler.headers.get("Range"),
            "authorization": handler.headers.get("Authorization") is not None,
            "cdn": handler.server.is_cdn,
            "status": None,
            "time": time.time(),
        }
        with self._lock:
            self.requests.append(LoggedRequest(record["method"], record["path"], record["range"]))
            self.log.append(record)
        return record

    def _log_end(self, record: dict[str, Any]) -> None:
        if not self.request_log:
            return
        with self._lock, open(self.request_log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def _count(self, key: tuple[str, str] | None, count: int) -> None:
        with self._lock:
            self.total_bytes_sent += count
            if key is not None:
                self.bytes_sent[key] += count

    # ------------------------------------------------------------------ repositories

    def _repo(self, repo_id: str) -> _Repo:
        parts = repo_id.split("/")
        if len(parts) != 2 or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise _not_found()
        directory = os.path.join(self.root, *parts)
        if not os.path.isdir(directory):
            raise _not_found()
        return _Repo(self, repo_id, directory)

    def _entry(self, path: str, abspath: str) -> FileEntry:
        st = os.stat(abspath)
        key = (abspath, st.st_size, st.st_mtime_ns, st.st_ino)
        hashes = self._hashes.get(key)
        if hashes is None:
            git = hashlib.sha1(b"blob %d\0" % st.st_size)
            sha256 = hashlib.sha256()
            with open(abspath, "rb") as handle:
                while chunk := handle.read(1024 * 1024):
                    git.update(chunk)
                    sha256.update(chunk)
            hashes = self._hashes[key] = (git.hexdigest(), sha256.hexdigest())
        if st.st_size >= self.lfs_threshold or path.endswith(self.lfs_suffixes):
            pointer = lfs_pointer(hashes[1], st.st_size)
            return FileEntry(path, abspath, st.st_size, git_blob_id(pointer), hashes[1], len(pointer))
        return FileEntry(path, abspath, st.st_size, hashes[0], None, None)

    def _sign(self, repo_id: str, commit: str, path: str, sha256: str) -> str:
        message = "\n".join((repo_id, commit, path, sha256)).encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def _cdn_location(self, host: str, repo_id: str, commit: str, entry: FileEntry) -> str:
        assert entry.sha256 is not None and self.cdn_port is not None
        query = urlencode(
            {"path": entry.path, "commit": commit, "Signature": self._sign(repo_id, commit, entry.path, entry.sha256)}
        )
        return f"http://{self._netloc(self.cdn_port, host)}/repos/{quote(repo_id)}/{entry.sha256}?{query}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A local stand-in for the Hugging Face Hub, for tests.")
    parser.add_argument("--root", required=True, help="ROOT/<org>/<name>/<commit>/... (+ refs.json)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    parser.add_argument("--port-file", help="write the bound port here (atomically) once listening")
    parser.add_argument("--lfs-threshold", type=int, default=DEFAULT_LFS_THRESHOLD, help="bytes (default 1 MiB)")
    parser.add_argument("--cdn", action="store_true", help="redirect LFS downloads to a CDN port (another origin)")
    parser.add_argument("--cdn-port", type=int, default=0, help="CDN port with --cdn (default: a free one)")
    parser.add_argument("--faults", help="JSON list of {'op': ...} entries; re-read whenever the file changes")
    parser.add_argument("--gate", action="append", default=[], metavar="ORG/NAME=TOKEN", help="gate a repository")
    parser.add_argument("--request-log", help="append one JSON line per request here")
    parser.add_argument("--tree-page-size", type=int, default=1000)
    parser.add_argument("--verbose", action="store_true", help="log requests to stderr")
    args = parser.parse_args(argv)

    hub = FakeHub(
        args.root,
        args.host,
        args.port,
        lfs_threshold=args.lfs_threshold,
        cdn=args.cdn,
        cdn_port=args.cdn_port,
        tree_page_size=args.tree_page_size,
        faults_file=args.faults,
        request_log=args.request_log,
        verbose=args.verbose,
    )
    for item in args.gate:
        repo_id, _sep, token = item.partition("=")
        hub.gate(repo_id, token)

    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    hub.start()
    if args.port_file:
        tmp = f"{args.port_file}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(f"{hub.port}\n")
        os.replace(tmp, args.port_file)
    cdn = f" cdn={hub.cdn_url}" if hub.cdn_url else ""
    print(f"fakehub serving {args.root} at {hub.url}{cdn}", file=sys.stderr, flush=True)
    while not done.wait(0.5):
        pass
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
