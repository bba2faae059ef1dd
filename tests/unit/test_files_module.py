"""plugins/modules/files.py as Ansible runs it (a script given its arguments' file): a set of directories and files
installed in one run, each only where it differs, with the changed paths named, check mode and diffs."""

import base64
import grp
import json
import os
import pwd
import stat
import subprocess
import sys

from conftest import ROOT
from test_triage import module_env

OWNER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def run(tmp_path, files, check=False, diff=False):
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "files": [dict({"owner": OWNER, "group": GROUP}, **entry) for entry in files],
        "_ansible_check_mode": check, "_ansible_diff": diff}}))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "plugins/modules/files.py"), str(args)],
                          capture_output=True, text=True, env=module_env(), timeout=60, check=False)
    return json.loads(done.stdout)


def b64(text):
    return base64.b64encode(text.encode()).decode()


def tree(tmp_path):
    where = tmp_path / "tree"
    return where, [{"path": str(where), "state": "directory", "mode": "0750"},
                   {"path": str(where / "helper"), "mode": "0755", "content": b64("#!/bin/sh\necho hi\n")},
                   {"path": str(where / "unit.service"), "mode": "0644", "content": b64("[Unit]\n")},
                   {"path": str(where / "empty"), "mode": "0644", "content": ""}]


def test_a_set_is_installed_once_and_a_second_run_changes_nothing(tmp_path):
    where, files = tree(tmp_path)
    first = run(tmp_path, files)
    assert not first.get("failed"), first
    assert first["changed"] and first["changed_paths"] == [entry["path"] for entry in files]
    assert (where / "helper").read_text() == "#!/bin/sh\necho hi\n" and (where / "empty").read_bytes() == b""
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(where / "helper").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(where / "unit.service").st_mode) == 0o644
    second = run(tmp_path, files)
    assert second["changed"] is False and second["changed_paths"] == []
    assert sorted(os.listdir(where)) == ["empty", "helper", "unit.service"]  # no temporary file left behind


def test_only_the_file_whose_bytes_or_mode_differ_is_named(tmp_path):
    where, files = tree(tmp_path)
    run(tmp_path, files)
    inode = os.stat(where / "unit.service").st_ino
    files[2]["content"] = b64("[Unit]\nDescription=new\n")
    os.chmod(where / "helper", 0o700)
    again = run(tmp_path, files)
    assert again["changed_paths"] == [str(where / "helper"), str(where / "unit.service")]
    assert (where / "unit.service").read_text() == "[Unit]\nDescription=new\n"
    assert os.stat(where / "unit.service").st_ino != inode  # replaced by a rename, never rewritten in place
    assert stat.S_IMODE(os.stat(where / "helper").st_mode) == 0o755


def test_check_mode_reports_what_would_change_and_writes_nothing_with_diffs(tmp_path):
    where, files = tree(tmp_path)
    checked = run(tmp_path, files, check=True, diff=True)
    assert checked["changed"] and checked["changed_paths"] == [entry["path"] for entry in files]
    assert not where.exists()
    assert {"before_header": str(where / "helper"), "after_header": str(where / "helper"), "before": "",
            "after": "#!/bin/sh\necho hi\n"} in checked["diff"]
    run(tmp_path, files)
    files[1]["content"] = b64("#!/bin/sh\necho bye\n")
    checked = run(tmp_path, files, check=True, diff=True)
    assert checked["changed_paths"] == [str(where / "helper")]
    assert checked["diff"] == [{"before_header": str(where / "helper"), "after_header": str(where / "helper"),
                                "before": "#!/bin/sh\necho hi\n", "after": "#!/bin/sh\necho bye\n"}]
    assert (where / "helper").read_text() == "#!/bin/sh\necho hi\n"


def test_bad_entries_are_refused_in_one_line_naming_the_path(tmp_path):
    where, files = tree(tmp_path)
    files[1]["content"] = "not base64!"
    result = run(tmp_path, files)
    assert result["failed"] and result["msg"].startswith(f"{where / 'helper'}: content: found text that is not "
                                                         "base64"), result
    assert "fix: pass it through the b64encode filter" in result["msg"]
    orphan = tmp_path / "no-such-dir" / "file"
    result = run(tmp_path, [{"path": str(orphan), "mode": "0644", "content": b64("x")}])
    assert result["failed"] and result["msg"] == (f"{orphan}: found no directory {orphan.parent}; expected it to "
                                                  "exist; fix: list the directory before the file (state: directory)")
    (tmp_path / "adir").mkdir()
    result = run(tmp_path, [{"path": str(tmp_path / "adir"), "mode": "0644", "content": b64("x")}])
    assert result["failed"] and result["msg"].startswith(f"{tmp_path / 'adir'}: found a directory; expected a file")
    result = run(tmp_path, [{"path": str(tmp_path / "nocontent"), "mode": "0644"}])
    assert result["failed"] and "content: found nothing" in result["msg"]
