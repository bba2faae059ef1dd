# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The ConnectX-7 fabric as the kernel shows it: RoCE devices, their netdevs, link state and GID tables.

Everything is read from sysfs below a root, so tests can point it at a tree laid out like a GB10 node's
(four netdevs - two QSFP cages, each seen as two PCIe functions, the "twins" - four RoCE devices, GID tables
holding IPv4-mapped RoCE v2 entries at indexes that differ between nodes and boots). Nothing is guessed: the
GID index NCCL needs is the one whose entry holds the node's IPv4 address with type RoCE v2.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.node import list_dir as _listdir
from ansible_collections.sparkfleet.cluster.plugins.module_utils.node import read_text

# enp1s0f1np1 / enP2p1s0f1np1: optional PCI domain, bus, slot, function (= the cage), port name.
NETDEV = re.compile(r"^en(?:P(?P<domain>\d+))?p(?P<bus>\d+)s(?P<slot>\d+)f(?P<function>\d+)(?:np(?P<port>\d+))?$")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


class FabricError(Exception):
    """What was found, what was expected, and what to do."""


def _read(root: str, path: str) -> str | None:
    """A sysfs value, stripped; None where it cannot be read (unused GID slots answer EINVAL, a down link has
    no speed)."""
    text = read_text(root, path)
    return text.strip() if text is not None else None


def cage_of(netdev: str) -> dict[str, Any] | None:
    """'enP2p1s0f1np1' -> {'cage': 1, 'twin': 'P2'}; None for names that are not PCIe function netdevs."""
    match = NETDEV.match(netdev)
    if not match:
        return None
    return {"cage": int(match.group("function")), "twin": f"P{match.group('domain')}" if match.group("domain") else ""}


def netdev_state(root: str, ifname: str) -> dict[str, Any]:
    base = f"/sys/class/net/{ifname}"
    speed = _read(root, f"{base}/speed")
    mtu = _read(root, f"{base}/mtu")
    return {
        "operstate": _read(root, f"{base}/operstate") or "unknown",
        "carrier": _read(root, f"{base}/carrier") == "1",
        "mtu": int(mtu) if mtu and mtu.isdigit() else None,
        # -1 or unreadable while the link is down
        "speed_mbps": int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
        "mac": _read(root, f"{base}/address"),
    }


def gid_ipv4(gid: str) -> str | None:
    """'0000:0000:0000:0000:0000:ffff:c0a8:640a' -> '192.168.100.10' (an IPv4-mapped GID), else None."""
    try:
        address = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    return str(address.ipv4_mapped) if address.ipv4_mapped else None


def gid_table(root: str, device: str, port: str = "1") -> list[dict[str, Any]]:
    """The used entries of a port's GID table: index, gid, type ('RoCE v2', 'IB/RoCE v1'), netdev, IPv4."""
    base = f"/sys/class/infiniband/{device}/ports/{port}"
    entries = []
    for name in sorted(_listdir(root, f"{base}/gids"), key=lambda n: int(n) if n.isdigit() else -1):
        gid = _read(root, f"{base}/gids/{name}")
        if not name.isdigit() or not gid or gid == ZERO_GID:
            continue
        entries.append({"index": int(name), "gid": gid, "type": _read(root, f"{base}/gid_attrs/types/{name}"),
                        "netdev": _read(root, f"{base}/gid_attrs/ndevs/{name}"), "ipv4": gid_ipv4(gid)})
    return entries


def roce_devices(root: str = "/") -> list[dict[str, Any]]:
    """Every RoCE device with its netdev, cage, twin, port state and the netdev's link."""
    devices = []
    for name in _listdir(root, "/sys/class/infiniband"):
        netdevs = _listdir(root, f"/sys/class/infiniband/{name}/device/net")
        for port in _listdir(root, f"/sys/class/infiniband/{name}/ports") or ["1"]:
            base = f"/sys/class/infiniband/{name}/ports/{port}"
            netdev = netdevs[0] if netdevs else None
            devices.append({
                "name": name,
                "port": port,
                "netdev": netdev,
                "cage": (cage_of(netdev) or {}).get("cage") if netdev else None,
                "twin": (cage_of(netdev) or {}).get("twin") if netdev else None,
                "state": (_read(root, f"{base}/state") or "").split(":")[-1].strip() or "unknown",
                "phys_state": (_read(root, f"{base}/phys_state") or "").split(":")[-1].strip() or "unknown",
                "link_layer": _read(root, f"{base}/link_layer") or "unknown",
                "link": netdev_state(root, netdev) if netdev else None,
            })
    return devices


