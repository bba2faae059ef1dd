# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Bounds and shapes of the roles' variables, beyond the type their argument_specs declare.

Ansible's argument specs give each variable a type and, for enums, its choices; they have no ranges, no
network or size syntax and no reference to the inventory's hosts. This table adds those, one rule per key,
so that preflight refuses an MTU of 100000, a port of 99999 or a negative zram size before any host is
touched, instead of a later stage writing it to disk. `tests/unit/test_input_rules.py` holds every numeric
option of every role to having a rule here, so a new variable cannot go unbounded.

A rule sees the value after Ansible's own type conversion, and a small context (the cluster's host names).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.parsing.convert_bool import BOOLEANS_FALSE, BOOLEANS_TRUE


@dataclass(frozen=True)
class Context:
    """What a rule may compare against: the names of the cluster's hosts."""

    hosts: frozenset = field(default_factory=frozenset)


@dataclass(frozen=True)
class Rule:
    """`test(value, context)` is true for a good value; `expected` says what a good value is. `found`, where
    given, says what is wrong with a bad value instead of quoting all of it (a mapping whose other values may be
    secrets)."""

    expected: str
    test: Callable[[Any, Context], bool]
    found: Callable[[Any], str] | None = None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def between(low: float, high: float, unit: str = "") -> Rule:
    suffix = f" {unit}" if unit else ""
    return Rule(f"a number from {low:,} to {high:,}{suffix}",
                lambda value, _: _number(value) and low <= value <= high)


def at_least(low: float, unit: str = "") -> Rule:
    suffix = f" {unit}" if unit else ""
    return Rule(f"a number of at least {low:,}{suffix}", lambda value, _: _number(value) and value >= low)


def above(low: float, unit: str = "") -> Rule:
    suffix = f" {unit}" if unit else ""
    return Rule(f"a number above {low:,}{suffix}", lambda value, _: _number(value) and value > low)


def each(rule: Rule) -> Rule:
    """Every element of a list."""
    return Rule(f"a list of which every element is {rule.expected}",
                lambda value, ctx: isinstance(value, list) and all(rule.test(item, ctx) for item in value))


def matching(pattern: str, expected: str) -> Rule:
    compiled = re.compile(pattern)
    return Rule(expected, lambda value, _: isinstance(value, str) and compiled.fullmatch(value) is not None)


def _network(value: Any, version: int | None) -> bool:
    try:
        network = ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return False
    return isinstance(value, str) and "/" in value and (version is None or network.version == version)


def _ipv4_source(value: Any, _context: Any = None) -> bool:
    """What the firewall's nftables set takes: an IPv4 address or network (host bits allowed)."""
    try:
        ipaddress.IPv4Network(str(value), strict=False)
    except ValueError:
        return False
    return isinstance(value, str)


def _bad_environment(value: Any) -> str:
    """The offending names and values of an environment mapping, without quoting its other values."""
    if not isinstance(value, Mapping):
        return f"a {type(value).__name__}"
    names = [str(key) for key in value if not (isinstance(key, str) and ENV_NAME.fullmatch(key))]
    multiline = [str(key) for key, item in value.items() if "\n" in str(item)]
    parts = ([f"the names {', '.join(names)}"] if names else []) + \
        ([f"a line break in the value of {', '.join(multiline)}"] if multiline else [])
    return " and ".join(parts) or "a mapping"


def _xid(value: Any, _context: Any = None) -> bool:
    """What the Xid filter reads: a number in Python's notation (81, 0x51)."""
    try:
        int(str(value), 0)
    except ValueError:
        return False
    return True


def _auto_or_bool(value: Any, _context: Any = None) -> bool:
    """auto, or anything Ansible's bool filter reads as true or false (the roles compare 'auto' exactly)."""
    if not isinstance(value, (str, int, float, bool)):
        return False
    return value == "auto" or value in BOOLEANS_TRUE or value in BOOLEANS_FALSE or \
        str(value).lower() in BOOLEANS_TRUE or str(value).lower() in BOOLEANS_FALSE


PORT = between(1, 65535)
SECONDS = at_least(1, "seconds")
# The ConnectX-7 ports take 1280 (the IPv6 minimum) to 9216 bytes, the NIC's largest frame.
MTU = between(1280, 9216, "bytes")
CPU_NUMBERS = each(at_least(0))
IPV4_NETWORK = Rule("an IPv4 network in CIDR form such as 10.100.0.0/16",
                    lambda value, _: _network(value, 4))
