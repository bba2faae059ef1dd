"""The lab playbook in check mode reports no drift on a lab it made; site.yml's stage tags select its plays.
(These run on the second lab, converged through the preflight and fabric stages only, so that the serving lab's
long chain of drills runs alone. The lab playbook's second run, with zero changes, after a whole site, is
test_serve's lab -> site -> lab -> site.)"""

import os
import subprocess
from pathlib import Path

from conftest import ROOT, lab_hosts, on_node, output, run_playbook, task_names


def test_check_mode_reports_no_drift(weights_lab, tmp_path):
    check = run_playbook(tmp_path / "check", os.path.join(ROOT, "playbooks/lab.yml"),
                         extravars=weights_lab["extravars"], cmdline="--check")
    assert check.status == "successful", output(check)[-4000:]
    assert check.stats["changed"] == {}


def test_inventory_reaches_nodes_over_ssh_as_admin(weights_lab):
    text = Path(weights_lab["inventory"]).read_text()
    assert "ansible_user: spark" in text
    assert "ansible_ssh_private_key_file:" in text
    assert "StrictHostKeyChecking=yes" in text
    mode = os.stat(os.path.join(weights_lab["extravars"]["lab_state_dir"], "id_ed25519")).st_mode & 0o777
    assert mode == 0o600


def test_stage_tags_select_plays(weights_lab, tmp_path):
    site = os.path.join(ROOT, "site.yml")
    runner = run_playbook(tmp_path, site, inventory=weights_lab["inventory"], cmdline="--tags preflight --check")
    assert runner.status == "successful", output(runner)[-4000:]
    assert runner.stats["changed"] == {}
    assert "Validate the inventory on the controller" in task_names(runner)
    # A tag of no stage runs no stage; the preflight still validates and plans (as before every stage run alone).
    skipped = run_playbook(tmp_path / "none", site, inventory=weights_lab["inventory"],
                           cmdline="--tags no-such-stage")
    assert skipped.status == "successful"
    ran = {(e["event_data"]["play"], e["event_data"]["task"]) for e in skipped.events
           if e["event"] == "playbook_on_task_start"
           and not e["event_data"]["task"].startswith("Validating arguments against arg spec")}
    assert {play for play, _task in ran} == {"Preflight"}, ran
    assert ("Preflight", "Validate the inventory on the controller") in ran


def test_the_nodes_keep_the_code_compiled_from_ansibles_zips(weights_lab):
    """The lab's zipimport cache (roles/lab/files/sparkfleet_lab_zipcache.py) is in use on every node: the module
    runs of the lab's converges left root-only compiled code of the zips' sources behind. (Each rank's CPU of its
    own, the lab's other lab-only setting, is test_serve's: it shows in the boot log.)"""
    for node in sorted(lab_hosts(weights_lab)):
        listing = on_node(weights_lab, node, "sh", "-c", "stat -c '%a %U' /var/cache/sparkfleet-lab-zipcache;"
                          " ls /var/cache/sparkfleet-lab-zipcache | wc -l").stdout.split()
        assert listing[:2] == ["700", "root"] and int(listing[2]) > 20, (node, listing)


def test_check_mode_on_a_lab_that_does_not_exist_creates_nothing(weights_lab, tmp_path):
    """A preview of a new lab (networks and containers it would create): it succeeds and creates nothing."""
    name = weights_lab["extravars"]["lab_name"] + "-preview"
    check = run_playbook(tmp_path / "check", os.path.join(ROOT, "playbooks/lab.yml"), cmdline="--check",
                         extravars={"lab_name": name, "lab_nodes": 3, "lab_fabric_topology": "triangle",
                                    "lab_inventory_dir": str(tmp_path / "inventory"),
                                    "lab_state_dir": str(tmp_path / "state")})
    assert check.status == "successful", output(check)[-4000:]
    assert check.stats["changed"].get("localhost", 0) > 0  # it says what it would do
    made = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
                          check=True).stdout.split()
    made += subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert not [n for n in made if n.startswith(name)]
    assert not (tmp_path / "inventory").exists() and not (tmp_path / "state").exists()