def roce_v2_gid_index(root: str, device: str, ipv4: str, port: str = "1") -> int:
    """The index of the RoCE v2 GID that holds ``ipv4`` - what NCCL_IB_GID_INDEX must be on this node now."""
    table = gid_table(root, device, port)
    for entry in table:
        if entry["ipv4"] == ipv4 and (entry["type"] or "").lower() == "roce v2":
            return entry["index"]
    found = ", ".join(f"{e['index']}={e['ipv4'] or e['gid']} ({e['type']})" for e in table) or "no used entry"
    raise FabricError(
        f"{device} port {port}: found GIDs {found}; expected a RoCE v2 GID holding {ipv4}; fix: check that "
        f"{ipv4} is configured on the device's netdev and the link is up (ip -br addr), then read "
        f"/sys/class/infiniband/{device}/ports/{port}/gids again")


def cabled_cages(devices: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Cages with their twins' devices, for cages where any twin's port is ACTIVE (a cable is in)."""
    cages: dict[int, list[dict[str, Any]]] = {}
    for device in devices:
        if device["cage"] is not None:
            cages.setdefault(device["cage"], []).append(device)
    return {cage: sorted(members, key=lambda d: d["twin"]) for cage, members in sorted(cages.items())
            if any(member["state"] == "ACTIVE" for member in members)}


def check_rails(node: str, devices: list[dict[str, Any]], cages: list[int], rails: int) -> list[str]:
    """Problems with the cages a node must use: each cabled, and with ``rails`` == 2 both twins up."""
    problems = []
    by_cage: dict[int, list[dict[str, Any]]] = {}
    for device in devices:
        if device["cage"] is not None:
            by_cage.setdefault(device["cage"], []).append(device)
    active = sorted(cabled_cages(devices))
    for cage in cages:
        members = sorted(by_cage.get(cage, []), key=lambda d: d["twin"])
        if not members:
            problems.append(f"{node}: cage {cage}: found no RoCE device on it (devices: "
                            f"{', '.join(d['name'] for d in devices) or 'none'}); expected the ConnectX-7's "
                            "netdevs; fix: check that mlx5_core is loaded (ibdev2netdev)")
            continue
        up = [m for m in members if m["state"] == "ACTIVE"]
        if not up:
            problems.append(f"{node}: cage {cage}: found every port down "
                            f"({', '.join(m['name'] + ' ' + m['state'] for m in members)}), cabled cage(s): "
                            f"{active or 'none'}; expected the cable in cage {cage} on every node; fix: move the "
                            "cable, or set sparkfleet_fabric_cage to the cage that is cabled on all nodes")
        elif rails == 2 and len(up) < len(members):
            down = [m for m in members if m["state"] != "ACTIVE"]
            problems.append(f"{node}: cage {cage}: found twin {', '.join(d['name'] + ' ' + d['state'] for d in down)}"
                            f" down while {', '.join(m['name'] for m in up)} is up; expected both twins up for "
                            "dual rail; fix: bring the twin's netdev up (ip link set <netdev> up), or use one rail "
                            "(sparkfleet_fabric_rails: 1)")
    return problems


# ------------------------------------------------------------------------------------------------ the plan

TOPOLOGIES = {
    # name: (node counts it takes, description)
    "direct": ((2,), "two nodes, one cable between the same cage on both"),
    "triangle": ((3,), "three nodes, each cage 0 cabled to the next node's cage 1 (one subnet per link)"),
    "ring": ((4,), "four nodes in a ring, each cage 0 cabled to the next node's cage 1 (one subnet per link)"),
    "switch": ((2, 3, 4), "two to four nodes, each with the same cage cabled to one switch (one subnet)"),
}
RAIL_TWINS = ("", "P2")  # rail 0: the enp1s0... functions; rail 1: their twins enP2p1s0...


MESH_TOPOLOGIES = ("triangle", "ring")  # no address reaches every peer: ranks rendezvous on management addresses
TOPOLOGY_BY_SIZE = {2: "direct", 3: "triangle", 4: "ring"}


def resolved_topology(setting: str | None, size: int) -> str:
    """The topology as set, or for auto the one the node count cables (the fabric role's vars apply the same)."""
    setting = setting or "auto"
    return TOPOLOGY_BY_SIZE.get(size, "switch") if setting == "auto" else setting


def cables(nodes: list[str], topology: str, cage: int = 1) -> list[dict[str, Any]]:
    """The cables a topology has: [{ends: [(node, cage), (node, cage)]}], or one 'switch' cable for all."""
    if topology not in TOPOLOGIES:
        raise FabricError(f"sparkfleet_fabric_topology: found {topology!r}; expected one of "
                          f"{', '.join(TOPOLOGIES)}; fix: set the topology the nodes are cabled in")
    counts, _description = TOPOLOGIES[topology]
    if len(nodes) not in counts:
        raise FabricError(f"topology {topology}: found {len(nodes)} nodes ({', '.join(nodes)}); expected "
                          f"{' or '.join(map(str, counts))} ({TOPOLOGIES[topology][1]}); fix: choose the topology "
                          "that matches the cabling (sparkfleet_fabric_topology)")
    if topology == "direct":
        return [{"ends": [(nodes[0], cage), (nodes[1], cage)]}]
    if topology == "switch":
        return [{"ends": [(node, cage) for node in nodes]}]
    return [{"ends": [(node, 0), (nodes[(i + 1) % len(nodes)], 1)]} for i, node in enumerate(nodes)]


def plan(nodes: list[str], topology: str, rails: int = 1, supernet: str = "10.100.0.0/16", cage: int = 1,
         mtu: int = 9000, pinned: dict[str, str] | None = None, prefix: int = 24,
         subnets: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every node's fabric interfaces: one subnet per (cable, rail), host number = the node's place + 1.

    ``pinned`` {node: address} fixes the rail-0 address of a direct or switch fabric (the inventory's
    sparkfleet_fabric_address); its subnet (``prefix``) then replaces the computed one for rail 0.
    ``subnets`` names the subnet of each (cable, rail) in order (cable 0 rail 0, cable 0 rail 1, ...) instead
    of carving /24s from ``supernet``.
    Returns {node: [{cage, rail, twin, netdev, subnet, address, prefix, mtu, peers: [{node, address}]}]}.
    """
    if rails not in (1, 2):
        raise FabricError(f"sparkfleet_fabric_rails: found {rails}; expected 1 or 2 (2 addresses both twins of "
                          "each cabled cage); fix: set 1 or 2")
    links = cables(nodes, topology, cage)
    needed = len(links) * rails
    if subnets:
        networks = _explicit_subnets(subnets, needed, len(nodes))
    else:
        network = _network("sparkfleet_fabric_supernet", supernet)
        networks = list(network.subnets(new_prefix=24)) if network.prefixlen <= 24 else []
        if len(networks) < needed:
            raise FabricError(f"sparkfleet_fabric_supernet: found {supernet} ({len(networks)} /24 subnets); expected "
                              f"room for {needed} (one per cable and rail); fix: use a "
                              f"/{24 - (needed - 1).bit_length()} or larger private range")
    pinned = pinned or {}
    if pinned and topology not in ("direct", "switch"):
        raise FabricError(f"sparkfleet_fabric_address: found addresses pinned on a {topology}; expected computed "
                          f"addresses (a {topology} has one subnet per cable, so no one address reaches every peer); "
                          "fix: remove sparkfleet_fabric_address from the inventory")
    result: dict[str, list[dict[str, Any]]] = {node: [] for node in nodes}
    slots: list[ipaddress.IPv4Network] = []  # the subnet of each (cable, rail): no two may overlap
    for number, link in enumerate(links):
        for rail in range(rails):
            subnet = networks[number * rails + rail]
            length = subnet.prefixlen
            addresses = {node: str(subnet.network_address + nodes.index(node) + 1) for node, _cage in link["ends"]}
            if rail == 0 and pinned:
                subnet = _pinned_subnet(nodes, pinned, prefix)
                length = prefix
                addresses = {node: pinned[node] for node, _cage in link["ends"]}
            slots.append(subnet)
            for node, node_cage in link["ends"]:
                result[node].append({
                    "cage": node_cage, "rail": rail, "twin": RAIL_TWINS[rail],
                    "netdev": netdev_name(node_cage, RAIL_TWINS[rail]), "subnet": str(subnet),
                    "address": addresses[node], "prefix": length, "mtu": mtu,
                    "peers": [{"node": peer, "address": addresses[peer]}
                              for peer, _cage in link["ends"] if peer != node],
                })
    for i, one in enumerate(slots):
        for other in slots[i + 1:]:
            if one.overlaps(other):
                raise FabricError(f"fabric plan: found {one} and {other} overlapping (the pinned addresses' subnet "
                                  "and one carved for another cable or rail); expected one subnet of its own per "
                                  "cable and rail; fix: pin addresses outside sparkfleet_fabric_supernet, or choose "
                                  "another supernet")
    return result


def _pinned_subnet(nodes: list[str], pinned: dict[str, str], prefix: int) -> ipaddress.IPv4Network:
    """The one subnet every pinned rail-0 address must share (a direct cable or a switch is one L2 segment)."""
    missing = [node for node in nodes if not pinned.get(node)]
    if missing:
        raise FabricError(f"{', '.join(missing)}: sparkfleet_fabric_address: found none; expected an address on "
                          "every node or on none; fix: set it on every node, or remove it everywhere to use "
                          "computed addresses")
    subnet = ipaddress.IPv4Interface(f"{pinned[nodes[0]]}/{prefix}").network
    for node in nodes:
        if ipaddress.IPv4Address(pinned[node]) not in subnet:
            raise FabricError(f"{node}: sparkfleet_fabric_address: found {pinned[node]}, outside {subnet} (the "
                              f"subnet of {nodes[0]}'s {pinned[nodes[0]]}/{prefix}); expected every node in one "
                              "subnet on a direct cable or a switch; fix: correct the address or "
                              "sparkfleet_fabric_prefix")
    return subnet


def _network(key: str, text: str) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(str(text), strict=True)
    except ValueError as err:
        raise FabricError(f"{key}: found {text!r} ({err}); expected an IPv4 network such as 10.100.0.0/16 (host "
                          "bits zero); fix: correct it") from err


def _explicit_subnets(subnets: list[str], needed: int, hosts: int) -> list[ipaddress.IPv4Network]:
    networks = [_network("sparkfleet_fabric_subnets", text) for text in subnets]
    if len(networks) != needed:
        raise FabricError(f"sparkfleet_fabric_subnets: found {len(networks)} subnet(s); expected {needed} (one per "
                          "cable and rail, in cable order); fix: list one subnet per cable and rail, or remove the "
                          "key to carve them from sparkfleet_fabric_supernet")
    for i, one in enumerate(networks):
        for other in networks[i + 1:]:
            if one.overlaps(other):
                raise FabricError(f"sparkfleet_fabric_subnets: found {one} and {other} overlapping; expected one "
                                  "subnet of its own per cable and rail; fix: give each cable a separate subnet")
        if one.num_addresses - 2 < hosts:
            raise FabricError(f"sparkfleet_fabric_subnets: found {one}, too small for {hosts} nodes; expected room "
                              "for one address per node; fix: use a /24")
    return networks


def netdev_name(cage: int, twin: str) -> str:
    """The GB10 netdev of a cage and twin: (1, '') -> 'enp1s0f1np1', (1, 'P2') -> 'enP2p1s0f1np1'."""
    return f"en{twin}p1s0f{cage}np{cage}"


def parse_ip_addr(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``ip -j addr show`` -> {ifname: {mtu, operstate, up, ipv4: [a.b.c.d/len], ipv6: [...]}}."""
    links = {}
    for entry in entries:
        addresses = entry.get("addr_info") or []
        links[entry["ifname"]] = {
            "mtu": entry.get("mtu"),
            "operstate": str(entry.get("operstate", "UNKNOWN")).lower(),
            "up": "UP" in (entry.get("flags") or []),
            "ipv4": [f"{a['local']}/{a['prefixlen']}" for a in addresses if a.get("family") == "inet"],
            "ipv6": [f"{a['local']}/{a['prefixlen']}" for a in addresses if a.get("family") == "inet6"],
        }
    return links


def interface_holding(links: dict[str, dict[str, Any]], address: str) -> str | None:
    """The interface that has ``address`` (IPv4, without a prefix) configured, or None."""
    for name, link in links.items():
        if any(cidr.split("/")[0] == address for cidr in link["ipv4"]):
            return name
    return None


# ------------------------------------------------------------------------------------------------ netplan

def netplan_config(interfaces: list[dict[str, Any]], renderer: str = "networkd") -> dict[str, Any]:
    """The netplan document for a node's fabric interfaces (each with netdev, address, prefix, mtu).

    No DHCP, no routes (the fabric never carries the default route), IPv6 link-local kept with EUI-64 address
    generation: stable-privacy adds a second link-local after a reboot and moves the IPv4-mapped RoCE GIDs to
    other indexes.
    """
    if renderer not in ("networkd", "NetworkManager"):
        raise FabricError(f"netplan renderer: found {renderer!r}; expected networkd or NetworkManager")
    ethernets: dict[str, Any] = {}
    for interface in interfaces:
        entry = ethernets.setdefault(interface["netdev"], {
            "renderer": renderer, "dhcp4": False, "dhcp6": False, "accept-ra": False, "link-local": ["ipv6"],
            "ipv6-address-generation": "eui64", "mtu": interface["mtu"], "addresses": []})
        if entry["mtu"] != interface["mtu"]:
            raise FabricError(f"{interface['netdev']}: found MTU {interface['mtu']} and {entry['mtu']} planned; "
                              "expected one MTU per interface")
        entry["addresses"].append(f"{interface['address']}/{interface['prefix']}")
    # The renderer per device: a network-level one would become the default of every other netplan file
    # (a management port without its own renderer would change backend on the next apply).
    return {"network": {"version": 2, "ethernets": ethernets}}


# ------------------------------------------------------------------------------------------------ checks

def overlaps(fabric_plan: dict[str, list[dict[str, Any]]], others: dict[str, list[str]]) -> list[str]:
    """Fabric subnets that overlap a node's other networks (``others``: {node: [cidr of its non-fabric
    addresses]}) - traffic for a peer would leave through the management port."""
    problems = []
    for node, interfaces in fabric_plan.items():
        for cidr in others.get(node, []):
            network = ipaddress.IPv4Interface(cidr).network
            for interface in interfaces:
                if network.overlaps(ipaddress.IPv4Network(interface["subnet"])):
                    problems.append(f"{node}: {interface['netdev']}: found fabric subnet {interface['subnet']} "
                                    f"overlapping {network} (the node's {cidr} on another interface); expected "
                                    "fabric subnets apart from every other network; fix: choose another "
                                    "sparkfleet_fabric_supernet or sparkfleet_fabric_subnets")
    return problems


def duplicates(fabric_plan: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Addresses planned twice (pinned addresses or explicit subnets can collide)."""
    seen: dict[str, str] = {}
    problems = []
    for node, interfaces in sorted(fabric_plan.items()):
        for interface in interfaces:
            where = f"{node} {interface['netdev']}"
            if interface["address"] in seen:
                problems.append(f"{where}: found address {interface['address']}, already planned on "
                                f"{seen[interface['address']]}; expected one address per interface; fix: give "
                                "each node and rail an address of its own")
            seen.setdefault(interface["address"], where)
    return problems


def rendezvous_inside(fabric_plan: dict[str, list[dict[str, Any]]], rendezvous: dict[str, str],
                      topology: str) -> list[str]:
    """On a triangle or ring no fabric address reaches every peer, so the ranks' rendezvous address (the
    inventory's sparkfleet_fabric_address) must be the management address, outside every fabric subnet."""
    if topology not in ("triangle", "ring"):
        return []
    subnets = sorted({i["subnet"] for interfaces in fabric_plan.values() for i in interfaces})
    problems = []
    for node, address in sorted(rendezvous.items()):
        inside = [s for s in subnets if ipaddress.IPv4Address(str(address)) in ipaddress.IPv4Network(s)]
        if inside:
            problems.append(f"{node}: sparkfleet_fabric_address: found {address} inside the fabric subnet "
                            f"{inside[0]} of a {topology}; expected the node's management address (no fabric "
                            "address reaches every peer, so ranks rendezvous on the management network); fix: set "
                            "sparkfleet_fabric_address to the management address")
    return problems


def mtu_mismatches(node: str, interfaces: list[dict[str, Any]],
                   live: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Links whose MTU differs between this node and a peer's end of the same cable (``live``: {node: links
    from fabric_facts}); a jumbo frame from one end is dropped by the other."""
    problems = []
    for interface in interfaces:
        mine = (live.get(node, {}).get(interface["netdev"]) or {}).get("mtu")
        for peer in interface["peers"]:
            peer_links = live.get(peer["node"], {})
            theirs = next((link.get("mtu") for link in peer_links.values()
                           if any(cidr.split("/")[0] == peer["address"] for cidr in link.get("ipv4", []))), None)
            if mine is not None and theirs is not None and mine != theirs:
                problems.append(f"{node}: {interface['netdev']}: found MTU {mine} here and {theirs} on "
                                f"{peer['node']} ({peer['address']}); expected the same MTU at both ends of a "
                                "cable; fix: set one sparkfleet_fabric_mtu for the cluster and converge every node")
    return problems


def unmet(links: dict[str, dict[str, Any]], devices: list[dict[str, Any]], expect: list[dict[str, Any]],
          speed_mbps: int = 0) -> list[str]:
    """What differs between the live links and the planned interfaces (netdev, address, prefix, mtu): link
    down, address missing, MTU, and on RoCE netdevs the speed. Empty when all is in effect."""
    by_netdev = {device["netdev"]: device for device in devices if device.get("netdev")}
    problems = []
    for interface in expect:
        name = interface["netdev"]
        link = links.get(name)
        if link is None:
            problems.append(f"{name}: found no such interface; expected it to carry {interface['address']}")
            continue
        if not link["up"] or link["operstate"] == "down":
            problems.append(f"{name}: found the link {link['operstate']}; expected it up (carrier on the cable)")
        cidr = f"{interface['address']}/{interface['prefix']}"
        planned = {f"{i['address']}/{i['prefix']}" for i in expect if i["netdev"] == name}
        if cidr not in link["ipv4"]:
            problems.append(f"{name}: found addresses {', '.join(link['ipv4']) or 'none'}; expected {cidr}")
        elif set(link["ipv4"]) - planned and interface is next(i for i in expect if i["netdev"] == name):
            extra = ", ".join(sorted(set(link["ipv4"]) - planned))
            problems.append(f"{name}: found {extra} besides {', '.join(sorted(planned))}; expected only the planned "
                            "address(es); fix: remove the port's other configuration (an older netplan file such "
                            "as 40-cx7.yaml, or a NetworkManager profile: nmcli -f NAME,DEVICE connection show)")
        if link["mtu"] != interface["mtu"]:
            problems.append(f"{name}: found MTU {link['mtu']}; expected {interface['mtu']}")
        device = by_netdev.get(name)
        speed = (device.get("link") or {}).get("speed_mbps") if device else None
        if device and speed_mbps and speed != speed_mbps:
            problems.append(f"{name} ({device['name']}): found speed {speed or 'unknown'} Mb/s; expected "
                            f"{speed_mbps} Mb/s (a 200GbE ConnectX-7 link); fix: reseat or replace the cable (a "
                            f"passive DAC), check ethtool {name}")
    return problems


# ------------------------------------------------------------------------------------------------ host files

def hosts_entries(fabric_plan: dict[str, list[dict[str, Any]]], node: str) -> list[str]:
    """/etc/hosts lines for ``node``: each peer's address as reached from here, and on a direct cable or switch
    its own (<name>-fabric for rail 0, <name>-fabric-r1 for rail 1; a ring's far node has none)."""
    lines = []
    interfaces = fabric_plan.get(node, [])
    for interface in interfaces:
        suffix = "-fabric" if interface["rail"] == 0 else f"-fabric-r{interface['rail']}"
        # a node of a triangle or ring has one address per cable: no one of them is "its" fabric name
        own = sum(1 for i in interfaces if i["rail"] == interface["rail"]) == 1
        names = [(interface["address"], f"{node}{suffix}")] if own else []
        names += [(peer["address"], f"{peer['node']}{suffix}") for peer in interface["peers"]]
        lines += [f"{address} {name}" for address, name in names]
    return sorted(dict.fromkeys(lines), key=lambda line: (line.split()[1], line))


def nft_ruleset(netdevs: list[str], fabric_subnets: list[str], cluster_sources: list[str],
                service_ports: list[int], api_port: int | None, api_sources: list[str],
                watch_ports: list[int] | None = None, watch_sources: list[str] | None = None,
                state_port: int | None = None, router_sources: list[str] | None = None) -> str:
    """The sparkfleet nftables table, replaced atomically when loaded with nft -f.

    - On the fabric interfaces only the fabric subnets are accepted (NCCL, Gloo and RDMA-CM traffic).
    - The service ports (rendezvous, rsync daemon) accept only the fabric subnets and the cluster's nodes.
    - The API port accepts only the listed clients and the cluster's nodes; loopback is always accepted.
    - The monitoring ports (Prometheus, the node exporter) accept only the monitor hosts and the listed sources.
    - The routers of a fleet (router_sources) reach the API port and the group agent's port (state_port, one of
      the service ports), which otherwise only the cluster reaches.
    Everything else keeps the host's own policy (the chain's policy is accept).
    """
    watch_ports, watch_sources = list(watch_ports or []), list(watch_sources or [])
    router_sources = list(router_sources or [])
    opened = state_port if router_sources and state_port in service_ports else None
    for cidr in [*fabric_subnets, *cluster_sources, *api_sources, *watch_sources, *router_sources]:
        ipaddress.IPv4Network(cidr, strict=False)  # refuse anything nft would choke on

    def elements(cidrs: list[str]) -> str:
        unique = sorted({str(ipaddress.IPv4Network(c, strict=False)) for c in cidrs},
                        key=ipaddress.IPv4Network)
        return ", ".join(_collapse(unique))

    lines = [
        "# sparkfleet fabric firewall (written by the fabric role; loaded by sparkfleet-firewall.service)",
        "table inet sparkfleet",
        "delete table inet sparkfleet",
        "table inet sparkfleet {",
        "	set fabric_nets {", "		type ipv4_addr", "		flags interval",
        f"		elements = {{ {elements(fabric_subnets)} }}", "	}",
        "	set cluster_sources {", "		type ipv4_addr", "		flags interval",
        f"		elements = {{ {elements([*fabric_subnets, *cluster_sources])} }}", "	}",
    ]
    if api_port:
        lines += ["	set api_clients {", "		type ipv4_addr", "		flags interval",
                  f"		elements = {{ {elements([*api_sources, *cluster_sources, *router_sources])} }}", "	}"]
    if opened:
        lines += ["	set state_clients {", "		type ipv4_addr", "		flags interval",
                  f"		elements = {{ {elements([*fabric_subnets, *cluster_sources, *router_sources])} }}", "	}"]
    if watch_ports:
        # an empty set is legal in nft, an empty element list is not
        members = f"		elements = {{ {elements(watch_sources)} }}" if watch_sources else ""
        lines += ["	set watch_clients {", "		type ipv4_addr", "		flags interval",
                  *([members] if members else []), "	}"]
    lines += ["	chain input {", "		type filter hook input priority filter - 5; policy accept;",
              '		iif "lo" accept']
    if netdevs:
        names = ", ".join(f'"{name}"' for name in netdevs)
        lines.append(f"		iifname {{ {names} }} ip saddr != @fabric_nets counter drop")
    closed = sorted(set(service_ports) - {opened})
    if closed:
        ports = ", ".join(str(port) for port in closed)
        lines += [f"		tcp dport {{ {ports} }} ip saddr != @cluster_sources counter drop",
                  f"		tcp dport {{ {ports} }} meta nfproto ipv6 counter drop"]
    if opened:
        lines += [f"		tcp dport {opened} ip saddr != @state_clients counter drop",
                  f"		tcp dport {opened} meta nfproto ipv6 counter drop"]
    if api_port:
        lines += [f"		tcp dport {api_port} ip saddr != @api_clients counter drop",
                  f"		tcp dport {api_port} meta nfproto ipv6 counter drop"]
    if watch_ports:
        ports = ", ".join(str(port) for port in sorted(set(watch_ports)))
        lines += [f"		tcp dport {{ {ports} }} ip saddr != @watch_clients counter drop",
                  f"		tcp dport {{ {ports} }} meta nfproto ipv6 counter drop"]
    lines += ["	}", "}"]
    return "\n".join(lines) + "\n"


def _collapse(cidrs: list[str]) -> list[str]:
    """nft refuses overlapping interval elements: merge them first."""
    return [str(net) for net in ipaddress.collapse_addresses(ipaddress.IPv4Network(c) for c in cidrs)]
