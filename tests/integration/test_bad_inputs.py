"""Bad inventories, one class of mistake each, through site.yml on a live lab: every one is refused by the
preflight's first check, on the controller, in one line naming where (host or group), the key, what was found,
what was expected and the fix, and no task reaches a node (changed=0 on every host).

The lab is the weights lab (its nodes are up and converged through the fabric stage), so a check that let a
value through would go on to change real nodes."""

import os

import pytest
import yaml
from conftest import ROOT, inventory_copy, output, run_playbook, task_names

SITE = os.path.join(ROOT, "site.yml")
NODES = "node0, node1"
GROUP = "sparkfleet_cluster"
# What runs before the refusal: Ansible's argument check of the preflight role, then the refusal itself.
ALLOWED = {"Validating arguments against arg spec 'main' - "
           "Validate the inventory and print the cluster plan, changing nothing",
           "Validate the inventory on the controller"}

# (id, group_vars, where, key, found): the refusal's line starts "<where>: <key>: found <found>; expected " (a found
# ending in "..." is the start of what was found).
CASES = [
    # the cluster's own keys: types, bounds, enums, syntax
    ("mtu-too-large", {"sparkfleet_fabric_mtu": 100000}, GROUP, "sparkfleet_fabric_mtu", "100000"),
    ("mtu-too-small", {"sparkfleet_fabric_mtu": 100}, GROUP, "sparkfleet_fabric_mtu", "100"),
    ("mtu-not-a-number", {"sparkfleet_fabric_mtu": "jumbo"}, GROUP, "sparkfleet_fabric_mtu", "'jumbo'"),
    ("prefix-33", {"sparkfleet_fabric_prefix": 33}, GROUP, "sparkfleet_fabric_prefix", "33"),
    ("supernet-not-a-network", {"sparkfleet_fabric_supernet": "banana"}, GROUP, "sparkfleet_fabric_supernet",
     "'banana'"),
    ("supernet-ipv6", {"sparkfleet_fabric_supernet": "fd00::/48"}, GROUP, "sparkfleet_fabric_supernet",
     "'fd00::/48'"),
    ("subnet-bad-length", {"sparkfleet_fabric_subnets": ["10.0.0.0/33"]}, GROUP, "sparkfleet_fabric_subnets",
     "['10.0.0.0/33']"),
    ("allowed-source-not-a-network", {"sparkfleet_api_allowed_sources": ["not-a-network"]}, GROUP,
     "sparkfleet_api_allowed_sources", "['not-a-network']"),
    ("allowed-source-ipv6", {"sparkfleet_api_allowed_sources": ["fd00::/8"]}, GROUP,
     "sparkfleet_api_allowed_sources", "['fd00::/8']"),
    ("api-key-newline", {"sparkfleet_api_key": "0123456789abcdef0123\n"}, GROUP, "sparkfleet_api_key",
     "a secret of 21 characters with a line break"),
    ("api-key-empty", {"sparkfleet_api_key": ""}, GROUP, "sparkfleet_api_key", "an empty secret"),
    ("api-key-non-ascii", {"sparkfleet_api_key": "clé-secrète-1234"}, GROUP, "sparkfleet_api_key",
     "a secret of 16 characters with a non-ASCII character"),
    ("tp-not-a-number", {"sparkfleet_tensor_parallel_size": "two"}, GROUP, "sparkfleet_tensor_parallel_size",
     "'two'"),
    ("tp-zero", {"sparkfleet_tensor_parallel_size": 0}, GROUP, "sparkfleet_tensor_parallel_size", "0"),
    ("profile-unknown", {"sparkfleet_model_profile": "no-such-profile"}, GROUP, "sparkfleet_model_profile",
     "no file no-such-profile.yml in ..."),
    ("profile-bad-name", {"sparkfleet_model_profile": "../etc/passwd"}, GROUP, "sparkfleet_model_profile",
     "'../etc/passwd'"),
    ("topology-unknown", {"sparkfleet_fabric_topology": "star"}, GROUP, "sparkfleet_fabric_topology", "'star'"),
    ("rails-three", {"sparkfleet_fabric_rails": 3}, GROUP, "sparkfleet_fabric_rails", "3"),
    ("cage-five", {"sparkfleet_fabric_cage": 5}, GROUP, "sparkfleet_fabric_cage", "5"),
    ("vllm-args-a-list", {"sparkfleet_vllm_args": ["max-model-len", 512]}, GROUP, "sparkfleet_vllm_args",
     "['max-model-len', 512]"),
    ("profile-paths-a-mapping", {"sparkfleet_profile_paths": {"a": 1}}, GROUP, "sparkfleet_profile_paths",
     "{'a': 1}"),
    # the vLLM overrides, flag by flag
    ("max-model-len-negative", {"sparkfleet_vllm_args": {"max-model-len": -5}}, GROUP,
     "sparkfleet_vllm_args: max-model-len", "-5"),
    ("max-model-len-text", {"sparkfleet_vllm_args": {"max-model-len": "long"}}, GROUP,
     "sparkfleet_vllm_args: max-model-len", "'long'"),
    ("kv-pin-words", {"sparkfleet_vllm_args": {"kv-cache-memory-bytes": "lots"}}, GROUP,
     "sparkfleet_vllm_args: kv-cache-memory-bytes", "'lots'"),
    ("kv-pin-zero", {"sparkfleet_vllm_args": {"kv-cache-memory-bytes": 0}}, GROUP,
     "sparkfleet_vllm_args: kv-cache-memory-bytes", "0"),
    ("kv-pin-fraction-binary", {"sparkfleet_vllm_args": {"kv-cache-memory-bytes": "1.5G"}}, GROUP,
     "sparkfleet_vllm_args: kv-cache-memory-bytes", "'1.5G'"),
    ("utilization-above-one", {"sparkfleet_vllm_args": {"gpu-memory-utilization": 1.5}}, GROUP,
     "sparkfleet_vllm_args: gpu-memory-utilization", "1.5"),
    ("block-size-not-power-of-two", {"sparkfleet_vllm_args": {"block-size": 48}}, GROUP,
     "sparkfleet_vllm_args: block-size", "48"),
    ("max-num-seqs-zero", {"sparkfleet_vllm_args": {"max-num-seqs": 0}}, GROUP,
     "sparkfleet_vllm_args: max-num-seqs", "0"),
    ("managed-tensor-parallel-flag", {"sparkfleet_vllm_args": {"tensor-parallel-size": 4}}, GROUP,
     "sparkfleet_vllm_args: tensor-parallel-size", "4"),
    ("managed-api-key-flag", {"sparkfleet_vllm_args": {"api-key": "x"}}, GROUP,
     "sparkfleet_vllm_args: api-key", "a secret of 1 character"),
    ("flag-with-dashes", {"sparkfleet_vllm_args": {"--max-model-len": 256}}, GROUP,
     "sparkfleet_vllm_args: --max-model-len", "a flag written with its dashes"),
    ("speculative-config-not-json", {"sparkfleet_vllm_args": {"speculative-config": "{mtp"}}, GROUP,
     "sparkfleet_vllm_args: speculative-config", "speculative-config '{mtp'"),
    # the roles' variables: each typed by its argument_specs and bounded by input_rules
    ("api-port-99999", {"fabric_api_port": 99999}, NODES, "fabric_api_port", "99999"),
    ("service-port-70000", {"fabric_service_ports": [29501, 70000]}, NODES, "fabric_service_ports",
     "[29501, 70000]"),
    ("ping-count-zero", {"fabric_ping_count": 0}, NODES, "fabric_ping_count", "0"),
    ("apply-timeout-negative", {"fabric_apply_timeout": -1}, NODES, "fabric_apply_timeout", "-1"),
    ("renderer-unknown", {"fabric_renderer": "ifupdown"}, NODES, "fabric_renderer", "'ifupdown'"),
    ("netplan-file-elsewhere", {"fabric_netplan_file": "/tmp/fabric.yaml"}, NODES, "fabric_netplan_file",
     "'/tmp/fabric.yaml'"),
    ("firewall-maybe", {"fabric_firewall": "maybe"}, NODES, "fabric_firewall", "'maybe'"),
    ("zram-negative", {"node_memory_zram_size_mib": -1}, NODES, "node_memory_zram_size_mib", "-1"),
    ("zram-backend-unknown", {"node_memory_zram_backend": "swapfile"}, NODES, "node_memory_zram_backend",
     "'swapfile'"),
    ("zram-device-name", {"node_memory_zram_device": "sda"}, NODES, "node_memory_zram_device", "'sda'"),
    ("swap-priority-out-of-range", {"node_memory_zram_priority": 40000}, NODES, "node_memory_zram_priority",
     "40000"),
    ("swappiness-words", {"node_memory_sysctls": {"vm.swappiness": "high"}}, NODES, "node_memory_sysctls",
     "{'vm.swappiness': 'high'}"),
    ("sysctl-not-a-name", {"node_memory_sysctls": {"swappiness": 10}}, NODES, "node_memory_sysctls",
     "{'swappiness': 10}"),
    ("watermark-500", {"node_memory_sysctls": {"vm.swappiness": 180, "vm.watermark_scale_factor": 500}}, NODES,
     "node_memory_sysctls: vm.watermark_scale_factor", "500"),
    ("swappiness-zero", {"node_memory_sysctls": {"vm.swappiness": 0, "vm.watermark_scale_factor": 100}}, NODES,
     "node_memory_sysctls: vm.swappiness", "0"),
    ("watchdog-interval-zero", {"node_memory_watchdog_interval": 0}, NODES, "node_memory_watchdog_interval", "0"),
    ("watchdog-threshold-negative", {"node_memory_watchdog_threshold_kib": -5}, NODES,
     "node_memory_watchdog_threshold_kib", "-5"),
    ("reclaim-amount-words", {"node_memory_reclaim_amount": "lots"}, NODES, "node_memory_reclaim_amount",
     "'lots'"),
    ("gpu-branch-words", {"gpu_driver_branch": "latest"}, NODES, "gpu_driver_branch", "'latest'"),
    ("sm-clock-range-reversed", {"gpu_sm_clock_range": [3000, 100]}, NODES, "gpu_sm_clock_range", "[3000, 100]"),
    ("docker-user-with-space", {"container_runtime_docker_users": ["bad user"]}, NODES,
     "container_runtime_docker_users", "['bad user']"),
    ("docker-log-size-words", {"container_runtime_log_max_size": "big"}, NODES, "container_runtime_log_max_size",
     "'big'"),
    ("runtime-enabled-maybe", {"container_runtime_enabled": "maybe"}, NODES, "container_runtime_enabled",
     "'maybe'"),
    ("weights-transport-ftp", {"model_weights_transport": "ftp"}, NODES, "model_weights_transport", "'ftp'"),
    ("weights-fetch-node-unknown", {"model_weights_fetch_node": "node9"}, NODES, "model_weights_fetch_node",
     "'node9'"),
    ("weights-rsyncd-port", {"model_weights_rsyncd_port": 70000}, NODES, "model_weights_rsyncd_port", "70000"),
    ("weights-margin-negative", {"model_weights_disk_margin_bytes": -1}, NODES,
     "model_weights_disk_margin_bytes", "-1"),
    ("weights-endpoint-not-a-url", {"model_weights_endpoint": "hub.example"}, NODES, "model_weights_endpoint",
     "'hub.example'"),
    ("hub-requirement-unpinned", {"model_weights_hub_requirement": "huggingface_hub>=2"}, NODES,
     "model_weights_hub_requirement", "'huggingface_hub>=2'"),
    ("nccl-probe-port-zero", {"nccl_probe_port": 0}, NODES, "nccl_probe_port", "0"),
    ("nccl-env-multiline", {"nccl_env_overrides": {"NCCL_DEBUG": "INFO\nNCCL_X=1"}}, NODES,
     "nccl_env_overrides", "a line break in the value of NCCL_DEBUG"),
    ("image-compression-99", {"vllm_image_compression_level": 99}, NODES, "vllm_image_compression_level", "99"),
    ("image-build-node-unknown", {"vllm_image_build_node": "node9"}, NODES, "vllm_image_build_node", "'node9'"),
    ("image-hosts-unknown", {"vllm_image_hosts": ["node0", "node9"]}, NODES, "vllm_image_hosts",
     "['node0', 'node9']"),
    ("image-transport-unknown", {"vllm_image_transport": "floppy"}, NODES, "vllm_image_transport", "'floppy'"),
    ("runtime-podman", {"vllm_service_runtime": "podman"}, NODES, "vllm_service_runtime", "'podman'"),
    ("shm-size-words", {"vllm_service_shm_size": "huge"}, NODES, "vllm_service_shm_size", "'huge'"),
    ("log-dir-relative", {"vllm_service_log_dir": "logs/vllm"}, NODES, "vllm_service_log_dir", "'logs/vllm'"),
    ("start-burst-zero", {"vllm_service_start_limit_burst": 0}, NODES, "vllm_service_start_limit_burst", "0"),
    ("stop-timeout-zero", {"vllm_service_stop_timeout": 0}, NODES, "vllm_service_stop_timeout", "0"),
    ("drain-timeout-negative", {"vllm_service_drain_timeout": -5}, NODES, "vllm_service_drain_timeout", "-5"),
    ("service-env-bad-name", {"vllm_service_env": {"1BAD": "x"}}, NODES, "vllm_service_env", "the names 1BAD"),
    ("service-api-key-newline", {"vllm_service_api_key": "0123456789abcdef\n"}, NODES, "vllm_service_api_key",
     "a secret of 17 characters with a line break"),
    ("verify-timeout-zero", {"verify_wait_timeout": 0}, NODES, "verify_wait_timeout", "0"),
    ("ignored-xid-words", {"verify_ignored_xids": ["zz"]}, NODES, "verify_ignored_xids", "['zz']"),
    # names: a key nobody documents
    ("unknown-key", {"sparkfleet_frobnicate": 1}, NODES, "sparkfleet_frobnicate", "an unknown key"),
    ("mistyped-role-key", {"node_memory_swapiness": 180}, NODES, "node_memory_swapiness", "an unknown key"),
]


