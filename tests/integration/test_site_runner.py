"""site.yml on the lab, driven through ansible_runner.run() as a user's CI would."""

import os

from conftest import ROOT, output, run_playbook, task_names


def test_site_through_ansible_runner(lab, tmp_path):
    converge = run_playbook(tmp_path / "converge", os.path.join(ROOT, "site.yml"), inventory=lab["inventory"])
    assert converge.status == "successful", output(converge)[-4000:]
    runner = run_playbook(tmp_path / "again", os.path.join(ROOT, "site.yml"), inventory=lab["inventory"])
    text = output(runner)
    assert runner.status == "successful", text[-4000:]
    assert runner.rc == 0
    assert set(runner.stats["ok"]) == {"node0", "node1"}
    assert runner.stats["changed"] == {}  # converged: the second run changes nothing
    assert runner.stats["failures"] == {}
    assert runner.stats["dark"] == {}
    assert "Discover what each node has" in task_names(runner)
    assert "rank 0 head   node0" in text and "rank 1 worker node1" in text
    assert "GPU none | RDMA none | in a docker container" in text


def test_stage_tags_select_plays(lab, tmp_path):
    runner = run_playbook(tmp_path, os.path.join(ROOT, "site.yml"), inventory=lab["inventory"],
                          cmdline="--tags preflight --check")
    assert runner.status == "successful", output(runner)[-4000:]
    skipped = run_playbook(tmp_path / "none", os.path.join(ROOT, "site.yml"), inventory=lab["inventory"],
                           cmdline="--tags no-such-stage")
    assert skipped.status == "successful"
    assert "Validate the inventory on the controller" not in task_names(skipped)
