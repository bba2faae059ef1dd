"""Playbook runs for the tests that drive Ansible: through ansible-runner, as a user's CI would."""

import os
import re

import ansible_runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLAYBOOK_LIMIT = 2700


def run_playbook(tmp_dir, playbook, inventory=None, extravars=None, cmdline=None, cwd=None, envvars=None,
                 event_handler=None):
    """Run a playbook the way a user's CI would, through ansible-runner; returns the runner object.
    event_handler(event) is called with each of the play's events as it happens (ansible-runner's own hook)."""
    os.makedirs(tmp_dir, exist_ok=True)
    env = {"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "false"}
    env.update(envvars or {})
    # Only a hung run meets the timeout (a converge takes minutes): then the run fails instead of the session.
    kwargs = dict(private_data_dir=str(tmp_dir), playbook=playbook, envvars=env, quiet=True,
                  extravars=extravars or {}, cmdline=cmdline, project_dir=cwd or ROOT, timeout=PLAYBOOK_LIMIT)
    if inventory:
        kwargs["inventory"] = inventory
    if event_handler:
        kwargs["event_handler"] = lambda event: event_handler(event) or True
    return ansible_runner.run(**kwargs)


def task_names(runner):
    return [e["event_data"]["task"] for e in runner.events if e["event"] == "playbook_on_task_start"]


def output(runner):
    """What ansible-playbook printed, without terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", runner.stdout.read())
