"""daemon.json merging (plugins/filter/docker.py): sparkfleet's keys in, every other key kept, stable."""

import pytest

from ansible_collections.sparkfleet.cluster.plugins.filter.docker import docker_daemon_config


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
