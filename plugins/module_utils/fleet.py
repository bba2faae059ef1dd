# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""A fleet: several serving groups behind one vllm-router.

A group is a whole sparkfleet cluster with an inventory of its own, converged, verified and upgraded by the
collection's playbooks as before; the fleet inventory names the groups' inventories and the router host. This
module is the fleet's pure logic, shared by the fleet preflight (what every group says of itself, checked across
the groups) and the membership agent on the router host (which group the router may send requests to):

* `check_fleet` - the problems of a fleet as a whole, one line each, before any host changes: a node in two
  groups, a fabric address or subnet two groups share, groups that serve different models or take different API
  keys (the router passes the client's key through to every group), a router no group lets in, a router port a
  group's node already uses.
* `membership` - the router's worker list from each head's own state: a group is a member exactly when its head
  says its current start was verified (the group agent's phase ``ready``) and no fleet upgrade holds it out; no
  other URL stays on the router.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils import errors

GROUP_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
# The per-node facts each group reports (the fleet's describe step), by key.
NODE_KEYS = ("host", "address", "fabric_address", "rank", "head", "api_port", "state_port", "master_port", "ports",
             "model", "api_key_sha256", "fabric_subnets", "router_addresses")
# The phase the head's group agent publishes once the current start's verification passed.
VERIFIED_PHASE = "ready"


def check_groups_spec(groups: Any, base: str = "sparkfleet_fleet_groups") -> list[str]:
    """What is wrong with the fleet inventory's list of groups: [{name, inventory}, ...], names unique."""
    fix = "list each group once, as {name: <a-z0-9_- name>, inventory: <path of the group's own inventory>}"
    if not isinstance(groups, list) or not groups:
        return [errors.line(f"{_shown(groups)}", "a non-empty list of groups", fix, base, "fleet")]
    problems, seen = [], {}
    for index, group in enumerate(groups):
        where = f"{base}[{index}]"
        if not isinstance(group, Mapping):
            problems.append(errors.line(f"a {type(group).__name__}", "a mapping with name and inventory", fix,
                                        where, "fleet"))
            continue
        unknown = sorted(set(group) - {"name", "inventory"})
        if unknown:
            problems.append(errors.line(f"the key(s) {', '.join(unknown)}", "name and inventory only", fix, where,
                                        "fleet"))
        name = group.get("name")
        if not isinstance(name, str) or not GROUP_NAME.match(name):
            problems.append(errors.line(f"name={_shown(name)}", "1-32 of a-z, 0-9, _ and -, starting with a letter "
                                        "or digit", fix, where, "fleet"))
        elif name in seen:
            problems.append(errors.line(f"the name {name} again (also {base}[{seen[name]}])", "each name once", fix,
                                        where, "fleet"))
        else:
            seen[name] = index
        if not isinstance(group.get("inventory"), str) or not group["inventory"].strip():
            problems.append(errors.line(f"inventory={_shown(group.get('inventory'))}", "the path of the group's "
                                        "inventory (relative paths from the fleet inventory's directory)", fix,
                                        where, "fleet"))
    return problems


def _port(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _networks(values: Iterable[Any]) -> list[ipaddress.IPv4Network]:
    found = []
    for value in values or ():
        try:
            found.append(ipaddress.ip_network(str(value), strict=False))
        except ValueError:
            continue  # the group's own preflight refuses it, with its key
    return found


def _allowed(address: str, sources: Iterable[Any]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in _networks(sources))


def check_fleet(groups: Mapping[str, list[Mapping[str, Any]]], router: Mapping[str, Any]) -> list[str]:
    """The problems of the fleet as a whole, one line each (the groups' own preflights check each group).

    `groups` maps a group's name to its nodes' facts (NODE_KEYS); `router` holds the router host's inventory name,
    its address and the ports it listens on (`port`, `metrics_port`). Addresses are compared as given: the caller
    reports every management address as the IPv4 address the node is reached on, never a name."""
    problems: list[str] = []
    owner: dict[str, str] = {}  # a management address -> the group holding it
    fabric: dict[str, str] = {}
    subnets: dict[ipaddress.IPv4Network, str] = {}
    heads: dict[str, Mapping[str, Any]] = {}
    for name, nodes in groups.items():
        group_heads = [node for node in nodes if node.get("head")]
        if len(group_heads) != 1:
            problems.append(errors.line(f"{len(group_heads)} heads", "exactly one node in the group's "
                                        "sparkfleet_head", "fix the group's inventory; its preflight says more",
                                        "sparkfleet_head", f"group {name}"))
        else:
            heads[name] = group_heads[0]
        for node in nodes:
            where = f"group {name}: {node.get('host')}"
            address = str(node.get("address"))
            if address in owner and owner[address] != name:
                problems.append(errors.line(f"{address}, a node of group {owner[address]} too", "every node in one "
                                            "group only (a node serves one rank of one group)", "take the node out "
                                            "of one of the two groups' inventories", "ansible_host", where))
            owner.setdefault(address, name)
            fabric_address = str(node.get("fabric_address"))
            if fabric_address in fabric and fabric[fabric_address] != name:
                problems.append(errors.line(f"{fabric_address}, the fabric address of a node of group "
                                            f"{fabric[fabric_address]}", "fabric addresses unique across the fleet",
                                            "give the group its own fabric subnets (sparkfleet_fabric_supernet or "
                                            "sparkfleet_fabric_subnets)", "sparkfleet_fabric_address", where))
            fabric.setdefault(fabric_address, name)
        for subnet in _networks({s for node in nodes for s in node.get("fabric_subnets") or ()}):
            clash = next((other for net, other in subnets.items() if other != name and net.overlaps(subnet)), None)
            if clash:
                problems.append(errors.line(f"{subnet}, overlapping a fabric subnet of group {clash}",
                                            "fabric subnets apart across the fleet (two groups on one switch would "
                                            "answer for each other's addresses)", "give each group its own "
                                            "sparkfleet_fabric_supernet", "sparkfleet_fabric_subnets", f"group {name}"))
            subnets.setdefault(subnet, name)
    for subnet, name in subnets.items():
        inside = sorted(address for address in [*owner, str(router.get("address"))] if _allowed(address, [subnet]))
        if inside:
            problems.append(errors.line(f"{subnet}, holding the management address(es) {', '.join(inside)}",
                                        "fabric subnets apart from every management address and the router's "
                                        "(else that traffic would take the fabric)", "give the group another "
                                        "sparkfleet_fabric_supernet", "sparkfleet_fabric_subnets", f"group {name}"))
    problems += _check_same(heads, "model", "sparkfleet_model_profile",
                            "the router sends any request to any group: every group serves the same model under "
                            "the same name", "serve one profile in every group, or run one fleet per model")
    problems += _check_same(heads, "api_key_sha256", "sparkfleet_api_key",
                            "the router passes the client's key through: every group takes the same key",
                            "give every group the same sparkfleet_api_key")
    problems += _check_router(groups, heads, router, owner)
    return problems


def _check_same(heads: Mapping[str, Mapping[str, Any]], key: str, setting: str, expected: str, fix: str) -> list[str]:
    values: dict[Any, list[str]] = {}
    for name, head in heads.items():
        values.setdefault(head.get(key), []).append(name)
    if len(values) <= 1:
        return []
    if key == "api_key_sha256":  # never the key, nor its hash: which groups agree is enough
        found = "; ".join(f"group(s) {', '.join(names)} one key" for names in values.values())
    else:
        found = "; ".join(f"{value} in group(s) {', '.join(names)}" for value, names in values.items())
    return [errors.line(found, expected, fix, setting, "fleet")]


def _check_router(groups: Mapping[str, list[Mapping[str, Any]]], heads: Mapping[str, Mapping[str, Any]],
                  router: Mapping[str, Any], owner: Mapping[str, str]) -> list[str]:
    problems = []
    where = f"router {router.get('host')}"
    address = str(router.get("address"))
    ports = {key: router.get(key) for key in ("port", "metrics_port")}
    if _port(ports["port"]) == _port(ports["metrics_port"]):
        problems.append(errors.line(f"{ports['port']}, router_port's too", "two ports", "set router_metrics_port "
                                    "to another port", "router_metrics_port", where))
    home = owner.get(address)
    if home:  # the router runs on a node of a group: its ports must be free there
        node = next(node for node in groups[home] if str(node.get("address")) == address)
        taken = {_port(port): "service ports" for port in node.get("ports") or ()}
        taken.update({_port(node.get(key)): key for key in ("api_port", "state_port", "master_port")})
        for key, port in ports.items():
            if _port(port) in taken and _port(port) is not None:
                problems.append(errors.line(f"{port}, the group's {taken[_port(port)]} on this node",
                                            "a port the node's rank does not use", f"set router_{key} to a free port",
                                            f"router_{key}", where))
    for name, head in heads.items():
        if home == name:
            continue  # a node of the group: the group's firewall lets its own nodes in
        if not _allowed(address, head.get("router_addresses")):
            problems.append(errors.line(f"{address} not among {list(head.get('router_addresses') or [])}",
                                        f"the router's address, let in to the head's API port {head.get('api_port')}"
                                        f" and its group agent's port {head.get('state_port')}", f"add {address} to "
                                        "the group's sparkfleet_router_addresses", "sparkfleet_router_addresses",
                                        f"group {name}"))
    return problems


def membership(states: Mapping[str, Any], held: Iterable[str], current: Iterable[str],
               urls: Mapping[str, str]) -> tuple[list[str], list[str], dict[str, str]]:
    """What the router's worker list must become: (URLs to add, URLs to remove, each group's reason).

    `states` is each group's head state (the group agent's GET /state; None, or anything but a mapping, when it
    did not answer), `held` the groups a fleet upgrade holds out, `current` the router's worker URLs, `urls` each
    group's worker URL. The fleet owns the router: a URL of the router's that is no group's (a group since
    dropped, a worker someone added through the router's open /add_worker) is removed too."""
    current = set(current)
    held = set(held)
    add, remove, why = [], [], {}
    for name in sorted(urls):
        url, state = urls[name], states.get(name)
        if name in held:
            member, why[name] = False, "held out by a fleet upgrade"
        elif not isinstance(state, Mapping):
            member, why[name] = False, "its head's group agent did not answer"
        elif state.get("phase") != VERIFIED_PHASE:
            member, why[name] = False, f"its head is {state.get('phase')} (epoch {state.get('epoch')})"
        else:
            member, why[name] = True, f"verified (epoch {state.get('epoch')})"
        if member and url not in current:
            add.append(url)
        elif not member and url in current:
            remove.append(url)
    remove += sorted(current - set(urls.values()))
    return add, remove, why
