"""Which address a node's Prometheus and exporter listen on (the monitoring role's address step, on this machine):
monitoring_listen_address, else an IPv4 ansible_host, else - ansible_host being a name - the default route's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = """\
- name: The monitoring role's address step
  hosts: sparkfleet_cluster
  gather_facts: false
  tasks:
    - name: Find the address
      ansible.builtin.include_role:
        name: sparkfleet.cluster.monitoring
        tasks_from: address
    - name: Say it
      ansible.builtin.debug:
        msg: "ADDRESS={{ sparkfleet_monitoring_address }}"
"""


def default_route_address():
    route = json.loads(subprocess.run(["ip", "-j", "-4", "route", "get", "192.0.2.123"], capture_output=True,
                                      text=True, check=True).stdout)
    return route[0]["prefsrc"]


@pytest.mark.parametrize(("host_vars", "expected"), [
    ({"ansible_host": "localhost"}, "default route"),
    ({"ansible_host": "127.0.0.1", "monitoring_listen_address": "10.9.8.7"}, "10.9.8.7"),
    ({"ansible_host": "10.1.2.3"}, "10.1.2.3"),
])
def test_the_listen_address(tmp_path, host_vars, expected):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    inventory = {"all": {"children": {"sparkfleet_cluster": {"hosts": {"node0": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, **host_vars}}}}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "false"}
    result = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
                            capture_output=True, text=True, cwd=ROOT, env=env, check=False, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    want = default_route_address() if expected == "default route" else expected
    assert f"ADDRESS={want}" in result.stdout, result.stdout
