# Copyright: sparkfleet developers
# Apache License 2.0 (see LICENSE)
"""Tensor-parallel padding: how a model's split dimensions divide over the ranks, and the zero padding that makes
them divide where the profile allows it.

A profile describes the dimensions vLLM splits over the ranks in its ``tensor_parallel`` section::

    tensor_parallel:
      config_sections: [text_config]      # nested config.json sections that repeat the keys
      dimensions:
        - name: attention heads
          keys: [num_attention_heads, num_key_value_heads]
          size: 64
          shard_multiple: 1               # each rank's share is a multiple of this
          pad: true                       # zero padding allowed
      vocab: {size: 154880, multiple: 64, pad: true}

At a tensor-parallel size that does not divide a dimension, a padded dimension grows to the next multiple of
``tp * shard_multiple``; the rows and columns it adds are zeros, so they add nothing to any output (the image's
loader seam fills them while it loads the checkpoint). vLLM pads the vocabulary to ``multiple`` and then splits it
evenly; where that does not divide by tp the vocabulary is padded to a multiple of ``lcm(multiple, tp)`` instead,
and the padded logits are cut off before sampling, as vLLM does with its own padding.

Pure Python (standard library): used by the planner, the preflight, the weights stage and the tests.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Mapping
from typing import Any

from ansible_collections.sparkfleet.cluster.plugins.module_utils.errors import SparkfleetError
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights import atomic_write

# The environment variable the loader seams read (files/sparkfleet_vllm/hooks.py): set only on a padded group.
ENV = "SPARKFLEET_TP_PADDING"
# The copy of the checkpoint's own config.json the weights stage keeps beside the padded one.
ORIGINAL_SUFFIX = ".orig"


class PaddingError(SparkfleetError):
    """A tensor_parallel section that cannot be used, or a config.json that does not match it."""

    def __init__(self, key: str, found: str, expected: str, fix: str) -> None:
        super().__init__(found, expected, fix, key=key)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _share(total: int, tp: int) -> int | float:
    """A rank's share: whole where it divides (the size vLLM splits), else the fraction a refusal names."""
    return total // tp if total % tp == 0 else total / tp


def _divisors(size: int) -> str:
    return ", ".join(str(d) for d in range(1, size + 1) if size % d == 0 and d <= 16)


def _section(profile: Mapping[str, Any]) -> Mapping[str, Any]:
    section = profile.get("tensor_parallel")
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise PaddingError("tensor_parallel", repr(section), "a mapping with dimensions and vocab",
                           "describe the split dimensions as in profiles/tiny-cpu.yml")
    return section


