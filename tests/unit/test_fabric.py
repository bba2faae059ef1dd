"""RoCE discovery on sysfs trees laid out like a GB10 node's (plugins/module_utils/fabric.py).

A GB10 has two QSFP cages; each shows as two PCIe functions ("twins"): netdevs enp1s0f0np0, enP2p1s0f0np0
(cage 0) and enp1s0f1np1, enP2p1s0f1np1 (cage 1), RoCE devices rocep1s0f0, roceP2p1s0f0, rocep1s0f1,
roceP2p1s0f1. GID tables hold link-local IPv6 GIDs (v1 and v2) and the IPv4-mapped ones; where they sit moves
with IPv6 address generation and reboots (seen 3, 3, 3, 4 across nodes, 5 behind a switch).
"""

import ipaddress

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils import fabric

TWINS = {  # RoCE device -> netdev
    "rocep1s0f0": "enp1s0f0np0", "roceP2p1s0f0": "enP2p1s0f0np0",
    "rocep1s0f1": "enp1s0f1np1", "roceP2p1s0f1": "enP2p1s0f1np1",
}


def write(root, path, text):
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text + "\n")


def mapped(ipv4):
    """The GID the kernel shows for an IPv4 address: ::ffff:a.b.c.d in eight groups of four hex digits."""
    raw = bytes(10) + b"\xff\xff" + ipaddress.IPv4Address(ipv4).packed
    return ":".join(f"{b:02x}{c:02x}" for b, c in zip(*[iter(raw)] * 2, strict=True))


def gb10(root, active=("rocep1s0f1", "roceP2p1s0f1"), addresses=None, ipv4_at=3, extra_link_locals=0):
    """A GB10 node: `active` ports up (cage 1 cabled by default), `addresses` {roce: ipv4} on their netdevs."""
    addresses = addresses if addresses is not None else {"rocep1s0f1": "192.168.100.10",
                                                         "roceP2p1s0f1": "192.168.101.10"}
    for number, (device, netdev) in enumerate(TWINS.items()):
        base = f"/sys/class/infiniband/{device}"
        write(root, f"{base}/device/net/{netdev}/ifindex", str(number + 2))
        up = device in active
        write(root, f"{base}/ports/1/state", "4: ACTIVE" if up else "1: DOWN")
        write(root, f"{base}/ports/1/phys_state", "5: LinkUp" if up else "3: Disabled")
        write(root, f"{base}/ports/1/link_layer", "Ethernet")
        net = f"/sys/class/net/{netdev}"
        write(root, f"{net}/operstate", "up" if up else "down")
        write(root, f"{net}/carrier", "1" if up else "0")
        write(root, f"{net}/mtu", "9000")
        write(root, f"{net}/address", f"4c:bb:47:2e:1a:{number:02x}")
        if up:
            write(root, f"{net}/speed", "200000")
        # GID table: the EUI-64 link-local (v1, v2), maybe stable-privacy extras, then the IPv4-mapped pair.
        gids = [(f"fe80:0000:0000:0000:4ebb:47ff:fe2e:1a{number:02x}", t) for t in ("IB/RoCE v1", "RoCE v2")]
        for extra in range(extra_link_locals):
            gids += [(f"fe80:0000:0000:0000:9a3c:{extra:04x}:11d2:7e{number:02x}", t)
                     for t in ("IB/RoCE v1", "RoCE v2")]
        if device in addresses:
            gids.insert(min(ipv4_at - 1, len(gids)), (mapped(addresses[device]), "IB/RoCE v1"))
            gids.insert(min(ipv4_at, len(gids)), (mapped(addresses[device]), "RoCE v2"))
        for index in range(16):
            gid, kind = gids[index] if index < len(gids) else (fabric.ZERO_GID, None)
            write(root, f"{base}/ports/1/gids/{index}", gid)
            if kind:  # an unused slot's type cannot be read (EINVAL): no file here
                write(root, f"{base}/ports/1/gid_attrs/types/{index}", kind)
                write(root, f"{base}/ports/1/gid_attrs/ndevs/{index}", netdev)
    return str(root)