def hosts_file(inventory):
    return yaml.safe_load((inventory / "hosts.yml").read_text())


def write_hosts(inventory, data):
    (inventory / "hosts.yml").write_text(yaml.safe_dump(data))


def cluster_hosts(data):
    return data["all"]["children"]["sparkfleet_cluster"]["hosts"]


# Inventories broken in their structure (hosts, ranks, groups) rather than in one value:
# (id, change(inventory), where, key, found).
def rank_out_of_range(inventory):
    data = hosts_file(inventory)
    cluster_hosts(data)["node1"]["sparkfleet_node_rank"] = 5
    write_hosts(inventory, data)


def rank_twice(inventory):
    data = hosts_file(inventory)
    cluster_hosts(data)["node1"]["sparkfleet_node_rank"] = 0
    write_hosts(inventory, data)


def rank_words(inventory):
    data = hosts_file(inventory)
    cluster_hosts(data)["node1"]["sparkfleet_node_rank"] = "second"
    write_hosts(inventory, data)


def fabric_address_words(inventory):
    data = hosts_file(inventory)
    cluster_hosts(data)["node1"]["sparkfleet_fabric_address"] = "node1.fabric"
    write_hosts(inventory, data)


def head_is_rank_one(inventory):
    data = hosts_file(inventory)
    cluster_hosts(data)["node0"]["sparkfleet_node_rank"] = 1
    cluster_hosts(data)["node1"]["sparkfleet_node_rank"] = 0
    write_hosts(inventory, data)


