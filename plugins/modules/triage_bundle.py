#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Collect one node's triage bundle, every secret redacted: logs, units, journal, memory, GPU, fabric, state."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: triage_bundle
short_description: Collect a node's forensics (logs, units, journal, memory, GPU, fabric, state) as one redacted tar.gz
description:
  - Reads, and changes nothing on the node - it works on a node whose service is broken, stopped, gave up, or was
    never installed. Every item is best-effort - what cannot be read is listed in RV(missing) (expected here and
    not found) or RV(skipped_items) (does not apply, such as C(nvidia-smi -q) on a node without a GPU), with the
    reason.
  - "Collects: this boot's and the previous boot's vLLM per-start logs (C(vllm-boot<boot>-<start>.log)),
    C(systemctl status), C(show) and C(cat) of every unit matching O(unit_pattern), the journal of those units for
    this boot and the previous one where the journal holds it, the kernel log with its NVRM/Xid lines
    (C(journalctl -k -b), else C(dmesg)), C(/proc/meminfo), PSI (C(/proc/pressure/*)), zram (C(mm_stat),
    C(zramctl), C(swapon)), the memory watchdog's textfile and trips, C(nvidia-smi -q), the rendered environment and
    configuration files (O(config_files)), the verification's and the group's state, the give-up marker, the fabric
    (C(ip -d link), C(ip addr), RoCE GIDs, C(rdma link), C(ibv_devinfo), the netplan file, the nftables table), the
    image (C(docker image inspect), or the virtualenv's distributions and install marker) and the weights' verified
    marker."
  - Logs, journals and command outputs keep their last O(tail_mib) MiB each; the vLLM logs of the node together at
    most O(logs_max_mib) MiB (this boot's newest first); what is left out is listed in RV(missing).
  - "Every member is redacted before it is written: each value of O(secrets) (also JSON- and URL-escaped, and broken
    by a line break), the values of secret-named C(NAME=value) pairs of environment text and of secret-named JSON
    keys (names holding TOKEN, KEY, SECRET, PASSWORD), C(Bearer) tokens and C(hf_) tokens, each replaced by
    C(<redacted>). Secret-named values of the env files in O(config_files) are redacted from every member too."
  - The bundle is written to a new private directory (mode 0700) under O(dest), as C(<name>.tar.gz) (mode 0600)
    holding C(<name>/...), with C(MANIFEST.json) (every member, its source, bytes kept and in all, and redactions)
    and C(summary.json) last. Fetch it, then remove RV(dir).
version_added: 0.1.0
options:
  name:
    description: The bundle's name (the inventory host); its file name and top directory.
    type: str
    required: true
  dest:
    description: An existing directory on the node that receives the private directory of the bundle.
    type: path
    default: /var/tmp
  secrets:
    description: Values that must never leave the node (the API key, the Hugging Face token); empty ones are ignored.
    type: list
    elements: str
    default: []
  tail_mib:
    description: Each log, journal and command output keeps its last this many MiB.
    type: int
    default: 8
  logs_max_mib:
    description: The vLLM per-start logs of the node together keep at most this many MiB.
    type: int
    default: 64
  timeout:
    description: Seconds each command may take (a program that hangs once is not run again in the same bundle).
    type: int
    default: 60
  log_dir:
    description: The per-start vLLM logs (vllm_service_log_dir).
    type: path
    default: /var/log/sparkfleet/vllm
  marker:
    description: The give-up marker.
    type: path
    default: /var/lib/sparkfleet/vllm/gave-up
  verify_dir:
    description: The per-start verification's directory (C(status.json), C(scrub.json), known answers).
    type: path
    default: /var/lib/sparkfleet/verify
  group_dir:
    description: The group supervisor's state (C(state.json), C(history.json)).
    type: path
    default: /var/lib/sparkfleet/group
  textfile_dirs:
    description: Directories whose Prometheus textfiles (C(*.prom)) are taken.
    type: list
    elements: path
    default: [/var/lib/sparkfleet/metrics]
  config_files:
    description: Rendered configuration; C(*.env) files are read as environment text, C(*.json) as JSON.
    type: list
    elements: path
    default: [/etc/sparkfleet/vllm.env, /etc/sparkfleet/nccl.env, /etc/sparkfleet/group.json,
              /etc/sparkfleet/verify.json, /etc/sparkfleet/firewall.nft]
  state_files:
    description: More state files, taken where present (the NCCL probe's record, the Xid baseline).
    type: list
    elements: path
    default: [/var/lib/sparkfleet/nccl-probe.json, /var/lib/sparkfleet/gpu/xid-baseline.json]
  watchdog_textfile:
    description: The memory watchdog's Prometheus textfile (its trip counter).
    type: path
    default: /var/lib/prometheus/node-exporter/sparkfleet_watchdog.prom
  watchdog_log:
    description: The watchdog's log where it runs without systemd.
    type: path
    default: /var/log/sparkfleet/watchdog.log
  watchdog_unit:
    description: The watchdog's unit, whose journal lines count its trips of this boot.
    type: str
    default: sparkfleet-watchdog.service
  sysctl_file:
    description: The memory settings node_memory writes.
    type: path
    default: /etc/sysctl.d/90-sparkfleet-memory.conf
  hub_cache:
    description: The Hugging Face hub cache holding the weights and their C(.sparkfleet-verified.json).
    type: path
    default: /var/lib/sparkfleet/hf/hub
  venv:
    description: The native runtime's virtualenv.
    type: path
    default: /opt/sparkfleet/vllm
  images:
    description: Docker images to inspect where docker is installed.
    type: list
    elements: str
    default: [sparkfleet/vllm:current, sparkfleet/vllm:previous]
  netplan_file:
    description: The netplan file the fabric stage writes.
    type: path
    default: /etc/netplan/40-sparkfleet-fabric.yaml
  nft_table:
    description: The nftables table the fabric stage loads, as C(nft list table) takes it (family and name).
    type: str
    default: inet sparkfleet
  unit_pattern:
    description: The units to report (status, properties, unit file, journal).
    type: str
    default: sparkfleet-*
  ignored_xids:
    description: Xid codes the summary counts as benign (decimal or hexadecimal).
    type: list
    elements: str
    default: ["0x51"]
attributes:
  check_mode:
    description: Runs in check mode (C(--check)) the same way - it only reads; the bundle is its output.
    support: full
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
notes:
  - Run it with C(become) (the env files are root's, mode 0600) and C(no_log) (O(secrets) are its options).
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Collect this node's bundle
  sparkfleet.cluster.triage_bundle:
    name: "{{ inventory_hostname }}"
    secrets:
      - "{{ sparkfleet_api_key }}"
      - "{{ model_weights_token }}"
  become: true
  no_log: true
  register: bundle

- name: Fetch it
  ansible.builtin.fetch:
    src: "{{ bundle.path }}"
    dest: "triage/{{ inventory_hostname }}.tar.gz"
    flat: true
  become: true

- name: Remove it from the node
  ansible.builtin.file:
    path: "{{ bundle.dir }}"
    state: absent
  become: true
"""

RETURN = r"""
path:
  description: The bundle on the node.
  returned: success
  type: str
  sample: /var/tmp/sparkfleet-triage-k2j1x0/node0.tar.gz
dir:
  description: The private directory holding it (remove it once fetched).
  returned: success
  type: str
  sample: /var/tmp/sparkfleet-triage-k2j1x0
size:
  description: The bundle's size in bytes.
  returned: success
  type: int
  sample: 1843201
members:
  description: How many files the bundle holds (the manifest and the summary included).
  returned: success
  type: int
  sample: 71
missing:
  description: What was expected here and could not be collected, and why.
  returned: success
  type: list
  elements: dict
  sample: [{item: config/nccl.env, why: "/etc/sparkfleet/nccl.env: absent (the stage that writes it has not run)"}]
skipped_items:
  description: What does not apply to this node, and why.
  returned: success
  type: list
  elements: dict
  sample: [{item: gpu/nvidia-smi-q.txt, why: "no nvidia-smi on this node (no NVIDIA driver ...)"}]
summary:
  description: The figures parsed from the redacted members (also the bundle's C(summary.json)).
  returned: success
  type: dict
  sample:
    group: {phase: ready, epoch: 3, rank: 0, why: ""}
    meminfo: {MemTotal: 24683412, MemAvailable: 23999000}
    xid: {source: journalctl -k -b, nvrm_lines: 0, xid: 0, errors: 0}
rows:
  description: The node's cells of SUMMARY.md, by row.
  returned: success
  type: dict
  sample: {bundle: "1.8 MiB, 71 files", "last verify": "ok, epoch 3, 2025-06-01 10:00:00 UTC"}
redacted:
  description: How many places were redacted in all.
  returned: success
  type: int
  sample: 1
"""

import os
import re
import shutil
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import line
from ansible_collections.sparkfleet.cluster.plugins.module_utils.triage import DEFAULTS, MIB, collect

PATHS = ("log_dir", "marker", "verify_dir", "group_dir", "textfile_dirs", "config_files", "state_files",
         "watchdog_textfile", "watchdog_log", "watchdog_unit", "sysctl_file", "hub_cache", "venv", "images",
         "netplan_file", "nft_table", "unit_pattern", "ignored_xids")
TYPES = {"textfile_dirs": "list", "config_files": "list", "state_files": "list", "images": "list",
         "ignored_xids": "list", "watchdog_unit": "str", "nft_table": "str", "unit_pattern": "str"}


def spec():
    options = {"name": {"type": "str", "required": True}, "dest": {"type": "path", "default": "/var/tmp"},
               "secrets": {"type": "list", "elements": "str", "default": [], "no_log": True},
               "tail_mib": {"type": "int", "default": 8}, "logs_max_mib": {"type": "int", "default": 64},
               "timeout": {"type": "int", "default": 60}}
    for key in PATHS:
        kind = TYPES.get(key, "path")
        if kind == "list":
            options[key] = {"type": "list", "elements": "str" if key in ("images", "ignored_xids") else "path",
                            "default": list(DEFAULTS[key])}
        else:
            options[key] = {"type": kind, "default": DEFAULTS[key]}
    return options


def main():
    module = AnsibleModule(argument_spec=spec(), supports_check_mode=True)
    p = module.params
    name = p["name"]
    for key, low in (("tail_mib", 1), ("logs_max_mib", 1), ("timeout", 1)):
        if p[key] < low:
            module.fail_json(msg=line(str(p[key]), f"a whole number of at least {low}", f"set {key} to {low} or more",
                                      key=key, where=name))
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}", name):
        module.fail_json(msg=line(repr(name), "a name of letters, digits, '.', '_' and '-' (an inventory host name)",
                                  "pass the inventory_hostname", key="name", where=name))
    if not os.path.isdir(p["dest"]):
        module.fail_json(msg=line(f"no directory {p['dest']}", "an existing directory to build the bundle in",
                                  "set triage_node_tmp_dir to one (the default is /var/tmp)", key="dest", where=name))
    try:
        directory = tempfile.mkdtemp(prefix="sparkfleet-triage-", dir=p["dest"])
    except OSError as err:
        module.fail_json(msg=line(f"{p['dest']} refusing a new directory ({err.strerror})",
                                  "room for the bundle", f"free space in {p['dest']}, or set triage_node_tmp_dir",
                                  key="dest", where=name))
    settings = {key: p[key] for key in PATHS}
    settings.update(tail_bytes=p["tail_mib"] * MIB, logs_max_bytes=p["logs_max_mib"] * MIB, timeout=p["timeout"])
    try:
        result = collect(name, directory, p["secrets"], settings)
    except (OSError, tarfile.TarError) as err:
        shutil.rmtree(directory, ignore_errors=True)
        module.fail_json(msg=line(f"{type(err).__name__} while writing the bundle under {p['dest']}: {err}",
                                  "room for the bundle (the logs alone take up to logs_max_mib)",
                                  f"free space in {p['dest']}, lower triage_logs_max_mib, or set triage_node_tmp_dir",
                                  where=name))
    module.exit_json(changed=False, dir=directory, **result)


if __name__ == "__main__":
    main()
