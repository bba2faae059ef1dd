#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Verify a booted vLLM server: alive, serving, and with the KV pool the plan says."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kv_pool
short_description: Verify a booted vLLM head - health, KV pool size, max_model_len, canary and known answer
description:
  - Waits until C(/health) on O(url) answers 200 (at most O(wait_timeout) seconds). A C(503) from a server whose
    engine had started means the engine is dead (EngineDeadError) and fails at once.
  - Reads the KV pool from C(/metrics) (the C(vllm:cache_config_info) labels - C(kv_cache_size_tokens), or
    C(num_gpu_blocks) x C(block_size) on older vLLM, which the result marks) and from this boot's
    C(KV cache size) log line in O(log_path), and requires both to agree when both exist.
  - A log last written before the server's C(process_start_time_seconds) is from an earlier start; it is not
    used, RV(log_stale) is true and a warning names the file.
  - Reads C(max_model_len) from C(/v1/models) and, with O(canary=true), sends a one-token completion through
    the head (a dead worker can leave C(/health) at 200).
  - Fails when the pool is outside O(expected_tokens) +- O(tolerance) (larger too - a missing KV pin lets the
    auto-sizer take memory), below O(min_tokens), or when C(/v1/models) reports another C(max_model_len) than
    O(max_model_len); the message says what was found, what was expected and the likely causes.
  - Runs on the head node (it reads the log file there). It only reads, so it runs in check mode too.
version_added: 0.1.0
options:
  url:
    description: Base URL of the head's OpenAI-compatible server, for example C(http://10.0.0.1:8888).
    type: str
    required: true
  api_key:
    description: The server's API key (C(--api-key)), sent as a Bearer token to C(/v1/*).
    type: str
  log_path:
    description:
      - This boot's head log (a per-boot file, or the stable symlink to it). The resolved file is read.
      - Without it the pool comes from C(/metrics) alone.
    type: path
  min_tokens:
    description: Fail when the pool holds fewer tokens than this.
    type: int
  expected_tokens:
    description: The planned pool in tokens; fail when the pool differs by more than O(tolerance) either way.
    type: int
  tolerance:
    description: Relative tolerance around O(expected_tokens) (0.05 is 5%).
    type: float
    default: 0.05
  max_model_len:
    description: The expected C(max_model_len); fail when C(/v1/models) reports another.
    type: int
  wait_timeout:
    description: Seconds to wait for C(/health) to answer 200.
    type: int
    default: 900
  canary:
    description: Send a one-token completion through the head after the checks.
    type: bool
    default: true
  known_answer:
    description:
      - Also send the known-answer canary - greedy completions of fixed prompts with their log-probabilities - and
        hold them to the answer recorded for O(known_answer.identity).
      - With no record for that identity yet, the answer is recorded (never in check mode, never when it is empty
        or has a non-finite log-probability); with one, the tokens must be the same and each log-probability
        within O(known_answer.logprob_tolerance), or the module fails saying which prompt and token differ.
      - The group's per-start verification on the head uses the same record, so a converge and a start agree.
    type: dict
    suboptions:
      path:
        description: The directory the records are kept in, one file per identity.
        type: path
        required: true
      identity:
        description:
          - What the answer depends on, for example the weights revision, the image fingerprint and the profile
            with its arguments. Another identity gets a record of its own.
        type: dict
        required: true
      logprob_tolerance:
        description: The largest difference of one token's log-probability from the record, in nats.
        type: float
        default: 0.1
      record:
        description: Record the answer when the identity has no record yet.
        type: bool
        default: true
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
- name: Verify the boot on the head
  sparkfleet.cluster.kv_pool:
    url: "http://{{ sparkfleet_head_address }}:8888"
    api_key: "{{ vault_vllm_api_key }}"
    log_path: /var/log/sparkfleet/vllm-head.log
    expected_tokens: 2049230
    tolerance: 0.05
    max_model_len: 900000
  register: pool

- name: Only require a minimum, without a canary
  sparkfleet.cluster.kv_pool:
    url: http://127.0.0.1:8888
    min_tokens: 1000000
    canary: false

- name: Hold the answer to the one recorded for these weights, image and profile
  sparkfleet.cluster.kv_pool:
    url: http://127.0.0.1:8888
    expected_tokens: 2049230
    known_answer:
      path: /var/lib/sparkfleet/verify
      identity:
        revision: 0123456789abcdef0123456789abcdef01234567
        image: sha256:6d1f
        profile: glm-5.3-flash-nvfp4-tp2
