"""The fabric stage on labs cabled like a Spark triangle (3 nodes) and ring (4 nodes).

Each lab cable is a Docker network of its own between two nodes, and every fabric port comes up bare at each
boot (no address, MTU 1500), as a ConnectX-7 port does: only the fabric stage's netplan configuration, applied by
the real systemd-networkd, brings it back. The verification's don't-fragment pings run for real between the
nodes. (The two-node direct cable is the main lab's, converged by every site.yml test.)
"""

import ipaddress
import json
import os
import re
import subprocess

import pytest
import yaml
from conftest import ROOT, TOPOLOGIES, on_node, output, restart_node, run_playbook, wait_until

FABRIC = os.path.join(ROOT, "playbooks/fabric.yml")
# Each test runs on every topology's lab (the conftest's fabric_lab, shared with the node and runtime tests).
EVERY_TOPOLOGY = pytest.mark.parametrize("fabric_lab", sorted(TOPOLOGIES), indirect=True)


def hosts(lab):
    with open(lab["inventory"], encoding="utf-8") as handle:
        data = yaml.safe_load(handle)["all"]["children"]["sparkfleet_cluster"]
    return data["hosts"], data["vars"]


def cables(lab):
    """(node, cage) pairs of each cable and its subnet: node i's cage 0 to node i+1's cage 1."""
    nodes, cluster = hosts(lab)
    names = sorted(nodes)
    return [((names[i], 0), (names[(i + 1) % len(names)], 1), cluster["sparkfleet_fabric_subnets"][i])
            for i in range(len(names))]


def links(lab, node):
    return {link["ifname"]: link for link in json.loads(on_node(lab, node, "ip", "-j", "addr", "show").stdout)}


def expected_address(subnet, node):
    return str(ipaddress.ip_network(subnet).network_address + int(node.removeprefix("node")) + 1)


def assert_configured(lab):
    for a, b, subnet in cables(lab):
        for node, cage in (a, b):
            link = links(lab, node)[f"enp1s0f{cage}np{cage}"]
            addresses = [(i["local"], i["prefixlen"]) for i in link["addr_info"] if i["family"] == "inet"]
            assert addresses == [(expected_address(subnet, node), 24)], (node, link)
            assert link["mtu"] == 9000 and "UP" in link["flags"], (node, link)
            # EUI-64 link-local from the MAC: what keeps a ConnectX-7's RoCE GID indexes stable across reboots
            mac = bytes.fromhex(link["address"].replace(":", ""))
            eui = bytes([mac[0] ^ 2]) + mac[1:3] + b"\xff\xfe" + mac[3:]
            local = [i["local"] for i in link["addr_info"] if i["family"] == "inet6"]
            assert local == [str(ipaddress.ip_address(b"\xfe\x80" + bytes(6) + eui))], (node, local)


@EVERY_TOPOLOGY
def test_the_plan_is_printed_and_every_cable_is_configured_and_pinged(fabric_lab):
    said = " ".join(fabric_lab["converge"].split())
    assert f"fabric: {fabric_lab['topology']}, 1 rail(s)" in said
    for a, b, subnet in cables(fabric_lab):
        line = f"enp1s0f0np0 {expected_address(subnet, a[0])}/24 MTU 9000 -> {b[0]} {expected_address(subnet, b[0])}"
        assert line in said.split(f" {a[0]}: ", 1)[1], line
    assert_configured(fabric_lab)
    nodes, _cluster = hosts(fabric_lab)
    for node in nodes:
        # each node's own summary: two neighbours on a triangle and on a ring, one ping task each
        summary = re.search(rf"{node} \({fabric_lab['topology']}\): (.*?) bytes answered", said)
        assert summary and summary.group(1).endswith("2 unfragmented ping(s) of 8972"), node
        stat = on_node(fabric_lab, node, "stat", "-c", "%a %U", "/etc/netplan/40-sparkfleet-fabric.yaml").stdout
        assert stat.split() == ["600", "root"]
        netplan = yaml.safe_load(on_node(fabric_lab, node, "cat", "/etc/netplan/40-sparkfleet-fabric.yaml").stdout)
        for entry in netplan["network"]["ethernets"].values():
            assert entry["dhcp4"] is False and entry["ipv6-address-generation"] == "eui64"
            assert "routes" not in entry and "gateway4" not in entry


@EVERY_TOPOLOGY
def test_each_rank_gets_its_environment_with_sockets_on_the_management_network(fabric_lab):
    nodes, _cluster = hosts(fabric_lab)
    for node, values in nodes.items():
        assert on_node(fabric_lab, node, "stat", "-c", "%a", "/etc/sparkfleet/nccl.env").stdout.strip() == "600"
        text = on_node(fabric_lab, node, "cat", "/etc/sparkfleet/nccl.env").stdout
        env = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
        management = next(name for name, link in links(fabric_lab, node).items()
                          if any(i.get("local") == values["ansible_host"] for i in link["addr_info"]))
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == management
        assert env["VLLM_HOST_IP"] == values["sparkfleet_fabric_address"] == values["ansible_host"]
        # no RoCE device in the lab: NCCL over sockets; the core keys of docs/field-facts.md §5 everywhere
        assert env["NCCL_NET"] == "Socket" and env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in env
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_IGNORE_CPU_AFFINITY"] == "1"
        assert ("NCCL_MIN_NCHANNELS" in env) == (fabric_lab["topology"] == "ring")