def test_the_mapped_gid_looks_as_the_kernel_prints_it():
    assert mapped("192.168.100.10") == "0000:0000:0000:0000:0000:ffff:c0a8:640a"
    assert fabric.gid_ipv4("0000:0000:0000:0000:0000:ffff:c0a8:640a") == "192.168.100.10"
    assert fabric.gid_ipv4("fe80:0000:0000:0000:4ebb:47ff:fe2e:1a00") is None


def test_names_map_to_cages_and_twins():
    assert fabric.cage_of("enp1s0f1np1") == {"cage": 1, "twin": ""}
    assert fabric.cage_of("enP2p1s0f1np1") == {"cage": 1, "twin": "P2"}
    assert fabric.cage_of("enp1s0f0np0") == {"cage": 0, "twin": ""}
    assert fabric.cage_of("enP7s7") is None  # the management port


def test_four_devices_with_their_netdevs_cages_and_links(tmp_path):
    devices = {d["name"]: d for d in fabric.roce_devices(gb10(tmp_path))}
    assert sorted(devices) == sorted(TWINS)
    cabled = devices["roceP2p1s0f1"]
    assert (cabled["netdev"], cabled["cage"], cabled["twin"], cabled["state"], cabled["phys_state"]) == (
        "enP2p1s0f1np1", 1, "P2", "ACTIVE", "LinkUp")
    assert cabled["link"] == {"operstate": "up", "carrier": True, "mtu": 9000, "speed_mbps": 200000,
                              "mac": "4c:bb:47:2e:1a:03"}
    assert devices["rocep1s0f0"]["state"] == "DOWN" and devices["rocep1s0f0"]["link"]["speed_mbps"] is None


@pytest.mark.parametrize("ipv4_at, extra, expected", [(3, 0, 3), (4, 1, 4), (3, 2, 3), (7, 2, 7)])
def test_the_roce_v2_index_holding_the_address_is_found_wherever_it_sits(tmp_path, ipv4_at, extra, expected):
    root = gb10(tmp_path, ipv4_at=ipv4_at, extra_link_locals=extra)
    assert fabric.roce_v2_gid_index(root, "rocep1s0f1", "192.168.100.10") == expected
    # The v1 entry with the same address, one index lower, is not the one NCCL needs.
    table = {e["index"]: e for e in fabric.gid_table(root, "rocep1s0f1")}
    assert table[expected - 1]["ipv4"] == "192.168.100.10" and table[expected - 1]["type"] == "IB/RoCE v1"


def test_an_address_missing_from_the_table_is_a_clear_error(tmp_path):
    root = gb10(tmp_path)
    with pytest.raises(fabric.FabricError) as error:
        fabric.roce_v2_gid_index(root, "rocep1s0f1", "192.168.100.99")
    message = str(error.value)
    assert message.startswith("rocep1s0f1 port 1: found GIDs 0=")
    assert "2=192.168.100.10 (IB/RoCE v1), 3=192.168.100.10 (RoCE v2)" in message
    assert "expected a RoCE v2 GID holding 192.168.100.99; fix:" in message


def test_the_cabled_cage_is_the_one_with_an_active_port(tmp_path):
    assert sorted(fabric.cabled_cages(fabric.roce_devices(gb10(tmp_path)))) == [1]
    root = gb10(tmp_path / "cage0", active=("rocep1s0f0",), addresses={"rocep1s0f0": "10.0.0.1"})
    assert sorted(fabric.cabled_cages(fabric.roce_devices(root))) == [0]


def test_a_cable_in_the_other_cage_is_named(tmp_path):
    devices = fabric.roce_devices(gb10(tmp_path, active=("rocep1s0f0", "roceP2p1s0f0"), addresses={}))
    problems = fabric.check_rails("spark-b", devices, cages=[1], rails=1)
    assert len(problems) == 1
    assert problems[0].startswith("spark-b: cage 1: found every port down (rocep1s0f1 DOWN, roceP2p1s0f1 DOWN), "
                                  "cabled cage(s): [0]; expected the cable in cage 1 on every node")


