"""The capacity planner against vLLM's exact CPU figures and the field's published GLM-5.3-Flash pools."""

import copy
import os

import pytest
import yaml

from ansible_collections.sparkfleet.cluster.plugins.filter.capacity import kv_plan
from ansible_collections.sparkfleet.cluster.plugins.module_utils import kv_capacity
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import profiles

GIB = 1024 ** 3
PROFILES = profiles.collection_profile_dir()


def load(name):
    return profiles.load(name, [PROFILES])


def llama(layers, kv_heads, head_dim, block=128):
    """A dense model as vLLM's CPU backend pages it (bf16 K and V per head)."""
    return {"name": "dense", "max_model_len": 512, "kv_cache_dtype": "auto",
            "capacity": {"block_size": block, "token_layers": {
                "attention": {"layers": layers, "kv_heads": kv_heads, "bytes_per_token": {"auto": 2 * head_dim * 2}}}}}


# Measured on vLLM CPU 0.32.0 (docs/testing.md §7, and this project's lab): exact, whole blocks.
@pytest.mark.parametrize("profile, tp, pin, tokens", [
    (llama(1, 2, 64), 1, GIB, 2_097_152),            # 512 B/token: 16,384 blocks of 128
    (llama(1, 2, 64), 1, 300_000_000, 585_856),      # 4,577 whole blocks
    (llama(2, 4, 64), 2, 256 * 2 ** 20, 262_144),    # a 4-head tiny model over two ranks (2 heads each)
    ({"name": "mla", "max_model_len": 512, "kv_cache_dtype": "auto",   # DeepSeek-style MLA, 576 B latent+rope
      "capacity": {"block_size": 16, "token_layers": {"mla": {"layers": 2, "bytes_per_token": {"auto": 1152}}}}},
     1, GIB, 466_032),
])
def test_dense_and_mla_pools_match_vllm_exactly(profile, tp, pin, tokens):
    plan = kv_capacity.plan(profile, tp, {"kv-cache-memory-bytes": pin})
    assert plan["pool_tokens"] == tokens
    assert plan["pool_source"] == "pin"


def test_tiny_cpu_profile_plans_the_lab_pool():
    plan = kv_plan(load("tiny-cpu"), 2)
    assert plan["kv_bytes_per_token"] == 3072  # 2 layers x 6 of 12 heads per rank x 256 B
    assert plan["pool_tokens"] == 87_296  # 682 whole blocks of 128 in 256 MiB
    assert plan["max_concurrency"] == 170.5
    assert plan["problems"] == []
    assert plan["lanes"] == {"200000": None, "500000": None, "1000000": None}  # longer than max_model_len


def test_kv_heads_are_split_but_never_below_one_per_rank():
    model = llama(2, 2, 64)
    assert kv_capacity.plan(model, 4, {"kv-cache-memory-bytes": GIB})["kv_bytes_per_token"] == 512


# The field's published pools (docs/field-facts.md §10) and the planner's distance from each. The community images
# keep the indexer at kpool 4. Every point is over-estimated: the forks spend ~0.9-1.3 KB per token beyond
# MLA + indexer + KDA state (alignment of hybrid pages, the KDA tail ring, drafter layers that are not MTP).
# MTP-4 at 262K grows state the planner does not model (6,962 -> 8,793 B/token in the field), and the NVFP4
# pool at TP4 is a fork whose budget is not published: both carry wider bounds.
PUBLISHED = [
    # name, tp, KV dtype, pin, max_model_len, MTP tokens, block, published pool, error bound
    ("TP2 NVFP4 KV, 9.06e9 pin, 900K, MTP-3", 2, "nvfp4", 9_060_000_000, 900_000, 3, 64, 2_049_230, 0.13),
    ("TP2 NVFP4 KV, 11.24e9 pin, 900K", 2, "nvfp4", 11_239_802_020, 900_000, 3, 64, 2_600_787, 0.13),
    ("TP2 NVFP4 KV, 9.5e9 pin, 900K", 2, "nvfp4", 9_500_000_000, 900_000, 3, 64, 2_150_000, 0.13),
    ("TP2 fp8_ds_mla, 4.14 GiB, 262K", 2, "fp8_ds_mla", int(4.14 * GIB), 262_144, 0, 64, 507_041, 0.13),
    ("TP3 fp8_e4m3, 10.73 GiB, 512K, MTP-4", 3, "fp8_e4m3", int(10.73 * GIB), 524_288, 4, 2304, 1_505_849, 0.16),
    ("TP3 fp8_e4m3, 4.38 GiB, 262K", 3, "fp8_e4m3", int(4.38 * GIB), 262_144, 0, 2304, 675_219, 0.13),
    ("TP3 fp8_e4m3, 4.38 GiB, 262K, MTP-4", 3, "fp8_e4m3", int(4.38 * GIB), 262_144, 4, 2304, 534_635, 0.31),
    ("TP4 fp8_e4m3, 16 GiB, 1M", 4, "fp8_e4m3", 16 * GIB, 1_048_576, 0, 2304, 2_516_582, 0.13),
    ("TP4 fp8_e4m3, 24 GiB, 1M", 4, "fp8_e4m3", 24 * GIB, 1_048_576, 0, 2304, 3_895_606, 0.13),
    ("TP4 fp8_e4m3, 32 GiB, 1M", 4, "fp8_e4m3", 32 * GIB, 1_048_576, 0, 2304, 5_033_164, 0.13),
    ("TP4 NVFP4 KV, 32 GiB, 1M", 4, "nvfp4", 32 * GIB, 1_048_576, 0, 2304, 6_652_112, 0.45),
]


