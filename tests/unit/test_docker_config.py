"""daemon.json merging and image summaries (plugins/filter/docker.py): keys kept, stable, absent images empty."""

import pytest

from ansible_collections.sparkfleet.cluster.plugins.filter.docker import (
    docker_daemon_config,
    image_summary,
    stale_image_tags,
)


def test_an_empty_file_gets_log_limits_and_the_nvidia_runtime():
    assert docker_daemon_config({}, "100m", 3, True) == {
        "log-driver": "json-file",
        "log-opts": {"max-size": "100m", "max-file": "3"},
        "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}},
    }


def test_what_nvidia_ctk_and_the_admin_wrote_is_kept():
    # As `nvidia-ctk runtime configure --runtime=docker` leaves it on DGX OS, plus an admin's own key.
    existing = {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
                "default-runtime": "nvidia", "data-root": "/srv/docker", "log-opts": {"labels": "rank"}}
    merged = docker_daemon_config(existing, "50m", 5, True)
    assert merged["default-runtime"] == "nvidia" and merged["data-root"] == "/srv/docker"
    assert merged["log-opts"] == {"labels": "rank", "max-size": "50m", "max-file": "5"}
    assert existing["log-opts"] == {"labels": "rank"}  # the input is not modified


def test_a_second_merge_changes_nothing():
    once = docker_daemon_config({"debug": True}, "100m", 3, True)
    assert docker_daemon_config(once, "100m", 3, True) == once


def test_another_log_driver_is_respected():
    merged = docker_daemon_config({"log-driver": "journald"}, "100m", 3, False)
    assert merged == {"log-driver": "journald"}  # dockerd would refuse max-size/max-file for journald


def test_a_file_that_is_not_an_object_is_refused():
    with pytest.raises(ValueError, match=r"daemon\.json holds a list, expected a JSON object"):
        docker_daemon_config([], "100m", 3, False)


# --------------------------------------------------------------------------------------------- image_summary

IMAGE = {"Id": "sha256:" + "ab" * 32, "Size": 7340032, "RepoTags": ["sparkfleet/vllm:current"],
         "Config": {"Labels": {"io.sparkfleet.fingerprint": "f" * 64, "maintainer": "x"}}}


def test_an_image_is_summarised_by_id_size_and_fingerprint():
    assert image_summary([IMAGE]) == {"id": "sha256:" + "ab" * 32, "size": 7340032, "fingerprint": "f" * 64}


@pytest.mark.parametrize("images", [[], None], ids=["no-such-image", "engine-did-not-answer"])
def test_no_image_is_the_empty_summary(images):
    assert image_summary(images) == {"id": "", "size": 0, "fingerprint": ""}


def test_an_unlabelled_image_has_no_fingerprint_and_another_label_can_be_read():
    bare = {"Id": "sha256:1", "Size": 1, "Config": {"Labels": None}}
    assert image_summary([bare])["fingerprint"] == ""
    assert image_summary([IMAGE], "maintainer")["fingerprint"] == "x"


def test_several_images_for_one_name_are_refused():
    with pytest.raises(ValueError, match="the one image"):
        image_summary([IMAGE, IMAGE])


# --------------------------------------------------------------------------------------------- stale_image_tags

def test_only_images_without_a_kept_tag_lose_their_tags():
    repo = "sparkfleet/vllm"
    images = [
        {"Id": "1", "RepoTags": [f"{repo}:current", f"{repo}:aaaa"]},        # current: kept whole
        {"Id": "2", "RepoTags": [f"{repo}:previous"]},                        # previous: kept
        {"Id": "3", "RepoTags": [f"{repo}:bbbb", f"{repo}:old", "other/x:1"]},  # an old build: its repo tags go
        {"Id": "4", "RepoTags": [f"{repo}:cccc"]},                            # the new tag, not yet current
        {"Id": "5", "RepoTags": None},                                        # dangling: not ours to name
    ]
    keep = [f"{repo}:current", f"{repo}:previous", f"{repo}:cccc"]
    assert stale_image_tags(images, repo, keep) == [f"{repo}:bbbb", f"{repo}:old"]
    assert stale_image_tags(None, repo, keep) == []
    # A repository whose name prefixes another's is not confused with it.
    assert stale_image_tags([{"RepoTags": [f"{repo}-dev:1"]}], repo, keep) == []
