#!/usr/bin/env python
"""Benchmark the weights fan-out on the local lab: ssh vs rsyncd, to 1 and to 3 peers.

Creates a 4-node lab of its own, generates a ~1 GiB random Llama checkpoint on the controller, places it on
the head once, then for each transport and peer count empties the peers' caches and runs the weights stage,
reading each peer's achieved rate from the stage's own results. Prints a table; asserts nothing.

    .venv/bin/python scripts/bench_fanout.py [--size-mib 1024] [--keep]

Figures are for this machine's Docker bridges and CPU (SSH's cipher and sha256 verification compete for the
same cores as the transfer), not for ConnectX-7: compare transports and peer counts, not absolute speeds.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

import ansible_runner
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB = "sparkfleet-bench"
CACHE = "/var/lib/sparkfleet-bench/hub"
PULL_TASK = "Wait for the pull, showing its progress"


def run(private_dir: str, playbook: str, extravars: dict, inventory: str | None = None):
    os.makedirs(private_dir, exist_ok=True)
    kwargs = dict(private_data_dir=private_dir, playbook=os.path.join(ROOT, playbook), quiet=True,
                  extravars=extravars, project_dir=ROOT,
                  envvars={"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "false"})
    if inventory:
        kwargs["inventory"] = inventory
    started = time.monotonic()
    result = ansible_runner.run(**kwargs)
    elapsed = time.monotonic() - started
    if result.status != "successful":
        sys.exit(f"{playbook} failed; see {private_dir}/artifacts")
    return result, elapsed


def generate(directory: str, size_mib: int) -> None:
    if os.path.isfile(os.path.join(directory, "SHA256SUMS")):
        return
    spec = importlib.util.spec_from_file_location("make_tiny_model", os.path.join(ROOT, "scripts/make_tiny_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(module.generate(directory, target_mib=size_mib)["summary"], flush=True)


def inventory_for(full_inventory: str, nodes: int, target: str) -> str:
    with open(full_inventory, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    cluster = data["all"]["children"]["sparkfleet_cluster"]
    cluster["hosts"] = {name: values for name, values in cluster["hosts"].items()
                        if values["sparkfleet_node_rank"] < nodes}
    cluster["vars"]["sparkfleet_tensor_parallel_size"] = nodes
    with open(target, "w", encoding="utf-8") as handle:
        yaml.safe_dump(data, handle)
    return target


def pulls(result) -> list[dict]:
    rates = []
    for event in result.events:
        data = event.get("event_data", {})
        if event["event"] == "runner_on_ok" and data.get("task") == PULL_TASK:
            res = data["res"]
            rates.append({"host": data["host"], "bytes": res["transferred_bytes"], "seconds": res["seconds"],
                          "rate": res["bytes_per_second"]})
    return sorted(rates, key=lambda r: r["host"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--keep", action="store_true", help="leave the bench lab running")
    args = parser.parse_args()
    # ansible-runner starts ansible-playbook from PATH: use the one beside this interpreter (the project's venv).
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

    work = tempfile.mkdtemp(prefix="sparkfleet-bench-")
    model = os.path.join(os.path.expanduser("~/.cache/sparkfleet/bench"), f"tiny-{args.size_mib}mib")
    generate(model, args.size_mib)
    lab_vars = {"lab_name": LAB, "lab_nodes": 4, "lab_inventory_dir": os.path.join(work, "inventory"),
                "lab_state_dir": os.path.join(work, "state")}
    _result, seconds = run(os.path.join(work, "lab"), "playbooks/lab.yml", lab_vars)
    print(f"lab of 4 nodes ready in {seconds:.0f} s", flush=True)
    full = os.path.join(work, "inventory", "hosts.yml")
    stage = {"model_weights_cache_dir": CACHE, "model_weights_upload_dir": model}
    try:
        _result, seconds = run(os.path.join(work, "seed"), "playbooks/weights.yml", stage,
                               inventory_for(full, 1, os.path.join(work, "head-only.yml")))
        print(f"checkpoint uploaded and placed on the head in {seconds:.0f} s", flush=True)
        rows = []
        for transport in ("ssh", "rsyncd"):
            for peers in (1, 3):
                for index in range(1, 4):
                    subprocess.run(["docker", "exec", f"{LAB}-node{index}", "rm", "-rf", CACHE], check=True)
                inventory = inventory_for(full, peers + 1, os.path.join(work, f"tp{peers + 1}.yml"))
                result, seconds = run(os.path.join(work, f"{transport}-{peers}"), "playbooks/weights.yml",
                                      dict(stage, model_weights_transport=transport), inventory)
                measured = pulls(result)
                total = sum(p["bytes"] for p in measured)
                slowest = max(p["seconds"] for p in measured)
                rows.append((transport, peers, measured, total / slowest, seconds))
                print(f"{transport:<7} {peers} peer(s): " + ", ".join(
                    f"{p['host']} {p['rate'] / 2**20:.0f} MiB/s" for p in measured), flush=True)
    finally:
        if not args.keep:
            run(os.path.join(work, "destroy"), "playbooks/lab.yml", dict(lab_vars, lab_state="absent"))

    print(f"\nfan-out of {args.size_mib} MiB from the head, per peer and aggregate (bytes / slowest pull)")
    print(f"{'transport':<10}{'peers':>6}  {'per peer MiB/s':<28}{'aggregate MiB/s':>16}{'stage s':>9}")
    for transport, peers, measured, aggregate, seconds in rows:
        per_peer = " ".join(f"{p['rate'] / 2**20:.0f}" for p in measured)
        print(f"{transport:<10}{peers:>6}  {per_peer:<28}{aggregate / 2**20:>16.0f}{seconds:>9.0f}")


if __name__ == "__main__":
    main()
