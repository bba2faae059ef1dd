"""Model profiles: every shipped one is sound; a bad name or file says what to do."""

import os

import pytest

from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import profiles

SHIPPED = profiles.available([profiles.collection_profile_dir()])


def test_the_documented_profiles_ship():
    assert {"tiny-cpu", "glm-5.3-flash-nvfp4-tp2", "glm-5.3-flash-nvfp4-tp3", "glm-5.3-flash-fp8-tp4"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_loads(name):
    profile = profiles.load(name, [profiles.collection_profile_dir()])
    assert profile["name"] == name
    assert profiles.check(profile, name) == []


def test_user_directory_wins(tmp_path):
    (tmp_path / "tiny-cpu.yml").write_text(
        "name: tiny-cpu\ndescription: mine\ntensor_parallel_sizes: [2]\nserved_model_name: t\n"
        "max_model_len: 64\ncheckpoint: {source: local}\n")
    profile = profiles.load("tiny-cpu", [str(tmp_path), profiles.collection_profile_dir()])
    assert profile["description"] == "mine"


def test_missing_profile(tmp_path):
    with pytest.raises(profiles.ProfileError) as caught:
        profiles.load("nope", [str(tmp_path)])
    assert caught.value.found == f"no file nope.yml in {tmp_path}"
    assert "sparkfleet_profile_paths" in caught.value.fix


@pytest.mark.parametrize("name", ["../etc/passwd", "", "Upper", None])
def test_bad_names_are_refused(name):
    with pytest.raises(profiles.ProfileError):
        profiles.load(name, [profiles.collection_profile_dir()])


def test_incomplete_profile_names_each_missing_key(tmp_path):
    (tmp_path / "half.yml").write_text("name: half\ntensor_parallel_sizes: [two]\nmax_model_len: true\n")
    with pytest.raises(profiles.ProfileError) as caught:
        profiles.load("half", [str(tmp_path)])
    found = caught.value.found
    for phrase in ("no description", "no served_model_name", "no checkpoint", "max_model_len=True",
                   "tensor_parallel_sizes=['two']"):
        assert phrase in found
    assert found.endswith(os.path.join(str(tmp_path), "half.yml"))


def test_unparseable_profile(tmp_path):
    (tmp_path / "broken.yml").write_text("name: [unclosed\n")
    with pytest.raises(profiles.ProfileError) as caught:
        profiles.load("broken", [str(tmp_path)])
    assert "does not parse" in caught.value.found and "\n" not in str(caught.value)
