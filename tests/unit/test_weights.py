"""Model weights in the Hugging Face cache layout: manifests, blobs, verification, the marker, progress."""

import hashlib
import json
import os
import shutil
import subprocess
import time

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils import weights as w

REPO = "org/name"
REV = "0123456789abcdef0123456789abcdef01234567"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_checkpoint(directory, files: dict[str, bytes], sums_text: str | None = None) -> None:
    """A local checkpoint: the files and a SHA256SUMS listing them (or the given text)."""
    for path, data in files.items():
        full = directory / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(data)
    if sums_text is None:
        sums_text = "".join(f"{sha256(data)}  {path}\n" for path, data in files.items())
    (directory / "SHA256SUMS").write_text(sums_text)


def place(cache, files: dict[str, bytes], source_dir, revision: str = REV) -> list[w.Entry]:
    """Place local files into the cache as the module does; returns their entries."""
    entries = []
    for path, data in files.items():
        source = source_dir / path
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(data)
        entry = w.Entry(path, len(data), sha256=sha256(data))
        w.place_blob(str(cache), REPO, revision, entry, str(source))
        entries.append(entry)
    return entries


# ---------------------------------------------------------------------------------------------- revision

def test_check_revision_accepts_a_pinned_commit():
    assert w.check_revision(REV, False) is None
    assert w.check_revision(REV, True) is None


@pytest.mark.parametrize("revision", ["main", "0123456", REV[:39], REV + "0", REV.upper(), None, ""])
def test_check_revision_refuses_anything_but_a_commit(revision):
    with pytest.raises(w.WeightsError) as caught:
        w.check_revision(revision, False)
    err = caught.value
    assert err.found == (repr(revision) if revision else "no revision")
    assert "40-hex commit" in err.expected
    assert "model_weights_allow_branch" in err.fix
    assert "checkpoint.revision" in err.fix
    assert str(err) == f"found {err.found}; expected {err.expected}; fix: {err.fix}"


def test_check_revision_refuses_a_commit_with_a_trailing_newline():
    # `$` also matches before a final newline: "<40 hex>\n" is not a 40-hex commit hash.
    with pytest.raises(w.WeightsError):
        w.check_revision(REV + "\n", False)


def test_check_revision_accepts_a_branch_when_allowed():
    assert w.check_revision("main", True) is None
    assert w.check_revision("v1.0", True) is None
    with pytest.raises(w.WeightsError, match="no revision"):
        w.check_revision(None, True)  # allowing a branch still needs some revision


# ----------------------------------------------------------------------------------------------- select

PATHS = ["model-00002.safetensors", "config.json", "model-00001.safetensors", "README.md", "sub/extra.json",
         "original/consolidated.pth"]


def test_select_without_patterns_returns_everything_sorted():
    assert w.select(PATHS, None, None) == sorted(PATHS)
    assert w.select(PATHS, [], []) == sorted(PATHS)


def test_select_allow_patterns():
    assert w.select(PATHS, ["*.safetensors", "config.json"], None) == [
        "config.json", "model-00001.safetensors", "model-00002.safetensors"]
    # fnmatch's * crosses directory separators, as huggingface_hub's filtering does
    assert w.select(PATHS, ["*.json"], None) == ["config.json", "sub/extra.json"]
    assert w.select(PATHS, ["*.bin"], None) == []


def test_select_ignore_patterns_win_over_allow():
    assert w.select(PATHS, None, ["original/*", "*.md"]) == [
        "config.json", "model-00001.safetensors", "model-00002.safetensors", "sub/extra.json"]
    assert w.select(PATHS, ["*.json"], ["sub/*"]) == ["config.json"]


# ------------------------------------------------------------------------------------------- SHA256SUMS

HA = "a" * 64
HB = "0123456789abcdef" * 4


def test_parse_sha256sums_text_and_binary_mode():
    text = f"{HA}  model.safetensors\n{HB} *tokenizer.json\n"
    assert w.parse_sha256sums(text) == {"model.safetensors": HA, "tokenizer.json": HB}