"""

RETURN = r"""
kv_cache_tokens:
  description: The KV pool in tokens (the server's group-aware headline).
  returned: success
  type: int
  sample: 2049230
num_gpu_blocks:
  description: KV cache blocks from C(/metrics); null when only the log was read.
  returned: success
  type: int
  sample: 128077
block_size:
  description: Tokens per block from C(/metrics) (or the log's attention block size when only the log was read).
  returned: success
  type: int
  sample: 16
max_concurrency:
  description: How many requests of C(max_model_len) tokens fit in the pool.
  returned: success
  type: float
  sample: 2.28
max_model_len:
  description: The served model's context length from C(/v1/models).
  returned: success
  type: int
  sample: 900000
served_model:
  description: The served model's id from C(/v1/models).
  returned: success
  type: str
  sample: glm-5.3-flash
source:
  description: Where the pool was read - C(both) (log and /metrics, equal), C(metrics) or C(log).
  returned: success
  type: str
  sample: both
metrics_fallback:
  description: True when C(/metrics) had no C(kv_cache_size_tokens) and the pool there is blocks x block size.
  returned: success
  type: bool
  sample: false
health_wait_s:
  description: Seconds waited for C(/health) to answer 200.
  returned: always
  type: float
  sample: 12.5
canary_ok:
  description: True when the one-token completion came back; false when O(canary=false).
  returned: success
  type: bool
  sample: true
canary_latency_s:
  description: Latency of the canary completion in seconds; null without a canary.
  returned: success
  type: float
  sample: 0.41
log_path:
  description: The resolved log file whose pool line was used; null when no log was used.
  returned: success
  type: str
  sample: /var/log/sparkfleet/vllm-head-20251130T120001-3f2a.log
known_answer:
  description: C(recorded) (this run wrote the record), C(matched), or C(unrecorded) (no record and none written).
  returned: when O(known_answer) is set and the checks passed
  type: str
  sample: matched
known_answer_record:
  description: The record file the answer was held to or written to.
  returned: when O(known_answer) is set and the checks passed
  type: str
  sample: /var/lib/sparkfleet/verify/known-answer-3f2a9c0d1e2b4a5c.json
known_answer_latency_s:
  description: Latency of the known-answer completions in seconds.
  returned: when O(known_answer) is set and the checks passed
  type: float
  sample: 1.82
log_stale:
  description: True when the log at O(log_path) was older than the server's start and was therefore not used.
  returned: success
  type: bool
  sample: false
"""

import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils import verification
from ansible_collections.sparkfleet.cluster.plugins.module_utils import vllm_status as vs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            log_path=dict(type="path"),
            # token counts of the KV pool, not secrets ("token" in the name makes validate-modules ask)
            min_tokens=dict(type="int", no_log=False),
            expected_tokens=dict(type="int", no_log=False),
            tolerance=dict(type="float", default=0.05),
            max_model_len=dict(type="int"),
            wait_timeout=dict(type="int", default=900),
            canary=dict(type="bool", default=True),
            known_answer=dict(type="dict", options=dict(
                path=dict(type="path", required=True),
                identity=dict(type="dict", required=True),
                logprob_tolerance=dict(type="float", default=0.1),
                record=dict(type="bool", default=True),
            )),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["api_key"] is not None and not re.fullmatch(r"[\x21-\x7e]+", p["api_key"]):
        module.fail_json(msg="found an api_key with whitespace, a line break or non-ASCII characters (not shown); "
                             "expected printable ASCII without spaces, as an HTTP Bearer token; fix: strip the "
                             "trailing newline from the vaulted value (ansible-vault encrypt_string -n ... 'key')")
    if p["known_answer"] is not None and p["known_answer"]["logprob_tolerance"] < 0:
        module.fail_json(msg=f"found known_answer.logprob_tolerance {p['known_answer']['logprob_tolerance']}; "
                             "expected a non-negative number of nats; fix: pass the tolerance per token (0.1)")
    if p["tolerance"] < 0:
        module.fail_json(msg=f"found tolerance {p['tolerance']}; expected a fraction >= 0 (0.05 is 5%); "
                             "fix: pass a relative tolerance")
    result = dict(changed=False, health_wait_s=None, canary_ok=False, canary_latency_s=None, log_path=None,
                  log_stale=False)
    findings = vs.Findings()
    try:
        known = p["known_answer"]
        if known is not None and module.check_mode:
            known = dict(known, record=False)  # check mode compares with a record but never writes one
        verification.verify(dict(p, known_answer=known), result, findings)
    except vs.KvPoolError as err:
        for warning in vs.unique(findings.warnings):
            module.warn(warning)
        module.fail_json(msg=str(err), **result)
    for warning in vs.unique(findings.warnings):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
