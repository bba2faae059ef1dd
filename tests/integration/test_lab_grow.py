"""A lab grows to three nodes, a converge of the stages it re-plans takes the new node in, and the lab shrinks
back. Runs on the second 2-node lab after the weights tests (its inventory says TP3 while it is grown); the serving
lab is not disturbed."""

import os
import subprocess
from pathlib import Path

from conftest import ROOT, on_node, output, run_playbook


def test_lab_grows_to_three_nodes_and_shrinks_back(weights_lab, tmp_path):
    lab = weights_lab
    playbook = os.path.join(ROOT, "playbooks/lab.yml")
    # (Nothing serves on this lab: a serving TP2 group would be stopped first, as when re-cabling a cluster.)
    assert on_node(lab, "node0", "systemctl", "is-active", "sparkfleet-vllm.service", check=False).returncode != 0
    # (new networks, from this lab's own subnet range: another worker may be making a lab meanwhile)
    grown = run_playbook(tmp_path / "grow", playbook, extravars=dict(lab["extravars"], lab_nodes=3))
    assert grown.status == "successful", output(grown)[-4000:]
    text = Path(lab["inventory"]).read_text()
    assert "node2:" in text and "sparkfleet_tensor_parallel_size: 3" in text
    # The new node is planned, cabled and given the weights: the stages whose plan the third node changes (the
    # preflight's, the fabric's cables and the weights' fan-out). The node stage is each node's own, the same on
    # node2 as on the others (test_node runs it on a 3-node lab); the image stage installs the same venv on node2
    # and serving three CPU ranks costs minutes on a 2-core machine: test_serve covers both (TP2), and the lab's
    # model splits over 3 ranks too (TP3 served by hand: 131,072 tokens, as planned). Nor does it watch: the watch
    # stage installs the same packages on node2 as on the serving lab's nodes (test_serve).
    site = run_playbook(tmp_path / "site", os.path.join(ROOT, "site.yml"), inventory=lab["inventory"],
                        cmdline="--tags preflight,fabric,weights")
    assert site.status == "successful", output(site)[-4000:]
    assert set(site.stats["ok"]) == {"node0", "node1", "node2"}
    assert on_node(lab, "node2", "test", "-s", "/var/lib/sparkfleet/hf/hub/models--sparkfleet--tiny-cpu/"
                   ".sparkfleet-verified.json", check=False).returncode == 0  # the weights reached the new node

    shrunk = run_playbook(tmp_path / "shrink", playbook, extravars=lab["extravars"])
    assert shrunk.status == "successful", output(shrunk)[-4000:]
    assert "node2:" not in Path(lab["inventory"]).read_text()
    containers = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
                                check=True).stdout.split()
    prefix = lab["extravars"]["lab_name"]
    assert f"{prefix}-node0" in containers and f"{prefix}-node1" in containers
    assert f"{prefix}-node2" not in containers
