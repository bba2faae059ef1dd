"""Every role variable is typed (argument_specs) and bounded (input_rules), and preflight refuses a bad one
with one line naming the host, the key, what was found, what was expected and the fix."""

import copy

import pytest
from inventory_cases import GOOD, SPECS, lines, validate

from ansible_collections.sparkfleet.cluster.plugins.module_utils import input_rules, kv_capacity


def all_options():
    for role, spec in sorted(SPECS.items()):
        for entry, body in sorted(spec.items()):
            for key, option in sorted(((body or {}).get("options") or {}).items()):
                yield role, entry, key, option


def test_every_numeric_option_of_every_role_has_bounds():
    """A new int or float variable without a rule would reach its role unchecked: name it here first."""
    numeric = ("int", "float")
    unbounded = sorted({key for _role, _entry, key, option in all_options()
                        if (option.get("type") in numeric or option.get("elements") in numeric)
                        and not option.get("choices") and key not in input_rules.RULES})
    assert unbounded == []


def test_every_rule_is_for_a_documented_option():
    documented = {key for _role, _entry, key, _option in all_options()}
    assert sorted(set(input_rules.RULES) - documented) == []


@pytest.mark.parametrize("role, entry, key, option", [
    item for item in all_options() if item[2] in input_rules.RULES and "default" in item[3]
    and not str(item[3]["default"]).startswith("{{")])
def test_every_default_passes_its_own_rule(role, entry, key, option):
    """The shipped defaults are good values (a rule that refused them would refuse every inventory)."""
    context = input_rules.Context(hosts=frozenset({"node0", "node1"}))
    default = option["default"]
    if key.endswith("_api_key") and default in (None, ""):
        return
    assert input_rules.check(key, default, context) is None, (role, entry, key, default)


def with_group_vars(**values):
    hosts = copy.deepcopy(GOOD)
    for host in hosts.values():
        host.update(values)
    return hosts


# (group_vars, the one line preflight gives). Each is a different class of mistake a user makes.
BAD_ROLE_VALUES = [
    ({"fabric_api_port": 99999},
     "node0, node1: fabric_api_port: found 99999; expected a number from 0 to 65,535 (0 leaves the API port to "
     "the host's policy); fix: correct fabric_api_port: The OpenAI API port (the profile's port)"),
    ({"fabric_service_ports": [29501, 0]},
     "node0, node1: fabric_service_ports: found [29501, 0]; expected a list of which every element is a number "
     "from 1 to 65,535; fix: "),
    ({"node_memory_zram_size_mib": -1},
     "node0, node1: node_memory_zram_size_mib: found -1; expected a number of at least 0 MiB; fix: "),
    ({"node_memory_watchdog_interval": 0},
     "node0, node1: node_memory_watchdog_interval: found 0; expected a number above 0 seconds; fix: "),
    ({"model_weights_transport": "ftp"},
     "node0, node1: model_weights_transport: found 'ftp'; expected a str (one of ssh, rsyncd); fix: "),
    ({"vllm_service_runtime": "podman"},
     "node0, node1: vllm_service_runtime: found 'podman'; expected a str (one of "),
    ({"gpu_driver_branch": "latest"},
     "node0, node1: gpu_driver_branch: found 'latest'; expected a int; fix: "),
    ({"node_memory_sysctls": {"vm.swappiness": "high"}},
     "node0, node1: node_memory_sysctls: found {'vm.swappiness': 'high'}; expected a mapping of sysctl names "
     "(vm.swappiness) to whole numbers such as 180 or \"256 256 32 0 0\"; fix: "),
    ({"vllm_service_shm_size": "huge"},
     "node0, node1: vllm_service_shm_size: found 'huge'; expected a size such as 32g, 512m or 1.5GB"),
    ({"vllm_image_compression_level": 99},
     "node0, node1: vllm_image_compression_level: found 99; expected a number from 1 to 19; fix: "),
    ({"model_weights_fetch_node": "node7"},
     "node0, node1: model_weights_fetch_node: found 'node7'; expected the name of a host in group "
     "sparkfleet_cluster; fix: "),
    ({"gpu_sm_clock_range": [3000, 100]},
     "node0, node1: gpu_sm_clock_range: found [3000, 100]; expected empty, or [lowest, highest] MHz with lowest "
     "<= highest; fix: "),
    ({"vllm_service_env": {"1BAD": "x"}},
     "node0, node1: vllm_service_env: found the names 1BAD; expected a mapping of environment variable names"),
    ({"model_weights_hub_requirement": "huggingface_hub>=2"},
     "node0, node1: model_weights_hub_requirement: found 'huggingface_hub>=2'; expected one pinned requirement, "
     "name==version (extras allowed: name[extra]==version); fix: "),
    ({"vllm_service_log_dir": "logs/vllm"},
     "node0, node1: vllm_service_log_dir: found 'logs/vllm'; expected an absolute path on the node; fix: "),
    ({"verify_ignored_xids": ["zz"]},
     "node0, node1: verify_ignored_xids: found ['zz']; expected a list of which every element is an Xid code"),
    ({"monitoring_listen_address": "0.0.0.0"},
     "node0, node1: monitoring_listen_address: found '0.0.0.0'; expected an IPv4 address other hosts reach this "
     "one on (not 0.0.0.0, loopback or multicast), or empty; fix: "),
    ({"monitoring_scrape_interval": "5m"},
     "node0, node1: monitoring_scrape_interval: found '5m'; expected a Prometheus duration from 1s to 30s such as "
     "15s (the recording rules' 1 minute rate windows need two samples); fix: "),
    ({"monitoring_retention": "30s1m"},
     "node0, node1: monitoring_retention: found '30s1m'; expected a Prometheus duration of at least 1h"),
    ({"monitoring_collector_interval": "1ms"},
     "node0, node1: monitoring_collector_interval: found '1ms'; expected a systemd time span of at least 5 seconds"),
    ({"monitoring_grafana_url": "grafana.lan:3000"},
     "node0, node1: monitoring_grafana_url: found 'grafana.lan:3000'; expected an http(s):// URL of a Grafana, or "
     "empty; fix: "),
    ({"fabric_monitoring_ports": [9090, 70000]},
     "node0, node1: fabric_monitoring_ports: found [9090, 70000]; expected a list of which every element is a "
     "number from 1 to 65,535; fix: "),
]