def test_a_twin_down_breaks_dual_rail_only(tmp_path):
    devices = fabric.roce_devices(gb10(tmp_path, active=("rocep1s0f1",)))
    assert fabric.check_rails("spark-a", devices, cages=[1], rails=1) == []
    problems = fabric.check_rails("spark-a", devices, cages=[1], rails=2)
    assert problems == ["spark-a: cage 1: found twin roceP2p1s0f1 DOWN down while rocep1s0f1 is up; expected both "
                        "twins up for dual rail; fix: bring the twin's netdev up (ip link set <netdev> up), or use "
                        "one rail (sparkfleet_fabric_rails: 1)"]


def test_a_ring_node_uses_both_cages(tmp_path):
    devices = fabric.roce_devices(gb10(tmp_path, active=tuple(TWINS), addresses={}))
    assert fabric.check_rails("spark-c", devices, cages=[0, 1], rails=2) == []


def test_a_node_without_the_card_says_so(tmp_path):
    (tmp_path / "sys/class").mkdir(parents=True)
    problems = fabric.check_rails("lab-0", fabric.roce_devices(str(tmp_path)), cages=[1], rails=1)
    assert problems == ["lab-0: cage 1: found no RoCE device on it (devices: none); expected the ConnectX-7's "
                        "netdevs; fix: check that mlx5_core is loaded (ibdev2netdev)"]


# ------------------------------------------------------------------------------------------------ the plan

def addresses(plan, node):
    return [(i["cage"], i["twin"], f"{i['address']}/{i['prefix']}", [p["node"] for p in i["peers"]])
            for i in plan[node]]


def test_two_nodes_direct_dual_rail_one_subnet_per_twin():
    plan = fabric.plan(["a", "b"], "direct", rails=2)
    assert addresses(plan, "a") == [(1, "", "10.100.0.1/24", ["b"]), (1, "P2", "10.100.1.1/24", ["b"])]
    assert addresses(plan, "b") == [(1, "", "10.100.0.2/24", ["a"]), (1, "P2", "10.100.1.2/24", ["a"])]
    assert fabric.netdev_name(1, "") == "enp1s0f1np1" and fabric.netdev_name(0, "P2") == "enP2p1s0f0np0"


def test_pinned_addresses_keep_the_inventorys_subnet_on_rail_0():
    plan = fabric.plan(["a", "b"], "direct", rails=2, pinned={"a": "192.168.100.10", "b": "192.168.100.11"})
    assert addresses(plan, "b") == [(1, "", "192.168.100.11/24", ["a"]), (1, "P2", "10.100.1.2/24", ["a"])]
    assert plan["b"][0]["subnet"] == "192.168.100.0/24"


def test_a_triangle_has_a_subnet_per_cable_and_each_node_two_cages():
    plan = fabric.plan(["h", "w1", "w2"], "triangle")
    # head P0 -> w1 P1, w1 P0 -> w2 P1, w2 P0 -> head P1
    assert addresses(plan, "h") == [(0, "", "10.100.0.1/24", ["w1"]), (1, "", "10.100.2.1/24", ["w2"])]
    assert addresses(plan, "w1") == [(1, "", "10.100.0.2/24", ["h"]), (0, "", "10.100.1.2/24", ["w2"])]
    assert addresses(plan, "w2") == [(1, "", "10.100.1.3/24", ["w1"]), (0, "", "10.100.2.3/24", ["h"])]


def test_a_four_node_ring_dual_rail_uses_eight_subnets():
    plan = fabric.plan(["n0", "n1", "n2", "n3"], "ring", rails=2)
    subnets = {i["subnet"] for node in plan.values() for i in node}
    assert len(subnets) == 8 and all(len(plan[node]) == 4 for node in plan)
    assert addresses(plan, "n3")[2] == (0, "", "10.100.6.4/24", ["n0"])


def test_a_switch_puts_every_node_in_one_subnet():
    plan = fabric.plan(["a", "b", "c", "d"], "switch")
    assert addresses(plan, "c") == [(1, "", "10.100.0.3/24", ["a", "b", "d"])]


