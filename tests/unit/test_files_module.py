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

from conftest import ROOT, module_env

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
    assert first["changed_files"] == [entry["path"] for entry in files[1:]]  # the directory is not a file
    assert (where / "helper").read_text() == "#!/bin/sh\necho hi\n" and (where / "empty").read_bytes() == b""
    assert stat.S_IMODE(os.stat(where).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(where / "helper").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(where / "unit.service").st_mode) == 0o644
    second = run(tmp_path, files)
    assert second["changed"] is False and second["changed_paths"] == [] and second["changed_files"] == []
    os.chmod(where, 0o700)  # a directory's change alone is no file's change
    third = run(tmp_path, files)
    assert third["changed_paths"] == [str(where)] and third["changed_files"] == []
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


def test_bad_entries_are_refused_in_one_line_naming_the_path_before_anything_is_written(tmp_path):
    where, files = tree(tmp_path)
    files[2]["content"] = "not base64!"
    result = run(tmp_path, files)
    assert result["failed"] and result["msg"].startswith(f"{where / 'unit.service'}: found content that is not "
                                                         "base64"), result
    assert result["msg"].endswith("fix: pass it through the b64encode filter")
    assert not where.exists() and result["changed_paths"] == []  # the set is checked whole before any write
    files[2]["content"], files[1]["owner"] = b64("[Unit]\n"), "no-such-user-here"
    result = run(tmp_path, files)
    assert result["msg"] == (f"{where / 'helper'}: found owner 'no-such-user-here', which this node does not know; "
                             "expected an existing owner; fix: create the owner first (or fix its name)")
    assert not where.exists()
    files[1]["owner"], files[1]["mode"] = OWNER, "u+rwx"
    result = run(tmp_path, files)
    assert result["msg"] == (f"{where / 'helper'}: found mode 'u+rwx'; expected an octal mode such as '0644'; fix: "
                             "quote the mode in octal")
    orphan = tmp_path / "no-such-dir" / "file"
    result = run(tmp_path, [{"path": str(orphan), "mode": "0644", "content": b64("x")}])
    assert result["failed"] and result["msg"] == (f"{orphan}: found no directory {orphan.parent}; expected it to "
                                                  "exist; fix: list the directory before the file (state: directory)")
    # in --check an earlier task (or this one) may be what makes the directory: the file would be written
    checked = run(tmp_path, [{"path": str(orphan), "mode": "0644", "content": b64("x")}], check=True)
    assert checked["changed_paths"] == [str(orphan)] and not orphan.parent.exists()
    (tmp_path / "adir").mkdir()
    result = run(tmp_path, [{"path": str(tmp_path / "adir"), "mode": "0644", "content": b64("x")}])
    assert result["failed"] and result["msg"].startswith(f"{tmp_path / 'adir'}: found a directory; expected a file")
    result = run(tmp_path, [{"path": str(tmp_path / "nocontent"), "mode": "0644"}])
    assert result["failed"] and "found no content" in result["msg"]


def test_a_failure_part_way_reports_what_was_already_changed(tmp_path):
    where, files = tree(tmp_path)
    (tmp_path / "tree").mkdir()
    (where / "unit.service").mkdir()  # a directory where the second file goes: found only when it is reached
    result = run(tmp_path, files)
    assert result["failed"] and result["changed_paths"] == [str(where), str(where / "helper")]
    assert result["changed"] is True and (where / "helper").exists()


def test_symbolic_links_a_directory_is_followed_a_file_replaced_a_dangling_one_refused(tmp_path):
    real = tmp_path / "data"
    real.mkdir(mode=0o700)
    os.chmod(real, 0o700)
    (tmp_path / "state").symlink_to(real)
    result = run(tmp_path, [{"path": str(tmp_path / "state"), "state": "directory", "mode": "0755"}])
    assert result["changed_paths"] == [str(tmp_path / "state")]
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o755 and os.path.islink(tmp_path / "state")
    target = tmp_path / "elsewhere"
    target.write_text("same\n")
    (tmp_path / "conf").symlink_to(target)
    result = run(tmp_path, [{"path": str(tmp_path / "conf"), "mode": "0644", "content": b64("same\n")}], diff=True)
    assert result["changed_paths"] == [str(tmp_path / "conf")]
    assert not os.path.islink(tmp_path / "conf") and target.read_text() == "same\n"
    assert result["diff"][0]["before"] == f"(a symbolic link to {target})\n"
    (tmp_path / "gone").symlink_to(tmp_path / "missing")
    result = run(tmp_path, [{"path": str(tmp_path / "gone"), "state": "directory", "mode": "0755"}])
    assert result["msg"] == (f"{tmp_path / 'gone'}: found a symbolic link to {tmp_path / 'missing'}, which is not a "
                             "directory; expected a directory; fix: point the link at a directory, or remove it")
