"""The image for real: docker build of files/image FROM the stand-in base, then the vllm_image role between two
Docker engines of this machine (build on one, pull into the other, current/previous, rollback)."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, docker, image_id, labels
from runner import output, run_playbook
from sparkfleet_vllm import seams

REPOSITORY = "sparkfleet-test/vllm"
FILES = os.path.join(ROOT, "files")


def fingerprint(base_digest, require_torch=0, version="0.33.0"):
    """The fingerprint of the checkout's context on this base (the stand-in has no torch: REQUIRE_TORCH=0)."""
    return subprocess.run([sys.executable, os.path.join(FILES, "image", "install.py"), "--print-fingerprint",
                           "--base-digest", base_digest, "--vllm-version", version,
                           "--require-torch", str(require_torch)],
                          capture_output=True, text=True, check=True).stdout.strip()


def build(base, tag, fp, *extra):
    return docker("build", "--force-rm", "--file", os.path.join(FILES, "image", "Dockerfile"),
                  "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"BASE_DIGEST={base}",
                  "--build-arg", f"FINGERPRINT={fp}", *extra, "--tag", tag, FILES, check=False)


def derived_base(base, tag, *run):
    """A base built FROM the stand-in with extra steps (a drifted vLLM, or just another image ID)."""
    steps = "".join(f"RUN {step}\n" for step in run) or "LABEL io.sparkfleet.test=another-base\n"
    docker("build", "--tag", tag, "-", input_text=f"FROM {base}\n{steps}")
    return image_id(tag)


@pytest.fixture(scope="module")
def built(standin_base):
    fp = fingerprint(standin_base)
    tag = f"{REPOSITORY}:{fp[:12]}"
    # --no-cache: the test reads what the install step prints, and a layer cached by an earlier build of the same
    # context (another stage's, or a previous run's on this engine) would print nothing (CI found that).
    result = build(standin_base, tag, fp, "--build-arg", "REQUIRE_TORCH=0", "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    yield {"tag": tag, "fingerprint": fp, "log": result.stdout, "base": standin_base}


@pytest.fixture(scope="module", autouse=True)
def remove_test_images():
    yield
    tags = docker("images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout.split()
    leftovers = [t for t in tags if t.startswith(("sparkfleet-test/", "sparkfleet-standin/drifted"))]
    if leftovers:
        docker("rmi", "--force", *leftovers, check=False)


def run_in(tag, *argv):
    return docker("run", "--rm", "--entrypoint", "python3", tag, *argv, check=False)


def test_the_image_is_labelled_and_every_seam_is_in_place(built):
    assert labels(built["tag"]) == {"io.sparkfleet.vllm-version": "0.33.0",
                                    "io.sparkfleet.base-digest": built["base"],
                                    "io.sparkfleet.fingerprint": built["fingerprint"]}
    check = run_in(built["tag"], "-m", "sparkfleet_vllm", "check")
    assert check.returncode == 0, check.stderr
    assert "every seam in place (version, kv_dtype, spec_bytes, sm120_admit, read, write" in check.stdout
    assert "tp_pad_linear, tp_pad_moe, tp_pad_vocab)" in check.stdout
    files = {edit.path for seam in seams.SEAMS for edit in seam.edits if edit.action != "check"}
    assert f"{len(seams.SEAMS)} seams applied; {len(files)} files written" in built["log"]
    # vLLM finds the plugin through its entry-point group, as importlib.metadata reports it.
    eps = run_in(built["tag"], "-c", "import importlib.metadata as m; "
                 "print([(e.name, e.value) for e in m.entry_points(group='vllm.general_plugins')])")
    assert "('sparkfleet', 'sparkfleet_vllm:register')" in eps.stdout, eps.stderr
    # The stand-in has no torch: said in the build log, never silently.
    assert "no torch in this base and REQUIRE_TORCH=0" in built["log"]
    stamp = run_in(built["tag"], "-c", "import sparkfleet_vllm, os; "
                   "print(open(os.path.join(os.path.dirname(sparkfleet_vllm.__file__), 'IMAGE')).read())")
    assert f"fingerprint={built['fingerprint']}" in stamp.stdout


def test_a_rebuild_of_the_same_context_is_the_same_image(built):
    before = image_id(built["tag"])
    again = build(built["base"], built["tag"], built["fingerprint"], "--build-arg", "REQUIRE_TORCH=0")
    assert again.returncode == 0
    assert image_id(built["tag"]) == before
    assert fingerprint(built["base"], require_torch=1) != built["fingerprint"]  # the arguments are part of it


def test_a_label_that_does_not_match_the_content_is_refused(built):
    result = build(built["base"], f"{REPOSITORY}:liar", "0" * 64, "--build-arg", "REQUIRE_TORCH=0")
    assert result.returncode != 0
    assert f"found fingerprint {built['fingerprint']} for this context; the build was labelled {'0' * 64}" in (
        result.stdout + result.stderr)


def test_a_base_without_torch_fails_the_import_checks_unless_told(built):
    result = build(built["base"], f"{REPOSITORY}:notorch", fingerprint(built["base"], require_torch=1))
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "No module named 'torch'" in text and "the import checks failed" in text


@pytest.mark.parametrize("drift,seam,found", [
    (r"sed -i 's/if init_snapshot.free_memory < requested_memory:/if requested_memory > init_snapshot.free_memory:/'"
     r" /usr/local/lib/python3*/dist-packages/vllm/v1/worker/utils.py", "uma_free_memory", "vLLM 0.33.0"),
    ("sed -i s/0.33.0/0.33.1/ /usr/local/lib/python3*/dist-packages/vllm/_version.py", "version", "vLLM 0.33.1"),
], ids=["drifted-anchor", "bumped-pin"])
def test_a_drifted_base_fails_closed_naming_the_seam(built, drift, seam, found):
    base = derived_base(built["base"], f"sparkfleet-standin/drifted:{seam}", drift)
    fp = fingerprint(base)
    result = build(base, f"{REPOSITORY}:drifted", fp, "--build-arg", "REQUIRE_TORCH=0")
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"sparkfleet seam '{seam}'" in text and found in text, text[-3000:]
    assert "applying the seams failed" in text
    assert image_id(f"{REPOSITORY}:drifted") == ""


# --------------------------------------------------------------------------------------------- the role


@pytest.fixture(scope="module")
def engines(standin_base, second_engine, tmp_path_factory):
    """An inventory of two 'nodes': this machine's engine (the build node) and the second engine (a peer)."""
    base = tmp_path_factory.mktemp("engines")
    common = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False,
              "vllm_image_hosts": ["engine-a", "engine-b"], "vllm_image_transport": "local",
              "vllm_image_repository": REPOSITORY, "vllm_image_selftest": False,
              # The stand-in carries no torch (see the Dockerfile's REQUIRE_TORCH).
              "vllm_image_build_args": {"REQUIRE_TORCH": "0"}}
    hosts = {"engine-a": {"vllm_image_state_dir": str(base / "a")},
             "engine-b": {"vllm_image_state_dir": str(base / "b"), "vllm_image_docker_host": second_engine}}
    inventory = base / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "sparkfleet_cluster": {"hosts": hosts, "vars": common},
        "sparkfleet_head": {"hosts": {"engine-a": {}}}}}}))
    return {"inventory": str(inventory), "base": base, "peer": second_engine, "standin": standin_base}


