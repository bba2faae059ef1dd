"""The lab playbook converges once and then changes nothing, also in check mode."""

import os
from pathlib import Path

from conftest import ROOT, output, run_playbook


def test_second_run_changes_nothing(lab, tmp_path):
    again = run_playbook(tmp_path / "again", os.path.join(ROOT, "playbooks/lab.yml"), extravars=lab["extravars"])
    assert again.status == "successful", output(again)[-4000:]
    assert again.stats["changed"] == {}
    assert again.stats["ok"]["localhost"] > 20


def test_check_mode_reports_no_drift(lab, tmp_path):
    check = run_playbook(tmp_path / "check", os.path.join(ROOT, "playbooks/lab.yml"), extravars=lab["extravars"],
                         cmdline="--check")
    assert check.status == "successful", output(check)[-4000:]
    assert check.stats["changed"] == {}


def test_inventory_reaches_nodes_over_ssh_as_admin(lab):
    text = Path(lab["inventory"]).read_text()
    assert "ansible_user: spark" in text
    assert "ansible_ssh_private_key_file:" in text
    assert "StrictHostKeyChecking=yes" in text
    mode = os.stat(os.path.join(lab["extravars"]["lab_state_dir"], "id_ed25519")).st_mode & 0o777
    assert mode == 0o600