IPV4_SOURCE = Rule("an IPv4 address or network such as 192.168.1.0/24", _ipv4_source)


def _listen_address(value: Any, _context: Any = None) -> bool:
    """Empty, or one IPv4 address another host can scrape: not 0.0.0.0, loopback, multicast or a network."""
    if value == "":
        return True
    try:
        address = ipaddress.IPv4Address(str(value))
    except ValueError:
        return False
    return isinstance(value, str) and not (address.is_unspecified or address.is_loopback or address.is_multicast)


_DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")
_DURATION_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)


def prometheus_seconds(value: Any) -> float | None:
    """A Prometheus duration ('1m30s', '15d'; units largest first) in seconds; None when it is not one."""
    match = _DURATION.fullmatch(value) if isinstance(value, str) and value else None
    if not match:
        return None
    return sum(int(part) * unit for part, unit in zip(match.groups(), _DURATION_SECONDS, strict=True) if part)


def duration(low: float, high: float, expected: str) -> Rule:
    return Rule(expected, lambda value, _ctx: low <= (prometheus_seconds(value) or 0) <= high)


def _systemd_span(value: Any, _context: Any = None) -> bool:
    match = re.fullmatch(r"(\d+) ?(s|sec|m|min|h)?", str(value)) if isinstance(value, (str, int)) else None
    if not match:
        return False
    return int(match.group(1)) * {"m": 60, "min": 60, "h": 3600}.get(match.group(2) or "s", 1) >= 5


LISTEN_ADDRESS = Rule("an IPv4 address other hosts reach this one on (not 0.0.0.0, loopback or multicast), or empty",
                      _listen_address)
# The recording rules' rate windows are 1m: at least two samples in each needs a scrape every 30 s or less.
SCRAPE_INTERVAL = duration(
    1, 30, "a Prometheus duration from 1s to 30s such as 15s (the recording rules' 1 minute rate windows need two "
    "samples)")
RETENTION = duration(3600, 10 * 365 * 86400, "a Prometheus duration of at least 1h, units largest first, such as 15d")
SYSTEMD_SPAN = Rule("a systemd time span of at least 5 seconds, such as 15s or 1min", _systemd_span)

# Docker's size syntax (--shm-size, log-opts max-size; go-units' RAMInBytes): a number, a unit, an optional i/b.
DOCKER_SIZE = matching(r"[0-9]+(\.[0-9]+)* ?([kKmMgGtTpP])?[iI]?[bB]?", "a size such as 32g, 512m or 1.5GB")
# The size memory.reclaim takes: a number of bytes with an optional K/M/G suffix.
RECLAIM_SIZE = matching(r"[1-9][0-9]*[KMGkmg]?", "a size such as 2G or 512M")
ABSOLUTE_PATH = matching(r"/.*", "an absolute path on the node")
ABSOLUTE_OR_EMPTY = matching(r"(/.*)?", "an absolute path on the node, or empty")
URL_OR_EMPTY = matching(r"(https?://[^\s/]+(/\S*)?)?", "an http(s):// URL, or empty for the Hub itself")
PINNED_REQUIREMENT = matching(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?==[A-Za-z0-9][A-Za-z0-9.+!_-]*",
                              "one pinned requirement, name==version (extras allowed: name[extra]==version)")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENVIRONMENT = Rule("a mapping of environment variable names ([A-Za-z_][A-Za-z0-9_]*) to single-line values",
                   lambda value, _: isinstance(value, Mapping) and all(
                       isinstance(key, str) and ENV_NAME.fullmatch(key) and "\n" not in str(item)
                       for key, item in value.items()),
                   _bad_environment)
USER_NAME = matching(r"[a-z_][a-z0-9_-]*[$]?", "a Unix user name such as spark")
XID = Rule("an Xid code such as 0x51 or 81", _xid)
# What ansible.posix.sysctl writes for the memory settings: a dotted name and whole numbers (one, or several
# separated by blanks as vm.lowmem_reserve_ratio takes).
SYSCTLS = Rule("a mapping of sysctl names (vm.swappiness) to whole numbers such as 180 or \"256 256 32 0 0\"",
               lambda value, _: isinstance(value, Mapping) and all(
                   isinstance(key, str) and re.fullmatch(r"[a-z][a-z0-9_]*(\.[a-z0-9_-]+)+", key)
                   and not isinstance(item, bool) and re.fullmatch(r"-?[0-9]+([ \t]+-?[0-9]+)*", str(item).strip())
                   for key, item in value.items()))
