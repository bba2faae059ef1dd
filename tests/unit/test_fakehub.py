"""The fake Hub (tests/fakehub/server.py) against the real huggingface_hub client, over 127.0.0.1 only.

How the client is pointed at the fake: huggingface_hub reads HF_ENDPOINT (and HF_HUB_DISABLE_XET, HF_HUB_OFFLINE,
HF_HUB_DISABLE_TELEMETRY...) into `huggingface_hub.constants` once, at import time, so setting the variable inside an
already-running test process does nothing. In process, these tests pass `endpoint=hub.url` to HfApi /
hf_hub_download / snapshot_download (all of them take it) and patch the few constants they depend on; the standalone
test starts a fresh client process with HF_ENDPOINT in its environment, the way the weights role runs.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

TESTS_DIR = Path(__file__).resolve().parents[1]
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import httpx2  # noqa: E402
import huggingface_hub as hf  # noqa: E402
from fakehub.server import FakeHub, git_blob_id, lfs_pointer  # noqa: E402
from huggingface_hub import constants, errors  # noqa: E402
from huggingface_hub.utils import _http as hf_http  # noqa: E402

SERVER = TESTS_DIR / "fakehub" / "server.py"
REPO = "acme/tiny"
MiB = 1024 * 1024
# http_get reads the body with iter_bytes(chunk_size=constants.DOWNLOAD_CHUNK_SIZE): bytes still in that buffer when
# the connection breaks are lost, so a retry resumes from the last whole 10 MiB chunk written to disk.
CHUNK = constants.DOWNLOAD_CHUNK_SIZE


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_commit(root: Path, repo_id: str, commit: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / repo_id / commit / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.fixture(autouse=True)
def client_env(monkeypatch, tmp_path):
    """A hermetic client: no token from the machine, no Xet, no offline mode, no telemetry."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield
    hf_http.close_session()  # no pooled connection to this test's server survives it


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "hub"
    main = hashlib.sha1(b"main commit").hexdigest()
    dev = hashlib.sha1(b"dev commit").hexdigest()
    files = {
        "config.json": b'{"model_type": "tiny", "hidden_size": 8}\n',
        "model.safetensors": os.urandom(2 * MiB + 512 * 1024),
        "tokenizer.json": json.dumps({"version": "1.0", "vocab": list(range(64))}).encode(),
    }
    dev_files = {**files, "config.json": b'{"model_type": "tiny", "hidden_size": 16}\n'}
    write_commit(root, REPO, main, files)
    write_commit(root, REPO, dev, dev_files)
    (root / REPO / "refs.json").write_text(json.dumps({"main": main, "dev": dev}))
    return SimpleNamespace(root=root, main=main, dev=dev, files=files, dev_files=dev_files)


@pytest.fixture
def hub(repo):
    with FakeHub(repo.root) as running:
        yield running


def download(hub, filename, cache, repo_id=REPO, **kwargs):
    kwargs.setdefault("token", False)
    return hf.hf_hub_download(repo_id, filename, cache_dir=cache, endpoint=hub.url, **kwargs)


def etag_of(name: str, data: bytes) -> str:
    """The blob name the cache uses: sha256 for LFS files (>= 1 MiB or *.safetensors), git blob id otherwise."""
    return sha256(data) if name.endswith(".safetensors") or len(data) >= MiB else git_blob_id(data)


def test_model_info_siblings_carry_sizes_blob_ids_and_lfs(hub, repo):
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # what `git hash-object /dev/null` says
    api = hf.HfApi(endpoint=hub.url, token=False)

    info = api.model_info(REPO, revision="main", files_metadata=True)

    assert (info.id, info.sha, info.gated, info.private) == (REPO, repo.main, False, False)
    siblings = {s.rfilename: s for s in info.siblings}
    assert set(siblings) == set(repo.files)
    for name, data in repo.files.items():
        assert siblings[name].size == len(data)
    weights, data = siblings["model.safetensors"], repo.files["model.safetensors"]
    pointer = lfs_pointer(sha256(data), len(data))
    assert (weights.lfs.sha256, weights.lfs.size, weights.lfs.pointer_size) == (sha256(data), len(data), len(pointer))
    assert weights.blob_id == git_blob_id(pointer)  # an LFS file's git blob is its pointer, as on the Hub
    config, data = siblings["config.json"], repo.files["config.json"]
    assert config.lfs is None
    assert config.blob_id == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    bare = api.model_info(REPO)  # no revision: /api/models/<repo>, i.e. main; no files_metadata: names only
    assert bare.sha == repo.main
    assert {s.rfilename: (s.size, s.lfs) for s in bare.siblings} == {name: (None, None) for name in repo.files}


