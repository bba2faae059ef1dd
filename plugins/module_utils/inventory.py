# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Cross-host validation of a sparkfleet inventory.

Pure Python: the cluster_validate action plugin feeds it the hosts' variables and the roles' argument
specs; the unit tests feed it plain dicts. Every problem becomes one line that names where it was found
(host or group), the key, what was found, what was expected and what to do.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.common.validation import check_type_bool

from ansible_collections.sparkfleet.cluster.plugins.module_utils import (
    errors,
    fabric,
    input_rules,
    kv_capacity,
    tp_padding,
    weights,
)

CLUSTER_GROUP = "sparkfleet_cluster"
HEAD_GROUP = "sparkfleet_head"
CLUSTER_PREFIX = "sparkfleet_"

# Entry points of roles/preflight/meta/argument_specs.yml that describe the inventory itself.
CLUSTER_ENTRY = "cluster"  # one value for the whole cluster, identical on every node
NODE_ENTRY = "node"  # one value per node


@dataclass(frozen=True)
class Problem:
    where: str
    key: str
    found: str
    expected: str
    fix: str

    def line(self) -> str:
        return errors.line(self.found, self.expected, self.fix, self.key, self.where)


def documented_keys(role_specs: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Every option of every entry point of every role: the names a user may set."""
    keys: set[str] = set()
    for spec in role_specs.values():
        for entry in (spec or {}).values():
            keys.update((entry or {}).get("options") or {})
    return keys


def checked_prefixes(role_names: Iterable[str]) -> tuple[str, ...]:
    """Variable prefixes that belong to this collection: ours and one per role."""
    return (CLUSTER_PREFIX, *sorted(f"{name}_" for name in role_names))


def unknown_keys(host: str, names: Iterable[str], known: set[str], prefixes: tuple[str, ...]) -> list[Problem]:
    """Names that look like ours (by prefix) but are documented nowhere: typos, or keys of a newer release."""
    problems = []
    for name in sorted(names):
        if name in known or not name.startswith(prefixes):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        fix = (f"rename it to {close[0]}" if close
               else "remove it, or see the roles' meta/argument_specs.yml for the keys that exist")
        problems.append(Problem(host, name, "an unknown key", "only documented keys with this prefix", fix))
    return problems


def _type_name(option: Mapping[str, Any]) -> str:
    kind = option.get("type", "str")
    if kind == "list" and option.get("elements"):
        kind = f"list of {option['elements']}"
    if option.get("choices"):
        kind += " (one of " + ", ".join(map(str, option["choices"])) + ")"
    return kind


Validator = Callable[[Mapping[str, Any], Mapping[str, Any]], "tuple[list[str], Mapping[str, Any]]"]


def check_options(where: str, values: Mapping[str, Any], options: Mapping[str, Mapping[str, Any]],
                  validate: Validator,
                  context: input_rules.Context | None = None) -> tuple[list[Problem], dict[str, Any]]:
    """Type, choice, presence and bounds (input_rules) of each documented option, one key at a time so each
    line names its key.

    `validate(spec, params)` returns (errors, converted params); the action plugin passes Ansible's own
    argument validator so conversions match what the roles will see. Returns the problems and the
    converted values, defaults filled in.
    """
    problems = []
    clean: dict[str, Any] = {}
    context = context or input_rules.Context()
    for key, option in sorted(options.items()):
        if key not in values:
            if option.get("required"):
                problems.append(Problem(where, key, "nothing", f"a {_type_name(option)}: {_first_line(option)}",
                                        f"set {key} in the inventory (see inventory/examples/spark2)"))
            elif "default" in option:
                clean[key] = option["default"]
            continue
        found = shown(values[key], option)
        failures, converted = validate({key: dict(option, required=False)}, {key: values[key]})
        if failures:
            problems.append(Problem(where, key, found, f"a {_type_name(option)}",
                                    f"correct {key}: {_first_line(option)}"))
            continue
        expected = input_rules.check(key, converted[key], context)
        if expected:
            problems.append(Problem(where, key, input_rules.found(key, converted[key]) or found, expected,
                                    f"correct {key}: {_first_line(option)}"))
        else:
            clean[key] = converted[key]
    return problems, clean


def shown(value: Any, option: Mapping[str, Any]) -> str:
    """How a found value is quoted in a message: a secret (no_log) only by its shape, never its text."""
    if not option.get("no_log"):
        return repr(value)
    if not isinstance(value, str):
        return f"a secret of type {type(value).__name__}"
    if not value:
        return "an empty secret"
    odd = [name for name, present in (("a line break", "\n" in value or "\r" in value),
                                      ("a space", " " in value or "\t" in value),
                                      ("a non-ASCII character", any(ord(c) > 126 for c in value))) if present]
    size = f"{len(value)} character" + ("" if len(value) == 1 else "s")
    return f"a secret of {size}" + (f" with {' and '.join(odd)}" if odd else "")


def check_role_variables(hosts: Mapping[str, Mapping[str, Any]], role_specs: Mapping[str, Mapping[str, Any]],
                         validate: Validator, context: input_rules.Context) -> list[Problem]:
    """Every role variable the inventory sets: its argument_specs type, then its bounds (input_rules).

    Checked here, on the controller, so that a bad value stops the run before the first host is changed
    rather than when its role is reached. The preflight role's own inventory entries are checked apart."""
    options: dict[str, Mapping[str, Any]] = {}
    for role, spec in sorted(role_specs.items()):
        for entry, body in sorted((spec or {}).items(), key=lambda item: item[0] != "main"):
            if role == "preflight" and entry in (CLUSTER_ENTRY, NODE_ENTRY):
                continue
            for key, option in ((body or {}).get("options") or {}).items():
                options.setdefault(key, option)
    problems = []
    for host in sorted(hosts):
        values = {key: value for key, value in hosts[host].items() if key in options}
        found, _clean = check_options(host, values, {key: options[key] for key in values}, validate, context)
        problems += found
    return problems


def _first_line(option: Mapping[str, Any]) -> str:
    description = option.get("description") or ""
    if isinstance(description, list):
        description = description[0] if description else ""
    # Ansible's doc markup (C(x), I(x), V(x), O(x), ...) reads as plain words in a message.
    return re.sub(r"\b[A-Z]\(([^()]*)\)", r"\1", description.strip().split("\n")[0].rstrip("."))


def merge_hosts(problems: Iterable[Problem]) -> list[Problem]:
    """One line for the same problem on several hosts, naming them all, in first-seen order."""
    merged: dict[tuple[str, str, str, str], list[str]] = {}
    for problem in problems:
        merged.setdefault((problem.key, problem.found, problem.expected, problem.fix), []).append(problem.where)
    return [Problem(", ".join(where), *details) for details, where in merged.items()]


def check_same_everywhere(hosts: Mapping[str, Mapping[str, Any]],
                          options: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    """Cluster-wide keys must hold one value on every node (a per-host override splits the cluster)."""
    problems = []
    for key in sorted(options):
        seen: dict[str, list[str]] = {}
        for host in sorted(hosts):
            if key in hosts[host]:
                seen.setdefault(repr(hosts[host][key]), []).append(host)
        if len(seen) > 1:
            if (options[key] or {}).get("no_log"):  # secrets differ: say where, never what
                found = "different secrets on " + "; ".join(", ".join(names) for names in seen.values())
            else:
                found = ", ".join(f"{value} on {', '.join(names)}" for value, names in seen.items())
            problems.append(Problem(CLUSTER_GROUP, key, found, "one value for the whole cluster",
                                    f"set {key} once in group_vars/{CLUSTER_GROUP}, not per host"))
    return problems


# Kernel settings the field learned to refuse, with the reason (docs/field-facts.md §2).
MEMORY_SETTINGS = "node_memory_sysctls"


def check_memory_settings(hosts: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    """The nodes' kernel memory settings: identical everywhere, and none the field saw break a node."""
    problems = check_same_everywhere(hosts, {MEMORY_SETTINGS: {}})
    for host in sorted(hosts):
        sysctls = hosts[host].get(MEMORY_SETTINGS)
        if not isinstance(sysctls, Mapping):
            continue
        watermark = _whole(sysctls.get("vm.watermark_scale_factor"))
        if watermark is not None and watermark > 200:
            problems.append(Problem(
                host, f"{MEMORY_SETTINGS}: vm.watermark_scale_factor", str(watermark),
                "at most 200 (the field runs 100, 1 %)",
                "set 100: at 500 the kernel silently hides ~12 GiB from MemAvailable and vLLM's start check "
                "fails as if memory leaked"))
        swappiness = _whole(sysctls.get("vm.swappiness"))
        if swappiness == 0:
            problems.append(Problem(
                host, f"{MEMORY_SETTINGS}: vm.swappiness", "0", "a value above 0 (180 with zram)",
                "set 180: swappiness 0 with zram preceded a 3-node lock-up in the field"))
    return merge_hosts(problems)


def _whole(value: Any) -> int | None:
    """A sysctl value as a number; None where it is not one (input_rules has refused it already)."""
    try:
        return int(str(value))
    except ValueError:
        return None


def check_ranks(ranks: Mapping[str, int]) -> list[Problem]:
    """Ranks are 0..N-1, one per node: each out-of-range rank names its host, then each rank held twice."""
    problems = []
    for host, rank in sorted(ranks.items()):
        if not 0 <= rank < len(ranks):
            problems.append(Problem(host, "sparkfleet_node_rank", str(rank),
                                    f"a rank from 0 to {len(ranks) - 1} (one per node of {len(ranks)})",
                                    f"number the nodes 0..{len(ranks) - 1}, once each"))
    if problems:
        return problems
    by_rank: dict[int, list[str]] = {}
    for host, rank in ranks.items():
        by_rank.setdefault(rank, []).append(host)
    for rank, names in sorted(by_rank.items()):
        if len(names) > 1:
            problems.append(Problem(", ".join(sorted(names)), "sparkfleet_node_rank",
                                    f"rank {rank} on {len(names)} nodes", "a unique rank per node",
                                    f"number the nodes 0..{len(ranks) - 1}, once each"))
    return problems  # N ranks, each in 0..N-1, none twice: every rank is there


def check_fabric_addresses(addresses: Mapping[str, str]) -> list[Problem]:
    """Each node's fabric address is a valid IPv4 host address of its own."""
    problems = []
    owners: dict[ipaddress.IPv4Address, list[str]] = {}
    for host, text in sorted(addresses.items()):
        try:
            address = ipaddress.IPv4Address(str(text))
        except ValueError:
            problems.append(Problem(host, "sparkfleet_fabric_address", repr(text),
                                    "an IPv4 address such as 192.168.100.10",
                                    "write the address of this node's ConnectX-7 interface, without a prefix length"))
            continue
        owners.setdefault(address, []).append(host)
    for address, hosts in owners.items():
        for host in hosts[1:]:
            problems.append(Problem(host, "sparkfleet_fabric_address", f"{address}, already the address of {hosts[0]}",
                                    "a fabric address of its own on every node",
                                    f"give {host} an unused address in the fabric subnet"))
    return problems


def check_head(head_hosts: Iterable[str], cluster_hosts: Iterable[str], ranks: Mapping[str, int]) -> list[Problem]:
    """Exactly one head, in the cluster, holding rank 0 (it runs the API server and the rendezvous)."""
    head = sorted(head_hosts)
    cluster = set(cluster_hosts)
    if len(head) != 1:
        found = f"{len(head)} hosts" + (f" ({', '.join(head)})" if head else "")
        return [Problem(HEAD_GROUP, "hosts", found, "exactly one head node",
                        f"put exactly one node of {CLUSTER_GROUP} in group {HEAD_GROUP}")]
    name = head[0]
    if name not in cluster:
        return [Problem(name, "group membership", f"in {HEAD_GROUP} but not in {CLUSTER_GROUP}",
                        "the head to be one of the cluster's nodes", f"add {name} to {CLUSTER_GROUP}")]
    if ranks.get(name, 0) != 0:
        return [Problem(name, "sparkfleet_node_rank", str(ranks[name]), "rank 0 on the head node",
                        f"give {name} rank 0 and renumber the workers 1..{len(cluster) - 1}")]
    return []


def check_size(hosts: Iterable[str], tensor_parallel_size: int, profile_name: str,
               supported_sizes: Iterable[int]) -> list[Problem]:
    """One node per tensor-parallel rank, at a size the profile supports."""
    names = sorted(hosts)
    sizes = sorted(supported_sizes)
    problems = []
    if tensor_parallel_size not in sizes:
        problems.append(Problem(CLUSTER_GROUP, "sparkfleet_tensor_parallel_size", str(tensor_parallel_size),
                                f"a size profile {profile_name} supports ({', '.join(map(str, sizes))})",
                                "choose a profile made for this many nodes"))
    if len(names) != tensor_parallel_size:
        delta = len(names) - tensor_parallel_size
        fix = (f"remove {delta} node(s) from group {CLUSTER_GROUP}" if delta > 0
               else f"add {-delta} node(s) to group {CLUSTER_GROUP}")
        found = f"{len(names)} nodes ({', '.join(names)}) for tensor_parallel_size {tensor_parallel_size}"
        problems.append(Problem(CLUSTER_GROUP, "sparkfleet_tensor_parallel_size", found,
                                f"exactly {tensor_parallel_size} nodes, one rank each",
                                f"{fix}, or set sparkfleet_tensor_parallel_size: {len(names)} "
                                "with a profile that supports it"))
    return problems


def check_tp_split(profile: Mapping[str, Any], tensor_parallel_size: int) -> list[Problem]:
    """Every dimension vLLM splits over the ranks divides by the tensor-parallel size, padded where the profile
    allows it (tp_padding); a dimension that does not is named with its remainder and the padding that would help."""
    try:
        split = tp_padding.layout(profile, tensor_parallel_size)
    except tp_padding.PaddingError as err:
        return [Problem(CLUSTER_GROUP, f"sparkfleet_model_profile: {profile.get('name')}: {err.key}", err.found,
                        err.expected, err.fix)]
    return [Problem(CLUSTER_GROUP, f"sparkfleet_tensor_parallel_size: {tensor_parallel_size} (profile "
                    f"{profile.get('name')}, {key})", found, expected, fix)
            for key, found, expected, fix in split["problems"]]


# vLLM flags sparkfleet sets itself on every rank, and the key that decides each: set in sparkfleet_vllm_args
# they would be overwritten without a word.
MANAGED_VLLM_ARGS = {
    "tensor-parallel-size": "sparkfleet_tensor_parallel_size",
    "nnodes": "sparkfleet_tensor_parallel_size",
    "node-rank": "sparkfleet_node_rank",
    "master-addr": "the head's sparkfleet_fabric_address",
    "headless": "each node's rank (the head serves, the workers run headless)",
    "distributed-executor-backend": "sparkfleet_tensor_parallel_size",
    "served-model-name": "the profile's served_model_name",
    "host": "vllm_service_host",
    "api-key": "sparkfleet_api_key",
}


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# Flags the plan computes with: (test, what is expected).
VLLM_ARG_RULES: Mapping[str, tuple[Callable[[Any], bool], str]] = {
    "max-model-len": (_positive_int, "a whole number of tokens, at least 1"),
    "block-size": (lambda v: _positive_int(v) and v & (v - 1) == 0, "a power of two such as 16 or 64"),
    "max-num-seqs": (_positive_int, "a whole number, at least 1"),
    "max-num-batched-tokens": (_positive_int, "a whole number of tokens, at least 1"),
    "gpu-memory-utilization": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
                               "a fraction above 0 and at most 1, such as 0.85"),
}


def check_vllm_args(args: Any) -> list[Problem]:
    """The inventory's vLLM overrides: flag names as vLLM spells them, none that sparkfleet sets itself, and
    sound values for the flags the capacity plan computes with."""
    key = "sparkfleet_vllm_args"
    problems = []
    for flag, value in sorted((args or {}).items(), key=lambda item: str(item[0])):
        where = f"{key}: {flag}"
        if not isinstance(flag, str) or flag.startswith("-") or not flag:
            problems.append(Problem(CLUSTER_GROUP, where, "a flag written with its dashes" if isinstance(flag, str)
                                    else f"a key of type {type(flag).__name__}", "the flag's name without the "
                                    "leading --, such as max-model-len", "write the flag as vLLM names it, no dashes"))
            continue
        if flag in MANAGED_VLLM_ARGS:
            shown_value = shown(value, {"no_log": flag == "api-key"})
            problems.append(Problem(CLUSTER_GROUP, where, shown_value, "no value: sparkfleet sets this flag on "
                                    f"every rank from {MANAGED_VLLM_ARGS[flag]}",
                                    f"remove {flag} from {key} and set {MANAGED_VLLM_ARGS[flag]} instead"))
            continue
        if value is None:  # removes the profile's flag
            continue
        if flag in VLLM_ARG_RULES and not VLLM_ARG_RULES[flag][0](value):
            problems.append(Problem(CLUSTER_GROUP, where, repr(value), VLLM_ARG_RULES[flag][1],
                                    f"correct {flag} in {key}, or set it to null to keep the profile's"))
        elif flag == "speculative-config":
            try:
                kv_capacity.speculative_tokens({flag: value})
            except kv_capacity.PlanError as err:
                problems.append(Problem(CLUSTER_GROUP, where, err.found, err.expected, err.fix))
        elif flag == "kv-cache-memory-bytes":
            try:
                size = kv_capacity.parse_bytes(value)
            except kv_capacity.PlanError as err:
                problems.append(Problem(CLUSTER_GROUP, where, err.found, err.expected, err.fix))
                continue
            if size is not None and size < 1:
                problems.append(Problem(CLUSTER_GROUP, where, repr(value), "a positive byte count such as 24G",
                                        "pin a pool of at least one block, or set it to null to size the pool "
                                        "by gpu-memory-utilization"))
    return problems


def fabric_subnets(ranks: Mapping[str, int], addresses: Mapping[str, str],
                   cluster: Mapping[str, Any]) -> dict[str, dict[str, str]] | None:
    """The subnets the fabric stage will give its ports ({subnet: {node: its port}}): the fabric role's own plan
    (module_utils/fabric.plan) with the arguments it passes. None when no plan can be made (the fabric role's
    plan check says why)."""
    nodes = sorted(ranks, key=ranks.__getitem__)
    topology = fabric.resolved_topology(cluster.get("sparkfleet_fabric_topology"), len(nodes))
    try:
        interfaces = fabric.plan(nodes, topology, rails=cluster.get("sparkfleet_fabric_rails", 1),
                                 supernet=cluster.get("sparkfleet_fabric_supernet", "10.100.0.0/16"),
                                 cage=cluster.get("sparkfleet_fabric_cage", 1),
                                 mtu=cluster.get("sparkfleet_fabric_mtu", 9000),
                                 pinned={} if topology in fabric.MESH_TOPOLOGIES else dict(addresses),
                                 prefix=cluster.get("sparkfleet_fabric_prefix", 24),
                                 subnets=cluster.get("sparkfleet_fabric_subnets") or None)
    except (fabric.FabricError, ValueError):
        return None
    ports: dict[str, dict[str, str]] = {}
    for node, items in interfaces.items():
        for item in items:
            ports.setdefault(str(item["subnet"]), {}).setdefault(node, str(item["netdev"]))
    return ports


def check_pinned_in_subnet(addresses: Mapping[str, str], cluster: Mapping[str, Any]) -> list[Problem]:
    """On a direct cable or a switch the fabric addresses are pinned, and their subnet is cable 0 rail 0's: a first
    entry of sparkfleet_fabric_subnets that does not hold them would be ignored without a word."""
    subnets = cluster.get("sparkfleet_fabric_subnets") or []
    topology = fabric.resolved_topology(cluster.get("sparkfleet_fabric_topology"), len(addresses))
    if not subnets or topology in fabric.MESH_TOPOLOGIES:
        return []
    first = ipaddress.ip_network(str(subnets[0]), strict=False)  # input_rules checked the syntax
    return [Problem(host, "sparkfleet_fabric_address", f"{address}, outside {first} (the first entry of "
                    "sparkfleet_fabric_subnets: cable 0 rail 0)", "the pinned address inside its cable's subnet",
                    "correct the address, or the first entry of sparkfleet_fabric_subnets")
            for host, address in sorted(addresses.items()) if ipaddress.ip_address(str(address)) not in first]


def check_management_apart(management: Mapping[str, str],
                           subnets: Mapping[str, Mapping[str, str]] | None) -> list[Problem]:
    """No node's management address (how Ansible reaches it) inside a subnet the fabric will give a port: netplan
    would move the management route onto the fabric port and the controller would lose the node."""
    problems = []
    for host, text in sorted(management.items()):
        try:
            address = ipaddress.ip_address(str(text))
        except ValueError:
            continue  # a DNS name: the fabric discovery compares the node's real networks
        for subnet, ports in sorted((subnets or {}).items()):
            own = host if host in ports else next(iter(ports))  # the node's own port where it has one there
            port = f"{own} {ports[own]}"
            if address in ipaddress.ip_network(subnet):
                problems.append(Problem(host, "sparkfleet_fabric_subnets", f"{subnet} planned for {port}, which "
                                        f"holds the node's management address {address} (ansible_host)",
                                        "fabric subnets apart from the management network",
                                        "choose sparkfleet_fabric_subnets (or the pinned sparkfleet_fabric_address "
                                        f"values, or sparkfleet_fabric_supernet) outside {address}'s network"))
    return problems


def check_kv_dtype(profile: Mapping[str, Any], args: Mapping[str, Any] | None) -> list[Problem]:
    """An inventory override of the KV cache format must be one the profile has byte figures for (the capacity
    plan sizes the pool from them)."""
    dtype = (args or {}).get("kv-cache-dtype")
    layers = ((profile.get("capacity") or {}).get("token_layers") or {})
    if not dtype or not layers:
        return []
    known = [set((layer or {}).get("bytes_per_token") or {}) for layer in layers.values()]
    if all(str(dtype) in sizes or "any" in sizes for sizes in known):
        return []
    specific = [sizes for sizes in known if "any" not in sizes]  # a layer with an "any" size takes every format
    choices = sorted(set.intersection(*specific)) if specific else []
    return [Problem(CLUSTER_GROUP, "sparkfleet_vllm_args: kv-cache-dtype", repr(dtype),
                    f"a format profile {profile.get('name')} has KV sizes for ({', '.join(choices) or 'none'})",
                    "remove kv-cache-dtype from sparkfleet_vllm_args, or add the format's byte sizes to the profile")]


def check_revision(profile: Mapping[str, Any], allow_branch: bool) -> list[Problem]:
    """A checkpoint from the Hub at a pinned commit, unless the inventory accepts a moving branch; from a cache,
    always a commit (the weights module pins a cache's revision whatever model_weights_allow_branch says)."""
    checkpoint = profile.get("checkpoint") or {}
    if checkpoint.get("source") not in ("huggingface", "cache"):
        return []
    try:
        weights.check_revision(checkpoint.get("revision"),
                               allow_branch and checkpoint.get("source") == "huggingface")
    except weights.WeightsError as err:
        return [Problem(CLUSTER_GROUP, f"profile {profile.get('name')}: checkpoint.revision", err.found,
                        err.expected, err.fix)]
    return []


def validate_cluster(hosts: Mapping[str, Mapping[str, Any]], head_hosts: Iterable[str],
                     role_specs: Mapping[str, Mapping[str, Any]], validate: Validator,
                     load_profile: Callable[[str], Mapping[str, Any]], management: Mapping[str, str] | None = None,
                     weights_stage: bool = True, unresolved: Mapping[str, Mapping[str, str | None]] | None = None,
                     ) -> tuple[list[Problem], dict[str, Any] | None]:
    """All checks of an inventory; returns (problems, plan). The plan is None when there are problems.

    hosts: host name -> that host's variables (inventory and extra vars, not facts).
    role_specs: role name -> its parsed meta/argument_specs.yml `argument_specs` mapping.
    load_profile: name -> profile mapping; raises an exception with found/expected/fix attributes
        (profiles.ProfileError) when the profile cannot be used.
    management: host name -> its ansible_host, where it has one.
    weights_stage: whether this run reaches the weights stage (its revision pin is checked here, then).
    unresolved: host -> {key: why its value could not be resolved on the controller}: None for a template that
        needs a node's facts (left to its role, unless the key is one of the inventory's own), else the error.
    """
    if not hosts:
        return [Problem(CLUSTER_GROUP, "hosts", "an empty group", "2 to 4 nodes, one per tensor-parallel rank",
                        f"list your nodes under group {CLUSTER_GROUP} (see inventory/examples/spark2)")], None
    inventory_spec = role_specs.get("preflight") or {}
    cluster_options = (inventory_spec.get(CLUSTER_ENTRY) or {}).get("options") or {}
    node_options = (inventory_spec.get(NODE_ENTRY) or {}).get("options") or {}
    known = documented_keys(role_specs)
    prefixes = checked_prefixes(role_specs)

    context = input_rules.Context(hosts=frozenset(hosts))
    problems: list[Problem] = []
    nodes: dict[str, dict[str, Any]] = {}
    unresolved = unresolved or {}
    for host in sorted(hosts):
        pending = unresolved.get(host) or {}
        problems += unknown_keys(host, [*hosts[host], *pending], known, prefixes)
        for key, why in sorted(pending.items()):
            if why is not None or key in cluster_options or key in node_options:
                problems.append(Problem(host, key, f"a value that cannot be resolved on the controller ({why})"
                                        if why else "a template that needs a node's facts",
                                        "a value the preflight can check before any host is touched",
                                        "give the value itself, or provide what its template or vault needs"))
        found, nodes[host] = check_options(host, hosts[host], node_options, validate, context)
        problems += found
    problems += check_role_variables(hosts, role_specs, validate, context)
    problems = merge_hosts(problems)  # a typo in group_vars is one problem, not one per node
    problems += check_same_everywhere(hosts, cluster_options)
    if not problems:
        problems += check_memory_settings(hosts)
    found, cluster = check_options(CLUSTER_GROUP, hosts[min(hosts)], cluster_options, validate, context)
    problems += found
    if problems:  # the cross-host checks below need sound per-host values
        return problems, None
    problems += check_vllm_args(cluster.get("sparkfleet_vllm_args"))

    ranks = {host: values["sparkfleet_node_rank"] for host, values in nodes.items()}
    problems += check_ranks(ranks)
    addresses = {host: values["sparkfleet_fabric_address"] for host, values in nodes.items()}
    problems += check_fabric_addresses(addresses)
    if not problems:
        problems += check_pinned_in_subnet(addresses, cluster)
    if not problems:
        problems += check_management_apart(management or {}, fabric_subnets(ranks, addresses, cluster))
    head = sorted(head_hosts)
    problems += check_head(head, hosts, ranks)
    try:
        profile = load_profile(cluster["sparkfleet_model_profile"])
    except ValueError as err:
        problems.append(Problem(CLUSTER_GROUP, "sparkfleet_model_profile", getattr(err, "found", str(err)),
                                getattr(err, "expected", "a usable profile"), getattr(err, "fix", "correct it")))
        return problems, None
    problems += check_size(hosts, cluster["sparkfleet_tensor_parallel_size"], profile["name"],
                           profile["tensor_parallel_sizes"])
    problems += check_tp_split(profile, cluster["sparkfleet_tensor_parallel_size"])
    problems += check_kv_dtype(profile, cluster.get("sparkfleet_vllm_args"))
    if weights_stage:
        problems += check_revision(profile, check_type_bool(hosts[min(hosts)].get("model_weights_allow_branch", False)))
    if problems:
        return problems, None
    # The capacity plan is made once, by the preflight, with the memory node_facts finds (kv_plan).
    plan_nodes = [dict(host=host, rank=ranks[host], role="head" if host in head else "worker",
                       fabric_address=str(nodes[host]["sparkfleet_fabric_address"]))
                  for host in sorted(hosts, key=ranks.__getitem__)]
    public = {key: value for key, value in cluster.items() if not (cluster_options.get(key) or {}).get("no_log")}
    return [], dict(public, nodes=plan_nodes, profile=dict(profile))
