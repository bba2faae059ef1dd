#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Install a set of directories and small files on a node in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: files
short_description: Install a set of directories and small files in one round trip, each only where it differs
description:
  - Makes each directory and writes each file of O(files), in order, with its owner, group and mode; a file whose
    bytes, owner, group and mode are already the ones given is left alone, and a file whose bytes differ is
    replaced atomically (written beside it, then renamed over it).
  - Why not M(ansible.builtin.copy) or M(ansible.builtin.template) in a loop? Each of those runs two modules on
    the node per file even when nothing changes (a C(stat), then M(ansible.builtin.file) for the attributes), and
    the roles install dozens of small files (helpers, units, the module_utils the node's own checks import) on
    every converge. One run of this module does the same for the whole set. Its result names every path it
    changed, so that a role can still restart only what a changed file concerns.
  - The files' bytes travel base64-encoded (the P(ansible.builtin.b64encode#filter) filter over a
    P(ansible.builtin.template#lookup) or P(ansible.builtin.file#lookup) lookup) and are not logged on the node.
    Secrets do not belong here, since the result's diff shows the files' text.
version_added: 0.1.0
options:
  files:
    description: The directories and files, in the order they are made (a directory before the files in it).
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path of the directory or file.
        type: path
        required: true
      state:
        description: C(directory) makes the directory (and its missing parents); C(file) writes the file, whose
          directory must exist by then.
        type: str
        choices: [directory, file]
        default: file
      content:
        description: The file's bytes, base64-encoded. Required for C(state=file).
        type: str
      mode:
        description: The mode, as an octal string (for example C('0644')).
        type: raw
        required: true
      owner:
        description: The owner's name.
        type: str
        default: root
      group:
        description: The group's name.
        type: str
        default: root
attributes:
  check_mode:
    description: Reports what it would change (and with C(--diff), how) without changing anything.
    support: full
  diff_mode:
    description: Shows each changed file's text before and after (binary files by their size).
    support: full
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Install the helper and its unit
  sparkfleet.cluster.files:
    files:
      - {path: /usr/local/libexec/sparkfleet, state: directory, mode: "0755"}
      - path: /usr/local/libexec/sparkfleet/helper
        content: "{{ lookup('ansible.builtin.file', 'helper', rstrip=false) | b64encode }}"
        mode: "0755"
      - path: /etc/systemd/system/helper.service
        content: "{{ lookup('ansible.builtin.template', 'helper.service.j2') | b64encode }}"
        mode: "0644"
  register: installed

- name: Reload systemd when the unit changed
  ansible.builtin.systemd_service:
    daemon_reload: true
  when: "'/etc/systemd/system/helper.service' in installed.changed_paths"
"""

RETURN = r"""
changed_paths:
  description: The paths made or changed (bytes, owner, group or mode), in the order of O(files).
  returned: always
  type: list
  elements: str
  sample: [/usr/local/libexec/sparkfleet, /etc/systemd/system/helper.service]
changed_files:
  description: The files (not the directories) among RV(changed_paths), for what restarts only on a file's change.
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/helper.service]
"""

import base64
import binascii
import grp
import os
import pwd
import re
import tempfile

from ansible.module_utils.basic import AnsibleModule

DIFF_LIMIT = 104448  # bytes: a longer file is shown in a diff by its size (Ansible's own max_diff_size default)


def text_for_diff(data):
    if data is None:
        return ""
    if len(data) > DIFF_LIMIT:
        return f"({len(data)} bytes, longer than a diff shows)\n"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return f"({len(data)} bytes of binary content)\n"


class Installer:
    """The entries, checked as a whole first (nothing is written while any is wrong), then made in order. Every
    failure names the path and reports what was already changed."""

    def __init__(self, module):
        self.module = module
        self.changed_paths, self.changed_files, self.diffs = [], [], []

    def fail(self, path, found, expected, fix):
        self.module.fail_json(msg=f"{path}: found {found}; expected {expected}; fix: {fix}",
                              changed=bool(self.changed_paths), changed_paths=self.changed_paths)

    def check(self, entry):
        """The entry's bytes (None for a directory), once its options are known to be right."""
        path = entry["path"]
        if not os.path.isabs(path):
            self.fail(path, "a relative path", "an absolute one", "give the full path")
        if not re.fullmatch(r"0?o?[0-7]{3,4}", str(entry["mode"])):
            self.fail(path, f"mode {entry['mode']!r}", "an octal mode such as '0644'", "quote the mode in octal")
        for kind, lookup in (("owner", pwd.getpwnam), ("group", grp.getgrnam)):
            try:
                lookup(entry[kind])
            except KeyError:
                if not self.module.check_mode:  # (in --check an earlier task may not have made the user yet)
                    self.fail(path, f"{kind} {entry[kind]!r}, which this node does not know", f"an existing {kind}",
                              f"create the {kind} first (or fix its name)")
        if entry["state"] == "directory":
            return None
        if entry["content"] is None:
            self.fail(path, "no content", "the file's bytes, base64-encoded",
                      "give content (the b64encode filter over a template or file lookup)")
        try:
            return base64.b64decode(entry["content"], validate=True)
        except (binascii.Error, ValueError) as err:
            return self.fail(path, f"content that is not base64 ({err})", "the file's bytes, base64-encoded",
                             "pass it through the b64encode filter")

    def attributes(self, entry, path):
        return self.module.load_file_common_arguments(
            {"path": path, "mode": entry["mode"], "owner": entry["owner"], "group": entry["group"]})

    def directory(self, entry):
        """Make the directory (a symbolic link to one is followed, as the file module does); whether it changed."""
        path = entry["path"]
        if os.path.islink(path):
            target = os.path.realpath(path)
            if not os.path.isdir(target):
                self.fail(path, f"a symbolic link to {target}, which is not a directory", "a directory",
                          "point the link at a directory, or remove it")
            return self.module.set_fs_attributes_if_different(self.attributes(entry, target), False)
        if os.path.lexists(path) and not os.path.isdir(path):
            self.fail(path, "a file that is not a directory", "a directory", "move it away and run again")
        if os.path.isdir(path):
            return self.module.set_fs_attributes_if_different(self.attributes(entry, path), False)
        if self.module._diff:  # pylint: disable=protected-access
            self.diffs.append({"before_header": path, "after_header": path, "before": "", "after": "(directory)\n"})
        if self.module.check_mode:
            return True
        try:
            os.makedirs(path)
        except OSError as err:
            self.fail(path, f"making it failing ({err})", "a directory", "check the node's disk and the parents")
        self.module.set_fs_attributes_if_different(self.attributes(entry, path), True)
        return True

    def current(self, path):
        """(the file's bytes or None where there is none, a word for what else is there or None)."""
        if os.path.islink(path):
            return None, f"(a symbolic link to {os.readlink(path)})\n"
        if os.path.isdir(path):
            self.fail(path, "a directory", "a file", "move it away and run again")
        try:
            with open(path, "rb") as handle:
                return handle.read(), None
        except FileNotFoundError:
            return None, None
        except OSError as err:
            return self.fail(path, f"reading it failing ({err})", "a readable file or none", "check the path")

    def file(self, entry, wanted):
        """Write the file where its bytes differ (a symbolic link is replaced, as copy does); whether it changed."""
        path, parent = entry["path"], os.path.dirname(entry["path"])
        current, other = self.current(path)
        if current == wanted and other is None:
            return self.module.set_fs_attributes_if_different(self.attributes(entry, path), False)
        # (in --check a directory this run or an earlier task would make may not exist yet)
        if not os.path.isdir(parent) and not self.module.check_mode:
            self.fail(path, f"no directory {parent}", "it to exist",
                      "list the directory before the file (state: directory)")
        if self.module._diff:  # pylint: disable=protected-access
            self.diffs.append({"before_header": path, "after_header": path,
                               "before": other or text_for_diff(current), "after": text_for_diff(wanted)})
        if self.module.check_mode:
            return True
        temporary = None
        try:
            descriptor, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=parent)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(wanted)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as err:
            if temporary and os.path.exists(temporary):
                os.unlink(temporary)
            self.fail(path, f"writing it failing ({err})", f"a writable directory {parent}",
                      "check the node's disk and that directory")
        # the bytes beside it, then renamed over it: a reader sees the old file or the new one
        self.module.atomic_move(temporary, path, unsafe_writes=False)
        self.module.set_fs_attributes_if_different(self.attributes(entry, path), True)
        return True

    def run(self, entries):
        contents = [self.check(entry) for entry in entries]
        for entry, wanted in zip(entries, contents, strict=True):
            if entry["state"] == "directory":
                if self.directory(entry):
                    self.changed_paths.append(entry["path"])
            elif self.file(entry, wanted):
                self.changed_paths.append(entry["path"])
                self.changed_files.append(entry["path"])


def main():
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True, "options": {
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["directory", "file"], "default": "file"},
            "content": {"type": "str", "no_log": True},
            "mode": {"type": "raw", "required": True},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"}}}},
        supports_check_mode=True,
    )
    installer = Installer(module)
    installer.run(module.params["files"])
    result = {"changed": bool(installer.changed_paths), "changed_paths": installer.changed_paths,
              "changed_files": installer.changed_files}
    if module._diff and installer.diffs:  # pylint: disable=protected-access
        result["diff"] = installer.diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