@pytest.mark.parametrize("nodes, topology, rails, supernet, pinned, message", [
    (["a", "b", "c"], "direct", 1, "10.100.0.0/16", None,
     "topology direct: found 3 nodes (a, b, c); expected 2 (two nodes, one cable between the same cage on both)"),
    (["a", "b", "c", "d", "e"], "switch", 1, "10.100.0.0/16", None, "expected 2 or 3 or 4"),
    (["a", "b"], "direct", 3, "10.100.0.0/16", None, "sparkfleet_fabric_rails: found 3; expected 1 or 2"),
    (["a", "b", "c", "d"], "ring", 2, "10.100.0.0/22", None,
     "found 10.100.0.0/22 (4 /24 subnets); expected room for 8 (one per cable and rail); fix: use a /21"),
    (["a", "b", "c"], "triangle", 1, "10.100.0.0/16", {"a": "10.1.1.1"},
     "found addresses pinned on a triangle; expected computed addresses"),
])
def test_bad_plans_are_refused_with_the_reason(nodes, topology, rails, supernet, pinned, message):
    with pytest.raises(fabric.FabricError) as error:
        fabric.plan(nodes, topology, rails=rails, supernet=supernet, pinned=pinned)
    assert message in str(error.value) and "fix:" in str(error.value)


def test_the_filter_plans_and_refuses_like_the_module_utils():
    from ansible.errors import AnsibleFilterError

    from ansible_collections.sparkfleet.cluster.plugins.filter.fabric import fabric_plan

    plan = fabric_plan(["a", "b"], "direct", pinned={"a": "192.168.100.10", "b": "192.168.100.11"}, prefix="24")
    assert plan["a"][0]["address"] == "192.168.100.10" and plan["a"][0]["peers"][0]["address"] == "192.168.100.11"
    with pytest.raises(AnsibleFilterError, match="found 'mesh'; expected one of direct, triangle, ring, switch"):
        fabric_plan(["a", "b"], "mesh")
    with pytest.raises(AnsibleFilterError, match="topology ring: found 2 nodes"):
        fabric_plan(["a", "b"], "ring")


def test_ip_addr_json_as_iproute2_prints_it():
    import json
    import os

    with open(os.path.join(os.path.dirname(__file__), "data", "fabric", "ip-addr-host.json"), encoding="utf-8") as f:
        entries = json.load(f)
    links = fabric.parse_ip_addr(entries)
    assert links["lo"] == {"mtu": 65536, "operstate": "unknown", "up": True, "ipv4": ["127.0.0.1/8"],
                           "ipv6": ["::1/128"]}
    assert fabric.interface_holding(links, "127.0.0.1") == "lo"
    assert fabric.interface_holding(links, "192.0.2.1") is None
    other = next(name for name in links if name != "lo")
    first = links[other]["ipv4"][0].split("/")[0]
    assert fabric.interface_holding(links, first) == other


def test_the_netplan_document_of_a_dual_rail_node():
    plan = fabric.plan(["a", "b"], "direct", rails=2)
    interfaces = [dict(i, netdev=fabric.netdev_name(i["cage"], i["twin"])) for i in plan["a"]]
    document = fabric.netplan_config(interfaces, "NetworkManager")
    # the renderer per device: a network-level key would become every other netplan file's default
    assert document == {"network": {"version": 2, "ethernets": {
        "enp1s0f1np1": {"renderer": "NetworkManager", "dhcp4": False, "dhcp6": False, "accept-ra": False,
                        "link-local": ["ipv6"], "ipv6-address-generation": "eui64", "mtu": 9000,
                        "addresses": ["10.100.0.1/24"]},
        "enP2p1s0f1np1": {"renderer": "NetworkManager", "dhcp4": False, "dhcp6": False, "accept-ra": False,
                          "link-local": ["ipv6"], "ipv6-address-generation": "eui64", "mtu": 9000,
                          "addresses": ["10.100.1.1/24"]}}}}
    assert "routes" not in str(document) and "gateway" not in str(document)