def test_parse_sha256sums_normalises_paths_and_hex():
    text = f"# made by sha256sum\n\n{HB.upper()}  ./sub/dir/file.bin\n   \n{HA} *./config.json\r\n"
    assert w.parse_sha256sums(text) == {"sub/dir/file.bin": HB, "config.json": HA}


def test_parse_sha256sums_keeps_spaces_inside_paths():
    assert w.parse_sha256sums(f"{HA}  a file with spaces.txt\n") == {"a file with spaces.txt": HA}


@pytest.mark.parametrize("bad", [
    f"{HA} model.bin",  # one space, no mode character
    f"{HA[:63]}  model.bin",  # 63 hex digits
    f"{'g' * 64}  model.bin",  # not hex
    f"{HA}  ",  # no path
    "model.bin  " + HA,  # swapped
])
def test_parse_sha256sums_malformed_line_names_its_number(bad):
    text = f"# header\n{HA}  ok.bin\n\n{bad}\n"
    with pytest.raises(w.WeightsError) as caught:
        w.parse_sha256sums(text)
    assert caught.value.found.startswith("line 4 of SHA256SUMS: ")
    assert repr(bad[:80]) in caught.value.found
    assert "sha256sum" in caught.value.fix


# ------------------------------------------------------------------------------------------ local manifest

FILES = {
    "config.json": b'{"model_type": "llama"}\n',
    "model.safetensors": b"\x00\x01weights" * 100,
    "sub/dir/file.bin": b"nested",
}


def test_local_manifest_takes_sizes_from_the_files(tmp_path):
    make_checkpoint(tmp_path, FILES)
    entries = w.local_manifest(str(tmp_path))
    assert entries == [w.Entry(path, len(data), sha256=sha256(data)) for path, data in sorted(FILES.items())]
    assert all(e.git_sha1 is None for e in entries)


def test_local_manifest_size_is_the_file_size_not_a_listed_value(tmp_path):
    make_checkpoint(tmp_path, FILES)
    (tmp_path / "config.json").write_bytes(b"longer than before, same listed checksum")
    entries = {e.path: e for e in w.local_manifest(str(tmp_path))}
    assert entries["config.json"].size == len(b"longer than before, same listed checksum")
    assert entries["config.json"].sha256 == sha256(FILES["config.json"])


def test_local_manifest_without_sha256sums(tmp_path):
    (tmp_path / "config.json").write_bytes(b"{}")
    with pytest.raises(w.WeightsError) as caught:
        w.local_manifest(str(tmp_path))
    assert caught.value.found == f"no SHA256SUMS in {tmp_path}"
    assert "sha256sum" in caught.value.fix
    assert "> SHA256SUMS" in caught.value.fix


def test_local_manifest_listed_file_missing(tmp_path):
    make_checkpoint(tmp_path, FILES)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(w.WeightsError) as caught:
        w.local_manifest(str(tmp_path))
    assert caught.value.found == f"model.safetensors listed in SHA256SUMS but missing from {tmp_path}"


def test_local_manifest_applies_patterns(tmp_path):
    make_checkpoint(tmp_path, FILES)
    (tmp_path / "model.safetensors").unlink()  # ignored, so its absence does not matter
    entries = w.local_manifest(str(tmp_path), allow=["*.json", "*.safetensors", "sub/*"], ignore=["*.safetensors"])
    assert [e.path for e in entries] == ["config.json", "sub/dir/file.bin"]
    assert [e.path for e in w.local_manifest(str(tmp_path), allow=["sub/*"])] == ["sub/dir/file.bin"]


def test_local_manifest_no_matching_file(tmp_path):
    make_checkpoint(tmp_path, FILES)
    with pytest.raises(w.WeightsError) as caught:
        w.local_manifest(str(tmp_path), allow=["*.gguf"])
    assert caught.value.found == f"no file of {tmp_path} matches the patterns"
    assert "model_weights_allow_patterns" in caught.value.fix


