"""What the patched vLLM lines call (see seams.py). Each hook hands back the stock behaviour unless its case holds:
the NVFP4 hooks unless the layer's KV dtype is sparkfleet_nvfp4, the GB10 fixes unless the device needs them and
their switch is on. Imported by vLLM's own modules, so it imports torch and the kernels only when first used.
"""

from __future__ import annotations

import logging
import os

from .seams import DTYPE

# Bytes per token of an MLA KV row for the dtypes this package adds (vLLM's own are in its spec table).
STATE_BYTES = {DTYPE: 288}
# Past this many tokens in one step the gather deduplicates rows (and synchronises); at or below it the
# fixed-shape path runs, which CUDA graphs can capture (128-token mixed prefill + 16 sequences x 4 slots).
SYNC_FREE_TOKENS = int(os.environ.get("SPARKFLEET_NVFP4_SYNC_FREE_TOKENS", "192"))

logger = logging.getLogger("vllm.sparkfleet")


def switch(name: str) -> bool:
    """A GB10 fix's switch: on unless its environment variable is 0, false, no or off."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def write(latent, k_pe, kv_cache, slot_mapping, kv_cache_dtype: str) -> bool:
    """Quantise the step's MLA latent into the 288-byte rows; False (stock write runs) for any other dtype.

    The row has no room for RoPE: a model with a RoPE part (k_pe wider than 0) is refused, never truncated."""
    if kv_cache_dtype != DTYPE:
        return False
    if k_pe is not None and k_pe.shape[-1] != 0:
        raise ValueError(f"--kv-cache-dtype {DTYPE}: found a RoPE key part of width {k_pe.shape[-1]}; expected a "
                         "NoPE MLA model (GLM-5.3-Flash: qk_rope_head_dim 0), whose latent is all the row stores; "
                         "fix: use fp8_ds_mla for this model")
    if kv_cache.numel() == 0:
        return True
    import torch
    from sparkfleet_nvfp4 import kernels

    kernels.write(latent, slot_mapping.flatten(), kv_cache.view(torch.uint8))
    return True


class _Gather:
    """The read hook's state, shared by every layer: the sync-free scratch (one per top-k width and device)."""

    def __init__(self) -> None:
        from sparkfleet_nvfp4 import kernels

        self.kernels = kernels
        self.buffers = kernels.SyncFreeBuffers(max_tokens=SYNC_FREE_TOKENS)

    def __call__(self, kv_cache, topk_indices_physical):
        import torch

        pool = kv_cache.view(torch.uint8)
        tokens, topk = topk_indices_physical.shape
        if tokens > self.buffers.max_tokens and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{DTYPE}: found a CUDA graph captured for {tokens} tokens; expected at most {self.buffers.max_tokens} "
                "(above that the gather deduplicates rows, which synchronises); fix: cap --cudagraph-capture-sizes "
                f"at {self.buffers.max_tokens} or raise SPARKFLEET_NVFP4_SYNC_FREE_TOKENS")
        # The persistent scratch (SYNC_FREE_TOKENS x top-k rows of 656 B: 274 MB at 192 x 2176) is allocated on
        # the first call. vLLM's memory profiling runs without attention metadata and never gets here, so it is
        # outside the KV budget: the profiles' runtime_bytes leave room for it. The first call is the eager
        # warm-up before CUDA graph capture, so the allocation never happens inside a capture.
        self.buffers.get(topk, pool.device)
        return self.kernels.gather(pool, topk_indices_physical, buffers=self.buffers)


# The layers share one gather state: they run one after another, and the attention kernel has consumed a layer's
# scratch rows before the next layer's gather overwrites them.
_gather: _Gather | None = None


def mqa_inputs(impl, kv_cache, topk_indices_physical):
    """For the NVFP4 dtype: the selected rows of the 288-byte pool [P, 64, 288] expanded into fp8_ds_mla scratch
    pages [P', 64, 656], and the tables renumbered to them (-1 stays -1). Stock inputs otherwise."""
    global _gather
    if getattr(impl, "kv_cache_dtype", None) != DTYPE:
        return kv_cache, topk_indices_physical
    if _gather is None:
        _gather = _Gather()
    return _gather(kv_cache, topk_indices_physical)


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f}"


