#!/usr/bin/env python
# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Run the gpu role's clock check on a real NVIDIA machine and print what nvidia-smi says (no Ansible needed).

  python3 scripts/gpu_probe.py [--min-mhz 1500] [--seconds 6] [--out DIR]

Saves nvidia-smi's query output, its full report and its version as samples (for the unit tests), then runs
the gpu role's load (roles/gpu/files/sparkfleet-gpu-burn) while sampling the SM clock with the same code the
role uses (plugins/module_utils/gpu.py), and prints the verdict. It reads; it never sets clocks or power.
"""

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "plugins", "module_utils"))

import gpu  # noqa: E402  (plain module: no Ansible import)


def save(out, name, argv):
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out:
        with open(os.path.join(out, name), "w", encoding="utf-8") as handle:
            handle.write(result.stdout)
    return result.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--min-mhz", type=int, default=1500)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    idle = save(args.out, "query-idle.csv", ["nvidia-smi", f"--query-gpu={','.join(gpu.QUERY_FIELDS)}", "--format=csv"])
    save(args.out, "nvidia-smi-q.txt", ["nvidia-smi", "-q"])
    save(args.out, "nvidia-smi-version.txt", ["nvidia-smi", "--version"])
    print("idle:", json.dumps(gpu.parse_query(idle)))
    burn = [sys.executable, os.path.join(ROOT, "roles/gpu/files/sparkfleet-gpu-burn"),
            "--seconds", str(args.seconds + 30)]
    result = gpu.clocks_under_load(burn, args.seconds)
    print(f"load (ready: {result['ready']}, rc {result['load_rc']}):", result["load_output"].strip())
    ok_all = True
    for index, samples in sorted(result["samples"].items()):
        ok, message = gpu.clock_verdict(samples, args.min_mhz)
        ok_all &= ok
        print(f"GPU {index}: {'PASS' if ok else 'FAIL'}: {message}; samples {samples}")
    ok, message = gpu.clock_verdict(max(result["samples"].values(), key=max, default=[]), 10 ** 6)
    print(f"an impossible floor (10^6 MHz) fails as it must: {not ok}: {message[:160]}")
    return 0 if ok_all and result["ready"] else 1


if __name__ == "__main__":
    sys.exit(main())