def stage(engines, name, cmdline=None, **extravars):
    extravars.setdefault("vllm_image_base", engines["standin"])
    return run_playbook(engines["base"] / name, os.path.join(ROOT, "playbooks/image.yml"),
                        inventory=engines["inventory"], extravars=extravars, cmdline=cmdline)


def changed(result):
    return sum(result.stats.get("changed", {}).values())


def current(engines):
    return {node: labels(f"{REPOSITORY}:current", host=host).get("io.sparkfleet.fingerprint")
            for node, host in (("engine-a", None), ("engine-b", engines["peer"]))}


def test_a_base_without_a_digest_is_refused_before_any_node_changes(engines):
    result = stage(engines, "nodigest", vllm_image_base="debian:bookworm")
    text = " ".join(output(result).split())
    assert result.status == "failed"
    assert "vllm_image: found base debian:bookworm" in text and "expected a base pinned by digest" in text
    assert changed(result) == 0
    assert image_id(f"{REPOSITORY}:current") == "" and image_id(f"{REPOSITORY}:current", engines["peer"]) == ""


def test_build_once_pull_into_the_peer_and_make_current(engines):
    fp = fingerprint(engines["standin"])
    dry = stage(engines, "check-fresh", cmdline="--check")
    assert dry.status == "successful", output(dry)[-5000:]
    assert changed(dry) > 0  # what a real run would do
    for host in (None, engines["peer"]):
        assert image_id(f"{REPOSITORY}:current", host) == ""
    assert image_id(f"{REPOSITORY}:{fp[:12]}", engines["peer"]) == ""

    result = stage(engines, "first")
    text = " ".join(output(result).split())  # the YAML callback folds long messages
    assert result.status == "successful", output(result)[-5000:]
    assert current(engines) == {"engine-a": fp, "engine-b": fp}
    # The peer pulled the compressed stream from the build node and checked the label; its progress file (what
    # the progress lines show while a transfer runs) ends with every byte counted.
    assert f"engine-b: {REPOSITORY}:{fp[:12]} loaded from engine-a:" in text
    progress = json.loads((engines["base"] / "b" / "pull.json").read_text())
    assert progress["phase"] == "loaded" and progress["done_bytes"] > 50e6
    assert not (engines["base"] / "a" / "pull.json").exists()
    assert f"{REPOSITORY}:{fp[:12]} is current on engine-a, engine-b (fingerprint {fp})" in text
    assert image_id(f"{REPOSITORY}:current") == image_id(f"{REPOSITORY}:{fp[:12]}")
    assert image_id(f"{REPOSITORY}:previous") == ""

    again = stage(engines, "second")
    assert again.status == "successful" and changed(again) == 0, output(again)[-3000:]
    # Nothing to roll back to yet: refused, nothing changed.
    refused = stage(engines, "no-previous", vllm_image_rollback=True)
    assert refused.status == "failed" and changed(refused) == 0
    assert f"found {REPOSITORY}:previous" in " ".join(output(refused).split())
    assert current(engines) == {"engine-a": fp, "engine-b": fp}
    checked = stage(engines, "check", cmdline="--check")
    assert checked.status == "successful" and changed(checked) == 0, output(checked)[-3000:]