def _integrated() -> bool:
    import torch

    try:
        return bool(torch.cuda.get_device_properties(torch.cuda.current_device()).is_integrated)
    except (RuntimeError, AssertionError, AttributeError):
        return False


def uma_startup_ok(snapshot, cache_config, requested: int) -> bool:
    """On an integrated (unified-memory) GPU with the switch on: log the shortfall and let the engine start."""
    if not switch("SPARKFLEET_UMA_FREE_MEMORY_WARN") or not _integrated():
        return False
    logger.warning(
        "sparkfleet: free memory on %s at startup is %s of %s GiB, under the utilisation target %s (%s GiB). "
        "On unified memory the page cache and kernel watermarks hold part of it; starting anyway "
        "(SPARKFLEET_UMA_FREE_MEMORY_WARN=0 restores the error).",
        getattr(snapshot, "device_", "the device"), _gib(snapshot.free_memory), _gib(snapshot.total_memory),
        cache_config.gpu_memory_utilization, _gib(requested))
    return True


def pdl_allowed(major: int) -> bool:
    """Programmatic dependent launch on SM 9.x and 10.x only, unless the switch is off."""
    return major in (9, 10) or not switch("SPARKFLEET_PDL_SM9_10_ONLY")


# Tensor-parallel padding (the roles' tp_padding): the group's padding, as the serve stage writes it into every
# rank's environment, or None on a group that pads nothing.
TP_PADDING_ENV = "SPARKFLEET_TP_PADDING"


def tp_padding() -> dict | None:
    import json

    text = os.environ.get(TP_PADDING_ENV, "").strip()
    if not text:
        return None
    try:
        padding = json.loads(text)
        padding["tp"] = int(padding["tp"])
        padding["widths"] = [(int(size), int(padded)) for size, padded in padding.get("widths", [])]
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{TP_PADDING_ENV}: found {text!r} ({exc}); expected the JSON the serve stage writes "
                         '({"tp": 3, "widths": [[64, 66]], "vocab": true}); fix: converge the group again') from None
    return padding


def shard_source(tensor, dim: int, start: int, length: int):
    """The checkpoint tensor a rank cuts its shard [start, start + length) from along ``dim``.

    Unchanged while the shard lies inside it. On a padded group, a tensor whose width is a padded dimension's
    checkpoint size (in the same ratio as the layer's full padded width, whatever the packing) is extended with
    zeros to that full width: the rows and columns padding adds are zeros, so they add nothing to any output.
    Anything else is left as it is, and the loader's own narrow fails as stock vLLM does: a checkpoint that does
    not match the model is never filled in silently."""
    if tensor.ndim == 0:
        return tensor
    size = tensor.shape[dim]
    if start + length <= size:
        return tensor
    padding = tp_padding()
    if padding is None:
        return tensor
    full = length * padding["tp"]
    if not any(size * padded == full * original for original, padded in padding["widths"]):
        raise ValueError(
            f"sparkfleet tp padding: found a checkpoint tensor {tuple(tensor.shape)} of width {size} along dim {dim}, "
            f"short of the shard {start}:{start + length} of a full width {full}; expected the checkpoint size of one "
            f"of the padded dimensions {padding['widths']} (in the same ratio); fix: check that the profile's "
            "tensor_parallel section describes this checkpoint")
    import torch

    shape = list(tensor.shape)
    shape[dim] = full - size
    logger.debug("sparkfleet: tensor %s zero-padded to %d along dim %d", tuple(tensor.shape), full, dim)
    return torch.cat([tensor, torch.zeros(shape, dtype=tensor.dtype, device=tensor.device)], dim=dim)


def vocab_padding(padding_size: int, tp_size: int) -> int:
    """The unit vLLM pads the vocabulary to: its own, or on a group that pads the vocabulary, the least common
    multiple of it and the tensor-parallel size (so that the padded vocabulary splits evenly)."""
    import math

    padding = tp_padding()
    if padding is None or not padding.get("vocab"):
        return padding_size
    return math.lcm(int(padding_size), int(tp_size))