def two_heads(inventory):
    data = hosts_file(inventory)
    data["all"]["children"]["sparkfleet_cluster"]["children"]["sparkfleet_head"]["hosts"]["node1"] = None
    write_hosts(inventory, data)


def no_head(inventory):
    data = hosts_file(inventory)
    del data["all"]["children"]["sparkfleet_cluster"]["children"]["sparkfleet_head"]
    write_hosts(inventory, data)


def per_host_mtu(inventory):
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "node1.yml").write_text("---\nsparkfleet_fabric_mtu: 1500\n")


def one_hosts_zram(inventory):
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "node1.yml").write_text("---\nnode_memory_zram_size_mib: -4\n")


def fabric_over_management(inventory):
    """Fabric addresses pinned in the management network: the cable's subnet would be the management one."""
    data = hosts_file(inventory)
    address = cluster_hosts(data)["node0"]["ansible_host"]
    network = address.rsplit(".", 1)[0]
    data["all"]["children"]["sparkfleet_cluster"]["vars"]["sparkfleet_fabric_subnets"] = [f"{network}.0/24"]
    for number, host in enumerate(["node0", "node1"]):
        cluster_hosts(data)[host]["sparkfleet_fabric_address"] = f"{network}.{200 + number}"
    write_hosts(inventory, data)
    return address


