"""The weights stage on a lab of its own (the second 2-node lab), against a local stand-in for the Hub that the real
huggingface_hub talks to.

The fake Hub listens on that lab's management bridge address (a host this test run created), so the head
node's download code runs unchanged: file listing with LFS sha256, resolve with ETags, ranges, errors.
"""

import ipaddress
import json
import os
import secrets
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, lab_hosts, on_node, output, run_playbook, task_names, tiny_model_generator
from fakehub.server import FakeHub

COMMIT = "3f1d2c4b5a69788796a5b4c3d2e1f00112233445"
REPO = "test-org/tiny"
BIG = "extra/big.bin"  # 12 MiB: large enough for the client to resume with a Range request
PLAYBOOK = os.path.join(ROOT, "playbooks/weights.yml")


@pytest.fixture(scope="module")
def hub(weights_lab, tmp_path_factory):
    base = tmp_path_factory.mktemp("hub")
    snapshot = base / "repos" / REPO / COMMIT
    tiny_model_generator().generate(str(snapshot))
    (snapshot / "SHA256SUMS").unlink()  # the Hub's own metadata is the manifest here
    (snapshot / "extra").mkdir()
    (snapshot / BIG).write_bytes(os.urandom(12 * 1024 * 1024))
    (base / "repos" / REPO / "refs.json").write_text(json.dumps({"main": COMMIT}))
    # this machine's end of the weights_lab's management network: its first address
    gateway = str(ipaddress.ip_network(lab_hosts(weights_lab)["node0"]["ansible_host"] + "/24", strict=False)[1])
    profiles = base / "profiles"
    profiles.mkdir()
    (profiles / "hub-tiny.yml").write_text(yaml.safe_dump({
        "name": "hub-tiny", "description": "the tiny model on the fake Hub", "tensor_parallel_sizes": [2, 3, 4],
        "served_model_name": "tiny", "max_model_len": 512,
        "checkpoint": {"source": "huggingface", "repo_id": REPO, "revision": COMMIT}}))
    with FakeHub(str(base / "repos"), host=gateway) as server:
        server.profiles = str(profiles)
        yield server


def weights(weights_lab, hub, tmp_path, case, cmdline=None, **extra):
    extravars = {"sparkfleet_model_profile": "hub-tiny", "sparkfleet_profile_paths": [hub.profiles],
                 "model_weights_endpoint": hub.url, "model_weights_token": "", "model_weights_upload_dir": "",
                 "model_weights_cache_dir": f"/var/lib/sparkfleet-it/{case}/hub"}
    extravars.update(extra)
    return run_playbook(tmp_path / f"run-{time.monotonic_ns()}", PLAYBOOK, inventory=weights_lab["inventory"],
                        extravars=extravars, cmdline=cmdline)


