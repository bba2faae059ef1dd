#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Documentation of the job_progress action; the waiting is done on the controller in plugins/action."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: job_progress
short_description: Wait for an async task and print its progress (bytes done / total and rate) meanwhile
description:
  - Polls an async job started with C(async) and C(poll=0) until it finishes, and while it runs prints one line
    per change of the job's progress file (for example C(node0 - org/model download 1.2 GiB / 4.0 GiB (30%) at
    110.0 MiB/s)). Returns the job's own result, so a long download shows progress instead of a silent hang.
version_added: 0.1.0
options:
  jid:
    description: The C(ansible_job_id) of the async task.
    type: str
    required: true
  progress_file:
    description:
      - JSON file the job writes (C(done_bytes), C(total_bytes), C(bytes_per_second), C(phase)), or, for a job
        that counts no bytes, C(text) (where it is, in words).
    type: path
  label:
    description: What to call the job in the progress lines.
    type: str
    default: job
  interval:
    description: Seconds between polls.
    type: float
    default: 2
  timeout:
    description: Seconds to wait at most.
    type: int
    default: 86400
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would change without changing it.
    support: full
  action:
    description: Runs on the controller, through the action plugin of the same name.
    support: full
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: Download in the background
  sparkfleet.cluster.model_weights:
    source: huggingface
    repo_id: org/model
    revision: 0123456789abcdef0123456789abcdef01234567
    cache_dir: /var/lib/sparkfleet/hf/hub
    progress_file: /run/sparkfleet-weights.progress
  async: 86400
  poll: 0
  register: download

- name: Show progress until it is done
  sparkfleet.cluster.job_progress:
    jid: "{{ download.ansible_job_id }}"
    progress_file: /run/sparkfleet-weights.progress
    label: weights
  register: fetched
"""

RETURN = r"""
finished:
  description: Removed; the result is the job's own module result.
  returned: never
  type: bool
"""
