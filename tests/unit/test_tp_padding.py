"""Tensor-parallel padding: the layout of each shipped profile at each size, the refusals, the padded config.json,
the planner's --hf-overrides and the preflight's problem lines."""

import copy
import json

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils import inventory, kv_capacity, tp_padding
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import profiles

PROFILES = profiles.collection_profile_dir()


def load(name):
    return profiles.load(name, [PROFILES])


def sizes(split):
    return {d["name"]: (d["size"], d["padded_size"], d["per_rank"]) for d in split["dimensions"]}


def test_glm_at_tp3_pads_heads_moe_and_vocab_as_the_field_does():
    split = tp_padding.layout(load("glm-5.3-flash-nvfp4-tp3"), 3)
    assert split["problems"] == []
    assert sizes(split) == {"attention heads": (64, 66, 22), "MoE width": (2048, 2112, 704)}
    assert split["vocab"]["padded_size"] == 154_944 and split["vocab"]["padded_multiple"] == 192
    assert 704 % 16 == 0  # each rank's MoE share is whole NVFP4 blocks (upstream's 2049 gives 683)
    heads = {"num_attention_heads": 66, "num_key_value_heads": 66, "linear_num_heads": 66}
    assert split["hf_overrides"] == {**heads, "moe_intermediate_size": 2112,
                                     "text_config": {**heads, "moe_intermediate_size": 2112}}
    assert json.loads(split["env"][tp_padding.ENV]) == {"tp": 3, "widths": [[64, 66], [2048, 2112]], "vocab": True}


@pytest.mark.parametrize("name, tp", [("glm-5.3-flash-nvfp4-tp2", 2), ("glm-5.3-flash-fp8-tp4", 4),
                                      ("tiny-cpu", 1), ("tiny-cpu", 2), ("tiny-cpu", 3), ("tiny-cpu", 4),
                                      ("tiny-cpu-padded", 1), ("tiny-cpu-padded", 2)])
def test_sizes_that_divide_pad_nothing(name, tp):
    split = tp_padding.layout(load(name), tp)
    assert not split["padded"] and not split["problems"]
    assert split["hf_overrides"] == {} and split["env"] == {}
    assert all(d["padded_size"] == d["size"] for d in split["dimensions"])


def test_the_labs_proof_model_pads_every_dimension_at_tp3():
    split = tp_padding.layout(load("tiny-cpu-padded"), 3)
    assert sizes(split) == {"attention heads": (10, 12, 4), "MLP width": (1000, 1008, 336)}
    assert split["vocab"]["stock_padded_size"] == 4160  # vLLM's own padding, which does not divide by 3
    assert split["vocab"]["padded_size"] == 4224
    assert split["hf_overrides"] == {"num_attention_heads": 12, "num_key_value_heads": 12, "intermediate_size": 1008}


def test_a_size_the_profile_may_not_pad_is_named_with_remainder_and_padding():
    split = tp_padding.layout(load("glm-5.3-flash-nvfp4-tp2"), 3)
    assert split["env"] == {}
    lines = {key: (found, expected, fix) for key, found, expected, fix in split["problems"]}
    found, expected, fix = lines["tensor_parallel.dimensions: attention heads"]
    assert found == "num_attention_heads 64 over 3 ranks leaves a remainder of 1"
    assert "zero padding to 66 would make it divide (2 more, 3.1% of its work on zeros)" in fix
    found, expected, fix = lines["tensor_parallel.dimensions: MoE width"]
    assert "remainder of 128" in found and "multiples of 64" in expected and "padding to 2112" in fix
    found, expected, fix = lines["tensor_parallel.vocab"]
    assert "remainder of 2" in found and "lcm(64, 3) = 192 (154944)" in fix


def test_the_planner_passes_the_padding_and_plans_the_padded_heads():
    profile = load("tiny-cpu-padded")
    plan = kv_capacity.plan(profile, 3)
    assert plan["vllm_args"]["hf-overrides"] == {"num_attention_heads": 12, "num_key_value_heads": 12,
                                                 "intermediate_size": 1008}
    # 12 padded KV heads, 4 a rank: 2 layers x 4 x 768 B (float32 K and V of 96) = 6,144 B a token.
    assert plan["kv_bytes_per_token"] == 6144
    assert plan["tp_padding"]["padded"] and plan["tp_padding"]["env"]
    assert kv_capacity.plan(profile, 2)["kv_bytes_per_token"] == 2 * 5 * 768
    assert "hf-overrides" not in kv_capacity.plan(profile, 2)["vllm_args"]


def test_overrides_the_profile_sets_itself_are_kept_beside_the_padding():
    profile = copy.deepcopy(load("glm-5.3-flash-nvfp4-tp3"))
    profile["vllm_args"]["hf-overrides"] = {"rope_theta": 1.0, "text_config": {"rope_theta": 1.0}}
    args = kv_capacity.plan(profile, 3)["vllm_args"]["hf-overrides"]
    assert args["rope_theta"] == 1.0 and args["num_attention_heads"] == 66
    assert args["text_config"] == {"rope_theta": 1.0, "num_attention_heads": 66, "num_key_value_heads": 66,
                                   "linear_num_heads": 66, "moe_intermediate_size": 2112}


