"""The node collector's textfile, from real nvidia-smi, kernel and zram output, read back by the parser that judges
vLLM's /metrics (and held to Prometheus' format there)."""

from ansible_collections.sparkfleet.cluster.plugins.module_utils import node_metrics as nm
from ansible_collections.sparkfleet.cluster.plugins.module_utils import prometheus_text as prom

# GB10 (DGX Spark): its unified memory is "[N/A]" to nvidia-smi; an H100 next to it for contrast.
GB10_QUERY = """index, uuid, power.draw [W], clocks.current.sm [MHz], temperature.gpu, utilization.gpu [%], \
memory.used [MiB], memory.total [MiB]
0, GPU-5e1c2a9e-0000-0000-0000-000000000000, 22.41 W, 2405 MHz, 51, 96 %, [N/A], [N/A]
"""
H100_QUERY = """index, uuid, power.draw [W], clocks.current.sm [MHz], temperature.gpu, utilization.gpu [%], \
memory.used [MiB], memory.total [MiB]
0, GPU-aaaa, 312.50 W, 1980 MHz, 64, 100 %, 70123 MiB, 81559 MiB
"""
KERNEL = [
    "NVRM: Xid (PCI:000f:01:00): 31, pid=4242, name=python3, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS",
    "NVRM: Xid (PCI:000f:01:00): 81, pid='<unknown>', name=<unknown>, VGA Subsystem Error",
    "NVRM: Xid (PCI:000f:01:00): 31, pid=4242, name=python3, Ch 00000008, intr 10000000. MMU Fault",
    "NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  580.95.05",
]
ZRAM = {"zram0": {"disksize": "68719476736\n", "mm_stat": "4096000 1024000 1310720 0 1310720 12 0 0 0\n"},
        "zram1": {"disksize": "0\n", "mm_stat": ""}}


def samples(text):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in prom.parse_prometheus(text)}


def test_gb10_publishes_power_clock_and_xids_and_leaves_its_unknown_memory_out():
    got = samples(nm.render(GB10_QUERY, None, nm.xid_counts(KERNEL), ZRAM, None, 1_700_000_000.0, has_gpu=True,
                            group_epoch=7))
    gpu = (("gpu", "0"), ("uuid", "GPU-5e1c2a9e-0000-0000-0000-000000000000"))
    assert got[("sparkfleet_gpu_power_watts", gpu)] == 22.41
    assert got[("sparkfleet_gpu_sm_clock_hertz", gpu)] == 2405e6
    assert got[("sparkfleet_gpu_utilization_ratio", gpu)] == 0.96
    assert got[("sparkfleet_gpu_temperature_celsius", gpu)] == 51
    assert not [key for key in got if key[0].startswith("sparkfleet_gpu_memory")]  # [N/A] is not 0
    assert got[("sparkfleet_gpu_query_ok", ())] == 1
    assert got[("sparkfleet_gpu_xid_events_total", (("code", "any"),))] == 3
    assert got[("sparkfleet_gpu_xid_events_total", (("code", "31"),))] == 2
    assert got[("sparkfleet_gpu_xid_events_total", (("code", "81"),))] == 1
    assert got[("sparkfleet_node_metrics_timestamp_seconds", ())] == 1_700_000_000
    assert got[("sparkfleet_group_current_epoch", ())] == 7
    assert got[("sparkfleet_gpu_kernel_log_ok", ())] == 1


def test_an_unreadable_kernel_log_leaves_the_xid_counters_out_and_a_shorter_log_never_lowers_them():
    got = samples(nm.render(GB10_QUERY, None, None, {}, None, 1.0, has_gpu=True))
    assert got[("sparkfleet_gpu_kernel_log_ok", ())] == 0
    assert not [key for key in got if key[0] == "sparkfleet_gpu_xid_events_total"]  # not 0: that reads as a reset
    merged = nm.merge_counts({"31": 2, "81": 1, "bad": "x"}, nm.xid_counts(KERNEL[2:]))  # journald forgot two lines
    assert merged == {"31": 2, "81": 1}
    assert nm.merge_counts(None, nm.xid_counts(KERNEL)) == {"31": 2, "81": 1}


def test_a_gpu_that_reports_memory_publishes_it_in_bytes_and_a_clean_boot_counts_zero_xids():
    got = samples(nm.render(H100_QUERY, None, nm.xid_counts([]), {}, None, 1.0, has_gpu=True))
    gpu = (("gpu", "0"), ("uuid", "GPU-aaaa"))
    assert got[("sparkfleet_gpu_memory_used_bytes", gpu)] == 70123 * 2**20
    assert got[("sparkfleet_gpu_memory_total_bytes", gpu)] == 81559 * 2**20
    assert got[("sparkfleet_gpu_xid_events_total", (("code", "any"),))] == 0


def test_a_failed_or_garbled_nvidia_smi_is_published_as_such_not_as_figures():
    for query, error in ((None, "exit 9"), ("index, power.draw [W]\n0, 1, 2\n", None)):
        got = samples(nm.render(query, error, {}, {}, None, 1.0, has_gpu=True))
        assert got[("sparkfleet_gpu_query_ok", ())] == 0
        assert not [key for key in got if key[0] == "sparkfleet_gpu_power_watts"]


def test_a_node_without_a_gpu_publishes_zram_and_the_nccl_probe_only():
    record = {"bus_bandwidth_gbs": 3.1, "floor_gbs": 18.0, "checked_at": 1_700_000_100}
    text = nm.render(None, None, None, ZRAM, record, 5.0, has_gpu=False)
    got = samples(text)
    assert not [key for key in got if key[0].startswith("sparkfleet_gpu_")]
    device = (("device", "zram0"),)
    assert got[("sparkfleet_zram_disksize_bytes", device)] == 68719476736
    assert got[("sparkfleet_zram_original_bytes", device)] == 4096000
    assert got[("sparkfleet_zram_compressed_bytes", device)] == 1024000
    assert got[("sparkfleet_zram_memory_used_bytes", device)] == 1310720
    assert not [key for key in got if ("device", "zram1") in key[1]]  # an unset device has no mm_stat
    assert got[("sparkfleet_nccl_probe_bus_bandwidth_gbytes_per_second", ())] == 3.1
    assert got[("sparkfleet_nccl_probe_floor_gbytes_per_second", ())] == 18.0
    assert text.count("# TYPE sparkfleet_zram_original_bytes gauge") == 1


def test_label_values_are_escaped():
    out = prom.Textfile()
    out.add("m", "help", 1, {"a": 'x"y\\z\nw'})
    assert samples(out.render())[("m", (("a", 'x"y\\z\nw'),))] == 1
