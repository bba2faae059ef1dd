#!/usr/bin/env python
"""Generate a tiny random-weight Llama (or DeepSeek-V2 MLA) model offline, without torch.

The output directory is a complete Hugging Face style model that vLLM (CPU build included) and
transformers can load: config.json, safetensors weights (one file or shards plus an index), a BPE
tokenizer trained on generated text, tokenizer/generation configs and a SHA256SUMS file that
``sha256sum -c SHA256SUMS`` accepts.

Only numpy, safetensors and tokenizers are used. Everything is deterministic for a given seed:
every tensor is filled from its own random stream derived from (seed, tensor name, chunk index),
so the bytes do not depend on thread scheduling, on sharding, or on how many layers follow.

numpy has no bfloat16, so weights are written as float16 and config.json says ``"torch_dtype":
"float16"`` to match what is on disk.

``arch="llama"`` (the default) writes a ``LlamaForCausalLM``. ``arch="deepseek-mla"`` writes a
DeepSeek-V2-shaped ``DeepseekV2ForCausalLM`` with multi-head latent attention: kv_lora_rank 512 and
qk_rope_head_dim 64 (the only MLA shape vLLM's CPU build serves), no q LoRA, small nope/value head dims, and
every MLP dense (``first_k_dense_replace`` = the layer count; the MoE keys vLLM reads are still present). Its
KV cache holds one latent of kv_lora_rank + qk_rope_head_dim = 576 values per token and layer; ``kv_heads``
does not apply to it.

Usage as a script::

    python scripts/make_tiny_model.py --out DIR [--seed 0] [--hidden-size 256] [--layers 2] [--heads 4]
        [--kv-heads 4] [--vocab-size 4096] [--intermediate-size 512] [--target-mib N] [--shard-mib M]
        [--max-position 2048] [--arch {llama,deepseek-mla}]

Usage as a module::

    result = generate("DIR", seed=0, target_mib=1024)
"""

import argparse
import functools
import hashlib
import json
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

MIB = 1024 * 1024
ARCHS = ("llama", "deepseek-mla")
MIN_HEAD_DIM = 64
MIN_VOCAB_SIZE = 512
INIT_STD = 0.02
RMS_NORM_EPS = 1e-5
ROPE_THETA = 10000.0

# DeepSeek-V2 MLA shapes. vLLM's CPU build serves only kv_lora_rank 512 with qk_rope_head_dim 64 (a latent of 48,
# for one, boots and then dies on the first request); the nope and value head dims are free and kept small.
MLA_KV_LORA_RANK = 512
MLA_QK_ROPE_HEAD_DIM = 64
MLA_QK_NOPE_HEAD_DIM = 32
MLA_V_HEAD_DIM = 32
# MoE keys the DeepSeek-V2 loader reads; with first_k_dense_replace = num_hidden_layers no layer uses them.
MLA_ROUTED_EXPERTS = 4
MLA_EXPERTS_PER_TOKEN = 2
MLA_SHARED_EXPERTS = 1

# numpy cannot represent bfloat16 and safetensors.numpy cannot write it, so float16 is what goes on disk.
WEIGHT_DTYPE = np.dtype(np.float16)
TORCH_DTYPE = "float16"

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD)  # ids 0, 1, 2, 3 (the Llama order for the first three)
UNK_ID, BOS_ID, EOS_ID, PAD_ID = range(4)

# Renders [{"role": ..., "content": ...}, ...]; add_generation_prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' ~ message['role'] ~ '|>\\n' ~ (message['content'] or '') ~ eos_token ~ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# Random values are generated in chunks of this many elements; each chunk has its own seeded stream.
CHUNK_ELEMENTS = 1 << 20

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SUMS_FILE = "SHA256SUMS"

# The fixed part of the tokenizer training corpus; pseudo-words built from the syllables below are added to it.
_WORD_TEXT = (
    "the a an one two three four five red blue green small large quick slow bright dark cold warm old new "
    "river mountain city garden forest window engine signal cluster node switch cable rack server model "
    "token weight layer spark fleet packet stream queue shard disk memory network kernel driver socket port "
    "route bridge lamp stone cloud paper table letter number answer question morning evening winter summer "
    "runs builds sends reads writes sees finds keeps moves holds opens closes loads serves checks counts "
    "waits starts stops grows turns carries is was has had will can may must should would "
    "and or but with without under over near behind before after because while when where then there "
    "I you he she it we they this that these those my your our their"
)
_ONSET_TEXT = "b c d f g h j k l m n p r s t v w z br ch cl dr fl gr pl pr sh st th tr"
WORDS = tuple(_WORD_TEXT.split())
ONSETS = tuple(_ONSET_TEXT.split())
VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou")
CODAS = ("", "", "n", "r", "s", "l", "t", "m", "nd", "st", "ck")
ENDINGS = (".", ".", ".", "?", "!")