CLUSTER_HOST = Rule("the name of a host in group sparkfleet_cluster",
                    lambda value, ctx: value in ctx.hosts)
AUTO_TRUE_FALSE = Rule("auto (in lower case), or true or false", _auto_or_bool)
TRUE_FALSE = Rule("true or false", lambda value, _ctx: value != "auto" and _auto_or_bool(value))
# An API key travels in an HTTP header as a Bearer token: printable ASCII without spaces or line breaks.
API_KEY = matching(r"[!-~]{1,4096}", "printable ASCII characters without spaces or line breaks "
                                     "(ansible-vault encrypt_string -n ... keeps a trailing newline out)")

# What a timer's OnCalendar= takes (systemd.time(7)): weekly, Sun *-*-* 03:00, ...; one line; empty for none.
SCRUB_SCHEDULE = matching(r"([A-Za-z0-9*:,./~+ -]{1,200})?",
                          "a systemd OnCalendar expression such as weekly or \"Sun *-*-* 03:00\", or empty")


def _clock_range(value: Any, _context: Context) -> bool:
    return value == [] or (isinstance(value, list) and len(value) == 2 and all(_number(v) and v > 0 for v in value)
                           and value[0] <= value[1])


def _image_hosts(value: Any, ctx: Context) -> bool:
    return value == "auto" or (isinstance(value, list) and bool(value) and all(item in ctx.hosts for item in value))