def test_local_manifest_malformed_sha256sums_propagates(tmp_path):
    make_checkpoint(tmp_path, FILES, sums_text=f"{HA}  config.json\nnot a checksum line\n")
    with pytest.raises(w.WeightsError, match="line 2 of SHA256SUMS"):
        w.local_manifest(str(tmp_path))


def test_local_revision_is_the_sha1_of_sha256sums_and_follows_it(tmp_path):
    make_checkpoint(tmp_path, FILES)
    first = w.local_revision(str(tmp_path))
    assert first == hashlib.sha1((tmp_path / "SHA256SUMS").read_bytes()).hexdigest()
    assert w.COMMIT.match(first)
    assert w.local_revision(str(tmp_path)) == first
    w.check_revision(first, False)  # usable as a pinned revision
    with open(tmp_path / "SHA256SUMS", "a") as handle:
        handle.write(f"{HA}  extra.bin\n")
    assert w.local_revision(str(tmp_path)) != first


# ---------------------------------------------------------------------------------------------- manifest hash

ENTRIES = [w.Entry("b.bin", 10, sha256=HA), w.Entry("a.json", 3, git_sha1="1" * 40), w.Entry("c", 0)]


def test_manifest_hash_ignores_entry_order():
    digest = w.manifest_hash(ENTRIES)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert w.manifest_hash(list(reversed(ENTRIES))) == digest
    assert w.manifest_hash(iter(ENTRIES[1:] + ENTRIES[:1])) == digest


@pytest.mark.parametrize("changed", [
    w.Entry("b.bin", 11, sha256=HA),  # size
    w.Entry("b.bin", 10, sha256=HB),  # checksum
    w.Entry("b.bin", 10, git_sha1=HA[:40]),  # kind of checksum
    w.Entry("B.bin", 10, sha256=HA),  # path
])
def test_manifest_hash_changes_with_any_field(changed):
    assert w.manifest_hash([changed, *ENTRIES[1:]]) != w.manifest_hash(ENTRIES)


def test_manifest_hash_changes_when_a_file_is_dropped():
    assert w.manifest_hash(ENTRIES[:2]) != w.manifest_hash(ENTRIES)


def test_total_bytes_and_entries_from_dicts():
    assert w.total_bytes(ENTRIES) == 13
    items = [{"path": "x", "size": "5", "sha256": HA}, {"path": "y", "size": 2, "git_sha1": "2" * 40}]
    assert w.entries_from_dicts(items) == [w.Entry("x", 5, sha256=HA), w.Entry("y", 2, git_sha1="2" * 40)]
    assert w.Entry("x", 1, sha256=HA, git_sha1="3" * 40).etag == HA
    assert w.Entry("y", 1, git_sha1="3" * 40).etag == "3" * 40
    assert w.Entry("z", 1).etag == ""


# ------------------------------------------------------------------------------------------- cache layout

def test_place_blob_names_the_blob_by_sha256_and_links_it_relatively(tmp_path):
    cache, source = tmp_path / "cache", tmp_path / "src"
    place(cache, FILES, source)
    repo = cache / "models--org--name"
    for path, data in FILES.items():
        blob = repo / "blobs" / sha256(data)
        assert blob.read_bytes() == data
        link = repo / "snapshots" / REV / path
        assert link.is_symlink()
        target = os.readlink(link)
        assert not os.path.isabs(target)
        assert os.path.realpath(link) == os.path.realpath(blob)
        assert link.read_bytes() == data
    nested = repo / "snapshots" / REV / "sub/dir/file.bin"
    assert os.readlink(nested) == f"../../../../blobs/{sha256(FILES['sub/dir/file.bin'])}"
    assert os.readlink(repo / "snapshots" / REV / "config.json") == f"../../blobs/{sha256(FILES['config.json'])}"
    assert sorted(os.listdir(repo / "blobs")) == sorted(sha256(d) for d in FILES.values())