@pytest.mark.parametrize("section, key", [
    ("not a mapping", "tensor_parallel"),
    ({"dimensions": "heads"}, "tensor_parallel.dimensions"),
    ({"dimensions": [{"keys": [], "size": 4}]}, "tensor_parallel.dimensions[0].keys"),
    ({"dimensions": [{"keys": ["h"], "size": 0}]}, "tensor_parallel.dimensions[0]"),
    ({"dimensions": [{"keys": ["h"], "size": 4, "pad": "yes"}]}, "tensor_parallel.dimensions[0].pad"),
    ({"vocab": {"size": "big"}}, "tensor_parallel.vocab"),
    ({"config_sections": "text_config"}, "tensor_parallel.config_sections"),
])
def test_a_malformed_section_is_one_clear_error(section, key):
    with pytest.raises(tp_padding.PaddingError) as err:
        tp_padding.layout({"name": "x", "tensor_parallel": section}, 3)
    assert err.value.key == key and err.value.fix


def test_the_padded_config_changes_only_the_padded_keys_and_refuses_a_stranger():
    plan = tp_padding.layout(load("glm-5.3-flash-nvfp4-tp3"), 3)
    config = {"num_attention_heads": 64, "num_key_value_heads": 64, "moe_intermediate_size": 2048,
              "vocab_size": 154880, "text_config": {"num_attention_heads": 64, "linear_num_heads": 64}}
    padded = tp_padding.padded_config(config, plan)
    assert padded == {"num_attention_heads": 66, "num_key_value_heads": 66, "moe_intermediate_size": 2112,
                      "vocab_size": 154880, "text_config": {"num_attention_heads": 66, "linear_num_heads": 66}}
    assert config["num_attention_heads"] == 64  # the input is left as it was
    with pytest.raises(tp_padding.PaddingError, match=r"config.json text_config.linear_num_heads: found 66"):
        tp_padding.padded_config(dict(config, text_config={"linear_num_heads": 66}), plan)
    # A layout that pads nothing gives the file back as it is.
    assert tp_padding.padded_config(config, tp_padding.layout(load("glm-5.3-flash-nvfp4-tp2"), 2)) == config


def test_preflight_names_the_cluster_size_the_dimension_and_the_fix():
    problems = inventory.check_tp_split(load("glm-5.3-flash-nvfp4-tp2"), 3)
    assert len(problems) == 3
    line = problems[0].line()
    assert line.startswith("sparkfleet_cluster: sparkfleet_tensor_parallel_size: 3 (profile glm-5.3-flash-nvfp4-tp2, "
                           "tensor_parallel.dimensions: attention heads): found num_attention_heads 64 over 3 ranks")
    assert inventory.check_tp_split(load("glm-5.3-flash-nvfp4-tp3"), 3) == []
    broken = inventory.check_tp_split({"name": "odd", "tensor_parallel": {"dimensions": 5}}, 3)
    assert broken[0].key == "sparkfleet_model_profile: odd: tensor_parallel.dimensions"


def test_overrides_given_as_json_text_are_kept_and_anything_else_is_refused():
    profile = copy.deepcopy(load("glm-5.3-flash-nvfp4-tp3"))
    args = kv_capacity.plan(profile, 3, {"hf-overrides": '{"rope_theta": 2.0}'})["vllm_args"]["hf-overrides"]
    assert args["rope_theta"] == 2.0 and args["num_attention_heads"] == 66
    with pytest.raises(kv_capacity.PlanError) as err:
        kv_capacity.plan(profile, 3, {"hf-overrides": "not json"})
    assert err.value.key == "sparkfleet_vllm_args: hf-overrides" and "'not json'" in err.value.found


def test_grouped_query_heads_are_never_padded_without_their_kv_heads():
    profile = {"name": "gqa", "tensor_parallel": {"dimensions": [
        {"name": "attention heads", "keys": ["num_attention_heads"], "size": 20, "pad": True}]}}
    plan = tp_padding.layout(profile, 8)
    assert plan["dimensions"][0]["padded_size"] == 24
    with pytest.raises(tp_padding.PaddingError, match=r"num_key_value_heads: found 4 KV heads for 20 query heads"):
        tp_padding.padded_config({"num_attention_heads": 20, "num_key_value_heads": 4}, plan)
    # Multi-head attention with the KV heads left implicit pads as one.
    assert tp_padding.padded_config({"num_attention_heads": 20}, plan) == {"num_attention_heads": 24}


def test_a_padded_dimension_the_config_does_not_hold_is_refused():
    plan = tp_padding.layout(load("tiny-cpu-padded"), 3)
    with pytest.raises(tp_padding.PaddingError, match=r"config.json intermediate_size: found none of these keys"):
        tp_padding.padded_config({"num_attention_heads": 10, "num_key_value_heads": 10, "ffn_dim": 1000}, plan)