# ---------------------------------------------------------------------------------------------------------------
# Shapes


def _validate(hidden_size, layers, heads, kv_heads, vocab_size, intermediate_size, target_mib, shard_mib,
              max_position, seed, arch="llama"):
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    for name, value in (("hidden_size", hidden_size), ("layers", layers), ("heads", heads), ("kv_heads", kv_heads),
                        ("intermediate_size", intermediate_size), ("max_position", max_position)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be an integer >= {MIN_VOCAB_SIZE} (byte-level BPE needs 256 base "
                         f"tokens plus merges), got {vocab_size!r}")
    if hidden_size % heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by heads {heads}")
    if shard_mib is None or not shard_mib > 0:
        raise ValueError(f"shard_mib must be positive, got {shard_mib!r}")
    if target_mib is not None and not target_mib > 0:
        raise ValueError(f"target_mib must be positive, got {target_mib!r}")
    if arch == "deepseek-mla":
        return MLA_QK_NOPE_HEAD_DIM + MLA_QK_ROPE_HEAD_DIM  # fixed MLA head dims; kv_heads does not apply
    head_dim = hidden_size // heads
    if head_dim < MIN_HEAD_DIM:
        raise ValueError(
            f"head_dim = hidden_size / heads = {hidden_size} / {heads} = {head_dim} is below {MIN_HEAD_DIM}: "
            f"vLLM's CPU build dies on the first request with such a head size; use fewer heads or a larger "
            f"hidden size (e.g. --heads {max(1, hidden_size // MIN_HEAD_DIM)})"
        )
    if head_dim % 2:
        raise ValueError(f"head_dim {head_dim} must be even for rotary embeddings")
    if heads % kv_heads:
        raise ValueError(f"heads {heads} is not divisible by kv_heads {kv_heads}")
    return head_dim


def _attention_shapes(p, hidden_size, heads, kv_heads, head_dim, arch):
    if arch == "deepseek-mla":
        qk_head_dim = MLA_QK_NOPE_HEAD_DIM + MLA_QK_ROPE_HEAD_DIM
        return [
            (p + "self_attn.q_proj.weight", (heads * qk_head_dim, hidden_size), "normal"),
            (p + "self_attn.kv_a_proj_with_mqa.weight", (MLA_KV_LORA_RANK + MLA_QK_ROPE_HEAD_DIM, hidden_size),
             "normal"),
            (p + "self_attn.kv_a_layernorm.weight", (MLA_KV_LORA_RANK,), "ones"),
            (p + "self_attn.kv_b_proj.weight", (heads * (MLA_QK_NOPE_HEAD_DIM + MLA_V_HEAD_DIM), MLA_KV_LORA_RANK),
             "normal"),
            (p + "self_attn.o_proj.weight", (hidden_size, heads * MLA_V_HEAD_DIM), "normal"),
        ]
    return [
        (p + "self_attn.q_proj.weight", (heads * head_dim, hidden_size), "normal"),
        (p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden_size), "normal"),
        (p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden_size), "normal"),
        (p + "self_attn.o_proj.weight", (hidden_size, heads * head_dim), "normal"),
    ]


def _layer_shapes(i, hidden_size, heads, kv_heads, head_dim, intermediate_size, arch="llama"):
    p = f"model.layers.{i}."
    return [
        *_attention_shapes(p, hidden_size, heads, kv_heads, head_dim, arch),
        (p + "mlp.gate_proj.weight", (intermediate_size, hidden_size), "normal"),
        (p + "mlp.up_proj.weight", (intermediate_size, hidden_size), "normal"),
        (p + "mlp.down_proj.weight", (hidden_size, intermediate_size), "normal"),
        (p + "input_layernorm.weight", (hidden_size,), "ones"),
        (p + "post_attention_layernorm.weight", (hidden_size,), "ones"),
    ]


