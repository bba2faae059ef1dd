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
  sample: [/etc/systemd/system/helper.service]
"""

import base64
import binascii
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

DIFF_LIMIT = 262144  # bytes: a longer file is shown in a diff by its size, as Ansible's own max_diff_size does


def read_bytes(path):
    """The file's bytes, or None where there is no file."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def text_for_diff(data):
    if data is None:
        return ""
    if len(data) > DIFF_LIMIT:
        return f"({len(data)} bytes, longer than a diff shows)\n"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return f"({len(data)} bytes of binary content)\n"


def write_atomically(module, path, data):
    """The bytes to a file beside path, then renamed over it (a reader sees the old file or the new one)."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path))
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        os.unlink(temporary)
        module.fail_json(msg=f"{path}: found writing it failing ({err}); expected a writable directory "
                             f"{os.path.dirname(path)}; fix: check the node's disk and that directory")
    module.atomic_move(temporary, path, unsafe_writes=False)


def install(module, entry, diffs):
    """Make one directory or file; whether it changed."""
    path, state = entry["path"], entry["state"]
    if not os.path.isabs(path):
        module.fail_json(msg=f"{path}: path: found a relative path; expected an absolute one; fix: give the full path")
    attributes = module.load_file_common_arguments(
        {"path": path, "mode": entry["mode"], "owner": entry["owner"], "group": entry["group"]})
    if state == "directory":
        if os.path.exists(path) and not os.path.isdir(path):
            module.fail_json(msg=f"{path}: found a file that is not a directory; expected a directory; fix: move "
                                 "it away and run again")
        if not os.path.isdir(path):
            if module.check_mode:
                diffs.append({"before_header": path, "after_header": path, "before": "", "after": "(directory)\n"})
                return True
            os.makedirs(path)
            module.set_fs_attributes_if_different(attributes, True)
            return True
        return module.set_fs_attributes_if_different(attributes, False)

    if entry["content"] is None:
        module.fail_json(msg=f"{path}: content: found nothing; expected the file's bytes, base64-encoded; fix: give "
                             "content (the b64encode filter over a template or file lookup)")
    try:
        wanted = base64.b64decode(entry["content"], validate=True)
    except (binascii.Error, ValueError) as err:
        module.fail_json(msg=f"{path}: content: found text that is not base64 ({err}); expected the file's bytes, "
                             "base64-encoded; fix: pass it through the b64encode filter")
    if os.path.isdir(path):
        module.fail_json(msg=f"{path}: found a directory; expected a file; fix: move it away and run again")
    current = read_bytes(path)
    if current == wanted:
        return module.set_fs_attributes_if_different(attributes, False)
    if module._diff:  # pylint: disable=protected-access
        diffs.append({"before_header": path, "after_header": path, "before": text_for_diff(current),
                      "after": text_for_diff(wanted)})
    if module.check_mode:
        return True
    if not os.path.isdir(os.path.dirname(path)):
        module.fail_json(msg=f"{path}: found no directory {os.path.dirname(path)}; expected it to exist; fix: list "
                             "the directory before the file (state: directory)")
    write_atomically(module, path, wanted)
    module.set_fs_attributes_if_different(attributes, True)
    return True


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
    changed_paths, diffs = [], []
    for entry in module.params["files"]:
        if install(module, entry, diffs):
            changed_paths.append(entry["path"])
    result = {"changed": bool(changed_paths), "changed_paths": changed_paths}
    if module._diff and diffs:  # pylint: disable=protected-access
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
