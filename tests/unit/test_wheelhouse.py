"""Wheelhouses for nodes of this controller's platform and of another (an x86 controller, arm64 Sparks)."""

import json
import platform
import sys

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils import wheelhouse


def test_a_dgx_os_node_gets_binary_wheels_for_its_python_machine_and_glibc():
    args = wheelhouse.Target("3.12", "aarch64", "2.39").pip_args()
    assert args[:3] == ["--only-binary=:all:", "--python-version", "3.12"]
    platforms = [args[i + 1] for i, arg in enumerate(args) if arg == "--platform"]
    assert platforms[0] == "manylinux_2_39_aarch64" and "manylinux_2_17_aarch64" in platforms
    assert "manylinux_2_40_aarch64" not in platforms  # newer than the node's glibc would not load
    assert {"manylinux2014_aarch64", "manylinux2010_aarch64", "manylinux1_aarch64"} <= set(platforms)
    assert platforms[-1] == "linux_aarch64"


def test_this_machine_is_recognised_and_needs_no_target_options():
    here = wheelhouse.Target(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine(),
                             platform.libc_ver()[1])
    assert here.is_here()
    assert wheelhouse.platform_tag() == wheelhouse.platform_tag(here)
    assert not wheelhouse.Target("3.12", "aarch64", "2.39").is_here() or platform.machine() == "aarch64"


def test_the_marker_key_tells_platforms_apart():
    arm = wheelhouse.Target("3.12", "aarch64", "2.39")
    assert wheelhouse.requirements_key(["a==1"]) != wheelhouse.requirements_key(["a==1"], arm)
    assert wheelhouse.requirements_key(["b==2", "a==1"]) == wheelhouse.requirements_key(["a==1", "b==2"])
    assert wheelhouse.platform_tag(arm) == "cp312-aarch64"


def test_a_wheelhouse_is_complete_only_for_what_its_marker_names(tmp_path):
    (tmp_path / wheelhouse.MARKER).write_text(json.dumps({"key": wheelhouse.requirements_key(["a==1"])}))
    assert wheelhouse.is_complete(str(tmp_path), ["a==1"])
    assert not wheelhouse.is_complete(str(tmp_path), ["a==2"])
    assert not wheelhouse.is_complete(str(tmp_path / "missing"), ["a==1"])


def test_a_glibc_that_is_not_2_x_is_refused():
    with pytest.raises(wheelhouse.WheelhouseError, match=r"found glibc 3\.0 on the nodes"):
        wheelhouse.Target("3.12", "aarch64", "3.0").pip_args()