def tensor_plan(hidden_size, layers, heads, kv_heads, vocab_size, intermediate_size, arch="llama"):
    """The (name, shape, init) of every tensor of the model, in module order."""
    head_dim = hidden_size // heads
    plan = [("model.embed_tokens.weight", (vocab_size, hidden_size), "normal")]
    for i in range(layers):
        plan += _layer_shapes(i, hidden_size, heads, kv_heads, head_dim, intermediate_size, arch)
    plan += [("model.norm.weight", (hidden_size,), "ones"), ("lm_head.weight", (vocab_size, hidden_size), "normal")]
    return plan


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _layers_for_target(target_mib, hidden_size, layers, heads, kv_heads, vocab_size, intermediate_size,
                       arch="llama"):
    """The smallest layer count (at least `layers`) whose weights reach target_mib."""
    head_dim = hidden_size // heads
    itemsize = WEIGHT_DTYPE.itemsize
    shapes = _layer_shapes(0, hidden_size, heads, kv_heads, head_dim, intermediate_size, arch)
    per_layer = sum(_numel(shape) for _name, shape, _init in shapes) * itemsize
    fixed = (2 * vocab_size * hidden_size + hidden_size) * itemsize
    needed = -(-(int(target_mib * MIB) - fixed) // per_layer)  # ceiling division
    return max(layers, needed)


def _shards(plan, shard_bytes):
    """Split the plan greedily, in order, into groups of at most shard_bytes (a bigger tensor gets its own)."""
    groups, current, size = [], [], 0
    for entry in plan:
        nbytes = _numel(entry[1]) * WEIGHT_DTYPE.itemsize
        if current and size + nbytes > shard_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(entry)
        size += nbytes
    if current:
        groups.append(current)
    return groups


# ---------------------------------------------------------------------------------------------------------------
# Weights

_scratch = threading.local()


def _name_key(name):
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")


def _fill_chunk(flat, start, stop, seed, name_key, chunk):
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = np.empty(CHUNK_ELEMENTS, dtype=np.float32)
    view = buf[: stop - start]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, name_key, chunk])))
    rng.standard_normal(out=view, dtype=np.float32)
    np.multiply(view, INIT_STD, out=view)
    flat[start:stop] = view  # casts to the weight dtype


def _make_tensors(group, seed, pool):
    tensors, jobs = {}, []
    for name, shape, init in group:
        if init == "ones":
            tensors[name] = np.ones(shape, dtype=WEIGHT_DTYPE)
            continue
        arr = np.empty(shape, dtype=WEIGHT_DTYPE)
        tensors[name] = arr
        flat, key = arr.reshape(-1), _name_key(name)
        for chunk, start in enumerate(range(0, flat.size, CHUNK_ELEMENTS)):
            jobs.append((flat, start, min(start + CHUNK_ELEMENTS, flat.size), seed, key, chunk))
    for future in [pool.submit(_fill_chunk, *job) for job in jobs]:
        future.result()
    return tensors


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer


def _corpus(seed, vocab_size):
    """A few thousand deterministic sentences: fixed words plus seeded pseudo-words, Zipf-like frequencies."""
    rng = np.random.default_rng([seed, 0x70C])
    n_pseudo = max(2000, vocab_size)
    n_syll = rng.integers(1, 4, size=n_pseudo)
    parts = rng.integers(0, [len(ONSETS), len(VOWELS), len(CODAS)], size=(int(n_syll.sum()), 3))
    syllables = [ONSETS[o] + VOWELS[v] + CODAS[c] for o, v, c in parts.tolist()]
    pseudo, pos = [], 0
    for k in n_syll.tolist():
        pseudo.append("".join(syllables[pos: pos + k]))
        pos += k
    words = [*WORDS, *pseudo]
    weights = 1.0 / np.arange(1, len(words) + 1) ** 0.8
    n_sentences = max(3000, vocab_size)
    lengths = rng.integers(4, 16, size=n_sentences).tolist()
    picks = rng.choice(len(words), size=sum(lengths), p=weights / weights.sum()).tolist()
    numbers = rng.integers(0, 10000, size=n_sentences).tolist()
    with_number = (rng.random(n_sentences) < 0.2).tolist()
    endings = rng.integers(0, len(ENDINGS), size=n_sentences).tolist()
    sentences, pos = [], 0
    for i, n in enumerate(lengths):
        text = " ".join(words[j] for j in picks[pos: pos + n])
        pos += n
        if with_number[i]:
            text += f" {numbers[i]}"
        sentences.append(text[0].upper() + text[1:] + ENDINGS[endings[i]])
    return sentences