def test_snapshot_survives_moving_the_cache(tmp_path):
    cache, source = tmp_path / "cache", tmp_path / "src"
    place(cache, {"config.json": b"{}"}, source)
    shutil.move(str(cache), str(tmp_path / "moved"))
    assert (tmp_path / "moved/models--org--name/snapshots" / REV / "config.json").read_bytes() == b"{}"


def test_place_blob_refuses_a_damaged_source_and_leaves_nothing(tmp_path):
    cache = tmp_path / "cache"
    source = tmp_path / "model.bin"
    source.write_bytes(b"damaged bytes")
    entry = w.Entry("model.bin", 13, sha256=sha256(b"original bytes"))
    with pytest.raises(w.WeightsError) as caught:
        w.place_blob(str(cache), REPO, REV, entry, str(source))
    assert caught.value.found == f"sha256 {sha256(b'damaged bytes')} for model.bin in the source {source}"
    assert entry.sha256 in caught.value.expected
    blobs = cache / "models--org--name" / "blobs"
    assert os.listdir(blobs) == []  # neither the blob nor its .incomplete
    assert not os.path.lexists(cache / "models--org--name" / "snapshots" / REV / "model.bin")


def test_place_blob_again_is_harmless(tmp_path):
    cache, source = tmp_path / "cache", tmp_path / "src"
    place(cache, FILES, source)
    place(cache, FILES, source)
    link = cache / "models--org--name" / "snapshots" / REV / "config.json"
    assert link.read_bytes() == FILES["config.json"]


def test_link_snapshot_replaces_a_wrong_link_or_file(tmp_path):
    cache = tmp_path / "cache"
    entry = w.Entry("config.json", 2, sha256=sha256(b"{}"))
    link = cache / "models--org--name" / "snapshots" / REV / "config.json"
    link.parent.mkdir(parents=True)
    link.write_bytes(b"a plain file")
    w.link_snapshot(str(cache), REPO, REV, entry)
    assert os.readlink(link) == f"../../blobs/{entry.sha256}"
    os.unlink(link)
    os.symlink("../../blobs/elsewhere", link)
    w.link_snapshot(str(cache), REPO, REV, entry)
    assert os.readlink(link) == f"../../blobs/{entry.sha256}"


def test_repo_and_snapshot_dirs():
    assert w.repo_dir("/c", "org/name") == "/c/models--org--name"
    assert w.snapshot_dir("/c", "org/name", REV) == f"/c/models--org--name/snapshots/{REV}"


# ------------------------------------------------------------------------------------------- verification

def test_verify_entry_sha256(tmp_path):
    data = b"some weights"
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    entry = w.Entry("f.bin", len(data), sha256=sha256(data))
    assert w.verify_entry(str(path), entry) is None
    assert w.verify_entry(str(tmp_path / "gone.bin"), entry) == "f.bin: missing"
    assert w.verify_entry(str(tmp_path), entry) == "f.bin: missing"  # a directory is not the file
    path.write_bytes(data + b"!")
    assert w.verify_entry(str(path), entry) == f"f.bin: {len(data) + 1} bytes, expected {len(data)}"
    other = b"SOME WEIGHTS"
    path.write_bytes(other)
    assert w.verify_entry(str(path), entry) == f"f.bin: sha256 {sha256(other)}, expected {sha256(data)}"


def test_verify_entry_reports_progress_in_bytes(tmp_path):
    data = b"x" * 1000
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    counted = []
    assert w.verify_entry(str(path), w.Entry("f.bin", 1000, sha256=sha256(data)), counted.append) is None
    assert sum(counted) == 1000