@pytest.mark.parametrize("values, expected", BAD_ROLE_VALUES,
                         ids=[next(iter(values)) for values, _line in BAD_ROLE_VALUES])
def test_a_bad_role_variable_is_refused_on_the_controller(values, expected):
    (line,) = lines(with_group_vars(**values))
    assert line.startswith(expected), line


def test_a_role_variable_set_on_one_host_names_that_host():
    hosts = copy.deepcopy(GOOD)
    hosts["node1"]["node_memory_zram_size_mib"] = -5
    (line,) = lines(hosts)
    assert line.startswith("node1: node_memory_zram_size_mib: found -5;"), line


@pytest.mark.parametrize("key, value", [
    ("sparkfleet_fabric_mtu", 100000), ("sparkfleet_fabric_mtu", 100), ("sparkfleet_fabric_prefix", 33),
    ("sparkfleet_fabric_supernet", "banana"), ("sparkfleet_fabric_subnets", ["10.0.0.0/33"]),
    ("sparkfleet_api_allowed_sources", ["not-a-network"]), ("sparkfleet_tensor_parallel_size", 0),
    ("sparkfleet_monitoring_allowed_sources", ["10.0.0.0/40"]),
])
def test_a_bad_cluster_value_is_refused_with_its_bounds(key, value):
    (line,) = lines(with_group_vars(**{key: value}))
    assert line.startswith(f"sparkfleet_cluster: {key}: found {value!r}; expected "), line


@pytest.mark.parametrize("key, shape", [("abc\n" * 5, "a secret of 20 characters with a line break"),
                                        ("", "an empty secret"), ("clé-secrète", "a secret of 11 characters with a "
                                                                                 "non-ASCII character"),
                                        ("with space in the key 1234", "a secret of 26 characters with a space")])
def test_a_bad_api_key_is_described_by_its_shape_never_shown(key, shape):
    (line,) = lines(with_group_vars(sparkfleet_api_key=key))
    assert line.startswith(f"sparkfleet_cluster: sparkfleet_api_key: found {shape}; expected printable ASCII")
    if key:
        assert key.strip() not in line