def test_netplan_refuses_an_unknown_renderer_and_two_mtus_on_one_netdev():
    with pytest.raises(fabric.FabricError, match="expected networkd or NetworkManager"):
        fabric.netplan_config([], "ifupdown")
    same = [{"netdev": "eth1", "address": "10.0.0.1", "prefix": 24, "mtu": 9000},
            {"netdev": "eth1", "address": "10.0.1.1", "prefix": 24, "mtu": 1500}]
    with pytest.raises(fabric.FabricError, match="eth1: found MTU 1500 and 9000 planned"):
        fabric.netplan_config(same)


# ------------------------------------------------------------------------------------------------ more of the plan

def test_explicit_subnets_replace_the_carved_ones_in_cable_order():
    plan = fabric.plan(["n0", "n1", "n2"], "triangle", subnets=["10.12.1.0/24", "10.23.1.0/24", "10.31.1.0/24"])
    assert addresses(plan, "n1") == [(1, "", "10.12.1.2/24", ["n0"]), (0, "", "10.23.1.2/24", ["n2"])]
    assert [i["netdev"] for i in plan["n1"]] == ["enp1s0f1np1", "enp1s0f0np0"]


@pytest.mark.parametrize("subnets, message", [
    (["10.1.0.0/24"], "found 1 subnet(s); expected 3 (one per cable and rail, in cable order)"),
    (["10.1.0.0/24", "10.1.0.0/25", "10.3.0.0/24"], "found 10.1.0.0/24 and 10.1.0.0/25 overlapping"),
    (["10.1.0.0/24", "10.2.0.0/31", "10.3.0.0/24"], "found 10.2.0.0/31, too small for 3 nodes"),
    (["10.1.0.1/24", "10.2.0.0/24", "10.3.0.0/24"], "found '10.1.0.1/24' (10.1.0.1/24 has host bits set)"),
])
def test_bad_explicit_subnets_are_refused(subnets, message):
    with pytest.raises(fabric.FabricError) as error:
        fabric.plan(["a", "b", "c"], "triangle", subnets=subnets)
    assert message in str(error.value) and "fix:" in str(error.value)


def test_pinned_addresses_must_cover_every_node_and_share_one_subnet():
    with pytest.raises(fabric.FabricError, match="b: sparkfleet_fabric_address: found none"):
        fabric.plan(["a", "b"], "switch", pinned={"a": "192.168.100.10"})
    with pytest.raises(fabric.FabricError) as error:
        fabric.plan(["a", "b"], "direct", pinned={"a": "192.168.100.10", "b": "192.168.101.11"})
    assert str(error.value).startswith("b: sparkfleet_fabric_address: found 192.168.101.11, outside 192.168.100.0/24")


def test_duplicates_overlaps_and_a_rendezvous_inside_a_mesh_are_named():
    plan = fabric.plan(["a", "b"], "switch", pinned={"a": "10.9.0.5", "b": "10.9.0.6"})
    plan["b"][0]["address"] = "10.9.0.5"
    assert fabric.duplicates(plan) == [
        "b enp1s0f1np1: found address 10.9.0.5, already planned on a enp1s0f1np1; expected one address per "
        "interface; fix: give each node and rail an address of its own"]
    clean = fabric.plan(["a", "b"], "direct")
    assert fabric.duplicates(clean) == [] and fabric.overlaps(clean, {"a": ["192.168.1.5/24"]}) == []
    assert fabric.overlaps(clean, {"b": ["10.100.0.77/16"]}) == [
        "b: enp1s0f1np1: found fabric subnet 10.100.0.0/24 overlapping 10.100.0.0/16 (the node's 10.100.0.77/16 on "
        "another interface); expected fabric subnets apart from every other network; fix: choose another "
        "sparkfleet_fabric_supernet or sparkfleet_fabric_subnets"]
    triangle = fabric.plan(["a", "b", "c"], "triangle")
    assert fabric.rendezvous_inside(triangle, {"a": "192.168.1.10", "b": "192.168.1.11"}, "triangle") == []
    assert fabric.rendezvous_inside(triangle, {"a": "10.100.2.1"}, "triangle")[0].startswith(
        "a: sparkfleet_fabric_address: found 10.100.2.1 inside the fabric subnet 10.100.2.0/24 of a triangle")
    assert fabric.rendezvous_inside(clean, {"a": "10.100.0.1"}, "direct") == []