@functools.lru_cache(maxsize=4)
def tokenizer_json(seed, vocab_size):
    """Train the byte-level BPE tokenizer (cached per process) and return its tokenizer.json text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed, vocab_size), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"BPE training reached only {tok.get_vocab_size()} tokens of the {vocab_size} asked for")
    for token, want in zip(SPECIAL_TOKENS, (UNK_ID, BOS_ID, EOS_ID, PAD_ID), strict=True):
        if tok.token_to_id(token) != want:
            raise RuntimeError(f"special token {token} got id {tok.token_to_id(token)}, expected {want}")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    return tok.to_str(pretty=True)


def _tokenizer_config(max_position):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "model_max_length": max_position,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            for i, t in enumerate(SPECIAL_TOKENS)
        },
        "chat_template": CHAT_TEMPLATE,
    }


# ---------------------------------------------------------------------------------------------------------------
# Output


def _shared_config(max_position):
    """The config keys both architectures carry with the same values."""
    return {
        "hidden_act": "silu",
        "max_position_embeddings": max_position,
        "initializer_range": INIT_STD,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
    }


def _mla_config(hidden_size, layers, heads, vocab_size, intermediate_size, max_position):
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "kv_lora_rank": MLA_KV_LORA_RANK,
        "q_lora_rank": None,
        "qk_nope_head_dim": MLA_QK_NOPE_HEAD_DIM,
        "qk_rope_head_dim": MLA_QK_ROPE_HEAD_DIM,
        "v_head_dim": MLA_V_HEAD_DIM,
        # Dense everywhere: the first first_k_dense_replace layers get a plain MLP, and that is all of them.
        "first_k_dense_replace": layers,
        "moe_layer_freq": 1,
        "n_routed_experts": MLA_ROUTED_EXPERTS,
        "n_shared_experts": MLA_SHARED_EXPERTS,
        "num_experts_per_tok": MLA_EXPERTS_PER_TOKEN,
        "moe_intermediate_size": max(1, intermediate_size // 4),
        "topk_method": "greedy",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": False,
        "scoring_func": "softmax",
        "routed_scaling_factor": 1.0,
        **_shared_config(max_position),
        "vocab_size": vocab_size,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": TORCH_DTYPE,
    }


def _model_config(hidden_size, layers, heads, kv_heads, head_dim, vocab_size, intermediate_size, max_position,
                  arch="llama"):
    if arch == "deepseek-mla":
        return _mla_config(hidden_size, layers, heads, vocab_size, intermediate_size, max_position)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        **_shared_config(max_position),
        "mlp_bias": False,
        "pretraining_tp": 1,
        "vocab_size": vocab_size,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": TORCH_DTYPE,
    }


def _write_json(path, obj):
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _remove_stale_weights(out):
    """Weights of an earlier run with another layout would confuse loaders; remove only our own file names."""
    for path in [out / SINGLE_FILE, out / INDEX_FILE, *out.glob("model-*-of-*.safetensors")]:
        if path.is_file():
            path.unlink()


def generate(out_dir, *, seed=0, hidden_size=256, layers=2, heads=4, kv_heads=4, vocab_size=4096,
             intermediate_size=512, target_mib=None, shard_mib=512, max_position=2048, threads=None, arch="llama"):
    """Write a random-weight model, its tokenizer and SHA256SUMS into out_dir; return a summary dict.

    arch is "llama" (LlamaForCausalLM) or "deepseek-mla" (a dense DeepseekV2ForCausalLM with MLA; kv_heads is
    not used and head_dim in the result is its query/key head dim, qk_nope_head_dim + qk_rope_head_dim).
    With target_mib the number of layers grows (from `layers`) until the weights reach at least that many MiB.
    Raises ValueError for an unusable shape (head_dim below 64 among them) before anything is written.
    """
    started = time.perf_counter()
    head_dim = _validate(hidden_size, layers, heads, kv_heads, vocab_size, intermediate_size, target_mib,
                         shard_mib, max_position, seed, arch)
    if target_mib is not None:
        layers = _layers_for_target(target_mib, hidden_size, layers, heads, kv_heads, vocab_size, intermediate_size,
                                    arch)
    plan = tensor_plan(hidden_size, layers, heads, kv_heads, vocab_size, intermediate_size, arch)
    parameters = sum(_numel(shape) for _name, shape, _init in plan)
    weight_bytes = parameters * WEIGHT_DTYPE.itemsize
    groups = _shards(plan, int(shard_mib * MIB)) if weight_bytes > shard_mib * MIB else [plan]

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_weights(out)
    written = []

    config = _model_config(hidden_size, layers, heads, kv_heads, head_dim, vocab_size, intermediate_size,
                           max_position, arch)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
                                                 "pad_token_id": PAD_ID})
    (out / "tokenizer.json").write_text(tokenizer_json(seed, vocab_size))
    _write_json(out / "tokenizer_config.json", _tokenizer_config(max_position))
    _write_json(out / "special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
                                                  "pad_token": PAD})
    written += ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json"]

    if len(groups) == 1:
        shard_names = [SINGLE_FILE]
    else:
        shard_names = [f"model-{i:05d}-of-{len(groups):05d}.safetensors" for i in range(1, len(groups) + 1)]
    workers = threads or min(os.cpu_count() or 1, 8)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for name, group in zip(shard_names, groups, strict=True):
            tensors = _make_tensors(group, seed, pool)
            save_file(tensors, out / name, metadata={"format": "pt"})
            del tensors
            # safetensors creates files as 0600; give them the mode (umask) the other files got.
            os.chmod(out / name, stat.S_IMODE((out / "config.json").stat().st_mode))
        written += shard_names
        if len(groups) > 1:
            weight_map = {t: name for name, group in zip(shard_names, groups, strict=True)
                          for t, _shape, _init in group}
            _write_json(out / INDEX_FILE, {"metadata": {"total_size": weight_bytes},
                                           "weight_map": dict(sorted(weight_map.items()))})
            written.append(INDEX_FILE)
        written.sort()
        digests = list(pool.map(_sha256, [out / name for name in written]))
    (out / SUMS_FILE).write_text("".join(f"{d}  {name}\n" for d, name in zip(digests, written, strict=True)))

    files = sorted([*written, SUMS_FILE])
    total_bytes = sum((out / name).stat().st_size for name in files)
    seconds = time.perf_counter() - started
    summary = (f"wrote {len(files)} files, {total_bytes} bytes ({total_bytes / MIB:.1f} MiB) to {out}: "
               f"{config['architectures'][0]}, "
               f"{parameters} parameters, {layers} layers, {len(shard_names)} weight file(s) of {TORCH_DTYPE} "
               f"({weight_bytes / MIB:.1f} MiB) in {seconds:.1f}s")
    return {
        "out_dir": str(out),
        "files": files,
        "weight_files": shard_names,
        "total_bytes": total_bytes,
        "weight_bytes": weight_bytes,
        "parameters": parameters,
        "num_layers": layers,
        "head_dim": head_dim,
        "arch": arch,
        "dtype": TORCH_DTYPE,
        "config": config,
        "seconds": seconds,
        "summary": summary,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--intermediate-size", type=int, default=512)
    parser.add_argument("--target-mib", type=float, default=None,
                        help="add layers until the weights reach about this many MiB")
    parser.add_argument("--shard-mib", type=float, default=512,
                        help="split the weights into shards of at most this many MiB (default 512)")
    parser.add_argument("--max-position", type=int, default=2048)
    parser.add_argument("--arch", choices=ARCHS, default="llama",
                        help="llama (LlamaForCausalLM) or deepseek-mla (dense DeepseekV2ForCausalLM with MLA)")
    args = parser.parse_args(argv)
    try:
        result = generate(args.out, seed=args.seed, hidden_size=args.hidden_size, layers=args.layers,
                          heads=args.heads, kv_heads=args.kv_heads, vocab_size=args.vocab_size,
                          intermediate_size=args.intermediate_size, target_mib=args.target_mib,
                          shard_mib=args.shard_mib, max_position=args.max_position, arch=args.arch)
    except ValueError as e:
        parser.error(str(e))
    print(result["summary"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
