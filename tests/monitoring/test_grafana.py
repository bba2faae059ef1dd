"""The monitoring role's Grafana provisioning: its real modules (community.grafana) against a stand-in for
Grafana's HTTP API (tests/fakegrafana; Grafana is in no package archive these machines reach). The folder and both
dashboards are made, a second run changes nothing, a dashboard edited in Grafana is put back, check mode writes
nothing, and the token never shows, not even in a failure at -vvv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from fakegrafana.server import FakeGrafana  # noqa: E402  # pylint: disable=wrong-import-position

TOKEN = "glsa_sparkfleetTestToken_0123456789abcdef_5f3c"
DASHBOARDS = {path.name: json.loads(path.read_text())
              for path in (ROOT / "roles/monitoring/files/dashboards").glob("*.json")}
PLAYBOOK = """\
- name: The monitoring role's preflight and Grafana provisioning, on the controller
  hosts: sparkfleet_cluster
  gather_facts: false
  tasks:
    - name: Check the settings
      ansible.builtin.include_role:
        name: sparkfleet.cluster.monitoring
        tasks_from: preflight
    - name: Provision
      ansible.builtin.include_role:
        name: sparkfleet.cluster.monitoring
        tasks_from: grafana
"""


@pytest.fixture
def play(tmp_path):
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    sparkfleet_cluster:\n      hosts:\n        head:\n"
        "          ansible_connection: local\n          ansible_python_interpreter: " + sys.executable + "\n")

    def run(url, token=TOKEN, *extra):
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "false"}
        variables = json.dumps({"monitoring_grafana_url": url, "monitoring_grafana_token": token})
        result = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml"),
                                 "-e", variables, *extra], capture_output=True, text=True, cwd=ROOT, env=env,
                                check=False, timeout=300)
        output = result.stdout + result.stderr
        assert TOKEN not in output
        return result.returncode, output
    return run


def changed(output):
    return int(output.split("PLAY RECAP", 1)[1].split("changed=", 1)[1].split()[0])


def test_dashboards_are_provisioned_once_kept_and_put_back_when_edited_in_grafana(play):
    with FakeGrafana(TOKEN) as grafana:
        rc, output = play(grafana.url)
        assert rc == 0, output
        assert changed(output) == 2  # the folder's task, the dashboards' loop
        assert grafana.writes == 3  # the folder and two dashboards
        [folder] = grafana.folders
        assert folder["title"] == "sparkfleet"
        assert sorted(grafana.dashboards) == sorted(board["uid"] for board in DASHBOARDS.values())
        for board in DASHBOARDS.values():
            stored = grafana.dashboards[board["uid"]]
            assert stored["folderId"] == folder["id"]
            assert {k: v for k, v in stored["dashboard"].items() if k not in ("id", "version")} == {
                k: v for k, v in board.items() if k != "version"}

        writes = grafana.writes
        rc, output = play(grafana.url)
        assert rc == 0 and changed(output) == 0, output
        assert grafana.writes == writes

        grafana.dashboards["sparkfleet-vllm"]["dashboard"]["panels"] = []  # someone edited it in Grafana
        rc, output = play(grafana.url)
        assert rc == 0 and changed(output) == 1, output
        assert grafana.dashboards["sparkfleet-vllm"]["dashboard"]["panels"] == DASHBOARDS["sparkfleet-vllm.json"][
            "panels"]


def test_check_mode_reports_what_it_would_make_and_writes_nothing(play):
    with FakeGrafana(TOKEN) as grafana:
        rc, output = play(grafana.url, TOKEN, "--check")
        assert rc == 0, output
        assert changed(output) >= 1
        assert grafana.writes == 0 and not grafana.dashboards
        assert not [r for r in grafana.requests if r[0] == "POST"]
        assert "would make the folder sparkfleet" in output
        assert play(grafana.url)[0] == 0  # made for real, then check mode looks inside it
        grafana.dashboards["sparkfleet-cluster"]["dashboard"]["title"] = "edited"
        writes = grafana.writes
        rc, output = play(grafana.url, TOKEN, "--check")
        assert rc == 0 and changed(output) == 1 and grafana.writes == writes, output
        assert grafana.dashboards["sparkfleet-cluster"]["dashboard"]["title"] == "edited"


def test_a_wrong_token_fails_saying_so_and_no_token_shows(play):
    with FakeGrafana("glsa_the_real_one") as grafana:
        rc, output = play(grafana.url, TOKEN, "-vvv")
        assert rc != 0
        assert "Unauthorized" in output
        rc, output = play(grafana.url, TOKEN, "--check", "-vvv")
        assert rc != 0
        assert ("answering HTTP 401 to a folder listing (the token is not valid); expected 200; fix: give the token "
                "of a service account with the Editor role") in " ".join(output.split())
        assert grafana.writes == 0


def test_a_grafana_that_does_not_answer_is_named_in_check_mode(play, tmp_path):
    with FakeGrafana(TOKEN) as grafana:
        url = grafana.url
    rc, output = play(url, TOKEN, "--check")  # the server is gone: connection refused
    assert rc != 0
    text = " ".join(output.split())
    assert f"found monitoring_grafana_url {url} answering nothing to a folder listing" in text, text
    assert "fix: check the URL and that this machine reaches that Grafana" in text


def test_a_url_without_a_token_is_refused_before_grafana_is_asked(play):
    with FakeGrafana(TOKEN) as grafana:
        rc, output = play(grafana.url, "")
        assert rc != 0
        assert ("monitoring on head: found monitoring_grafana_url set and monitoring_grafana_token empty; "
                "expected both or neither") in " ".join(output.split())
        assert grafana.requests == []