def test_snapshot_download_writes_the_standard_cache_layout(hub, repo, tmp_path):
    hub.tree_page_size = 2  # the tree listing comes in pages: the client must follow the Link header
    cache = tmp_path / "cache"

    path = hf.snapshot_download(
        REPO, cache_dir=cache, endpoint=hub.url, token=False, allow_patterns=["*.safetensors", "config.json"]
    )

    storage = cache / "models--acme--tiny"
    snapshot = storage / "snapshots" / repo.main
    assert Path(path) == snapshot
    assert (storage / "refs" / "main").read_text() == repo.main
    wanted = {name: data for name, data in repo.files.items() if name != "tokenizer.json"}
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(wanted)
    for name, data in wanted.items():
        link = snapshot / name
        assert link.is_symlink()
        assert os.readlink(link) == f"../../blobs/{etag_of(name, data)}"
        assert link.read_bytes() == data
    assert sorted(p.name for p in (storage / "blobs").iterdir()) == sorted(etag_of(n, d) for n, d in wanted.items())
    assert (storage / "trees" / f"{repo.main}.json").is_file()  # huggingface_hub 2.x caches the tree listing
    tree_pages = [r for r in hub.log if "/tree/" in r["path"]]
    assert len(tree_pages) == 2 and "cursor=2" in tree_pages[1]["query"]
    assert not [r for r in hub.requests if r.path.endswith("/tokenizer.json")]  # filtered out client-side

    # Pinned to the commit and complete on disk: no network I/O at all.
    hub.reset_log()
    again = hf.snapshot_download(
        REPO, revision=repo.main, cache_dir=cache, endpoint=hub.url, allow_patterns=["*.safetensors", "config.json"]
    )
    assert Path(again) == snapshot
    assert hub.requests == [] and hub.total_bytes_sent == 0


def test_a_branch_name_resolves_through_refs_json(hub, repo, tmp_path):
    api = hf.HfApi(endpoint=hub.url, token=False)
    assert api.model_info(REPO, revision="dev").sha == repo.dev
    assert {(b.name, b.target_commit) for b in api.list_repo_refs(REPO).branches} == {
        ("main", repo.main),
        ("dev", repo.dev),
    }
    cache = tmp_path / "cache"

    dev_config = Path(download(hub, "config.json", cache, revision="dev"))
    main_config = Path(download(hub, "config.json", cache))

    # The client learnt the commit from X-Repo-Commit: snapshot folder and refs/<branch> name it.
    assert dev_config.parent.name == repo.dev and dev_config.read_bytes() == repo.dev_files["config.json"]
    assert main_config.parent.name == repo.main and main_config.read_bytes() == repo.files["config.json"]
    assert (cache / "models--acme--tiny" / "refs" / "dev").read_text() == repo.dev