def subnet_without_the_addresses(inventory):
    """A first subnet the pinned addresses are not in: the plan would ignore it."""
    data = hosts_file(inventory)
    data["all"]["children"]["sparkfleet_cluster"]["vars"]["sparkfleet_fabric_subnets"] = ["10.99.0.0/24"]
    write_hosts(inventory, data)


STRUCTURE = [
    ("rank-out-of-range", rank_out_of_range, "node1", "sparkfleet_node_rank", "5"),
    ("rank-twice", rank_twice, NODES, "sparkfleet_node_rank", "rank 0 on 2 nodes"),
    ("rank-words", rank_words, "node1", "sparkfleet_node_rank", "'second'"),
    ("fabric-address-a-name", fabric_address_words, "node1", "sparkfleet_fabric_address", "'node1.fabric'"),
    ("head-holds-rank-1", head_is_rank_one, "node0", "sparkfleet_node_rank", "1"),
    ("two-heads", two_heads, "sparkfleet_head", "hosts", "2 hosts (node0, node1)"),
    ("no-head", no_head, "sparkfleet_head", "hosts", "0 hosts"),
    ("per-host-cluster-key", per_host_mtu, GROUP, "sparkfleet_fabric_mtu", "9000 on node0, 1500 on node1"),
    ("one-hosts-role-value", one_hosts_zram, "node1", "node_memory_zram_size_mib", "-4"),
    ("fabric-over-management", fabric_over_management, "node0", "sparkfleet_fabric_subnets", None),
    ("subnet-without-the-addresses", subnet_without_the_addresses, "node0", "sparkfleet_fabric_address", None),
]