RULES: Mapping[str, Rule] = {
    # preflight: the inventory itself
    "sparkfleet_tensor_parallel_size": between(1, 8, "ranks"),
    "sparkfleet_node_rank": between(0, 7),
    "sparkfleet_fabric_prefix": between(8, 31, "bits"),
    "sparkfleet_fabric_mtu": MTU,
    "sparkfleet_fabric_supernet": IPV4_NETWORK,
    "sparkfleet_fabric_subnets": each(IPV4_NETWORK),
    "sparkfleet_api_allowed_sources": each(IPV4_SOURCE),
    "sparkfleet_monitoring_allowed_sources": each(IPV4_SOURCE),
    "sparkfleet_router_addresses": each(IPV4_SOURCE),
    "sparkfleet_api_key": API_KEY,
    # container_runtime
    "container_runtime_enabled": AUTO_TRUE_FALSE,
    "container_runtime_nvidia": AUTO_TRUE_FALSE,
    "container_runtime_docker_users": each(USER_NAME),
    "container_runtime_log_max_size": DOCKER_SIZE,
    "container_runtime_log_max_file": between(1, 100, "files"),
    "container_runtime_daemon_config": ABSOLUTE_PATH,
    # fabric
    "fabric_netplan_file": matching(r"/etc/netplan/[^/]+\.yaml", "a file /etc/netplan/<name>.yaml"),
    "fabric_require_roce": AUTO_TRUE_FALSE,
    "fabric_apply_timeout": between(1, 3600, "seconds"),
    "fabric_speed_mbps": between(0, 800000, "Mb/s (0 skips the check)"),
    "fabric_service_ports": each(PORT),
    "fabric_monitoring_ports": each(PORT),
    "fabric_api_port": between(0, 65535, "(0 leaves the API port to the host's policy)"),
    "fabric_ping_count": between(1, 100, "pings"),
    # gpu
    "gpu_driver_branch": between(100, 9999),
    "gpu_sm_clock_range": Rule("empty, or [lowest, highest] MHz with lowest <= highest", _clock_range),
    "gpu_load_check_min_mhz": at_least(0, "MHz"),
    "gpu_load_check_seconds": between(1, 600, "seconds"),
    "gpu_state_dir": ABSOLUTE_PATH,
    # lab (the lab's own playbook; checked here when an inventory sets them)
    "lab_fabric_rails": between(1, 2, "rails"),
    "lab_fabric_mtu": MTU,
    "lab_subnet_pool": IPV4_NETWORK,
    "lab_shm_size": DOCKER_SIZE,
    "lab_vllm_cpus": Rule("null, or a list of this machine's CPU numbers (whole numbers from 0)",
                          lambda value, ctx: value is None or CPU_NUMBERS.test(value, ctx)),
    # model_weights
    "model_weights_cache_dir": ABSOLUTE_PATH,
    "model_weights_fetch_node": CLUSTER_HOST,
    "model_weights_endpoint": URL_OR_EMPTY,
    "model_weights_upload_dir": Rule("a directory on the controller, or empty",
                                     lambda value, _: isinstance(value, str) and "\n" not in value),
    "model_weights_disk_margin_bytes": at_least(0, "bytes"),
    "model_weights_rsyncd_port": PORT,
    "model_weights_bwlimit_kib": at_least(0, "KiB/s (0: no limit)"),
    "model_weights_hub_requirement": PINNED_REQUIREMENT,
    "model_weights_tools_venv": ABSOLUTE_PATH,
    "model_weights_timeout": SECONDS,
    # nccl
    "nccl_env_file": ABSOLUTE_PATH,
    "nccl_env_overrides": ENVIRONMENT,
    "nccl_probe": AUTO_TRUE_FALSE,
    "nccl_probe_port": PORT,
    "nccl_probe_sizes": each(at_least(1, "bytes")),
    "nccl_probe_bw_bytes": at_least(1, "bytes"),
    "nccl_probe_min_busbw_gbs": at_least(0, "GB/s"),
    "nccl_probe_timeout": SECONDS,
    # node_memory
    "node_memory_gate_path": ABSOLUTE_PATH,
    "node_memory_reclaim_path": ABSOLUTE_PATH,
    "node_memory_sysctls": SYSCTLS,
    "node_memory_sysctl_file": matching(r"/etc/sysctl\.d/[^/]+\.conf", "a file /etc/sysctl.d/<name>.conf"),
    "node_memory_zram_device": matching(r"zram[0-9]+", "a zram device name such as zram0"),
    "node_memory_zram_size_mib": at_least(0, "MiB"),
    "node_memory_zram_priority": between(-1, 32767),  # swapon's priority range
    "node_memory_zram_reserve_mib": at_least(0, "MiB"),
    "node_memory_watchdog_threshold_kib": at_least(1, "KiB"),
    "node_memory_watchdog_interval": above(0, "seconds"),
    "node_memory_watchdog_grace": at_least(0, "seconds"),
    "node_memory_watchdog_min_trip_interval": at_least(0, "seconds"),
    "node_memory_watchdog_textfile": ABSOLUTE_PATH,
    "node_memory_settle_floor_bytes": at_least(0, "bytes"),
    "node_memory_settle_timeout": SECONDS,
    "node_memory_reclaim_amount": RECLAIM_SIZE,
    "node_memory_reclaim_below_mib": at_least(0, "MiB"),
    # python_venv
    "python_venv_path": ABSOLUTE_PATH,
    # teardown
    "teardown_weights": TRUE_FALSE,
    "teardown_keep_images": TRUE_FALSE,
    "teardown_allow_partial": TRUE_FALSE,
    # triage
    "bench_dir": matching(r"[^\n]+", "a directory on the controller, on one line"),
    "bench_cluster": matching(r"[A-Za-z0-9][A-Za-z0-9._-]*", "a directory name (letters, digits, . _ -)"),
    "bench_timeout": between(60, 7 * 86400, "seconds"),
    "bench_needle_timeout": between(10, 86400, "seconds"),
    "triage_dir": matching(r"[^\n]+", "a directory on the controller, on one line"),
    "triage_tail_mib": between(1, 1024, "MiB"),
    "triage_logs_max_mib": between(1, 16384, "MiB"),
    "triage_timeout": between(1, 3600, "seconds"),
    "triage_node_tmp_dir": ABSOLUTE_PATH,
    # verify
    "verify_wait_timeout": SECONDS,
    "verify_ignored_xids": each(XID),
    "verify_log_path": ABSOLUTE_PATH,
    "verify_group_port": PORT,
    "verify_status_file": ABSOLUTE_PATH,
    # vllm_image
    "vllm_image_vllm_version": matching(r"[0-9]+(\.[0-9]+)+([a-zA-Z0-9.+!_-]*)",
                                        "a vLLM version such as 0.33.0 or 0.33.1rc1"),
    "vllm_image_hosts": Rule("auto, or a non-empty list of hosts of group sparkfleet_cluster", _image_hosts),
    "vllm_image_build_node": CLUSTER_HOST,
    "vllm_image_state_dir": ABSOLUTE_PATH,
    "vllm_image_compression_level": between(1, 19),  # zstd's regular levels
    "vllm_image_build_args": ENVIRONMENT,
    "vllm_image_timeout": SECONDS,
    # vllm_service
    "vllm_service_shm_size": DOCKER_SIZE,
    "vllm_service_venv": ABSOLUTE_PATH,
    "vllm_service_hub_cache": ABSOLUTE_PATH,
    "vllm_service_state_dir": ABSOLUTE_PATH,
    "vllm_service_log_dir": ABSOLUTE_PATH,
    "vllm_service_log_keep": between(1, 10000, "logs"),
    "vllm_service_api_key": API_KEY,
    "vllm_service_env": ENVIRONMENT,
    "vllm_service_nccl_env_file": ABSOLUTE_PATH,
    "vllm_service_stop_timeout": SECONDS,
    "vllm_service_drain_timeout": at_least(0, "seconds"),
    "vllm_service_start_limit_burst": between(1, 100, "starts"),
    "vllm_service_start_limit_interval": SECONDS,
    "vllm_service_restart_delay": at_least(0, "seconds"),
    "vllm_service_group_port": PORT,
    "vllm_service_group_grace": SECONDS,
    "vllm_service_group_form_timeout": SECONDS,
    "vllm_service_ready_timeout": SECONDS,
    "vllm_service_memory_wait_timeout": SECONDS,
    "vllm_service_verify_timeout": SECONDS,
    "vllm_service_known_answer_tolerance": at_least(0, "nats"),
    "vllm_service_textfile_dir": ABSOLUTE_PATH,
    "vllm_service_scrub_schedule": SCRUB_SCHEDULE,
    # monitoring
    "monitoring_prometheus_port": PORT,
    "monitoring_node_exporter_port": PORT,
    "monitoring_listen_address": LISTEN_ADDRESS,
    "monitoring_scrape_interval": SCRAPE_INTERVAL,
    "monitoring_evaluation_interval": SCRAPE_INTERVAL,
    "monitoring_retention": RETENTION,
    "monitoring_textfile_dir": ABSOLUTE_PATH,
    "monitoring_collector_interval": SYSTEMD_SPAN,
    "monitoring_grafana_url": matching(r"(https?://[^\s/]+(/\S*)?)?", "an http(s):// URL of a Grafana, or empty"),
    # router
    "router_groups": Rule("a list of {name, worker, state}: each name once (1-32 of a-z, 0-9, _ and -), each worker "
                          "once, worker and state http:// URLs", lambda value, _: _router_groups(value)),
    "router_listen_address": LISTEN_ADDRESS,
    "router_port": PORT,
    "router_metrics_port": PORT,
    "router_allowed_sources": each(IPV4_SOURCE),
    "router_health_check_interval": between(1, 3600, "seconds"),
    "router_health_failure_threshold": between(1, 100),
    "router_health_success_threshold": between(1, 100),
    "router_members_poll": between(0.2, 60, "seconds"),
    "router_venv": ABSOLUTE_PATH,
}


_ROUTER_GROUP_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_HTTP_URL = re.compile(r"http://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?")


def _router_groups(value: Any) -> bool:
    """The router role's groups: names and worker URLs each once, every URL a plain http:// one (the agent compares
    them with what vllm-router lists, character for character)."""
    if not isinstance(value, list) or not all(isinstance(group, dict) for group in value):
        return False
    names = [group.get("name") for group in value]
    workers = [group.get("worker") for group in value]
    return (all(isinstance(name, str) and _ROUTER_GROUP_NAME.fullmatch(name) for name in names)
            and all(isinstance(group.get(key), str) and _HTTP_URL.fullmatch(group[key])
                    for group in value for key in ("worker", "state"))
            and len(set(names)) == len(names) and len(set(workers)) == len(workers))


def check(key: str, value: Any, context: Context) -> str | None:
    """What a good value of `key` is, when `value` is not one; None when it is (or the key has no rule)."""
    rule = RULES.get(key)
    if rule is None or rule.test(value, context):
        return None
    return rule.expected


def found(key: str, value: Any) -> str | None:
    """What a refusal says was found, where the rule describes bad values itself (None: quote the value)."""
    rule = RULES.get(key)
    return rule.found(value) if rule is not None and rule.found is not None else None