def live_link(address, mtu=9000, up=True):
    return {"mtu": mtu, "operstate": "up" if up else "down", "up": up, "ipv4": [address], "ipv6": []}


def test_an_mtu_that_differs_between_the_two_ends_of_a_cable_is_named():
    plan = fabric.plan(["a", "b"], "direct")
    live = {"a": {"enp1s0f1np1": live_link("10.100.0.1/24")}, "b": {"enp1s0f1np1": live_link("10.100.0.2/24", 1500)}}
    assert fabric.mtu_mismatches("a", plan["a"], live) == [
        "a: enp1s0f1np1: found MTU 9000 here and 1500 on b (10.100.0.2); expected the same MTU at both ends of a "
        "cable; fix: set one sparkfleet_fabric_mtu for the cluster and converge every node"]
    live["b"]["enp1s0f1np1"]["mtu"] = 9000
    assert fabric.mtu_mismatches("a", plan["a"], live) == []


def test_what_is_not_in_effect_is_listed_with_the_speed_of_roce_ports(tmp_path):
    gb10(tmp_path, addresses={"rocep1s0f1": "10.100.0.1"})
    devices = fabric.roce_devices(str(tmp_path))
    expect = [dict(i, netdev=i["netdev"]) for i in fabric.plan(["a", "b"], "direct")["a"]]
    good = {"enp1s0f1np1": live_link("10.100.0.1/24")}
    assert fabric.unmet(good, devices, expect, speed_mbps=200000) == []
    assert fabric.unmet(good, devices, expect, speed_mbps=400000) == [
        "enp1s0f1np1 (rocep1s0f1): found speed 200000 Mb/s; expected 400000 Mb/s (a 200GbE ConnectX-7 link); fix: "
        "reseat or replace the cable (a passive DAC), check ethtool enp1s0f1np1"]
    bad = {"enp1s0f1np1": live_link("10.100.0.9/24", mtu=1500, up=False)}
    assert fabric.unmet(bad, [], expect) == [
        "enp1s0f1np1: found the link down; expected it up (carrier on the cable)",
        "enp1s0f1np1: found addresses 10.100.0.9/24; expected 10.100.0.1/24",
        "enp1s0f1np1: found MTU 1500; expected 9000"]
    assert fabric.unmet({}, [], expect) == ["enp1s0f1np1: found no such interface; expected it to carry 10.100.0.1"]


def test_hosts_name_each_peer_as_reached_from_the_node():
    direct = fabric.plan(["a", "b"], "direct", rails=2)
    assert fabric.hosts_entries(direct, "a") == ["10.100.0.1 a-fabric", "10.100.1.1 a-fabric-r1",
                                                 "10.100.0.2 b-fabric", "10.100.1.2 b-fabric-r1"]
    ring = fabric.plan(["n0", "n1", "n2", "n3"], "ring")
    # n0's neighbours only; the node across the ring shares no cable with it
    assert fabric.hosts_entries(ring, "n0") == ["10.100.0.2 n1-fabric", "10.100.3.4 n3-fabric"]


def test_the_firewall_table_fences_the_fabric_and_the_service_ports():
    plan = fabric.plan(["a", "b", "c"], "triangle")
    text = fabric.nft_ruleset(["enp1s0f0np0", "enp1s0f1np1"], sorted({i["subnet"] for n in plan.values() for i in n}),
                              ["192.168.1.10", "192.168.1.11", "192.168.1.12"], [29521, 873, 29531], 8888,
                              ["192.168.1.0/24"])
    lines = text.splitlines()
    # replaced atomically: created if missing, deleted, created again in one nft -f transaction
    assert lines[1:4] == ["table inet sparkfleet", "delete table inet sparkfleet", "table inet sparkfleet {"]
    assert "\t\telements = { 10.100.0.0/23, 10.100.2.0/24 }" in lines  # overlapping elements merged for nft
    assert "\t\telements = { 10.100.0.0/23, 10.100.2.0/24, 192.168.1.10/31, 192.168.1.12/32 }" in lines
    assert '\t\tiifname { "enp1s0f0np0", "enp1s0f1np1" } ip saddr != @fabric_nets counter drop' in lines
    assert "\t\ttcp dport { 873, 29521, 29531 } ip saddr != @cluster_sources counter drop" in lines
    assert "\t\ttcp dport 8888 ip saddr != @api_clients counter drop" in lines
    assert lines.index('\t\tiif "lo" accept') < lines.index("\t\ttcp dport 8888 ip saddr != @api_clients counter drop")
    no_api = fabric.nft_ruleset([], ["10.100.0.0/24"], [], [873], None, [])
    assert "api_clients" not in no_api and "iifname" not in no_api
    with pytest.raises(ValueError):
        fabric.nft_ruleset([], ["10.100.0.0/24"], [], [873], 8888, ["not-an-address"])