@pytest.mark.parametrize("args, expected", [
    ({"max-model-len": -5}, "sparkfleet_vllm_args: max-model-len: found -5; expected a whole number of tokens"),
    ({"kv-cache-memory-bytes": "lots"}, "sparkfleet_vllm_args: kv-cache-memory-bytes: found 'lots'; expected a "
                                        "byte count as vLLM reads it"),
    ({"kv-cache-memory-bytes": 0}, "sparkfleet_vllm_args: kv-cache-memory-bytes: found 0; expected a positive "
                                   "byte count"),
    ({"gpu-memory-utilization": 1.5}, "sparkfleet_vllm_args: gpu-memory-utilization: found 1.5; expected a "
                                      "fraction above 0 and at most 1"),
    ({"block-size": 48}, "sparkfleet_vllm_args: block-size: found 48; expected a power of two"),
    ({"tensor-parallel-size": 4}, "sparkfleet_vllm_args: tensor-parallel-size: found 4; expected no value: "
                                  "sparkfleet sets this flag on every rank from sparkfleet_tensor_parallel_size"),
    ({"--max-model-len": 4096}, "sparkfleet_vllm_args: --max-model-len: found a flag written with its dashes"),
])
def test_bad_vllm_args_are_refused_by_flag(args, expected):
    found = lines(with_group_vars(sparkfleet_vllm_args=args))
    assert any(line.startswith(f"sparkfleet_cluster: {expected}") for line in found), found


def test_a_null_vllm_arg_removes_the_profiles_flag_and_is_accepted():
    problems, plan = validate(with_group_vars(sparkfleet_vllm_args={"max-num-seqs": None}))
    assert problems == []
    assert "max-num-seqs" in plan["profile"]["vllm_args"]
    assert "max-num-seqs" not in kv_capacity.merged_args(plan["profile"], plan["sparkfleet_vllm_args"])


def test_the_management_address_inside_the_fabric_is_refused():
    hosts = with_group_vars(sparkfleet_fabric_subnets=["192.168.1.0/24"])
    hosts["node0"]["sparkfleet_fabric_address"], hosts["node1"]["sparkfleet_fabric_address"] = "192.168.1.10", \
        "192.168.1.11"
    (line,) = lines(hosts, management={"node0": "192.168.1.101", "node1": "192.168.2.5"})
    assert line == ("node0: sparkfleet_fabric_subnets: found 192.168.1.0/24 planned for node0 enp1s0f1np1, which "
                    "holds the node's management address 192.168.1.101 (ansible_host); expected fabric subnets apart "
                    "from the management network; fix: choose sparkfleet_fabric_subnets (or the pinned "
                    "sparkfleet_fabric_address values, or sparkfleet_fabric_supernet) outside 192.168.1.101's "
                    "network")


def test_a_subnet_the_pinned_addresses_are_not_in_is_refused_not_ignored():
    found = lines(with_group_vars(sparkfleet_fabric_subnets=["192.168.1.0/24"]))
    assert found == [f"{host}: sparkfleet_fabric_address: found 192.168.100.1{n}, outside 192.168.1.0/24 (the first "
                     "entry of sparkfleet_fabric_subnets: cable 0 rail 0); expected the pinned address inside its "
                     "cable's subnet; fix: correct the address, or the first entry of sparkfleet_fabric_subnets"
                     for n, host in enumerate(["node0", "node1"])]


def test_the_subnet_of_pinned_fabric_addresses_counts_and_an_unused_supernet_does_not():
    """A direct cable's subnet is its pinned addresses' (/24 here); the supernet is not used then."""
    (line,) = lines(copy.deepcopy(GOOD), management={"node0": "192.168.100.50", "node1": "192.168.2.5"})
    assert line.startswith("node0: sparkfleet_fabric_subnets: found 192.168.100.0/24 planned for node0 ")
    problems, _plan = validate(copy.deepcopy(GOOD), management={"node0": "10.100.5.10", "node1": "10.100.5.11"})
    assert problems == []


def test_a_management_name_is_left_to_the_fabric_discovery():
    problems, _plan = validate(copy.deepcopy(GOOD), management={"node0": "spark-a.lan", "node1": "spark-b.lan"})
    assert problems == []


def test_an_unpinned_revision_is_refused_when_the_run_reaches_the_weights_stage():
    (line,) = lines(copy.deepcopy(GOOD), weights_stage=True)
    assert line.startswith("sparkfleet_cluster: profile glm-5.3-flash-nvfp4-tp2: checkpoint.revision: found no "
                           "revision; expected a pinned 40-hex commit hash"), line
    assert validate(copy.deepcopy(GOOD), weights_stage=False)[0] == []


def test_sysctl_values_that_are_not_numbers_do_not_crash_the_memory_checks():
    found = lines(with_group_vars(node_memory_sysctls={"vm.swappiness": "high", "vm.watermark_scale_factor": "x"}))
    assert len(found) == 1 and "node_memory_sysctls" in found[0]