def published_plan(tp, dtype, pin, max_len, mtp, block):
    profile = copy.deepcopy(load("glm-5.3-flash-nvfp4-tp2"))
    profile["kv_cache_dtype"] = dtype
    profile["capacity"]["token_layers"]["indexer"]["tokens_per_entry"] = 4
    args = {"kv-cache-memory-bytes": pin, "max-model-len": max_len, "block-size": block,
            "speculative-config": {"method": "mtp", "num_speculative_tokens": mtp} if mtp else None}
    return kv_capacity.plan(profile, tp, args)


@pytest.mark.parametrize("name, tp, dtype, pin, max_len, mtp, block, published, bound", PUBLISHED,
                         ids=[point[0] for point in PUBLISHED])
def test_published_glm_pools(name, tp, dtype, pin, max_len, mtp, block, published, bound):
    plan = published_plan(tp, dtype, pin, max_len, mtp, block)
    error = (plan["pool_tokens"] - published) / published
    assert 0 < error <= bound, f"{name}: planned {plan['pool_tokens']:,}, published {published:,} ({error:+.1%})"


def test_published_concurrency_of_the_tp2_headline():
    plan = published_plan(2, "nvfp4", 9_060_000_000, 900_000, 3, 64)
    assert plan["max_concurrency"] == pytest.approx(2.28, rel=0.13)  # the field's 2.28x


def test_nvfp4_store_holds_more_than_twice_the_fp8_ds_mla_pool():
    nvfp4 = published_plan(2, "nvfp4", 9_060_000_000, 900_000, 0, 64)
    fp8 = published_plan(2, "fp8_ds_mla", 9_060_000_000, 900_000, 0, 64)
    assert 2.0 < nvfp4["pool_tokens"] / fp8["pool_tokens"] < 2.28  # 656/288 = 2.28 on MLA alone


@pytest.mark.parametrize("name", ["glm-5.3-flash-nvfp4-tp2", "glm-5.3-flash-nvfp4-tp3", "glm-5.3-flash-fp8-tp4"])
def test_shipped_glm_profiles_plan_cleanly_on_a_gb10(name):
    profile = load(name)
    plan = kv_plan(profile, profile["tensor_parallel_sizes"][0])
    assert plan["problems"] == []
    assert plan["pool_tokens"] >= profile["capacity"]["min_pool_tokens"]
    assert plan["headroom_bytes"] > 0
    assert plan["lanes"]["200000"] >= 1


def test_a_pin_larger_than_the_node_holds_is_refused():
    profile = load("glm-5.3-flash-nvfp4-tp2")
    plan = kv_plan(profile, 2, {"kv-cache-memory-bytes": "40G"})
    assert len(plan["problems"]) == 1
    line = plan["problems"][0]
    assert line.startswith("sparkfleet_cluster: sparkfleet_vllm_args: kv-cache-memory-bytes: found ")
    assert "GiB needed per node" in line and "expected at most the node's 121.63 GiB" in line
    assert "fix: lower the KV pin by at least" in line


def test_max_model_len_above_the_models_limit_is_refused():
    plan = kv_plan(load("glm-5.3-flash-nvfp4-tp2"), 2, {"max-model-len": 2_000_000})
    assert any("max-model-len: found 2,000,000; expected at most the model's limit 1,048,576" in p
               for p in plan["problems"])