def _dimensions(section: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = section.get("dimensions") or []
    if not isinstance(found, list):
        raise PaddingError("tensor_parallel.dimensions", repr(found), "a list of dimensions",
                           "write each dimension as a mapping with name, keys, size, shard_multiple and pad")
    dims = []
    for index, dim in enumerate(found):
        where = f"tensor_parallel.dimensions[{index}]"
        if not isinstance(dim, Mapping):
            raise PaddingError(where, repr(dim), "a mapping", "give it name, keys, size, shard_multiple, pad")
        keys = dim.get("keys")
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
            raise PaddingError(f"{where}.keys", repr(keys), "a non-empty list of config.json keys",
                               "list the config.json keys that hold this dimension")
        size = _whole(dim.get("size"))
        multiple = _whole(dim.get("shard_multiple", 1))
        if size is None or multiple is None:
            raise PaddingError(where, f"size={dim.get('size')!r}, shard_multiple={dim.get('shard_multiple', 1)!r}",
                               "positive integers", "write the dimension's size in the checkpoint and the unit a "
                               "rank's share must be a multiple of")
        if not isinstance(dim.get("pad", False), bool):
            raise PaddingError(f"{where}.pad", repr(dim.get("pad")), "true or false",
                               "true where zero padding is exact for this model (see docs/tp-padding.md)")
        dims.append({"name": str(dim.get("name") or keys[0]), "keys": list(keys), "size": size,
                     "shard_multiple": multiple, "pad": dim.get("pad", False)})
    return dims


def _vocab(section: Mapping[str, Any]) -> dict[str, Any] | None:
    vocab = section.get("vocab")
    if vocab is None:
        return None
    size = _whole(vocab.get("size")) if isinstance(vocab, Mapping) else None
    multiple = _whole(vocab.get("multiple", 64)) if isinstance(vocab, Mapping) else None
    if size is None or multiple is None or not isinstance(vocab.get("pad", False), bool):
        raise PaddingError("tensor_parallel.vocab", repr(vocab), "size and multiple (positive integers) and pad "
                           "(true or false)", "write the checkpoint's vocab_size and vLLM's padding unit (64)")
    return {"size": size, "multiple": multiple, "pad": vocab.get("pad", False)}


def layout(profile: Mapping[str, Any], tensor_parallel_size: int) -> dict[str, Any]:
    """How each split dimension lands on the ranks at this size, padded where the profile allows it.

    Returns ``padded`` (whether anything is padded), ``dimensions`` (each with size, padded_size, per_rank,
    remainder and waste), ``vocab``, ``problems`` (key, found, expected, fix: what cannot be served),
    ``hf_overrides`` (for vLLM's --hf-overrides) and ``env`` (for the loader seams)."""
    tp = int(tensor_parallel_size)
    section = _section(profile)
    sections = section.get("config_sections") or []
    if not isinstance(sections, list) or not all(isinstance(s, str) and s for s in sections):
        raise PaddingError("tensor_parallel.config_sections", repr(sections), "a list of section names",
                           "name the nested config.json sections that repeat the keys (e.g. text_config)")
    problems: list[tuple[str, str, str, str]] = []
    dims = []
    for dim in _dimensions(section):
        unit = tp * dim["shard_multiple"]
        remainder = dim["size"] % unit
        padded = round_up(dim["size"], unit)
        split = padded if dim["pad"] else dim["size"]
        entry = dict(dim, padded_size=split, remainder=remainder, per_rank=_share(split, tp),
                     waste=round(padded / dim["size"] - 1, 4) if dim["pad"] else 0.0)
        if remainder and not dim["pad"]:
            share = f"shares that are multiples of {dim['shard_multiple']}" if dim["shard_multiple"] > 1 else \
                "whole shares"
            problems.append((
                f"tensor_parallel.dimensions: {dim['name']}",
                f"{dim['keys'][0]} {dim['size']} over {tp} ranks leaves a remainder of {remainder}",
                f"a size that splits into {tp} {share}",
                f"zero padding to {padded} would make it divide ({padded - dim['size']} more, "
                f"{(padded / dim['size'] - 1) * 100:.1f}% of its work on zeros): set pad: true for it in the profile "
                f"if padding is exact for this model, or choose a tensor-parallel size that divides "
                f"{dim['size'] // dim['shard_multiple']} ({_divisors(dim['size'] // dim['shard_multiple'])})"))
        dims.append(entry)
    vocab = _vocab(section)
    vocab_entry = None
    if vocab:
        stock = round_up(vocab["size"], vocab["multiple"])
        multiple = vocab["multiple"] if stock % tp == 0 else math.lcm(vocab["multiple"], tp)
        if multiple != vocab["multiple"] and not vocab["pad"]:
            wanted = round_up(vocab["size"], math.lcm(vocab["multiple"], tp))
            problems.append((
                "tensor_parallel.vocab",
                f"vocab_size {vocab['size']}, padded to {stock} (a multiple of {vocab['multiple']}), over {tp} ranks "
                f"leaves a remainder of {stock % tp}",
                f"a padded vocabulary that splits into {tp} whole shares",
                f"padding to a multiple of lcm({vocab['multiple']}, {tp}) = {math.lcm(vocab['multiple'], tp)} "
                f"({wanted}) would make it divide: set vocab.pad: true in the profile, or choose another "
                "tensor-parallel size"))
            multiple = vocab["multiple"]
        padded = round_up(vocab["size"], multiple)
        vocab_entry = dict(vocab, padded_multiple=multiple, padded_size=padded, per_rank=_share(padded, tp),
                           stock_padded_size=stock)
    padded_dims = [d for d in dims if d["padded_size"] != d["size"]]
    vocab_padded = bool(vocab_entry and vocab_entry["padded_multiple"] != vocab_entry["multiple"])
    overrides: dict[str, Any] = {}
    for dim in padded_dims:
        for key in dim["keys"]:
            overrides[key] = dim["padded_size"]
    if overrides:
        for name in sections:
            overrides[name] = {key: value for key, value in overrides.items() if key not in sections}
    env: dict[str, str] = {}
    if (padded_dims or vocab_padded) and not problems:
        env[ENV] = json.dumps({"tp": tp, "widths": [[d["size"], d["padded_size"]] for d in padded_dims],
                               "vocab": vocab_padded}, sort_keys=True, separators=(",", ":"))
    return {"tensor_parallel_size": tp, "padded": bool(padded_dims or vocab_padded), "dimensions": dims,
            "vocab": vocab_entry, "config_sections": list(sections), "problems": problems,
            "hf_overrides": overrides, "env": env}


def padded_config(config: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's config.json with the padded sizes of a layout (``plan``) in every place that holds them.

    Each key of a padded dimension that the file holds must hold the profile's unpadded size: anything else means
    the profile does not describe this checkpoint (or the file is padded already), and a PaddingError says so."""
    out = json.loads(json.dumps(config))
    places = [("", out)] + [(f"{name}.", out[name]) for name in plan.get("config_sections", [])
                            if isinstance(out.get(name), dict)]
    for dim in plan["dimensions"]:
        if dim["padded_size"] == dim["size"]:
            continue
        if not any(key in place for _prefix, place in places for key in dim["keys"]):
            raise PaddingError(f"config.json {', '.join(dim['keys'])}", "none of these keys",
                               f"the keys that hold the {dim['name']} ({dim['size']} before padding)",
                               "name the checkpoint's own keys in the profile's tensor_parallel section")
        for prefix, place in places:
            _refuse_regrouped_heads(prefix, place, dim)
            for key in dim["keys"]:
                if key not in place:
                    continue
                if place[key] != dim["size"]:
                    raise PaddingError(
                        f"config.json {prefix}{key}", repr(place[key]),
                        f"{dim['size']} (the profile's {dim['name']} before padding)",
                        "point the profile at the checkpoint it describes (its tensor_parallel section), or put the "
                        f"checkpoint's own config.json back from config.json{ORIGINAL_SUFFIX}")
                place[key] = dim["padded_size"]
    return out


# ------------------------------------------------------------------------------------ the padded checkpoint view

VIEWS = "sparkfleet-padded"
RECORD = ".sparkfleet-padding.json"


def _refuse_regrouped_heads(prefix: str, place: Mapping[str, Any], dim: Mapping[str, Any]) -> None:
    """Query heads padded without their KV heads regroup grouped-query attention: each query head would read
    another KV head than the one it was trained with, and the output would be wrong without any error."""
    heads, kv_heads = place.get("num_attention_heads"), place.get("num_key_value_heads")
    if "num_attention_heads" in dim["keys"] and "num_key_value_heads" not in dim["keys"] \
            and kv_heads is not None and kv_heads != heads:
        raise PaddingError(
            f"config.json {prefix}num_key_value_heads", f"{kv_heads} KV heads for {heads} query heads",
            "as many KV heads as query heads (multi-head or MLA attention), padded in the same dimension",
            "do not pad this model's heads: choose a tensor-parallel size that divides them (zero heads appended to "
            "grouped-query attention change which KV head each query head reads)")


def view_dir(repo: str, revision: str, tensor_parallel_size: int) -> str:
    """Where the padded view of a snapshot lives: beside the snapshots, one per revision and size."""
    return os.path.join(repo, VIEWS, f"{revision}-tp{int(tensor_parallel_size)}")


def view_entries(snapshot: str, view: str, config_text: str) -> dict[str, tuple[str, str]]:
    """What the view holds: name -> ("link", target) for every entry of the snapshot but config.json (relative
    links, so the view points at the verified files themselves), config.json as ("file", padded text) and
    config.json.orig as a link to the checkpoint's own."""
    rel = os.path.relpath(snapshot, view)
    entries: dict[str, tuple[str, str]] = {name: ("link", os.path.join(rel, name))
                                           for name in sorted(os.listdir(snapshot)) if name != "config.json"}
    entries["config.json" + ORIGINAL_SUFFIX] = ("link", os.path.join(rel, "config.json"))
    entries["config.json"] = ("file", config_text)
    return entries


def _entry_state(path: str) -> tuple[str, str] | None:
    if os.path.islink(path):
        return ("link", os.readlink(path))
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as handle:
            return ("file", handle.read())
    return ("other", "") if os.path.lexists(path) else None


def view_changes(view: str, entries: Mapping[str, tuple[str, str]], record: str) -> list[str]:
    """The names a sync would write or remove (empty: the view is as wanted)."""
    wanted = dict(entries, **{RECORD: ("file", record)})
    present = set(os.listdir(view)) if os.path.isdir(view) else set()
    changed = [name for name, state in wanted.items() if _entry_state(os.path.join(view, name)) != state]
    return sorted(changed + [name for name in present if name not in wanted])


def sync_view(view: str, entries: Mapping[str, tuple[str, str]], record: str) -> list[str]:
    """Make the view hold exactly ``entries`` and the record (written last: a view without a current record was
    interrupted and is redone). Returns the names written or removed."""
    changes = view_changes(view, entries, record)
    if not changes:
        return []
    os.makedirs(view, exist_ok=True)
    record_path = os.path.join(view, RECORD)
    if os.path.lexists(record_path):
        os.unlink(record_path)
    for name in changes:
        path = os.path.join(view, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        kind, value = entries.get(name, (None, None))
        if kind == "link":
            os.symlink(value, path)
        elif kind == "file":
            atomic_write(path, value, mode=0o644)
    atomic_write(record_path, record, mode=0o644)
    return changes


def view_drift(view: str, snapshot: str, revision: str, padding: str | None = None) -> list[str]:
    """What makes a padded view no longer the one the weights stage made of this verified snapshot for this
    padding (the rank's SPARKFLEET_TP_PADDING, when given); empty: nothing. The check before every engine start,
    next to the snapshot's own."""
    try:
        with open(os.path.join(view, RECORD), encoding="utf-8") as handle:
            record = json.load(handle)
        with open(os.path.join(view, "config.json"), "rb") as handle:
            config_sha256 = hashlib.sha256(handle.read()).hexdigest()
    except (OSError, ValueError) as exc:
        return [f"padded view {view}: {exc.__class__.__name__} ({exc})"]
    drift = []
    if record.get("revision") != revision:
        drift.append(f"padded view {view}: made of revision {record.get('revision')}, not the verified {revision}")
    if padding is not None and record.get("padding") != padding:
        drift.append(f"padded view {view}: made for the padding {record.get('padding')}, not this group's {padding}")
    if record.get("config_sha256") != config_sha256:
        drift.append(f"padded view {view}: config.json changed since it was written")
    wanted = view_entries(snapshot, view, "")
    for name, (kind, target) in wanted.items():
        if kind == "link" and _entry_state(os.path.join(view, name)) != (kind, target):
            drift.append(f"padded view {view}: {name} no longer links the verified snapshot's file")
    return drift