def marker(weights_lab, node, case):
    result = on_node(weights_lab, node, "cat", f"/var/lib/sparkfleet-it/{case}/hub/models--test-org--tiny/"
                     ".sparkfleet-verified.json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def test_fetch_once_fan_out_verify_then_rerun_without_network(weights_lab, hub, tmp_path):
    hub.reset_log()
    first = weights(weights_lab, hub, tmp_path, "fresh")
    text = output(first)
    assert first.status == "successful", text[-4000:]
    assert "node0: test-org/tiny@3f1d2c4b5a69 verified (7 files" in text
    assert "node1: pulled 18.8 MiB from node0 over ssh (" in text
    downloads = {r.path for r in hub.file_requests("GET")}
    assert len(downloads) == 7  # every file fetched from the Hub exactly once, by the head alone
    for node in ("node0", "node1"):
        recorded = marker(weights_lab, node, "fresh")
        assert recorded["revision"] == COMMIT and len(recorded["files"]) == 7
    # vLLM's offline view: refs/main names the pinned commit and the snapshot resolves to verified bytes
    ref = on_node(weights_lab, "node1", "cat", "/var/lib/sparkfleet-it/fresh/hub/models--test-org--tiny/refs/main")
    assert ref.stdout.strip() == COMMIT
    config = on_node(weights_lab, "node1", "cat",
                     f"/var/lib/sparkfleet-it/fresh/hub/models--test-org--tiny/snapshots/{COMMIT}/config.json")
    assert json.loads(config.stdout)["architectures"] == ["LlamaForCausalLM"]

    hub.reset_log()
    again = weights(weights_lab, hub, tmp_path, "fresh")
    assert again.status == "successful", output(again)[-4000:]
    assert again.stats["changed"] == {}
    assert hub.requests == []  # the marker answered: no network I/O at all


def test_branch_name_is_refused_before_any_download(weights_lab, hub, tmp_path):
    hub.reset_log()
    profile = Path(hub.profiles) / "hub-branch.yml"
    data = yaml.safe_load((Path(hub.profiles) / "hub-tiny.yml").read_text())
    data.update(name="hub-branch", checkpoint=dict(data["checkpoint"], revision="main"))
    profile.write_text(yaml.safe_dump(data))
    refused = weights(weights_lab, hub, tmp_path, "branch", sparkfleet_model_profile="hub-branch")
    text = output(refused)
    assert refused.status == "failed"
    assert "found 'main'; expected a pinned 40-hex commit hash" in text
    assert "fix: set checkpoint.revision in the profile to the commit you verified" in text
    assert hub.file_requests() == []
    allowed = weights(weights_lab, hub, tmp_path, "branch", sparkfleet_model_profile="hub-branch",
                      model_weights_allow_branch=True)
    assert allowed.status == "successful", output(allowed)[-4000:]
    assert marker(weights_lab, "node1", "branch")["revision"] == COMMIT  # the branch resolved once, on the head


def test_corrupted_download_is_detected_and_fetched_again(weights_lab, hub, tmp_path):
    hub.reset_log()
    hub.corrupt_once(REPO, "model.safetensors")
    result = weights(weights_lab, hub, tmp_path, "corrupt")
    text = output(result)
    assert result.status == "successful", text[-4000:]
    assert "re-fetched after a checksum mismatch: model.safetensors" in text
    assert [r.path for r in hub.file_requests("GET")].count(f"/{REPO}/resolve/{COMMIT}/model.safetensors") == 2
    assert marker(weights_lab, "node1", "corrupt") is not None


def test_interrupted_download_resumes_with_a_range_request(weights_lab, hub, tmp_path):
    hub.reset_log()
    hub.interrupt_once(REPO, BIG, 11 * 1024 * 1024)
    result = weights(weights_lab, hub, tmp_path, "resume")
    assert result.status == "successful", output(result)[-4000:]
    ranges = [r.range for r in hub.file_requests("GET") if r.path.endswith(BIG)]
    assert ranges[0] is None and ranges[1] == "bytes=10485760-"  # the client kept 10 MiB and asked for the rest


def test_disk_too_small_is_refused_on_every_node_before_anything_moves(weights_lab, hub, tmp_path):
    hub.reset_log()
    refused = weights(weights_lab, hub, tmp_path, "disk", model_weights_disk_margin_bytes=2**60)
    text = output(refused)
    assert refused.status == "failed"
    for node in ("node0", "node1"):
        assert f"{node}: model_weights_cache_dir: found " in text
    assert "fix: free disk space on node0, or set model_weights_cache_dir to a larger filesystem" in text
    assert hub.file_requests("GET") == []
    assert "Start the download in the background" not in task_names(refused)
    assert on_node(weights_lab, "node0", "test", "-e", "/var/lib/sparkfleet-it/disk/hub/models--test-org--tiny/blobs",
                   check=False).returncode != 0


def test_gated_repo_needs_the_token_and_the_token_never_shows(weights_lab, hub, tmp_path):
    token = "hf_" + secrets.token_hex(16)
    hub.gate(REPO, token)
    try:
        refused = weights(weights_lab, hub, tmp_path, "gated")
        assert refused.status == "failed"
        assert "test-org/tiny is gated and the request was refused (no token given)" in output(refused)
        allowed = weights(weights_lab, hub, tmp_path, "gated", model_weights_token=token)
        assert allowed.status == "successful", output(allowed)[-4000:]
    finally:
        hub.ungate(REPO)
    found = subprocess.run(["grep", "-rl", token, str(tmp_path)], capture_output=True, text=True,
                           check=False).stdout.split()
    # Only where the caller put it (ansible-runner's input files, mode 0600); not in any output or artifact.
    assert found and all("/env/" in path and os.stat(path).st_mode & 0o777 == 0o600 for path in found), found
    for node in ("node0", "node1"):
        on_node_hits = on_node(weights_lab, node, "grep", "-rl", token, "/root", "/home", "/tmp", "/etc", "/opt",
                               "/var/lib", check=False)
        assert on_node_hits.stdout == "", on_node_hits.stdout


def test_check_mode_reports_what_would_move_and_moves_nothing(weights_lab, hub, tmp_path):
    placed = weights(weights_lab, hub, tmp_path, "check")
    assert placed.status == "successful", output(placed)[-4000:]
    on_node(weights_lab, "node1", "rm", "-rf", "/var/lib/sparkfleet-it/check/hub/models--test-org--tiny")
    checked = weights(weights_lab, hub, tmp_path, "check", cmdline="--check")
    text = output(checked)
    assert checked.status == "successful", text[-4000:]
    assert "node0: test-org/tiny@3f1d2c4b5a69 verified, nothing to move" in text
    assert "node1: test-org/tiny@3f1d2c4b5a69 would receive" in text
    assert set(checked.stats["changed"]) == {"node1"}
    assert marker(weights_lab, "node1", "check") is None


def test_rsync_daemon_transport_serves_the_fabric_and_stops(weights_lab, hub, tmp_path):
    result = weights(weights_lab, hub, tmp_path, "rsyncd", model_weights_transport="rsyncd")
    assert result.status == "successful", output(result)[-4000:]
    assert "node1: pulled 18.8 MiB from node0 over rsyncd (" in output(result)
    assert marker(weights_lab, "node1", "rsyncd")["revision"] == COMMIT
    state = on_node(weights_lab, "node0", "systemctl", "is-active", "sparkfleet-weights-rsyncd.service", check=False)
    assert state.stdout.strip() == "inactive"


def test_peer_going_away_mid_transfer_fails_that_peer_and_loses_nothing(weights_lab, hub, tmp_path):
    address = lab_hosts(weights_lab)["node1"]["sparkfleet_fabric_address"]
    # the port that holds the fabric address (enp1s0f1np1 in the weights_lab): pulling its cable = its link going down
    port = on_node(weights_lab, "node1", "ip", "-o", "-4", "addr", "show", "to", f"{address}/32").stdout.split()[1]
    partial = "/var/lib/sparkfleet-it/away/hub/models--test-org--tiny"
    cut = {}

    def cut_the_fabric_during_the_pull():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = on_node(weights_lab, "node1", "cat", "/run/sparkfleet-weights.progress", check=False).stdout
            if '"phase": "pull"' in progress and '"done_bytes": 0,' not in progress:
                on_node(weights_lab, "node1", "ip", "link", "set", port, "down")
                cut["at"] = progress
                return
            time.sleep(0.3)

    on_node(weights_lab, "node1", "rm", "-f", "/run/sparkfleet-weights.progress", check=False)
    watcher = threading.Thread(target=cut_the_fabric_during_the_pull)
    watcher.start()
    try:
        failed = weights(weights_lab, hub, tmp_path, "away", model_weights_bwlimit_kib=2048)
    finally:
        watcher.join()
        on_node(weights_lab, "node1", "ip", "link", "set", port, "up", check=False)
    text = output(failed)
    assert cut, "the pull never started"
    assert failed.status == "failed"
    assert set(failed.stats["failures"]) == {"node1"}
    assert "check the peer is up and reachable on its fabric address" in text
    assert marker(weights_lab, "node0", "away")["revision"] == COMMIT  # the head's verified copy is untouched
    assert marker(weights_lab, "node1", "away") is None
    kept = on_node(weights_lab, "node1", "du", "-sb", partial).stdout.split()[0]
    assert int(kept) > 0  # what arrived before the cut is kept to continue from

    resumed = weights(weights_lab, hub, tmp_path, "away")
    assert resumed.status == "successful", output(resumed)[-4000:]
    assert marker(weights_lab, "node1", "away")["revision"] == COMMIT


def add_profile(hub, name, **checkpoint):
    data = yaml.safe_load((Path(hub.profiles) / "hub-tiny.yml").read_text())
    data.update(name=name, checkpoint=dict(data["checkpoint"], **checkpoint))
    (Path(hub.profiles) / f"{name}.yml").write_text(yaml.safe_dump(data))


def test_unknown_revision_is_named(weights_lab, hub, tmp_path):
    add_profile(hub, "hub-unknown", revision="0" * 40)
    refused = weights(weights_lab, hub, tmp_path, "unknown", sparkfleet_model_profile="hub-unknown")
    assert refused.status == "failed"
    assert f"found no revision {'0' * 40} in test-org/tiny; expected an existing commit" in output(refused)


def test_populated_cache_is_a_source_without_the_hub(weights_lab, hub, tmp_path):
    seeded = weights(weights_lab, hub, tmp_path, "seed")  # a cache on the head, as `hf download` would leave it
    assert seeded.status == "successful", output(seeded)[-4000:]
    add_profile(hub, "cache-tiny", source="cache", path="/var/lib/sparkfleet-it/seed/hub")
    hub.reset_log()
    result = weights(weights_lab, hub, tmp_path, "fromcache", sparkfleet_model_profile="cache-tiny")
    text = output(result)
    assert result.status == "successful", text[-4000:]
    assert hub.requests == []  # the blob names carry the checksums: no Hub needed
    assert "node0: test-org/tiny@3f1d2c4b5a69 verified (7 files" in text
    assert marker(weights_lab, "node1", "fromcache")["source"] == "peer"
    assert marker(weights_lab, "node0", "fromcache")["source"] == "cache"
