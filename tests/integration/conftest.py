"""A lab of its own for the integration tests, created once per session and removed at the end."""

import os
import re
import shutil

import ansible_runner
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAB_NAME = "sparkfleet-it"


def run_playbook(tmp_dir, playbook, inventory=None, extravars=None, cmdline=None, cwd=None, envvars=None):
    """Run a playbook the way a user's CI would, through ansible-runner; returns the runner object."""
    os.makedirs(tmp_dir, exist_ok=True)
    env = {"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "false"}
    env.update(envvars or {})
    kwargs = dict(private_data_dir=str(tmp_dir), playbook=playbook, envvars=env, quiet=True,
                  extravars=extravars or {}, cmdline=cmdline, project_dir=cwd or ROOT)
    if inventory:
        kwargs["inventory"] = inventory
    return ansible_runner.run(**kwargs)


def task_names(runner):
    return [e["event_data"]["task"] for e in runner.events if e["event"] == "playbook_on_task_start"]


def output(runner):
    """What ansible-playbook printed, without terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", runner.stdout.read())


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """The lab's inventory file; the lab is created with 2 nodes and removed after the session."""
    base = tmp_path_factory.mktemp("lab")
    extravars = {"lab_name": LAB_NAME, "lab_inventory_dir": str(base / "inventory"),
                 "lab_state_dir": str(base / "state")}
    created = run_playbook(base / "create", os.path.join(ROOT, "playbooks/lab.yml"), extravars=extravars)
    if created.status != "successful":
        pytest.fail("creating the lab failed:\n" + output(created)[-4000:])
    yield {"inventory": str(base / "inventory" / "hosts.yml"), "extravars": extravars, "base": base}
    removed = run_playbook(base / "destroy", os.path.join(ROOT, "playbooks/lab.yml"),
                           extravars=dict(extravars, lab_state="absent"))
    assert removed.status == "successful", output(removed)[-4000:]


@pytest.fixture
def lab_inventory_copy(lab, tmp_path):
    """A private copy of the lab inventory a test may break."""
    target = tmp_path / "inventory"
    target.mkdir()
    shutil.copy(lab["inventory"], target / "hosts.yml")
    return target