def test_a_pool_smaller_than_one_request_is_refused():
    plan = kv_plan(load("tiny-cpu"), 1, {"kv-cache-memory-bytes": 4096})
    assert any("room for one request of max-model-len 512" in p for p in plan["problems"])


def test_utilization_without_a_pin_subtracts_weights_and_runtime():
    profile = load("glm-5.3-flash-fp8-tp4")
    plan = kv_plan(profile, 4, {"kv-cache-memory-bytes": None, "gpu-memory-utilization": 0.85})
    memory = profile["capacity"]["memory"]
    expected = int(memory["node_memory_bytes"] * 0.85) - memory["weights_bytes_per_rank"] - memory["runtime_bytes"]
    assert plan["pool_bytes"] == expected
    assert plan["pool_source"] == "utilization 0.85"


def test_the_node_memory_found_wins_over_the_profiles():
    plan = kv_plan(load("tiny-cpu"), 2, None, 2 * GIB)
    assert plan["node_memory_bytes"] == 2 * GIB
    assert any("expected at most the node's 2.00 GiB" in p for p in plan["problems"])


def test_the_lab_pool_fits_this_machine_kind():
    plan = kv_plan(load("tiny-cpu"), 2, None, 23 * GIB)
    assert plan["problems"] == []
    assert plan["memory_needed_bytes"] == 16 * 2 ** 20 + 3 * GIB + 256 * 2 ** 20 + GIB


@pytest.mark.parametrize("value, expected", [
    (9060000000, 9060000000), ("9060000000", 9060000000), ("4G", 4 * GIB), ("4g", 4_000_000_000),
    ("9.06g", 9_060_000_000), ("25.6k", 25_600), ("512M", 512 * 2 ** 20), (None, None),
])
def test_byte_sizes_as_vllm_reads_them(value, expected):
    assert kv_capacity.parse_bytes(value) == expected


@pytest.mark.parametrize("value", ["lots", "24GiB", "24GB", "4.5G", "1.5", True])
def test_a_byte_size_vllm_would_refuse_is_refused_here(value):
    with pytest.raises(kv_capacity.PlanError, match="expected a byte count as vLLM reads it"):
        kv_capacity.parse_bytes(value)


def test_the_inventory_can_change_the_stored_kv_format():
    profile = load("glm-5.3-flash-nvfp4-tp2")
    nvfp4 = kv_plan(profile, 2)
    rolled_back = kv_plan(profile, 2, {"kv-cache-dtype": "fp8_ds_mla"})
    assert rolled_back["kv_cache_dtype"] == "fp8_ds_mla"
    assert rolled_back["pool_tokens"] < nvfp4["pool_tokens"] / 2


def test_a_speculative_config_in_vllms_json_form_counts():
    profile = load("glm-5.3-flash-nvfp4-tp2")
    as_text = kv_plan(profile, 2, {"speculative-config": '{"method": "mtp", "num_speculative_tokens": 3}'})
    assert as_text["speculative_tokens"] == 3
    assert as_text["pool_tokens"] == kv_plan(profile, 2)["pool_tokens"]


def test_a_kv_dtype_the_profile_has_no_size_for():
    profile = copy.deepcopy(load("glm-5.3-flash-nvfp4-tp2"))
    profile["kv_cache_dtype"] = "int4"
    with pytest.raises(kv_capacity.PlanError, match=r"KV dtype 'int4'.*expected one of fp8_ds_mla, fp8_e4m3, nvfp4"):
        kv_capacity.plan(profile, 2)


def test_plan_lines_for_people():
    lines = kv_plan(load("glm-5.3-flash-nvfp4-tp2"), 2)["lines"]
    assert lines[0].startswith("KV sparkfleet_nvfp4: 3,555 B/token per rank")
    assert "3 speculative tokens" in lines[0]
    assert "lanes 200K x" in lines[1] and "1000K n/a" in lines[1]  # max_model_len 900K


def test_every_shipped_profile_has_a_capacity_section():
    for name in profiles.available([PROFILES]):
        with open(os.path.join(PROFILES, f"{name}.yml"), encoding="utf-8") as handle:
            profile = yaml.safe_load(handle)
        assert kv_capacity.plan(profile, profile["tensor_parallel_sizes"][0])["pool_tokens"] > 0, name