def test_missing_repo_revision_and_file_raise_the_clients_errors(hub, repo, tmp_path):
    api = hf.HfApi(endpoint=hub.url, token=False)
    cache = tmp_path / "cache"

    with pytest.raises(errors.RepositoryNotFoundError) as err:
        api.model_info("acme/nope", files_metadata=True)
    assert err.type is errors.RepositoryNotFoundError and err.value.response.status_code == 404
    with pytest.raises(errors.RepositoryNotFoundError) as err:
        download(hub, "config.json", cache, repo_id="acme/nope")
    assert err.type is errors.RepositoryNotFoundError

    for revision in ("no-such-branch", "0" * 40):
        with pytest.raises(errors.RevisionNotFoundError):
            download(hub, "config.json", cache, revision=revision)
    with pytest.raises(errors.RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")

    with pytest.raises(errors.RemoteEntryNotFoundError) as err:
        download(hub, "missing.bin", cache)
    assert isinstance(err.value, errors.EntryNotFoundError) and err.value.response.status_code == 404
    # The 404 carries X-Repo-Commit, so the client caches the file's absence under the commit.
    assert (cache / "models--acme--tiny" / ".no_exist" / repo.main / "missing.bin").is_file()


def test_gated_repo_needs_the_right_token(hub, repo, tmp_path):
    hub.gate(REPO, "hf_right")
    cache = tmp_path / "cache"
    api = hf.HfApi(endpoint=hub.url, token=False)
    assert api.model_info(REPO, files_metadata=True).gated == "manual"  # metadata stays public, as on the Hub

    with pytest.raises(errors.GatedRepoError) as err:
        download(hub, "config.json", cache)
    assert err.value.response.status_code == 401
    with pytest.raises(errors.GatedRepoError) as err:
        download(hub, "config.json", cache, token="hf_wrong")
    assert err.value.response.status_code == 403
    with pytest.raises(errors.GatedRepoError):
        hf.snapshot_download(REPO, cache_dir=cache, endpoint=hub.url, token=False)
    assert hub.bytes_sent == {}

    path = download(hub, "model.safetensors", cache, token="hf_right")

    assert Path(path).read_bytes() == repo.files["model.safetensors"]
    assert hub.log[-1]["authorization"] and hub.log[-1]["status"] == 200


# huggingface_hub 2.4.0 and interrupted downloads (file_download.http_get / _download_to_tmp_and_move):
# * Within one call: when the body stops early with httpx2.RemoteProtocolError (server closed the connection: FIN),
#   ConnectError or a timeout, http_get sleeps 1 s and retries (up to 5 times without progress) with
#   "Range: bytes=<bytes written>-". Bytes written = whole 10 MiB chunks (DOWNLOAD_CHUNK_SIZE): a file cut before its
#   first 10 MiB is fetched again from byte 0, without a Range header.
# * A reset connection (httpx2.ReadError) is not retried: the call raises httpx2.ReadError (not an HfHubHTTPError).
# * Across calls there is no resume: each call downloads into its own `<etag>.<random>.incomplete` file and deletes
#   it when it fails, so the next call starts from byte 0.


def test_interrupted_download_is_retried_within_the_call_from_byte_zero_below_10_mib(hub, repo, tmp_path):
    hub.interrupt_once(REPO, "model.safetensors", after_bytes=MiB)

    path = download(hub, "model.safetensors", tmp_path / "cache")

    assert Path(path).read_bytes() == repo.files["model.safetensors"]
    gets = hub.file_requests("GET")
    assert [r.range for r in gets] == [None, None]
    assert [r.get("aborted") for r in hub.log if r["method"] == "GET" and "/resolve/" in r["path"]] == [
        "interrupt_once:close",
        None,
    ]


def test_interrupted_download_resumes_with_a_range_request(hub, repo, tmp_path):
    big = os.urandom(CHUNK + 2 * MiB)
    write_commit(repo.root, REPO, repo.main, {"big.safetensors": big})
    hub.interrupt_once(REPO, "big.safetensors", after_bytes=CHUNK + MiB)

    path = download(hub, "big.safetensors", tmp_path / "cache")

    assert sha256(Path(path).read_bytes()) == sha256(big)
    assert [r.range for r in hub.file_requests("GET")] == [None, f"bytes={CHUNK}-"]
    assert hub.log[-1]["status"] == 206
    assert hub.bytes_sent[(REPO, "big.safetensors")] == (CHUNK + MiB) + (len(big) - CHUNK)


def test_reset_connection_fails_the_call_and_the_next_call_starts_over(hub, repo, tmp_path):
    hub.interrupt_once(REPO, "model.safetensors", after_bytes=MiB, mode="reset")
    cache = tmp_path / "cache"

    with pytest.raises(httpx2.ReadError) as err:
        download(hub, "model.safetensors", cache)
    assert not isinstance(err.value, errors.HfHubHTTPError)
    assert list((cache / "models--acme--tiny" / "blobs").iterdir()) == []  # the partial file was deleted

    path = download(hub, "model.safetensors", cache)

    assert Path(path).read_bytes() == repo.files["model.safetensors"]
    assert [r.range for r in hub.file_requests("GET")] == [None, None]


def test_corrupted_download_is_not_detected_by_the_client(hub, repo, tmp_path):
    data = repo.files["model.safetensors"]
    hub.corrupt_once(REPO, "model.safetensors")
    cache = tmp_path / "cache"

    path = Path(download(hub, "model.safetensors", cache))

    # Plain HTTP downloads are checked for size only: the damaged bytes are cached under the sha256 name.
    served = path.read_bytes()
    assert len(served) == len(data) and sha256(served) != sha256(data)
    assert Path(os.path.realpath(path)).name == sha256(data)
    # ... and stay there: the next call sees the blob and does not download again (HEAD only).
    hub.reset_log()
    assert Path(download(hub, "model.safetensors", cache)).read_bytes() == served
    assert [r.method for r in hub.file_requests()] == ["HEAD"]

    os.remove(os.path.realpath(path))
    fresh = Path(download(hub, "model.safetensors", cache))

    assert sha256(fresh.read_bytes()) == sha256(data)
    assert [r.method for r in hub.file_requests()] == ["HEAD", "HEAD", "GET"]


def test_cdn_mode_redirects_lfs_files_to_another_origin_without_the_token(repo, tmp_path):
    with FakeHub(repo.root, cdn=True) as hub:
        hub.gate(REPO, "hf_right")
        cache = tmp_path / "cache"

        weights = download(hub, "model.safetensors", cache, token="hf_right")
        config = download(hub, "config.json", cache, token="hf_right")

        assert Path(weights).read_bytes() == repo.files["model.safetensors"]
        assert Path(config).read_bytes() == repo.files["config.json"]
        seen = [(r["method"], r["cdn"], r["status"], r["authorization"]) for r in hub.log]
        assert seen == [
            ("HEAD", False, 302, True),  # resolve answers 302 + X-Linked-Etag/Size; not followed cross-origin
            ("GET", True, 200, False),  # the signed CDN URL, fetched without Authorization
            ("HEAD", False, 200, True),  # small files are served by resolve itself
            ("GET", False, 200, True),
        ]
        location = urllib.request.Request(f"{hub.cdn_url}{hub.log[1]['path']}?{hub.log[1]['query']}x")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(location, timeout=5)
        assert err.value.code == 403  # a tampered signature is refused


def test_range_requests_and_errors_on_the_wire(hub, repo):
    url = f"{hub.url}/{REPO}/resolve/main/config.json"
    data = repo.files["config.json"]

    def fetch(method="GET", **headers):
        request = urllib.request.Request(url, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()

    status, headers, body = fetch(Range="bytes=5-")
    assert (status, headers["Content-Range"], body) == (206, f"bytes 5-{len(data) - 1}/{len(data)}", data[5:])
    assert headers["ETag"] == f'"{git_blob_id(data)}"' and headers["X-Repo-Commit"] == repo.main
    assert fetch(Range="bytes=-4")[2] == data[-4:]
    status, headers, _body = fetch(Range=f"bytes={len(data)}-")
    assert (status, headers["Content-Range"]) == (416, f"bytes */{len(data)}")
    status, headers, body = fetch("HEAD")
    assert (status, int(headers["Content-Length"]), body) == (200, len(data), b"")
    url = f"{hub.url}/{REPO}/resolve/main/nothing.txt"
    status, headers, body = fetch()
    assert (status, headers["X-Error-Code"], json.loads(body)) == (404, "EntryNotFound", {"error": "Entry not found"})


def test_standalone_server_with_port_file_faults_file_and_sigterm(repo, tmp_path):
    port_file, faults, request_log = tmp_path / "port", tmp_path / "faults.json", tmp_path / "requests.jsonl"
    faults.write_text(json.dumps([{"op": "gate", "repo_id": REPO, "token": "hf_standalone"}]))
    command = [sys.executable, str(SERVER), "--root", str(repo.root), "--host", "127.0.0.1", "--port", "0"]
    command += ["--port-file", str(port_file), "--faults", str(faults), "--request-log", str(request_log)]
    server = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert port_file.exists(), server.stderr.read() if server.poll() is not None else "no port file"
        endpoint = f"http://127.0.0.1:{int(port_file.read_text())}"

        # A fresh client process configured only through its environment, as the weights role runs it.
        client = textwrap.dedent(
            """
            import json, sys
            from huggingface_hub import HfApi, hf_hub_download, errors
            cache = sys.argv[1]
            out = {"sha": HfApi(token=False).model_info("acme/tiny", files_metadata=True).sha}
            try:
                hf_hub_download("acme/tiny", "config.json", cache_dir=cache, token=False)
            except errors.GatedRepoError as err:
                out["without_token"] = type(err).__name__
            path = hf_hub_download("acme/tiny", "config.json", cache_dir=cache, token="hf_standalone")
            out["config"] = open(path).read()
            print(json.dumps(out))
            """
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env.update(
            HF_ENDPOINT=endpoint,
            HF_HOME=str(tmp_path / "hf-home"),
            HF_HUB_DISABLE_XET="1",
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
        )
        result = subprocess.run(
            [sys.executable, "-c", client, str(tmp_path / "cache")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout.strip().splitlines()[-1])
        assert out == {
            "sha": repo.main,
            "without_token": "GatedRepoError",
            "config": repo.files["config.json"].decode(),
        }
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 0
        server.stderr.close()
    logged = [json.loads(line) for line in request_log.read_text().splitlines()]
    assert [(r["method"], r["status"]) for r in logged if "/resolve/" in r["path"]] == [
        ("HEAD", 401),
        ("HEAD", 200),
        ("GET", 200),
    ]
