#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The padded view of a verified checkpoint: the snapshot's files by link, and a config.json with padded sizes."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tp_padded_checkpoint
short_description: Keep the padded view of a verified checkpoint for a tensor-parallel size that pads
description:
  - For a group whose plan pads the model (see C(docs/tp-padding.md)), writes beside the verified snapshot of
    O(repo_id) in O(cache_dir) the directory C(sparkfleet-padded/<revision>-tp<N>). It holds a relative link to
    every file of the snapshot except C(config.json), a C(config.json) with the padded sizes of O(padding) (vLLM's
    MTP drafter reads the file, not C(--hf-overrides)), C(config.json.orig) linking the checkpoint's own, and
    C(.sparkfleet-padding.json) naming the verified revision and manifest it was made from and the padded
    C(config.json)'s sha256, written last (checked before every engine start, as the snapshot is).
  - The snapshot itself is never changed, so the weights stage's verification and scrub still cover every file
    the view points at. Views of other revisions or sizes are kept, as the weights stage keeps earlier snapshots
    (a rollback of C(upgrade.yml) starts the group it kept on its own view again); O(state=absent) removes every
    view.
  - Fails, changing nothing, when no verified checkpoint is there, or when the checkpoint's C(config.json) does
    not hold the sizes the profile describes.
version_added: 0.9.0
options:
  cache_dir:
    description: The Hugging Face hub cache the weights stage filled.
    type: path
    required: true
  repo_id:
    description: The checkpoint's repository id.
    type: str
    required: true
  tensor_parallel_size:
    description: Ranks the model is split over.
    type: int
    required: true
  padding:
    description: The plan's C(tp_padding) (C(dimensions), C(config_sections), C(padded)).
    type: dict
    default: {}
  state:
    description: C(present) keeps the view of a padded plan (a plan that pads nothing needs none, and nothing is
      done); C(absent) removes every view of the checkpoint.
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would change without changing it.
    support: full
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Keep the padded view for TP3
  sparkfleet.cluster.tp_padded_checkpoint:
    cache_dir: /var/lib/sparkfleet/hf/hub
    repo_id: local-inference-lab/GLM-5.3-Flash-NVFP4
    tensor_parallel_size: 3
    padding: "{{ sparkfleet_plan.capacity.tp_padding }}"
"""

RETURN = r"""
path:
  description: The directory vLLM loads (the view, or the snapshot itself when nothing is padded).
  returned: success
  type: str
  sample: /var/lib/sparkfleet/hf/hub/models--org--name/sparkfleet-padded/0123abcd-tp3
padded:
  description: Whether the view is in use.
  returned: success
  type: bool
changes:
  description: The names of the view written or removed (views removed by O(state=absent) as C(<dir>/)).
  returned: success
  type: list
  elements: str
config:
  description: The padded keys, C(key -> [checkpoint size, padded size]).
  returned: success
  type: dict
"""

import hashlib
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils import tp_padding, weights


def main():
    module = AnsibleModule(argument_spec=dict(
        cache_dir=dict(type="path", required=True),
        repo_id=dict(type="str", required=True),
        tensor_parallel_size=dict(type="int", required=True),
        padding=dict(type="dict", default={}),
        state=dict(type="str", choices=["present", "absent"], default="present"),
    ), supports_check_mode=True)
    params = module.params
    repo = weights.repo_dir(params["cache_dir"], params["repo_id"])
    views = os.path.join(repo, tp_padding.VIEWS)
    padding = params["padding"] or {}
    result = {"changed": False, "padded": False, "changes": [], "config": {}}
    if params["state"] == "present" and padding.get("padded"):
        marker = weights.read_marker(params["cache_dir"], params["repo_id"])
        if not marker or not marker.get("revision"):
            module.fail_json(msg=f"{params['repo_id']}: found no verified checkpoint in {params['cache_dir']}; "
                                 "expected the weights stage's marker .sparkfleet-verified.json before the padded "
                                 "view is made; fix: run site.yml --tags weights", **result)
        revision = marker["revision"]
        snapshot = weights.snapshot_dir(params["cache_dir"], params["repo_id"], revision)
        try:
            with open(os.path.join(snapshot, "config.json"), encoding="utf-8") as handle:
                original = json.load(handle)
            padded = tp_padding.padded_config(original, padding)
        except (OSError, ValueError) as exc:
            line = exc.args[0] if isinstance(exc, tp_padding.PaddingError) else \
                f"config.json: found {exc}; expected the checkpoint's JSON config; fix: run site.yml --tags weights"
            module.fail_json(msg=f"{params['repo_id']} ({snapshot}): {line}", **result)
        wanted = tp_padding.view_dir(repo, revision, params["tensor_parallel_size"])
        text = json.dumps(padded, indent=2, sort_keys=False) + "\n"
        record = json.dumps({"revision": revision, "manifest_sha256": marker.get("manifest_sha256"),
                             "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
                             "tensor_parallel_size": params["tensor_parallel_size"],
                             "padding": (padding.get("env") or {}).get(tp_padding.ENV),
                             "dimensions": [[d["keys"], d["size"], d["padded_size"]]
                                            for d in padding.get("dimensions", [])]},
                            sort_keys=True, indent=2) + "\n"
        entries = tp_padding.view_entries(snapshot, wanted, text)
        changes = tp_padding.view_changes(wanted, entries, record)
        if changes and not module.check_mode:
            changes = tp_padding.sync_view(wanted, entries, record)
        result.update(padded=True, path=wanted, changes=changes,
                      config={d["keys"][0]: [d["size"], d["padded_size"]] for d in padding.get("dimensions", [])
                              if d["padded_size"] != d["size"]})
    else:
        marker = weights.read_marker(params["cache_dir"], params["repo_id"]) or {}
        result["path"] = weights.snapshot_dir(params["cache_dir"], params["repo_id"], marker.get("revision", ""))
    if params["state"] == "absent" and os.path.isdir(views):
        result["changes"] = [f"{name}/" for name in sorted(os.listdir(views))] or [f"{tp_padding.VIEWS}/"]
        if not module.check_mode:
            shutil.rmtree(views)
    result["changed"] = bool(result["changes"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