def test_secrets_that_differ_between_hosts_are_named_by_host_never_quoted():
    hosts = copy.deepcopy(GOOD)
    hosts["node0"]["sparkfleet_api_key"], hosts["node1"]["sparkfleet_api_key"] = "key-of-node-zero", "key-of-node-one"
    found = lines(hosts)
    assert found == ["sparkfleet_cluster: sparkfleet_api_key: found different secrets on node0; node1; expected one "
                     "value for the whole cluster; fix: set sparkfleet_api_key once in group_vars/sparkfleet_cluster, "
                     "not per host"]


def test_an_api_key_passed_as_a_vllm_flag_is_refused_without_quoting_it():
    (line,) = lines(with_group_vars(sparkfleet_vllm_args={"api-key": "MySecretKey1234567890"}))
    assert "MySecretKey" not in line and "found a secret of 21 characters" in line


def test_an_environment_mapping_names_what_is_wrong_without_quoting_its_values():
    (line,) = lines(with_group_vars(vllm_service_env={"HF_TOKEN": "hf_secret", "BAD NAME": "x", "A": "1\n2"}))
    assert "hf_secret" not in line
    assert "found the names BAD NAME and a line break in the value of A;" in line


@pytest.mark.parametrize("key, value", [
    ("sparkfleet_api_allowed_sources", ["10.1.2.3"]), ("sparkfleet_api_allowed_sources", ["10.1.2.0/24"]),
    ("vllm_service_shm_size", "32GB"), ("vllm_service_shm_size", "1.5g"), ("container_runtime_log_max_size", "100m"),
    ("model_weights_hub_requirement", "huggingface_hub[hf_xet]==2.4.0"), ("vllm_image_vllm_version", "0.33.1rc1"),
    ("sparkfleet_fabric_prefix", 31), ("nccl_probe", "yes"), ("container_runtime_nvidia", True),
    ("node_memory_sysctls", {"vm.swappiness": 180, "vm.lowmem_reserve_ratio": "256 256 32 0 0"}),
    ("verify_ignored_xids", ["0x51", "0X51", "79"]), ("sparkfleet_api_key", "k"),
])
def test_values_the_roles_take_pass(key, value):
    problems, _plan = validate(with_group_vars(**{key: value}))
    assert problems == []


@pytest.mark.parametrize("key, value", [
    ("sparkfleet_api_allowed_sources", ["fd00::/8"]), ("nccl_probe", "AUTO"), ("verify_ignored_xids", ["081"]),
    ("node_memory_sysctls", {"vm.swappiness": "high"}), ("node_memory_sysctls", {"vm.swappiness": True}),
])
def test_values_the_roles_would_fail_on_are_refused(key, value):
    (line,) = lines(with_group_vars(**{key: value}))
    assert line.startswith(f"node0, node1: {key}: found ") or line.startswith(f"sparkfleet_cluster: {key}: found ")


def test_allow_branch_as_text_false_is_false():
    hosts = with_group_vars(model_weights_allow_branch="false")
    (line,) = lines(hosts, weights_stage=True)
    assert "checkpoint.revision: found no revision" in line


def test_an_unresolvable_value_is_refused_and_a_node_fact_template_is_left_to_its_role():
    unresolved = {"node0": {"vllm_service_host": None, "sparkfleet_api_key": "AnsibleVaultError: no secret"},
                  "node1": {"vllm_service_host": None}}
    (line,) = lines(copy.deepcopy(GOOD), unresolved=unresolved)
    assert line == ("node0: sparkfleet_api_key: found a value that cannot be resolved on the controller "
                    "(AnsibleVaultError: no secret); expected a value the preflight can check before any host is "
                    "touched; fix: give the value itself, or provide what its template or vault needs")


def test_a_kv_format_the_profile_has_no_size_for_is_refused_by_the_first_check():
    (line,) = lines(with_group_vars(sparkfleet_vllm_args={"kv-cache-dtype": "fp4_e2m1"}))
    assert line.startswith("sparkfleet_cluster: sparkfleet_vllm_args: kv-cache-dtype: found 'fp4_e2m1'; expected a "
                           "format profile glm-5.3-flash-nvfp4-tp2 has KV sizes for (fp8_ds_mla, fp8_e4m3, nvfp4, "
                           "sparkfleet_nvfp4); fix: remove kv-cache-dtype")
    problems, _plan = validate(with_group_vars(sparkfleet_vllm_args={"kv-cache-dtype": "fp8_ds_mla"}))
    assert problems == []