@pytest.fixture
def broken(weights_lab, tmp_path):
    """A private copy of the weights lab's inventory a test may break."""
    return inventory_copy(weights_lab, tmp_path)


def refused(inventory, tmp_path):
    """site.yml on the broken inventory: the run's output, after asserting nothing ran past the refusal."""
    runner = run_playbook(tmp_path / "run", SITE, inventory=str(inventory))
    text = output(runner)
    assert runner.status == "failed" and runner.rc != 0, text[-3000:]
    assert "(nothing was changed on any host):" in text, text[-3000:]
    assert runner.stats["changed"] == {}, runner.stats
    assert set(task_names(runner)) <= ALLOWED, task_names(runner)
    return text


def refusal_line(text, where, key, found):
    if found is None:
        start = f"{where}: {key}: found "
    elif found.endswith("..."):
        start = f"{where}: {key}: found {found[:-3]}"
    else:
        start = f"{where}: {key}: found {found}; expected "
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(start)]
    assert lines, f"no line starting {start!r} in:\n" + text[-3000:]
    assert "; fix: " in lines[0], lines[0]
    assert "Traceback" not in text
    return lines[0]


# The value cases share their site.yml runs: one run per batch of cases that set different keys, since the
# preflight reports every problem it finds at once; each case still asserts its own line in its batch's refusal.
# A profile that cannot be read leaves nothing to check its values against: those cases run alone. The flags of
# sparkfleet_vllm_args are checked only once the cluster's own keys pass: they batch among themselves, each flag a
# key of its own. (80 value cases: 11 runs.)
ALONE = {"profile-unknown", "profile-bad-name", "profile-paths-a-mapping"}


def batches(cases):
    """[(merged group_vars, [case ids])], in the order of the cases."""
    made = []
    for name, values, *_rest in cases:
        for merged, names in made:
            if name in ALONE or names[0] in ALONE:
                continue
            if (set(values) == {"sparkfleet_vllm_args"}) != (set(merged) == {"sparkfleet_vllm_args"}):
                continue
            clash = set(values) & set(merged)
            flags, merged_flags = values.get("sparkfleet_vllm_args"), merged.get("sparkfleet_vllm_args")
            if clash == {"sparkfleet_vllm_args"} and isinstance(flags, dict) and isinstance(merged_flags, dict) \
                    and not set(flags) & set(merged_flags):
                merged["sparkfleet_vllm_args"] = dict(merged_flags, **flags)
                names.append(name)
                break
            if not clash:
                merged.update(values)
                names.append(name)
                break
        else:
            made.append((dict(values), [name]))
    return made


