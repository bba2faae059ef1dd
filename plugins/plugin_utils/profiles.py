# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Model profiles: the data that describes what a cluster serves.

A profile is a YAML file `<name>.yml` in one of the profile directories (the user's first, then the
collection's own `profiles/`). The planner, the service and the boot verification all read the same
profile, so what is planned and what is verified cannot drift apart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import SparkfleetError
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import trace

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.-]*$")

# key -> (python types, description of what is expected)
REQUIRED_KEYS: Mapping[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "the profile's name, equal to its file name"),
    "description": ((str,), "one line on what this profile serves"),
    "tensor_parallel_sizes": ((list,), "the node counts this profile runs on, e.g. [2]"),
    "served_model_name": ((str,), "the model name clients ask for"),
    "max_model_len": ((int,), "the longest context in tokens"),
    "checkpoint": ((dict,), "where the weights come from (repo_id + revision, or a local path)"),
}


class ProfileError(SparkfleetError):
    """A profile that cannot be found or read: what was found, what was expected, what to do."""


def collection_profile_dir() -> str:
    """The `profiles/` directory of this collection, wherever it is installed."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "profiles"))


def available(search_dirs: Iterable[str]) -> list[str]:
    names = set()
    for directory in search_dirs:
        if os.path.isdir(directory):
            names.update(f[:-4] for f in os.listdir(directory) if f.endswith(".yml"))
    return sorted(names)


def load(name: str, search_dirs: Iterable[str]) -> dict[str, Any]:
    """The named profile from the first directory that has it, checked for the keys every profile needs."""
    dirs = list(search_dirs)
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ProfileError(repr(name), "a profile name such as tiny-cpu",
                           f"choose one of {', '.join(available(dirs))}")
    for directory in dirs:
        path = os.path.join(directory, f"{name}.yml")
        if os.path.isfile(path):
            trace.event("profile", name)
            with open(path, encoding="utf-8") as handle:
                try:
                    profile = yaml.safe_load(handle)
                except yaml.YAMLError as err:
                    raise ProfileError(f"YAML that does not parse in {path} ({err})".replace("\n", " "),
                                       "a YAML mapping", "correct the file") from err
            problems = check(profile, name)
            if problems:
                raise ProfileError(f"{', '.join(problems)} in {path}",
                                   f"every one of {', '.join(REQUIRED_KEYS)}, well-formed", "correct the profile")
            return profile
    raise ProfileError(f"no file {name}.yml in {', '.join(dirs)}",
                       f"one of {', '.join(available(dirs)) or 'the shipped profiles'}",
                       "correct sparkfleet_model_profile, or add your profile's directory to sparkfleet_profile_paths")


def check(profile: Any, name: str) -> list[str]:
    """What is wrong with a loaded profile, as short phrases (empty when it is sound)."""
    if not isinstance(profile, dict):
        return [f"a {type(profile).__name__} instead of a mapping"]
    problems = []
    for key, (types, meaning) in REQUIRED_KEYS.items():
        if key not in profile:
            problems.append(f"no {key} ({meaning})")
        elif not isinstance(profile[key], types) or isinstance(profile[key], bool):
            problems.append(f"{key}={profile[key]!r} ({meaning})")
    if profile.get("name") not in (None, name):
        problems.append(f"name={profile['name']!r} in file {name}.yml")
    sizes = profile.get("tensor_parallel_sizes")
    if isinstance(sizes, list) and not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        problems.append(f"tensor_parallel_sizes={sizes!r} (positive integers)")
    return problems