def test_a_new_build_keeps_the_old_one_as_previous_and_rolls_back(engines):
    first = fingerprint(engines["standin"])
    other = derived_base(engines["standin"], f"{REPOSITORY}-base:other")
    second = fingerprint(other)
    result = stage(engines, "newbase", vllm_image_base=other)
    assert result.status == "successful", output(result)[-5000:]
    assert current(engines) == {"engine-a": second, "engine-b": second}
    for host in (None, engines["peer"]):
        assert labels(f"{REPOSITORY}:previous", host=host)["io.sparkfleet.fingerprint"] == first

    rolled = stage(engines, "rollback", vllm_image_base=other, vllm_image_rollback=True)
    assert rolled.status == "successful", output(rolled)[-5000:]
    assert current(engines) == {"engine-a": first, "engine-b": first}
    assert changed(rolled) == 2
    again = stage(engines, "rollback-again", vllm_image_base=other, vllm_image_rollback=True)
    assert again.status == "successful" and changed(again) == 0, output(again)[-3000:]
    # Forward again: the wanted build becomes current, the rolled-back-to image previous.
    forward = stage(engines, "forward", vllm_image_base=other)
    assert forward.status == "successful", output(forward)[-3000:]
    assert current(engines) == {"engine-a": second, "engine-b": second}


UPGRADE_IMAGE = os.path.join(ROOT, "tests/image/playbooks/upgrade_image.yml")


def test_an_upgrade_keeps_the_image_a_rank_runs_through_a_new_build_and_gives_it_back(engines):
    """upgrade.yml's image half on a real engine (a GB10 rank runs in Docker; the lab's CPU ranks run natively):
    the image the rank's container runs is kept by its ID as :rollback; the image stage then builds, ships and
    makes a new image current, and its clean-up leaves the kept one; the rollback gives the kept image back the
    name the container was created with, so the kept configuration starts the image it served with."""
    running = image_id(f"{REPOSITORY}:current")
    kept_file = engines["base"] / "kept-image.json"
    docker("rm", "--force", "sparkfleet-vllm", check=False)  # an earlier, interrupted run's
    docker("create", "--name", "sparkfleet-vllm", f"{REPOSITORY}:current", "true")
    try:
        keep = run_playbook(engines["base"] / "keep-image", UPGRADE_IMAGE, inventory=engines["inventory"],
                            extravars={"step": "keep", "kept_file": str(kept_file),
                                       "vllm_service_image": f"{REPOSITORY}:current"})
        assert keep.status == "successful", output(keep)[-4000:]
        assert json.loads(kept_file.read_text()) == {"name": f"{REPOSITORY}:current", "id": running}
        assert image_id(f"{REPOSITORY}:rollback") == running

        newer = derived_base(engines["standin"], f"{REPOSITORY}-base:newer", "echo newer > /etc/sparkfleet-newer")
        upgraded = stage(engines, "upgrade-image", vllm_image_base=newer)
        assert upgraded.status == "successful", output(upgraded)[-5000:]
        assert current(engines) == {"engine-a": fingerprint(newer), "engine-b": fingerprint(newer)}
        assert image_id(f"{REPOSITORY}:rollback") == running  # the new state's clean-up kept it

        restore = run_playbook(engines["base"] / "restore-image", UPGRADE_IMAGE, inventory=engines["inventory"],
                               extravars={"step": "restore", "kept_file": str(kept_file),
                                          "vllm_service_image": f"{REPOSITORY}:current"})
        assert restore.status == "successful", output(restore)[-4000:]
        assert image_id(f"{REPOSITORY}:current") == running
        again = run_playbook(engines["base"] / "restore-again", UPGRADE_IMAGE, inventory=engines["inventory"],
                             extravars={"step": "restore", "kept_file": str(kept_file),
                                        "vllm_service_image": f"{REPOSITORY}:current"})
        assert again.status == "successful" and changed(again) == 0, output(again)[-3000:]
    finally:
        docker("rm", "--force", "sparkfleet-vllm", check=False)
