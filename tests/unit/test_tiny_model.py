"""scripts/make_tiny_model.py writes a loadable, verifiable, deterministic tiny Llama model."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import numpy as np
import pytest
import sourcefile
from jinja2.sandbox import ImmutableSandboxedEnvironment
from safetensors import safe_open
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make_tiny_model.py"

tiny = sourcefile.load("scripts/make_tiny_model.py", "make_tiny_model", register=True)

SMALL = {"vocab_size": 1024}  # a smaller vocabulary keeps the extra runs quick
EXPECTED_FILES = [
    "SHA256SUMS",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
]


def expected_shapes(hidden=256, layers=2, heads=4, kv_heads=4, vocab=4096, inter=512):
    head_dim = hidden // heads
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden],
              "lm_head.weight": [vocab, hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": [heads * head_dim, hidden],
            p + "self_attn.k_proj.weight": [kv_heads * head_dim, hidden],
            p + "self_attn.v_proj.weight": [kv_heads * head_dim, hidden],
            p + "self_attn.o_proj.weight": [hidden, heads * head_dim],
            p + "mlp.gate_proj.weight": [inter, hidden],
            p + "mlp.up_proj.weight": [inter, hidden],
            p + "mlp.down_proj.weight": [hidden, inter],
            p + "input_layernorm.weight": [hidden],
            p + "post_attention_layernorm.weight": [hidden],
        }
    return shapes


def read_json(path):
    return json.loads(Path(path).read_text())


def headers(model_dir):
    """{tensor name: (file, shape, dtype)} over every safetensors file in the directory."""
    found = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(path, framework="numpy") as f:
            assert f.metadata() == {"format": "pt"}
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                assert name not in found, f"{name} stored twice"
                piece = f.get_slice(name)
                found[name] = (path.name, list(piece.get_shape()), piece.get_dtype())
    return found


def file_sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sha256sum_check(model_dir):
    return subprocess.run(["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=model_dir, capture_output=True,
                          text=True, check=False)


@pytest.fixture(scope="module")
def default_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("default")
    return out, tiny.generate(out, seed=0)


@pytest.fixture(scope="module")
def sharded_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    return out, tiny.generate(out, seed=0, shard_mib=1)


def test_default_model_files_and_summary(default_model):
    out, result = default_model
    assert sorted(p.name for p in out.iterdir()) == EXPECTED_FILES
    assert result["files"] == EXPECTED_FILES
    assert result["total_bytes"] == sum(p.stat().st_size for p in out.iterdir())
    assert result["parameters"] == sum(int(np.prod(s)) for s in expected_shapes().values())
    assert result["weight_bytes"] == 2 * result["parameters"]
    assert result["num_layers"] == 2
    assert f"{result['parameters']} parameters" in result["summary"]
    assert "\n" not in result["summary"]


def test_sha256sums_cover_every_file_and_pass_sha256sum(default_model):
    out, _result = default_model
    lines = (out / "SHA256SUMS").read_text().splitlines()
    names = [line[66:] for line in lines]
    assert all(re.fullmatch(r"[0-9a-f]{64}  \S+", line) for line in lines)
    assert names == sorted(names) == [f for f in EXPECTED_FILES if f != "SHA256SUMS"]
    check = sha256sum_check(out)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == len(names)


def test_config_is_a_llama_config(default_model):
    out, _result = default_model
    config = read_json(out / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (256, 512, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (4, 4, 4096)
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["max_position_embeddings"] == 2048
    assert config["tie_word_embeddings"] is False
    assert config["rms_norm_eps"] > 0 and config["rope_theta"] > 0
    # What is on disk decides torch_dtype: numpy has no bfloat16, so float16 (safetensors "F16").
    assert config["torch_dtype"] == "float16"
    generation = read_json(out / "generation_config.json")
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (config["bos_token_id"], config["eos_token_id"])


def test_weights_have_llama_names_shapes_and_dtype(default_model):
    out, _result = default_model
    found = headers(out)
    assert {name: shape for name, (_shard, shape, _dtype) in found.items()} == expected_shapes()
    assert {dtype for _shard, _shape, dtype in found.values()} == {"F16"}
    with safe_open(out / "model.safetensors", framework="numpy") as f:
        assert np.all(f.get_tensor("model.norm.weight") == 1.0)
        assert np.all(f.get_tensor("model.layers.1.input_layernorm.weight") == 1.0)
        embed = f.get_tensor("model.embed_tokens.weight").astype(np.float32)
        assert abs(float(embed.mean())) < 0.001 and 0.018 < float(embed.std()) < 0.022
        assert not np.array_equal(f.get_tensor("model.layers.0.self_attn.q_proj.weight"),
                                  f.get_tensor("model.layers.0.self_attn.k_proj.weight"))


def test_same_seed_from_the_cli_gives_identical_files(default_model, tmp_path):
    out, _result = default_model
    # A separate process: the tokenizer cache does not help, so the tokenizer training itself must be deterministic.
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--seed", "0"], capture_output=True,
                         text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("\n") == 1 and "parameters" in run.stdout
    assert (tmp_path / "SHA256SUMS").read_bytes() == (out / "SHA256SUMS").read_bytes()


def test_another_seed_gives_other_weights(default_model, tmp_path):
    out, _result = default_model
    tiny.generate(tmp_path, seed=1)
    assert file_sha(tmp_path / "model.safetensors") != file_sha(out / "model.safetensors")
    assert sha256sum_check(tmp_path).returncode == 0


def test_tokenizer_loads_round_trips_and_matches_config(default_model):
    out, _result = default_model
    config = read_json(out / "config.json")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == config["vocab_size"] == 4096
    assert tok.token_to_id("<s>") == config["bos_token_id"]
    assert tok.token_to_id("</s>") == config["eos_token_id"]
    assert tok.token_to_id("<pad>") == config["pad_token_id"]
    assert tok.token_to_id("<unk>") is not None
    text = "The quick server sends 42 packets to the cluster, then waits!"
    enc = tok.encode(text)
    assert enc.ids[0] == config["bos_token_id"]
    assert len(enc.ids) < len(text)  # merges were learned
    assert tok.decode(enc.ids) == text
    assert tok.decode(tok.encode("Ünïcode ✓ and\ttabs").ids) == "Ünïcode ✓ and\ttabs"  # byte-level: nothing unknown
    tok_config = read_json(out / "tokenizer_config.json")
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_config["model_max_length"] == config["max_position_embeddings"]
    special = read_json(out / "special_tokens_map.json")
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert tok_config[key] == special[key]
        assert tok.token_to_id(special[key]) is not None


def test_chat_template_renders_a_conversation(default_model):
    out, _result = default_model
    tok_config = read_json(out / "tokenizer_config.json")
    # The environment transformers uses for apply_chat_template.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(tok_config["chat_template"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    tokens = {"bos_token": tok_config["bos_token"], "eos_token": tok_config["eos_token"]}
    prompt = template.render(messages=messages, add_generation_prompt=True, **tokens)
    assert prompt == "<s><|system|>\nBe brief.</s>\n<|user|>\nHello there</s>\n<|assistant|>\n"
    closed = template.render(messages=messages, add_generation_prompt=False, **tokens)
    assert closed == prompt.removesuffix("<|assistant|>\n")


@pytest.mark.parametrize(("hidden", "heads"), [(64, 4), (256, 8), (512, 16)])
def test_head_dim_below_64_is_refused_before_writing(tmp_path, hidden, heads):
    out = tmp_path / "refused"
    with pytest.raises(ValueError, match=rf"head_dim = hidden_size / heads = {hidden} / {heads} = \d+ is below 64"):
        tiny.generate(out, hidden_size=hidden, heads=heads, kv_heads=heads)
    assert not out.exists()


def test_cli_refuses_head_dim_below_64(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x"), "--hidden-size", "64"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2
    assert "head_dim" in run.stderr and "below 64" in run.stderr
    assert not (tmp_path / "x").exists()


def test_sharded_index_covers_every_tensor_once(sharded_model, default_model):
    out, result = sharded_model
    index = read_json(out / "model.safetensors.index.json")
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    n = len(shards)
    assert n > 2 and result["weight_files"] == shards
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert not (out / "model.safetensors").exists()
    found = headers(out)  # also asserts no tensor is stored in two shards
    assert index["weight_map"] == {name: shard for name, (shard, _shape, _dtype) in found.items()}
    assert set(index["weight_map"]) == set(expected_shapes())
    assert set(index["weight_map"].values()) == set(shards)
    tensor_bytes = sum(int(np.prod(shape)) * 2 for _shard, shape, _dtype in found.values())
    assert index["metadata"]["total_size"] == tensor_bytes == result["weight_bytes"]
    assert all((out / s).stat().st_size <= 2 * 1024 * 1024 + 4096 for s in shards)  # embeddings alone are 2 MiB
    assert "model.safetensors.index.json" in (out / "SHA256SUMS").read_text()
    assert sha256sum_check(out).returncode == 0
    # Sharding does not change a single value.
    default_out, _result = default_model
    with safe_open(default_out / "model.safetensors", framework="numpy") as whole:
        for name, (shard, _shape, _dtype) in found.items():
            with safe_open(out / shard, framework="numpy") as part:
                assert np.array_equal(part.get_tensor(name), whole.get_tensor(name)), name


def test_regenerating_in_place_drops_stale_shards(tmp_path):
    tiny.generate(tmp_path, shard_mib=1, **SMALL)
    assert (tmp_path / "model.safetensors.index.json").exists()
    tiny.generate(tmp_path, **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == EXPECTED_FILES
    assert sha256sum_check(tmp_path).returncode == 0


def test_target_mib_grows_layers_to_reach_the_size(tmp_path):
    result = tiny.generate(tmp_path, target_mib=12, **SMALL)
    config = read_json(tmp_path / "config.json")
    per_layer = 2 * sum(int(np.prod(s)) for n, s in expected_shapes(layers=1).items() if ".layers." in n)
    assert config["num_hidden_layers"] == result["num_layers"] > 2
    assert 12 * 2**20 <= result["weight_bytes"] < 12 * 2**20 + per_layer
    assert config["head_dim"] >= 64
    assert set(headers(tmp_path)) == set(expected_shapes(layers=result["num_layers"], vocab=1024))
    # A target below what the given layers already need keeps them.
    assert tiny.generate(tmp_path, target_mib=1, layers=3, **SMALL)["num_layers"] == 3


# ---------------------------------------------------------------------------------------------------------------
# arch="deepseek-mla": a dense DeepSeek-V2 with multi-head latent attention


def expected_mla_shapes(hidden=256, layers=2, heads=4, vocab=4096, inter=512, nope=32, rope=64, v=32, rank=512):
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden],
              "lm_head.weight": [vocab, hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": [heads * (nope + rope), hidden],
            p + "self_attn.kv_a_proj_with_mqa.weight": [rank + rope, hidden],
            p + "self_attn.kv_a_layernorm.weight": [rank],
            p + "self_attn.kv_b_proj.weight": [heads * (nope + v), rank],
            p + "self_attn.o_proj.weight": [hidden, heads * v],
            p + "mlp.gate_proj.weight": [inter, hidden],
            p + "mlp.up_proj.weight": [inter, hidden],
            p + "mlp.down_proj.weight": [hidden, inter],
            p + "input_layernorm.weight": [hidden],
            p + "post_attention_layernorm.weight": [hidden],
        }
    return shapes


@pytest.fixture(scope="module")
def mla_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("mla")
    return out, tiny.generate(out, seed=0, arch="deepseek-mla")


def test_mla_config_is_a_dense_deepseek_v2_with_mla(mla_model):
    out, result = mla_model
    config = read_json(out / "config.json")
    assert config["architectures"] == ["DeepseekV2ForCausalLM"] and config["model_type"] == "deepseek_v2"
    # The only MLA shape vLLM's CPU build serves: latent 512 + rope 64, no q LoRA.
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"], config["q_lora_rank"]) == (512, 64, None)
    assert config["qk_nope_head_dim"] < 128 and config["v_head_dim"] < 128  # smaller than DeepSeek's 128
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (256, 2, 4)
    assert config["num_key_value_heads"] == config["num_attention_heads"]
    # No layer uses the routed experts, but the keys the DeepSeek-V2 loader reads are there.
    assert config["first_k_dense_replace"] == config["num_hidden_layers"] == result["num_layers"]
    for key in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                "moe_layer_freq", "topk_method", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
                "scoring_func"):
        assert key in config, key
    assert config["num_experts_per_tok"] <= config["n_routed_experts"]
    assert "index_topk" not in config  # that would make it sparse MLA (V3.2), which the CPU build rejects
    assert config["torch_dtype"] == "float16" and config["tie_word_embeddings"] is False
    assert result["arch"] == "deepseek-mla"
    assert result["head_dim"] == config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    assert result["summary"].count("DeepseekV2ForCausalLM") == 1


def test_mla_tensors_match_the_config(mla_model):
    out, result = mla_model
    config = read_json(out / "config.json")
    found = headers(out)
    expected = expected_mla_shapes(hidden=config["hidden_size"], layers=config["num_hidden_layers"],
                                   heads=config["num_attention_heads"], vocab=config["vocab_size"],
                                   inter=config["intermediate_size"], nope=config["qk_nope_head_dim"],
                                   rope=config["qk_rope_head_dim"], v=config["v_head_dim"],
                                   rank=config["kv_lora_rank"])
    assert {name: shape for name, (_shard, shape, _dtype) in found.items()} == expected
    assert not any(".experts." in name or name.endswith(("k_proj.weight", "v_proj.weight")) for name in found)
    assert {dtype for _shard, _shape, dtype in found.values()} == {"F16"}
    assert result["parameters"] == sum(int(np.prod(s)) for s in expected.values())
    with safe_open(out / "model.safetensors", framework="numpy") as f:
        assert np.all(f.get_tensor("model.layers.0.self_attn.kv_a_layernorm.weight") == 1.0)
        latent = f.get_tensor("model.layers.1.self_attn.kv_a_proj_with_mqa.weight").astype(np.float32)
        assert 0.018 < float(latent.std()) < 0.022
    assert sha256sum_check(out).returncode == 0


def test_mla_is_deterministic_and_differs_from_llama(mla_model, default_model, tmp_path):
    out, _result = mla_model
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--arch", "deepseek-mla"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert "DeepseekV2ForCausalLM" in run.stdout
    assert (tmp_path / "SHA256SUMS").read_bytes() == (out / "SHA256SUMS").read_bytes()
    llama_out, _result = default_model
    # The shared tensors come from the same (seed, name) streams; the tokenizer is the same too.
    with safe_open(out / "model.safetensors", framework="numpy") as mla, \
            safe_open(llama_out / "model.safetensors", framework="numpy") as llama:
        embed = "model.embed_tokens.weight"
        assert np.array_equal(mla.get_tensor(embed), llama.get_tensor(embed))
    assert (out / "tokenizer.json").read_bytes() == (llama_out / "tokenizer.json").read_bytes()
    assert file_sha(out / "model.safetensors") != file_sha(llama_out / "model.safetensors")


def test_mla_target_mib_and_sharding_keep_the_layers_dense(tmp_path):
    result = tiny.generate(tmp_path, arch="deepseek-mla", target_mib=12, shard_mib=1, **SMALL)
    config = read_json(tmp_path / "config.json")
    assert config["num_hidden_layers"] == result["num_layers"] == config["first_k_dense_replace"] > 2
    assert result["weight_bytes"] >= 12 * 2**20
    assert set(headers(tmp_path)) == set(expected_mla_shapes(layers=result["num_layers"], vocab=1024))
    assert sha256sum_check(tmp_path).returncode == 0


def test_default_arch_is_llama_and_unknown_arch_is_refused(default_model, tmp_path):
    _out, result = default_model
    assert result["arch"] == "llama" and result["config"]["architectures"] == ["LlamaForCausalLM"]
    with pytest.raises(ValueError, match="arch must be one of llama, deepseek-mla"):
        tiny.generate(tmp_path / "x", arch="mamba")
    assert not (tmp_path / "x").exists()
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "y"), "--arch", "mamba"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2 and "invalid choice" in run.stderr