def test_a_fleets_router_reaches_the_api_and_the_group_agent_but_no_other_service_port():
    fenced = fabric.nft_ruleset([], ["10.100.0.0/24"], ["192.168.1.10", "192.168.1.11"], [29501, 873, 29530], 8888,
                                ["192.168.1.0/24"], state_port=29530)
    assert "state_clients" not in fenced  # no router: the group agent's port stays with the service ports
    assert "\t\ttcp dport { 873, 29501, 29530 } ip saddr != @cluster_sources counter drop" in fenced.splitlines()
    lines = fabric.nft_ruleset([], ["10.100.0.0/24"], ["192.168.1.10", "192.168.1.11"], [29501, 873, 29530], 8888,
                               ["192.168.1.0/24"], state_port=29530, router_sources=["172.16.0.5"]).splitlines()
    assert "\t\ttcp dport { 873, 29501 } ip saddr != @cluster_sources counter drop" in lines
    assert "\t\ttcp dport 29530 ip saddr != @state_clients counter drop" in lines
    state = lines[lines.index("\tset state_clients {") + 3]
    assert state == "\t\telements = { 10.100.0.0/24, 172.16.0.5/32, 192.168.1.10/31 }"
    api = lines[lines.index("\tset api_clients {") + 3]
    assert "172.16.0.5/32" in api and "192.168.1.0/24" in api
    with pytest.raises(ValueError):
        fabric.nft_ruleset([], ["10.100.0.0/24"], [], [29530], 8888, [], state_port=29530, router_sources=["x"])


def test_a_pinned_subnet_that_overlaps_a_carved_one_is_refused():
    with pytest.raises(fabric.FabricError, match=r"found 10\.100\.1\.0/24 and 10\.100\.1\.0/24 overlapping"):
        fabric.plan(["a", "b"], "direct", rails=2, pinned={"a": "10.100.1.10", "b": "10.100.1.11"})


def test_an_address_beside_the_planned_one_is_named_with_where_it_comes_from():
    expect = fabric.plan(["a", "b"], "direct")["a"]
    links = {"enp1s0f1np1": dict(live_link("10.100.0.1/24"), ipv4=["10.100.0.1/24", "192.168.100.10/24"])}
    assert fabric.unmet(links, [], expect) == [
        "enp1s0f1np1: found 192.168.100.10/24 besides 10.100.0.1/24; expected only the planned address(es); fix: "
        "remove the port's other configuration (an older netplan file such as 40-cx7.yaml, or a NetworkManager "
        "profile: nmcli -f NAME,DEVICE connection show)"]


@pytest.mark.parametrize("setting,size,expected", [
    ("auto", 2, "direct"), ("auto", 3, "triangle"), ("auto", 4, "ring"), ("auto", 5, "switch"), (None, 3, "triangle"),
    ("switch", 2, "switch"), ("ring", 4, "ring"),
])
def test_auto_resolves_by_node_count_and_a_setting_is_kept(setting, size, expected):
    from ansible_collections.sparkfleet.cluster.plugins.filter.fabric import fabric_topology
    assert fabric.resolved_topology(setting, size) == expected
    assert fabric_topology(setting, str(size)) == expected  # the filter, as Jinja hands it a count
