# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""The capacity planner: how many KV-cache tokens a rank holds, from a model profile and memory settings.

The model follows vLLM's own accounting:

* Token-proportional KV (attention, MLA, the sparse-attention indexer) costs bytes per token per layer,
  by KV dtype. MLA keeps one latent per token and is replicated on every tensor-parallel rank; dense
  attention splits its KV heads over the ranks (at least one head per rank).
* Linear-attention layers (KDA/Mamba-style) keep a fixed state per request instead: a recurrent state and
  a convolution window that grows with the number of speculative tokens.
* A speculative method such as MTP adds its own attention layers.
* The pool is a pin (``--kv-cache-memory-bytes``) or what a utilization target leaves after the weights and
  the runtime's own memory. vLLM cuts it into whole blocks; the pool of a pure-attention model is
  ``blocks x block_size`` tokens, a hybrid model's pool is ``max_concurrency x max_model_len`` (vLLM 0.33's
  group-aware figure), so its headline scales with ``--max-model-len``.

Profiles carry the numbers (``capacity:`` and ``vllm_args:``); see profiles/*.yml.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils import tp_padding
from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import SparkfleetError

LANES = (200_000, 500_000, 1_000_000)
GIB = 1024 ** 3


class PlanError(SparkfleetError):
    """A plan that cannot work: what was found, what was expected, what to do."""


_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")
_DECIMAL = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}
_BINARY = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def parse_bytes(value: Any) -> int | None:
    """A byte count the way vLLM's command line reads it: 9060000000, 4g (4e9), 4G (4 GiB), 25.6k.

    Lower-case suffixes are decimal, upper-case ones binary, and a fraction only goes with a decimal suffix;
    anything else vLLM refuses at boot, so it is refused here first."""
    if value is None or value == "":
        return None
    bad = PlanError(repr(value), "a byte count as vLLM reads it: 9060000000, 9.06g (decimal) or 24G (GiB)",
                    "write the size in bytes or with one k/m/g/t (x1000) or K/M/G/T (x1024) suffix")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(str(value).strip())
    if not match:
        raise bad
    number, suffix = match.groups()
    if not suffix:
        if "." in number:
            raise bad
        return int(number)
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise bad
    return int(number) * _BINARY[suffix]


def speculative_tokens(args: Mapping[str, Any]) -> int:
    """Draft tokens per step from --speculative-config, given as a mapping or as vLLM's JSON string."""
    spec = args.get("speculative-config")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            raise PlanError(f"speculative-config {spec!r}", "a mapping or its JSON text",
                            'write it as {"method": "mtp", "num_speculative_tokens": 3}') from None
    if isinstance(spec, Mapping):
        return int(spec.get("num_speculative_tokens") or 0)
    return 0


def _token_bytes(name: str, layer: Mapping[str, Any], dtype: str, tp: int, extra_layers: int,
                 padded_heads: Mapping[int, int] | None = None) -> float:
    table = layer.get("bytes_per_token") or {}
    if dtype in table:
        per_entry = table[dtype]
    elif "any" in table:
        per_entry = table["any"]
    else:
        raise PlanError(f"KV dtype {dtype!r}, which capacity.token_layers.{name} has no size for",
                        f"one of {', '.join(sorted(table))}",
                        "set the profile's kv_cache_dtype to a supported format or add its byte size")
    heads = layer.get("kv_heads")
    if heads:  # padded KV heads (tp_padding) are split as the padded size
        heads = (padded_heads or {}).get(int(heads), int(heads))
    per_rank_heads = max(1, int(heads) // tp) if heads else 1
    layers = int(layer["layers"]) + extra_layers
    return layers * per_rank_heads * float(per_entry) / int(layer.get("tokens_per_entry", 1))


def _state_bytes(layer: Mapping[str, Any], tp: int, spec_tokens: int) -> int:
    heads = math.ceil(int(layer["heads"]) / tp)
    per_head = int(layer["recurrent_bytes_per_head"]) + \
        int(layer.get("conv_bytes_per_head_per_slot", 0)) * (int(layer.get("conv_slots", 0)) + spec_tokens)
    return int(layer["layers"]) * heads * per_head


def merged_args(profile: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The profile's vLLM arguments with the inventory's overrides on top (a null override removes a flag)."""
    args = dict(profile.get("vllm_args") or {})
    for key, value in (overrides or {}).items():
        if value is None:
            args.pop(key, None)
        else:
            args[key] = value
    return args


def plan(profile: Mapping[str, Any], tensor_parallel_size: int, args_overrides: Mapping[str, Any] | None = None,
         node_memory_bytes: int | None = None, max_model_len: int | None = None) -> dict[str, Any]:
    """The capacity plan of one rank; raises PlanError when the plan cannot work."""
    capacity = profile.get("capacity")
    if not isinstance(capacity, Mapping):
        raise PlanError(f"no capacity section in profile {profile.get('name')!r}",
                        "capacity.token_layers, capacity.block_size and capacity.memory",
                        "add the model's KV byte figures to the profile")
    tp = int(tensor_parallel_size)
    args = merged_args(profile, args_overrides)
    try:
        split = tp_padding.layout(profile, tp)
    except tp_padding.PaddingError as err:
        raise PlanError(err.found, err.expected, err.fix, key=f"profile {err.key}") from err
    if split["hf_overrides"]:
        # The padded sizes reach vLLM's config through --hf-overrides, over any the profile sets itself.
        args["hf-overrides"] = _merged_overrides(_overrides_given(args.get("hf-overrides")), split["hf_overrides"])
    # KV heads a rank holds: a padded dimension's share where the layer's heads are one.
    padded_heads = {dim["size"]: dim["padded_size"] for dim in split["dimensions"]
                    if "num_key_value_heads" in dim["keys"]}
    max_len = int(max_model_len or args.get("max-model-len") or profile["max_model_len"])
    # The stored KV format: the profile's, unless the inventory overrides --kv-cache-dtype (e.g. fp8_ds_mla to
    # roll the NVFP4 store back), which then must be a format the profile knows the size of.
    dtype = str((args_overrides or {}).get("kv-cache-dtype") or profile.get("kv_cache_dtype", "auto"))
    spec_tokens = speculative_tokens(args)
    spec_layers = capacity.get("speculative_layers") or {} if spec_tokens else {}
    block_size = int(args.get("block-size") or capacity["block_size"])
    memory = capacity.get("memory") or {}

    try:
        per_token = sum(_token_bytes(name, layer, dtype, tp, int(spec_layers.get(name, 0)), padded_heads)
                        for name, layer in (capacity.get("token_layers") or {}).items())
    except PlanError as err:
        if (args_overrides or {}).get("kv-cache-dtype"):  # the inventory's override, not the profile, chose it
            raise PlanError(err.found, err.expected, "remove kv-cache-dtype from sparkfleet_vllm_args, or set it to "
                            "one of those", key="sparkfleet_vllm_args: kv-cache-dtype") from err
        raise
    state = sum(_state_bytes(layer, tp, spec_tokens) for layer in (capacity.get("state_layers") or {}).values())
    hybrid = state > 0
    if per_token <= 0:
        raise PlanError("no token-proportional KV layers", "at least one entry in capacity.token_layers",
                        "describe the model's attention layers in the profile")

    node_memory = int(node_memory_bytes or memory.get("node_memory_bytes") or 0)
    weights = int(memory.get("weights_bytes_per_rank", 0))
    runtime = int(memory.get("runtime_bytes", 0))
    floor = int(memory.get("safety_floor_bytes", 0))
    # What the OS keeps even after the page cache is dropped: MemAvailable never reaches MemTotal.
    reserve = int(memory.get("os_reserve_bytes", 0))
    pin = parse_bytes(args.get("kv-cache-memory-bytes"))
    utilization = args.get("gpu-memory-utilization")
    if pin is not None:
        pool_bytes, pool_source = pin, "pin"
    elif utilization is not None and node_memory:
        pool_bytes = int(node_memory * float(utilization)) - weights - runtime
        pool_source = f"utilization {float(utilization):g}"
    else:
        raise PlanError("neither kv-cache-memory-bytes nor gpu-memory-utilization (with a known node memory)",
                        "a KV pin in bytes, or a utilization target", "set vllm_args.kv-cache-memory-bytes")

    block_bytes = block_size * per_token
    num_blocks = int(pool_bytes // block_bytes) if pool_bytes > 0 else 0

    def per_request(length: int) -> float:
        return math.ceil(length / block_size) * block_bytes + state

    if hybrid:
        concurrency = pool_bytes / per_request(max_len) if pool_bytes > 0 else 0.0
        tokens = int(concurrency * max_len)
    else:
        concurrency = num_blocks / math.ceil(max_len / block_size)
        tokens = num_blocks * block_size
    lanes = {str(length): (int(pool_bytes // per_request(length)) if length <= max_len and pool_bytes > 0 else None)
             for length in LANES}
    needed = weights + runtime + max(pool_bytes, 0) + floor
    return {
        "profile": profile.get("name"),
        "tensor_parallel_size": tp,
        "kv_cache_dtype": dtype,
        "max_model_len": max_len,
        "block_size": block_size,
        "speculative_tokens": spec_tokens,
        "kv_bytes_per_token": round(per_token, 2),
        "state_bytes_per_request": state,
        "pool_bytes": pool_bytes,
        "pool_source": pool_source,
        "num_blocks": num_blocks,
        "pool_tokens": tokens,
        "max_concurrency": round(concurrency, 2),
        "lanes": lanes,
        "weights_bytes_per_rank": weights,
        "runtime_bytes": runtime,
        "safety_floor_bytes": floor,
        "node_memory_bytes": node_memory,
        "memory_needed_bytes": needed,
        "os_reserve_bytes": reserve,
        "headroom_bytes": (node_memory - reserve - needed) if node_memory else None,
        "vllm_args": args,
        "tp_padding": {key: split[key]
                       for key in ("padded", "dimensions", "vocab", "env", "problems", "config_sections")},
    }


def _overrides_given(given: Any) -> Mapping[str, Any]:
    """The profile's or inventory's own --hf-overrides, as a mapping (vLLM takes it as JSON text too)."""
    if given is None:
        return {}
    parsed = given
    if isinstance(given, str):
        try:
            parsed = json.loads(given)
        except ValueError:
            parsed = None
    if not isinstance(parsed, Mapping):
        raise PlanError(f"hf-overrides {given!r}", "a mapping (or its JSON text), which the padded sizes are added to",
                        "write hf-overrides as a mapping", key="sparkfleet_vllm_args: hf-overrides")
    return parsed


def _merged_overrides(given: Mapping[str, Any], padded: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(given)
    for key, value in padded.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def problems(result: Mapping[str, Any], profile: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Why a plan cannot work, as (key, found, expected, fix); empty when it can."""
    found: list[tuple[str, str, str, str]] = []
    limit = (profile.get("capacity") or {}).get("max_context")
    if limit and result["max_model_len"] > int(limit):
        found.append(("max-model-len", f"{result['max_model_len']:,}", f"at most the model's limit {int(limit):,}",
                      "lower max-model-len in sparkfleet_vllm_args or the profile"))
    if result["pool_bytes"] <= 0:
        found.append(("kv-cache-memory-bytes", f"a KV pool of {result['pool_bytes']:,} B",
                      "a positive pool after the weights and the runtime",
                      "raise gpu-memory-utilization or pin kv-cache-memory-bytes"))
    elif result["pool_tokens"] < result["max_model_len"]:
        found.append(("kv-cache-memory-bytes",
                      f"a pool of {result['pool_tokens']:,} tokens ({result['pool_bytes']:,} B)",
                      f"room for one request of max-model-len {result['max_model_len']:,} tokens",
                      "raise the KV pin or lower max-model-len"))
    headroom = result["headroom_bytes"]
    if headroom is not None and headroom < 0:
        found.append(("kv-cache-memory-bytes",
                      f"{(result['memory_needed_bytes'] + result['os_reserve_bytes']) / GIB:.2f} GiB needed per node "
                      f"(weights {result['weights_bytes_per_rank'] / GIB:.2f} + runtime "
                      f"{result['runtime_bytes'] / GIB:.2f} + KV {result['pool_bytes'] / GIB:.2f} + floor "
                      f"{result['safety_floor_bytes'] / GIB:.2f} + OS {result['os_reserve_bytes'] / GIB:.2f})",
                      f"at most the node's {result['node_memory_bytes'] / GIB:.2f} GiB",
                      f"lower the KV pin by at least {-headroom / GIB:.2f} GiB"))
    return found


def _number(value: float) -> str:
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def lines(result: Mapping[str, Any]) -> list[str]:
    """The plan for people, a few lines."""
    lanes = ", ".join(f"{int(length) // 1000}K x{count}" if count is not None else f"{int(length) // 1000}K n/a"
                      for length, count in result["lanes"].items())
    headroom = result["headroom_bytes"]
    return [
        f"KV {result['kv_cache_dtype']}: {_number(result['kv_bytes_per_token'])} B/token per rank"
        + (f" + {result['state_bytes_per_request'] / 2**20:.1f} MiB state per request"
           if result["state_bytes_per_request"] else "")
        + f", block {result['block_size']}"
        + (f", {result['speculative_tokens']} speculative tokens" if result["speculative_tokens"] else ""),
        f"KV pool {result['pool_bytes'] / GIB:.2f} GiB ({result['pool_source']}) -> expected "
        f"{result['pool_tokens']:,} tokens, {result['max_concurrency']}x at max_model_len "
        f"{result['max_model_len']:,}; lanes {lanes}",
        (f"memory per node: weights {result['weights_bytes_per_rank'] / GIB:.2f} GiB + runtime "
         f"{result['runtime_bytes'] / GIB:.2f} + KV {result['pool_bytes'] / GIB:.2f} + floor "
         f"{result['safety_floor_bytes'] / GIB:.2f} + OS {result['os_reserve_bytes'] / GIB:.2f} of "
         f"{result['node_memory_bytes'] / GIB:.2f} GiB"
         f" (headroom {headroom / GIB:.2f} GiB)") if headroom is not None else "memory per node: unknown",
    ]
