"""teardown.yml removes what sparkfleet installs: every sparkfleet path a role names lies where teardown looks.

The teardown role finds what to remove by sparkfleet's names (roles/teardown/vars/main.yml), not by a list of
one version's files; this test is the contract between the two. A role that starts writing a sparkfleet path
outside those places fails it here, naming the path, until teardown covers it (or the path is added below as
kept on purpose, with the reason).
"""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# The roles that install on a node (the lab's role makes the stand-ins for hardware; triage and teardown only read
# and remove).
INSTALLING = ("container_runtime", "fabric", "gpu", "model_weights", "monitoring", "nccl", "node_memory", "python_venv",
              "verify", "vllm_image", "vllm_service", "preflight")
PATH = re.compile(r"/(?:etc|usr|opt|var|run|root|srv|home)/[^\s\"'`{}(),;:]*sparkfleet[^\s\"'`{}(),;:]*")
# Kept on purpose (docs/day2.md), or not a path on the node.
KEPT = {
    "/var/log/sparkfleet": "the logs stay for a triage",
    "/usr/local/bin/sparkfleet-nccl-probe": "a path inside the NCCL probe's container (a bind mount), not the node's",
}


def teardown_places():
    variables = yaml.safe_load((ROOT / "roles/teardown/vars/main.yml").read_text())
    # an entry "{{ __teardown_x }}" is that variable's path
    places = [variables[entry.strip("{} ")] if entry.startswith("{{") else entry
              for entry in variables["__teardown_owned"]]
    places.append(variables["__teardown_state_dir"])
    places.append(variables["__teardown_unit_dir"] + "/sparkfleet-")  # every sparkfleet-* unit and its drop-ins
    # the defaults teardown reads through its variables (node_memory's sysctl file and textfile, the netplan file)
    for name in ("__teardown_sysctl_file", "__teardown_netplan_file", "__teardown_textfile_dir"):
        found = re.search(r"default\('([^']+)'\)", variables[name])
        assert found, f"{name} names no default path: {variables[name]}"
        places.append(found.group(1).rsplit("/", 1)[0] + "/sparkfleet_" if name == "__teardown_textfile_dir"
                      else found.group(1))
    return places


def named_paths():
    found = {}
    for role in INSTALLING:
        for path in sorted((ROOT / "roles" / role).rglob("*")):
            if path.is_file() and path.suffix in (".yml", ".j2", ".yaml", ""):
                for match in PATH.findall(path.read_text(errors="replace")):
                    found.setdefault(match.rstrip("."), f"{path.relative_to(ROOT)}")
    return found


def covered(path, places):
    """A place ending in / - or _ is a prefix of names; any other is a file or a directory and all below it."""
    return any(path == place or path.startswith(place if place.endswith(("/", "-", "_")) else place + "/")
               for place in places)


def test_every_sparkfleet_path_a_role_names_is_one_teardown_removes_or_keeps_on_purpose():
    places = teardown_places()
    found = named_paths()
    assert len(found) > 30  # the scan sees the roles' paths (a broken pattern would pass on nothing)
    uncovered = {path: where for path, where in found.items()
                 if not covered(path, places) and not covered(path, KEPT)}
    assert uncovered == {}, "teardown.yml would leave these behind: " + ", ".join(
        f"{path} ({where})" for path, where in sorted(uncovered.items()))


def test_the_contract_tells_a_path_teardown_does_not_know():
    places = teardown_places()
    assert not covered("/srv/sparkfleet-cache", places)
    assert not covered("/etc/sparkfleetx/a", places)
    assert covered("/etc/systemd/system/sparkfleet-vllm.service.d/override.conf", places)
    assert covered("/var/lib/prometheus/node-exporter/sparkfleet_verify.prom", places)