def test_verify_entry_size_only_without_checksum(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    assert w.verify_entry(str(path), w.Entry("f.bin", 3)) is None
    assert w.verify_entry(str(path), w.Entry("f.bin", 4)) == "f.bin: 3 bytes, expected 4"


def test_git_sha1_is_the_git_blob_id(tmp_path):
    data = b'{"architectures": ["LlamaForCausalLM"]}\n'
    path = tmp_path / "config.json"
    path.write_bytes(data)
    assert w.file_digest(str(path), "git_sha1") == git_blob_id(data)
    assert w.file_digest(str(path), "sha256") == sha256(data)
    entry = w.Entry("config.json", len(data), git_sha1=git_blob_id(data))
    assert w.verify_entry(str(path), entry) is None
    wrong = w.Entry("config.json", len(data), git_sha1="f" * 40)
    assert w.verify_entry(str(path), wrong) == f"config.json: git_sha1 {git_blob_id(data)}, expected {'f' * 40}"


def test_git_sha1_of_the_empty_file_is_gits():
    # The well-known id of the empty blob, independent of any git binary.
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


@pytest.mark.parametrize("data", [b"", b"hello\n", bytes(range(256)) * 3])
def test_git_sha1_matches_git_hash_object(tmp_path, data):
    path = tmp_path / "blob"
    path.write_bytes(data)
    out = subprocess.run(["git", "hash-object", "--no-filters", str(path)], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert w.file_digest(str(path), "git_sha1") == out
    assert w.verify_entry(str(path), w.Entry("blob", len(data), git_sha1=out)) is None


# ------------------------------------------------------------------------------------------------ marker

def make_verified(tmp_path, files=None):
    cache = tmp_path / "cache"
    entries = place(cache, files or FILES, tmp_path / "src")
    marker = w.write_marker(str(cache), REPO, REV, entries, "local")
    return cache, entries, marker


def test_write_marker_then_read_it(tmp_path):
    cache, entries, marker = make_verified(tmp_path)
    path = cache / "models--org--name" / w.MARKER
    on_disk = json.loads(path.read_text())
    assert on_disk == marker == w.read_marker(str(cache), REPO)
    assert marker["repo_id"] == REPO and marker["revision"] == REV and marker["source"] == "local"
    assert marker["manifest_sha256"] == w.manifest_hash(entries)
    assert marker["total_bytes"] == sum(len(d) for d in FILES.values())
    assert [f["path"] for f in marker["files"]] == sorted(FILES)
    first = dict(marker["files"][0])
    recorded = first.pop("stat")
    assert first == {"path": "config.json", "size": len(FILES["config.json"]),
                     "sha256": sha256(FILES["config.json"]), "git_sha1": None}
    blob = os.stat(cache / "models--org--name" / "snapshots" / REV / "config.json")  # the blob behind the link
    assert recorded == {"size": blob.st_size, "mtime_ns": blob.st_mtime_ns, "ctime_ns": blob.st_ctime_ns,
                        "inode": blob.st_ino, "device": blob.st_dev}
    assert marker["verified_at"].endswith("Z")
    assert not [n for n in os.listdir(path.parent) if n.endswith(".tmp")]


def test_read_marker_absent_or_unreadable(tmp_path):
    assert w.read_marker(str(tmp_path), REPO) is None
    repo = tmp_path / "models--org--name"
    repo.mkdir()
    (repo / w.MARKER).write_text("{not json")
    assert w.read_marker(str(tmp_path), REPO) is None
    assert w.marker_valid(str(tmp_path), REPO, REV) is False


def test_marker_valid_after_writing(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    assert w.marker_valid(str(cache), REPO, REV) is True
    assert w.marker_valid(str(cache), REPO, REV, w.manifest_hash(entries)) is True


def test_marker_invalid_for_another_revision(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    assert w.marker_valid(str(cache), REPO, "f" * 40, w.manifest_hash(entries)) is False
    assert w.marker_valid(str(cache), "org/other", REV) is False


def test_marker_invalid_for_another_manifest(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    changed = [*entries[:-1], w.Entry(entries[-1].path, entries[-1].size, sha256=HA)]
    assert w.marker_valid(str(cache), REPO, REV, w.manifest_hash(changed)) is False


def test_marker_invalid_when_a_file_is_removed(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    os.unlink(cache / "models--org--name" / "snapshots" / REV / "sub/dir/file.bin")
    assert w.marker_valid(str(cache), REPO, REV, w.manifest_hash(entries)) is False


def test_marker_invalid_when_a_blob_is_removed(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    os.unlink(cache / "models--org--name" / "blobs" / sha256(FILES["config.json"]))  # dangling link
    assert w.marker_valid(str(cache), REPO, REV, w.manifest_hash(entries)) is False


def test_marker_invalid_when_a_file_changes_size(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    blob = cache / "models--org--name" / "blobs" / sha256(FILES["model.safetensors"])
    with open(blob, "r+b") as handle:
        handle.truncate(10)
    assert w.marker_valid(str(cache), REPO, REV, w.manifest_hash(entries)) is False


def overwrite_in_place(path, offset, data):
    """As dd conv=notrunc does: the same file, the same size, other bytes in the middle."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def test_an_in_place_change_of_the_same_size_voids_the_marker(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    blob = cache / "models--org--name" / "blobs" / sha256(FILES["model.safetensors"])
    time.sleep(0.01)  # a coarse clock would give the write the verification's own timestamp
    overwrite_in_place(blob, 2, b"\xff\xff")
    assert w.marker_valid(str(cache), REPO, REV, w.manifest_hash(entries)) is False
    drift = w.marker_drift(str(cache), REPO, REV, w.manifest_hash(entries))
    assert len(drift) == 1 and drift[0].startswith("model.safetensors: ") and "mtime_ns" in drift[0], drift


def test_putting_the_mtime_back_does_not_hide_a_change(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    blob = cache / "models--org--name" / "blobs" / sha256(FILES["model.safetensors"])
    before = os.stat(blob)
    time.sleep(0.01)
    overwrite_in_place(blob, 0, b"\x00")
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))  # touch -r, as someone covering it up would
    drift = w.marker_drift(str(cache), REPO, REV, w.manifest_hash(entries))
    assert drift and "ctime_ns" in drift[0] and "mtime_ns" not in drift[0], drift


def test_a_file_replaced_by_another_of_the_same_size_voids_the_marker(tmp_path):
    cache, _entries, _marker = make_verified(tmp_path)
    blob = cache / "models--org--name" / "blobs" / sha256(FILES["model.safetensors"])
    other = blob.with_name("replacement")
    other.write_bytes(blob.read_bytes())
    os.replace(other, blob)
    assert "inode" in w.marker_drift(str(cache), REPO, REV)[0]


def test_a_marker_that_recorded_sizes_only_proves_nothing_more(tmp_path):
    # A marker from before the stat record: the files are hashed once more, then it is rewritten.
    cache, entries, marker = make_verified(tmp_path)
    for item in marker["files"]:
        del item["stat"]
    (cache / "models--org--name" / w.MARKER).write_text(json.dumps(marker))
    assert w.marker_valid(str(cache), REPO, REV, w.manifest_hash(entries)) is False


def test_marker_valid_does_not_open_the_weights(tmp_path, monkeypatch):
    cache, entries, _marker = make_verified(tmp_path)
    opened = []
    real_open = open

    def spying_open(file, *args, **kwargs):
        opened.append(os.path.basename(str(file)))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", spying_open)
    assert w.marker_valid(str(cache), REPO, REV, w.manifest_hash(entries)) is True
    assert opened == [w.MARKER]


# ---------------------------------------------------------------------------------------------- refs, removal

def test_write_ref(tmp_path):
    assert w.write_ref(str(tmp_path), REPO, REV) is True
    ref = tmp_path / "models--org--name" / "refs" / "main"
    assert ref.read_text() == REV
    assert w.write_ref(str(tmp_path), REPO, REV) is False
    other = "f" * 40
    assert w.write_ref(str(tmp_path), REPO, other) is True
    assert ref.read_text() == other
    assert w.write_ref(str(tmp_path), REPO, other, ref="v1") is True
    assert (ref.parent / "v1").read_text() == other
    ref.write_text(other + "\n")  # as written by hand or by another tool
    assert w.write_ref(str(tmp_path), REPO, other) is False


def test_remove_file_removes_link_and_blob_only(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    repo = cache / "models--org--name"
    victim = next(e for e in entries if e.path == "sub/dir/file.bin")
    w.remove_file(str(cache), REPO, REV, victim)
    assert not os.path.lexists(repo / "snapshots" / REV / "sub/dir/file.bin")
    assert not (repo / "blobs" / victim.sha256).exists()
    for entry in entries:
        if entry is not victim:
            assert (repo / "snapshots" / REV / entry.path).read_bytes() == FILES[entry.path]
            assert (repo / "blobs" / entry.sha256).is_file()
    assert (repo / w.MARKER).is_file()
    w.remove_file(str(cache), REPO, REV, victim)  # already gone: no error


def test_remove_file_removes_a_plain_file_in_the_snapshot(tmp_path):
    snapshot = tmp_path / "models--org--name" / "snapshots" / REV
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_bytes(b"{}")
    (snapshot / "keep.json").write_bytes(b"{}")
    w.remove_file(str(tmp_path), REPO, REV, w.Entry("config.json", 2))
    assert sorted(os.listdir(snapshot)) == ["keep.json"]


# ------------------------------------------------------------------------------------------------- space

def test_missing_bytes(tmp_path):
    cache, entries, _marker = make_verified(tmp_path)
    assert w.missing_bytes(str(cache), REPO, REV, entries) == 0
    extra = w.Entry("absent.bin", 1234, sha256=HA)
    assert w.missing_bytes(str(cache), REPO, REV, [*entries, extra]) == 1234
    resized = w.Entry("config.json", 999, sha256=HA)  # present but of another size: all of it is missing
    assert w.missing_bytes(str(cache), REPO, REV, [resized, extra]) == 999 + 1234
    assert w.missing_bytes(str(cache), REPO, "f" * 40, entries) == sum(len(d) for d in FILES.values())


def test_free_bytes_walks_up_to_an_existing_parent(tmp_path):
    deep = tmp_path / "not" / "yet" / "there"
    free = w.free_bytes(str(deep))
    assert isinstance(free, int) and free > 0
    assert not deep.exists()
    stats = os.statvfs(tmp_path)
    # same filesystem, measured a moment apart
    assert abs(free - stats.f_bavail * stats.f_frsize) < 512 * 1024 * 1024


# ---------------------------------------------------------------------------------------------- progress

class FakeClock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_progress_writes_at_most_every_half_second(tmp_path):
    clock = FakeClock(1000.0)
    path = tmp_path / "progress.json"
    progress = w.Progress(str(path), 4000, "copy", clock=clock)

    clock.now = 1001.0
    progress.advance(1000, "a.bin")
    assert json.loads(path.read_text()) == {"phase": "copy", "done_bytes": 1000, "total_bytes": 4000,
                                            "bytes_per_second": 1000.0, "file": "a.bin"}
    clock.now = 1001.3
    progress.advance(500, "b.bin")  # 0.3 s after the last write: not written
    assert json.loads(path.read_text())["done_bytes"] == 1000
    clock.now = 1001.49
    progress.advance(100, "b.bin")
    assert json.loads(path.read_text())["done_bytes"] == 1000
    clock.now = 1001.5
    progress.advance(400, "c.bin")  # 0.5 s since the last write
    assert json.loads(path.read_text()) == {"phase": "copy", "done_bytes": 2000, "total_bytes": 4000,
                                            "bytes_per_second": round(2000 / 1.5, 1), "file": "c.bin"}
    clock.now = 1004.0
    progress.write()
    assert json.loads(path.read_text()) == {"phase": "copy", "done_bytes": 2000, "total_bytes": 4000,
                                            "bytes_per_second": 500.0, "file": ""}
    assert progress.rate() == 500.0
    assert sorted(os.listdir(tmp_path)) == ["progress.json"]


def test_progress_rate_zero_before_any_time_passes(tmp_path):
    clock = FakeClock(50.0)
    progress = w.Progress(str(tmp_path / "p.json"), 10, "verify", clock=clock)
    progress.advance(10)
    assert progress.rate() == 0.0
    assert json.loads((tmp_path / "p.json").read_text())["bytes_per_second"] == 0.0


def test_progress_without_a_file_still_counts(tmp_path):
    clock = FakeClock(10.0)
    progress = w.Progress(None, 100, "download", clock=clock)
    clock.now = 12.0
    progress.advance(60, "x")
    progress.write()
    assert progress.done == 60 and progress.rate() == 30.0
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(("count", "text"), [
    (0, "0 B"),
    (1, "1 B"),
    (1023, "1023 B"),
    (1024, "1.0 KiB"),
    (1536, "1.5 KiB"),
    (5 * 1024 * 1024, "5.0 MiB"),
    (int(1.5 * 1024 ** 3), "1.5 GiB"),
    (2 * 1024 ** 4, "2.0 TiB"),
    (3 * 1024 ** 5, "3072.0 TiB"),
    (512.7, "512 B"),
])
def test_human_bytes(count, text):
    assert w.human_bytes(count) == text


def _populated_cache(root, files):
    """A hub cache as huggingface_hub leaves it: blobs named by checksum, snapshot links to them."""
    entries = []
    for path, data in files.items():
        source = root / "src" / path
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_bytes(data)
        if path.endswith(".safetensors"):
            entry = w.Entry(path, len(data), sha256=hashlib.sha256(data).hexdigest())
        else:
            entry = w.Entry(path, len(data), git_sha1=hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        w.place_blob(str(root / "hub"), "org/m", COMMIT_A, entry, str(source))
        entries.append(entry)
    return entries


COMMIT_A = "a" * 40


def test_cache_manifest_reads_checksums_from_blob_names(tmp_path):
    entries = _populated_cache(tmp_path, {"model.safetensors": b"\x01" * 4096, "sub/config.json": b'{"a": 1}'})
    found = w.cache_manifest(str(tmp_path / "hub"), "org/m", COMMIT_A)
    assert sorted(found, key=lambda e: e.path) == sorted(entries, key=lambda e: e.path)
    assert [e.path for e in w.cache_manifest(str(tmp_path / "hub"), "org/m", COMMIT_A, ignore=["*.json"])] == [
        "model.safetensors"]
    for entry in found:  # every file verifies against the checksum its blob name carries
        snapshot = w.snapshot_dir(str(tmp_path / "hub"), "org/m", COMMIT_A)
        assert w.verify_entry(os.path.join(snapshot, entry.path), entry) is None


def test_cache_manifest_refuses_a_missing_snapshot_and_foreign_links(tmp_path):
    with pytest.raises(w.WeightsError, match="no snapshot"):
        w.cache_manifest(str(tmp_path / "hub"), "org/m", COMMIT_A)
    snapshot = tmp_path / "hub" / "models--org--m" / "snapshots" / COMMIT_A
    snapshot.mkdir(parents=True)
    (tmp_path / "elsewhere.bin").write_bytes(b"x")
    (snapshot / "weights.bin").symlink_to(tmp_path / "elsewhere.bin")
    with pytest.raises(w.WeightsError) as caught:
        w.cache_manifest(str(tmp_path / "hub"), "org/m", COMMIT_A)
    assert "pointing at 'elsewhere.bin'" in caught.value.found


def test_place_blob_verifies_git_blob_ids_too(tmp_path):
    (tmp_path / "config.json").write_bytes(b"{}")
    good = w.Entry("config.json", 2, git_sha1=hashlib.sha1(b"blob 2\0{}").hexdigest())
    w.place_blob(str(tmp_path / "hub"), "org/m", COMMIT_A, good, str(tmp_path / "config.json"))
    bad = w.Entry("config.json", 2, git_sha1="0" * 40)
    with pytest.raises(w.WeightsError, match="git_sha1"):
        w.place_blob(str(tmp_path / "hub2"), "org/m", COMMIT_A, bad, str(tmp_path / "config.json"))
