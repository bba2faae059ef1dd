#!/usr/bin/python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Check that the GPUs reach their clock under a short load."""

DOCUMENTATION = r"""
---
module: gpu_clock_check
short_description: Fail when a GPU's SM clock stays low under a short load
version_added: 0.3.0
description:
  - Starts a load (a command that keeps every GPU busy and prints O(ready_marker) once it runs), reads each
    GPU's SM clock through nvidia-smi every O(interval) seconds for O(seconds), then ends the load.
  - Passes when each GPU's peak reaches O(min_mhz). A GB10 stuck at 600-700 MHz after a power event stays
    there until a cold power cycle; the failure says so, with the readings.
  - Reads only; it never sets clocks or power. In check mode it does not run (a load is not a check).
options:
  load:
    description: The load command, as a list.
    type: list
    elements: str
    required: true
  seconds:
    description: How long to read the clock once the load runs.
    type: float
    default: 6
  interval:
    description: Seconds between two readings.
    type: float
    default: 0.5
  min_mhz:
    description: The peak SM clock each GPU must reach.
    type: int
    default: 1500
  ready_marker:
    description: Text the load prints once the GPUs are busy.
    type: str
    default: "gpu burn: loaded"
  ready_timeout:
    description: Seconds to wait for the marker.
    type: float
    default: 180
attributes:
  check_mode:
    description: Runs in check mode (C(--check)), reporting what it would change without changing it.
    support: none
  diff_mode:
    description: Returns a diff of what it changes when run with C(--diff).
    support: none
author:
  - sparkfleet developers (@sparkfleet)
"""

EXAMPLES = r"""
- name: The GPU reaches its clock under load
  sparkfleet.cluster.gpu_clock_check:
    load: [docker, run, --rm, --gpus, all, sparkfleet/vllm:current, python3, /burn, --seconds, "40"]
"""

RETURN = r"""
samples:
  description: SM clock readings (MHz) per GPU index.
  returned: always
  type: dict
  sample: {"0": [1980, 1500, 1410, 1485]}
verdicts:
  description: One line per GPU with its peak, median and the floor.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.sparkfleet.cluster.plugins.module_utils.gpu import clock_verdict, clocks_under_load


def main():
    module = AnsibleModule(
        argument_spec={
            "load": {"type": "list", "elements": "str", "required": True},
            "seconds": {"type": "float", "default": 6.0},
            "interval": {"type": "float", "default": 0.5},
            "min_mhz": {"type": "int", "default": 1500},
            "ready_marker": {"type": "str", "default": "gpu burn: loaded"},
            "ready_timeout": {"type": "float", "default": 180.0},
        },
        supports_check_mode=False,
    )
    params = module.params
    result = clocks_under_load(params["load"], params["seconds"], params["interval"],
                               ready_marker=params["ready_marker"], ready_timeout=params["ready_timeout"])
    if result["error"]:
        module.fail_json(msg=f"reading the clock failed during the load: {result['error']}", samples={})
    if not result["ready"]:
        module.fail_json(msg=f"the GPU load never got going (exit code {result['load_rc']}): expected "
                             f"{params['ready_marker']!r} within {params['ready_timeout']:g} s; its output: "
                             f"{result['load_output'][-800:]}", samples={})
    verdicts, failed = [], []
    for index, samples in sorted(result["samples"].items()):
        ok, message = clock_verdict(samples, params["min_mhz"])
        verdicts.append(f"GPU {index}: {message}")
        if not ok:
            failed.append(f"GPU {index}: {message}")
    if not result["samples"]:
        failed.append(clock_verdict([], params["min_mhz"])[1])
    samples = {str(index): values for index, values in result["samples"].items()}
    if failed:
        module.fail_json(msg="; ".join(failed), samples=samples, verdicts=verdicts)
    module.exit_json(changed=False, samples=samples, verdicts=verdicts)


if __name__ == "__main__":
    main()
