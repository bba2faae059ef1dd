"""Every public role variable is documented in its argument spec, and named after its role."""

import os

import pytest
import yaml

from ansible_collections.sparkfleet.cluster.plugins.action.cluster_validate import ROLES_DIR, load_role_specs

ROLES = sorted(os.listdir(ROLES_DIR))


def defaults(role):
    path = os.path.join(ROLES_DIR, role, "defaults", "main.yml")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle) or {}


@pytest.mark.parametrize("role", ROLES)
def test_defaults_match_the_entry_points(role):
    spec = load_role_specs()[role]
    # every entry point's options together (node_memory's gate, settle and reclaim have their own); preflight's
    # cluster and node specs document inventory keys, not role defaults, and have no tasks file of their own
    entries = [entry for name, entry in spec.items()
               if os.path.isfile(os.path.join(ROLES_DIR, role, "tasks", f"{name}.yml"))]
    options = {}
    for entry in entries:
        options.update(entry.get("options") or {})
    # a required option (an entry point's parameter, e.g. the fabric's pull_trust) is the caller's, never a default
    assert sorted(defaults(role)) == sorted(name for name, option in options.items() if not option.get("required"))
    for name, option in options.items():
        assert name.startswith(f"{role}_"), name
        assert option.get("description"), name
        if name in defaults(role) and "{{" not in str(defaults(role)[name]):
            assert option.get("default") == defaults(role)[name], name


@pytest.mark.parametrize("role", ROLES)
def test_every_role_has_a_readme(role):
    assert os.path.isfile(os.path.join(ROLES_DIR, role, "README.md"))


def test_inventory_keys_carry_the_collection_prefix():
    spec = load_role_specs()["preflight"]
    for entry in ("cluster", "node"):
        for name in spec[entry]["options"]:
            assert name.startswith("sparkfleet_"), name