BATCHES = batches(CASES)
REFUSALS = {}  # batch number -> its run's output, on the worker that runs this module's tests


@pytest.fixture
def refusal(weights_lab, tmp_path_factory):
    """The refusal of the batch a case is in: site.yml run once per batch on a copy of the weights lab's
    inventory with the batch's values in its group_vars."""
    def text_for(case):
        number = next(index for index, (_merged, names) in enumerate(BATCHES) if case in names)
        if number not in REFUSALS:
            where = tmp_path_factory.mktemp(f"bad-batch-{number}")
            inventory = inventory_copy(weights_lab, where)
            (inventory / "group_vars").mkdir()
            (inventory / "group_vars" / "sparkfleet_cluster.yml").write_text(yaml.safe_dump(BATCHES[number][0]))
            try:
                REFUSALS[number] = refused(inventory, where)
            except AssertionError as failure:  # every case of the batch fails with it, without running it again
                REFUSALS[number] = failure
        if isinstance(REFUSALS[number], AssertionError):
            raise REFUSALS[number]
        return REFUSALS[number]
    return text_for


def test_the_value_cases_share_few_runs_and_every_case_is_in_one():
    assert sorted(name for _merged, names in BATCHES for name in names) == sorted(case[0] for case in CASES)
    assert len(BATCHES) <= len(ALONE) + 8, [names for _merged, names in BATCHES]


@pytest.mark.parametrize("case, where, key, found", [(case[0], *case[2:]) for case in CASES],
                         ids=[c[0] for c in CASES])
def test_a_bad_value_is_refused_before_any_host_changes(case, where, key, found, refusal):
    refusal_line(refusal(case), where, key, found)


@pytest.mark.parametrize("change, where, key, found", [case[1:] for case in STRUCTURE],
                         ids=[c[0] for c in STRUCTURE])
def test_a_broken_inventory_is_refused_before_any_host_changes(change, where, key, found, broken, tmp_path):
    address = change(broken)
    line = refusal_line(refused(broken, tmp_path), where, key, found)
    if address:
        assert f"the node's management address {address} (ansible_host)" in line


def test_an_empty_cluster_is_refused_rather_than_a_success_with_nothing_done(broken, tmp_path):
    data = hosts_file(broken)
    data["all"]["children"]["sparkfleet_cluster"] = {"hosts": {}}
    write_hosts(broken, data)
    line = refusal_line(refused(broken, tmp_path), GROUP, "hosts", "an empty group")
    assert line.endswith(f"fix: list your nodes under group {GROUP} (see inventory/examples/spark2)")


def test_no_secret_reaches_the_output_of_a_refusal(broken, tmp_path):
    key = "s3cret-with-a-newline-0123456789\n"
    (broken / "group_vars").mkdir()
    (broken / "group_vars" / "sparkfleet_cluster.yml").write_text(yaml.safe_dump({"sparkfleet_api_key": key}))
    text = refused(broken, tmp_path)
    assert key.strip() not in text
    refusal_line(text, GROUP, "sparkfleet_api_key", "a secret of 33 characters with a line break")


def test_an_unreachable_node_is_reported_as_such_and_nothing_is_changed(broken, tmp_path):
    """The preflight's first contact (node discovery) finds node1 refusing SSH: the run stops on every node."""
    data = hosts_file(broken)
    cluster_hosts(data)["node1"]["ansible_port"] = 1  # nothing listens there: connection refused at once
    write_hosts(broken, data)
    runner = run_playbook(tmp_path / "run", SITE, inventory=str(broken))
    text = output(runner)
    assert runner.status == "failed", text[-3000:]
    assert set(runner.stats["dark"]) == {"node1"}, runner.stats
    assert "fatal: [node1]: UNREACHABLE!" in text and "port 1" in text
    # The preflight play's any_errors_fatal ends it for node0 too; the later plays start with no host left. (Where
    # the role runs in a play without it, the preflight's own check stops the others, naming the node.)
    assert runner.stats["changed"] == {}
    plays = {e["event_data"].get("play") for e in runner.events if e["event"] == "runner_on_start"}
    assert plays == {"Preflight"}, plays