@EVERY_TOPOLOGY
def test_hosts_name_each_neighbour_and_the_admin_logs_in_without_a_prompt(fabric_lab):
    for (node, _cage), (peer, _peer_cage), subnet in cables(fabric_lab):
        text = on_node(fabric_lab, node, "cat", "/etc/hosts").stdout
        assert f"{expected_address(subnet, peer)} {peer}-fabric" in text.splitlines()
        login = on_node(fabric_lab, node, "su", "-", "spark", "-c",
                        f"ssh -o BatchMode=yes -o ConnectTimeout=8 {peer}-fabric hostname")
        assert login.stdout.strip() == peer


@EVERY_TOPOLOGY
def test_service_ports_answer_the_cluster_only(fabric_lab):
    nodes, cluster = hosts(fabric_lab)
    port = 29521  # the tiny profile's master (rendezvous) port
    on_node(fabric_lab, "node1", "sh", "-c", f"timeout 60 python3 -m http.server {port} >/dev/null 2>&1 &")
    wait_until(lambda: on_node(fabric_lab, "node1", "sh", "-c", f"ss -Hltn 'sport = :{port}' | grep -q .",
                               check=False).returncode == 0, f"node1's test server to listen on {port}", stall=45)
    (a, _cage), (b, _peer_cage), subnet = cables(fabric_lab)[0]
    probe = f"import socket; socket.create_connection(('{expected_address(subnet, b)}', {port}), 5); print('ok')"
    assert on_node(fabric_lab, a, "python3", "-c", probe).stdout.strip() == "ok"
    # this machine is on the management network but not a node: its packets are dropped
    from_here = probe.replace(expected_address(subnet, b), nodes["node1"]["ansible_host"])
    outside = subprocess.run(["python3", "-c", from_here], capture_output=True, text=True, timeout=30, check=False)
    assert outside.returncode != 0 and "timed out" in outside.stderr
    table = on_node(fabric_lab, "node1", "nft", "list", "table", "inet", "sparkfleet").stdout
    assert f"tcp dport {{ 873, {port}, 29530, 29531 }} ip saddr != @cluster_sources counter" in table
    assert cluster["sparkfleet_api_allowed_sources"][0] in table


def restart_bare(lab, node):
    """Restart a node's container: its fabric ports come up bare, and only the stage's own configuration (netplan,
    applied by systemd-networkd at boot) brings them back."""
    restart_node(lab, node, stop_seconds=5)
    journal = on_node(lab, node, "journalctl", "-b", "-u", "sparkfleet-lab-cables", "--no-pager").stdout
    assert "is enp1s0f1np1, bare" in journal  # the port came up bare: what follows is the stage's own config


# One lab takes each: the triangle's a second run and a check run with zero changes, the ring's a restarted node
# beside a drifted one (every run there changes the drifted node alone). The main lab's converge has its own
# second run (molecule's idempotence step).
@pytest.mark.parametrize("fabric_lab", ["triangle"], indirect=True)
def test_a_second_run_changes_nothing_and_a_restarted_node_comes_back_the_same(fabric_lab, tmp_path):
    again = run_playbook(tmp_path / "again", FABRIC, inventory=fabric_lab["inventory"])
    assert again.status == "successful" and again.stats["changed"] == {}, output(again)[-4000:]
    restart_bare(fabric_lab, "node1")
    check = run_playbook(tmp_path / "check", FABRIC, inventory=fabric_lab["inventory"], cmdline="--check")
    text = " ".join(output(check).split())  # the YAML callback folds long messages
    assert check.status == "successful" and check.stats["changed"] == {}, text[-4000:]
    assert "unfragmented ping(s) of 8972 bytes answered" in text
    assert_configured(fabric_lab)


@pytest.mark.parametrize("fabric_lab", ["ring"], indirect=True)
def test_a_drifted_mtu_is_reported_in_check_mode_and_repaired_beside_a_restarted_node(fabric_lab, tmp_path):
    restart_bare(fabric_lab, "node1")
    on_node(fabric_lab, "node2", "ip", "link", "set", "enp1s0f0np0", "mtu", "1500")
    check = run_playbook(tmp_path / "check", FABRIC, inventory=fabric_lab["inventory"], cmdline="--check")
    text = " ".join(output(check).split())
    # the restarted node came back as configured: only the drifted one has something to change
    assert check.status == "successful" and check.stats["changed"] == {"node2": 1}, text[-4000:]
    assert "node2: enp1s0f0np0: found MTU 1500; expected 9000" in text
    repair = run_playbook(tmp_path / "repair", FABRIC, inventory=fabric_lab["inventory"])
    text = " ".join(output(repair).split())
    assert repair.status == "successful" and repair.stats["changed"] == {"node2": 1}, text[-4000:]
    assert "unfragmented ping(s) of 8972 bytes answered" in text
    assert_configured(fabric_lab)


@pytest.mark.parametrize("fabric_lab", ["ring"], indirect=True)
def test_a_failed_apply_puts_the_previous_configuration_back(fabric_lab, tmp_path):
    netplan = "/etc/netplan/40-sparkfleet-fabric.yaml"
    before = on_node(fabric_lab, "node0", "sha256sum", netplan).stdout
    # an apply that runs but never brings the new MTU up: the wait gives up, the old file is put back and applied
    failed = run_playbook(tmp_path / "fail", FABRIC, inventory=fabric_lab["inventory"],
                          extravars={"sparkfleet_fabric_mtu": 8000, "fabric_apply_command": "true",
                                     "fabric_apply_timeout": 4})
    text = " ".join(output(failed).split())
    assert failed.status == "failed", text[-3000:]
    assert f"node0: {netplan}: found the fabric configuration failing" in text
    assert "unmet: enp1s0f0np0: found MTU 9000; expected 8000" in text
    assert "the previous configuration was put back; fix: correct the cause above" in text
    assert on_node(fabric_lab, "node0", "sha256sum", netplan).stdout == before
    assert_configured(fabric_lab)
