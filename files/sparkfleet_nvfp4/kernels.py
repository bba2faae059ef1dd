"""Triton kernels for the NVFP4 KV cache: the write (quantise into the pool) and the gather (expand the selected
rows into fp8_ds_mla scratch pages for the stock sparse-MLA attention kernel).

Every rounding is IEEE round-to-nearest-even, so the bytes equal `reference`'s for every finite input. On a GPU
of sm_89 or newer the kernels use its fp8 conversion (cvt.rn.satfinite.e4m3x2) and an FMA division in inline
PTX; elsewhere (older GPUs, TRITON_INTERPRET=1 on the CPU) the same roundings in integer arithmetic and div_rn.
bench.py proves both paths give the same bytes on the GPU. NaN inputs are undefined; +-inf saturate.

Two gather paths, chosen by the number of tokens in the step:
- up to SYNC_FREE_MAX_TOKENS: every (token, k) entry is expanded into its own row of a persistent scratch buffer
  (one per top-k width and device, RoPE region zeroed once at allocation); the kernel also writes the renumbered
  table. No host synchronisation, no allocation: safe inside a captured CUDA graph.
- above: the union of the selected rows is expanded once (torch.unique, which synchronises), for eager prefill
  chunks where the same rows recur across thousands of tokens.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .layout import (
    FP8_DS_MLA_PAGE_ROWS,
    FP8_DS_MLA_ROW_BYTES,
    LATENT_DIM,
    NVFP4_ROW_BYTES,
    SYNC_FREE_MAX_TOKENS,
)


@triton.jit
def _e4m3_decode(byte):
    """int32 holding an e4m3 byte -> its fp32 value."""
    exponent = (byte >> 3) & 15
    mantissa = byte & 7
    normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    value = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)
    return tl.where((byte & 128) != 0, -value, value)


@triton.jit
def _e4m3_encode_exact(x):
    """fp32 -> int32 holding the nearest e4m3 byte (ties to even), saturating at +-448, in integer arithmetic."""
    magnitude = tl.minimum(tl.abs(x), 448.0)
    bits = magnitude.to(tl.int32, bitcast=True)
    # Normal range (>= 2**-6): keep 3 of the 23 mantissa bits, rounding to nearest even.
    rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576
    normal = (((rounded >> 23) - 120) << 3) | ((rounded >> 20) & 7)
    # Subnormal range: multiples of 2**-9 (index 8 is 2**-6, the first normal, whose byte is also 8).
    steps = magnitude * 512.0
    whole = tl.floor(steps)
    fraction = steps - whole
    index = whole.to(tl.int32)
    index += ((fraction > 0.5) | ((fraction == 0.5) & ((index & 1) == 1))).to(tl.int32)
    code = tl.where(magnitude < 0.015625, index, normal)
    return code | (((x.to(tl.int32, bitcast=True) >> 31) & 1) << 7)


@triton.jit
def _e4m3_pair(low, high, HW: tl.constexpr):
    """Two fp32 -> int16 holding their e4m3 bytes, low's in the low byte (nearest even, saturating at +-448).

    On a GPU one cvt.rn.satfinite.e4m3x2 does both; elsewhere the same in integer arithmetic.
    """
    if HW:
        return tl.inline_asm_elementwise(
            asm="cvt.rn.satfinite.e4m3x2.f32 $0, $2, $1;",
            constraints="=h,f,f",
            args=[low, high],
            dtype=tl.int16,
            is_pure=True,
            pack=1,
        )
    else:
        return (_e4m3_encode_exact(low) | (_e4m3_encode_exact(high) << 8)).to(tl.int16)


@triton.jit
def _div(a, b, reciprocal, HW: tl.constexpr):
    """a / b correctly rounded, for b > 0 with its correctly rounded reciprocal (all of a's shape).

    On a GPU: q = a * (1/b), its exact residual e = q*b - a by FMA, then q - e * (1/b), which Markstein's
    theorem makes the IEEE quotient; -0 stays -0. Written in PTX with explicit rounding so that no compiler
    flag can contract or reorder it. The interpreter has no true FMA, so there it divides.
    """
    if HW:
        return tl.inline_asm_elementwise(
            asm="{ .reg .f32 q, e; mul.rn.f32 q, $1, $3; neg.f32 e, $1; fma.rn.f32 e, q, $2, e; "
            "neg.f32 e, e; fma.rn.f32 $0, e, $3, q; }",
            constraints="=f,f,f,f",
            args=[a, b, reciprocal],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        return tl.math.div_rn(a, b)


@triton.jit
def _e2m1_encode(q, x):
    """q = x / (its block scale) -> int32 nibble: the sign of x in bit 3, the magnitude nearest |q|, ties to even.

    A three-step search over the midpoints 0.25 0.75 1.25 1.75 2.5 3.5 5: a tie goes to the even index, so the
    midpoints after an even index (0.25, 1.25, 2.5, 5) need strictly more, the others (0.75, 1.75, 3.5) do not.
    Every comparison is written so that a NaN quotient saturates (the GPU division gives NaN for x = +-inf),
    and the sign comes from x, which the division cannot lose.
    """
    magnitude = tl.abs(q)
    upper = ~(magnitude < 1.75)
    middle = ~(magnitude < tl.where(upper, 3.5, 0.75))
    cut = tl.where(upper, tl.where(middle, 5.0, 2.5), tl.where(middle, 1.25, 0.25))
    index = upper.to(tl.int32) * 4 + middle.to(tl.int32) * 2 + (~(magnitude <= cut)).to(tl.int32)
    return index | ((x.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def _e2m1_decode(nibble, shift: tl.constexpr):
    """The nibble at bit `shift` of an int32 -> its fp32 value (0, 0.5, 1, 1.5, 2, 3, 4 or 6, signed) * 2**-126.

    The 3 magnitude bits placed at the top of an fp32's exponent and mantissa are the value times 2**-126
    exactly (codes 0 and 1 land in fp32's subnormals, as 0 and 0.5 * 2**-126): no conversion instruction, and
    the caller multiplies by 2**126 before anything else. One multiply puts two copies of the isolated nibble
    at bits 22 and 28 (they cannot overlap); the mask keeps the magnitude from the first and the sign (the
    nibble's bit 3) from the second.
    """
    spread = (nibble & (15 << shift)) * ((1 << (22 - shift)) + (1 << (28 - shift)))
    return (spread & -2118123520).to(tl.float32, bitcast=True)  # 0x81C00000


@triton.jit
def _pool_row(row, block_size, pool_block_stride, pool_row_stride):
    """Byte offset of pool row `row` (int64): row % block_size of block row // block_size, as vLLM slots count."""
    return (row // block_size) * pool_block_stride + (row % block_size) * pool_row_stride


@triton.jit
def _write_kernel(
    x_ptr,
    x_row_stride,
    slot_ptr,
    pool_ptr,
    block_size,
    pool_block_stride,
    pool_row_stride,
    num_pool_rows,
    num_tokens,
    BLOCK_T: tl.constexpr,
    X_KIND: tl.constexpr,
    HW: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = tokens < num_tokens
    slot = tl.load(slot_ptr + tokens, mask=in_range, other=-1).to(tl.int64)
    # A slot past the pool is skipped like a negative one: the kernel never writes outside the pool.
    live = in_range & (slot >= 0) & (slot < num_pool_rows)
    group = tl.arange(0, 32)
    pair = group[:, None] * 8 + tl.arange(0, 8)[None, :]  # [32, 8]: output byte j holds elements 2j and 2j+1
    live3 = live[:, None, None]
    # Each element pair is loaded as one word and split with integer operations, so no lane ever needs another
    # lane's element: bf16 and fp16 pairs as int32, fp32 pairs as int64 (little-endian: element 2j is low).
    word = tl.load(
        x_ptr + tokens.to(tl.int64)[:, None, None] * x_row_stride + pair[None, :, :], mask=live3, other=0
    )  # [BLOCK_T, 32, 8]
    if X_KIND == 0:  # bf16: an fp32 whose low 16 bits are zero
        even = (word << 16).to(tl.float32, bitcast=True)
        odd = (word & -65536).to(tl.float32, bitcast=True)
    elif X_KIND == 1:  # fp16
        even = word.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        odd = (word >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:  # fp32
        even = word.to(tl.int32).to(tl.float32, bitcast=True)
        odd = (word >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    amax = tl.maximum(tl.max(tl.abs(even), axis=2), tl.max(tl.abs(odd), axis=2))  # [BLOCK_T, 32]
    scale = tl.minimum(tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)), 0.001953125), 448.0)
    # 32 per token: the integer encoding costs nothing here (and inline PTX on a reduced tensor is not reliable).
    scale_byte = _e4m3_encode_exact(scale)
    stored_scale = _e4m3_decode(scale_byte)
    reciprocal = tl.math.div_rn(tl.full(stored_scale.shape, 1.0, tl.float32), stored_scale)
    divisor = tl.broadcast_to(stored_scale[:, :, None], even.shape)
    inverse = tl.broadcast_to(reciprocal[:, :, None], even.shape)
    even = _e2m1_encode(_div(even, divisor, inverse, HW), even)
    odd = _e2m1_encode(_div(odd, divisor, inverse, HW), odd)
    packed = (even | (odd << 4)).to(tl.uint8)  # [BLOCK_T, 32, 8]
    row = _pool_row(slot, block_size, pool_block_stride, pool_row_stride)
    tl.store(pool_ptr + row[:, None, None] + pair[None, :, :], packed, mask=live3)
    tl.store(pool_ptr + row[:, None] + 256 + group[None, :], scale_byte.to(tl.uint8), mask=live[:, None])


@triton.jit
def _gather_kernel(
    pool_ptr,
    block_size,
    pool_block_stride,
    pool_row_stride,
    num_pool_rows,
    src_ptr,
    src_width,
    src_row_stride,
    num_src,
    out16_ptr,
    out32_ptr,
    table_ptr,
    BLOCK_R: tl.constexpr,
    WRITE_TABLE: tl.constexpr,
    ZERO_ROPE: tl.constexpr,
    HW: tl.constexpr,
):
    dst = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_range = dst < num_src
    # Entry dst is (row dst // width, column dst % width) of the index matrix, whatever its row stride.
    token = dst // src_width
    src = tl.load(src_ptr + token.to(tl.int64) * src_row_stride + (dst - token * src_width), mask=in_range, other=-1)
    src = src.to(tl.int64)
    live = in_range & (src >= 0)
    if WRITE_TABLE:
        tl.store(table_ptr + dst, tl.where(live, dst, -1).to(tl.int32), mask=in_range)
    # Clamp into the pool: a stray index must never make the kernel read outside it.
    src = tl.maximum(tl.minimum(src, num_pool_rows - 1), 0)
    row = _pool_row(src, block_size, pool_block_stride, pool_row_stride)

    # One row: 4 tiles of 128 elements = 4 x 8 scale groups x 8 bytes, each byte holding elements 2j and 2j+1.
    tile = tl.arange(0, 4)
    group = tl.arange(0, 8)
    pair = tl.arange(0, 8)
    scale_index = tile[:, None] * 8 + group[None, :]  # [4, 8]
    byte_index = scale_index[:, :, None] * 8 + pair[None, None, :]  # [4, 8, 8]
    live4 = live[:, None, None, None]
    codes = tl.load(pool_ptr + row[:, None, None, None] + byte_index[None], mask=live4, other=0).to(tl.int32)
    scale_bytes = tl.load(pool_ptr + row[:, None, None] + 256 + scale_index[None], mask=live[:, None, None], other=0)
    # The decoded codes are value * 2**-126; times scale * 2**100 they are value * 2**-26, exactly (a code times
    # a scale has at most 6 significant bits, and nothing reaches fp32's subnormals). The tile scale is taken
    # from amax * 2**26 and the quotients, scale-free, come out exactly as from the unscaled values.
    block_scale = (_e4m3_decode(scale_bytes.to(tl.int32)) * 1.2676506002282294e30)[:, :, :, None]
    low = _e2m1_decode(codes, 0) * block_scale  # elements 2j
    high = _e2m1_decode(codes, 4) * block_scale  # elements 2j + 1
    amax = tl.max(tl.max(tl.maximum(tl.abs(low), tl.abs(high)), axis=3), axis=2) * 67108864.0  # [BLOCK_R, 4]
    tile_scale = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32)), 1.1754943508222875e-38)
    scaled_scale = tl.maximum(tile_scale * 1.4901161193847656e-08, 1.1754943508222875e-38)  # * 2**-26
    reciprocal = tl.math.div_rn(tl.full(scaled_scale.shape, 1.0, tl.float32), scaled_scale)
    divisor = tl.broadcast_to(scaled_scale[:, :, None, None], low.shape)
    inverse = tl.broadcast_to(reciprocal[:, :, None, None], low.shape)
    # Little-endian: the fp8 byte of element 2j is the low byte of 16-bit word j.
    words = _e4m3_pair(_div(low, divisor, inverse, HW), _div(high, divisor, inverse, HW), HW)
    out_row = dst.to(tl.int64)
    tl.store(out16_ptr + out_row[:, None, None, None] * 328 + byte_index[None], words, mask=live4)
    tl.store(out32_ptr + out_row[:, None] * 164 + 128 + tile[None, :], tile_scale, mask=live[:, None])
    if ZERO_ROPE:
        rope = tl.arange(0, 32)
        zeros = tl.zeros((BLOCK_R, 32), dtype=tl.float32)
        tl.store(out32_ptr + out_row[:, None] * 164 + 132 + rope[None, :], zeros, mask=live[:, None])


# Rows (gather) or tokens (write) per program. On the CPU interpreter each program is a Python-level step, so
# bigger blocks there only make the tests faster; on a GPU these were the fastest on an H200 (bench.py --sweep).
_GPU_BLOCKS = {"gather": (4, 1), "write": (2, 1)}  # (rows or tokens per program, warps)
_INTERPRETER_BLOCKS = {"gather": (1024, 4), "write": (256, 4)}


@functools.cache
def _has_fp8_conversion(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 9)


def _hardware(device: torch.device) -> bool:
    """Use the GPU's fp8 conversion and FMA division (sm_89 and newer), else the integer emulation.

    bench.py proves both give the reference's bytes on the GPU. SPARKFLEET_NVFP4_EMULATE=1 forces the emulation.
    """
    if device.type != "cuda" or os.environ.get("SPARKFLEET_NVFP4_EMULATE", "0") == "1":
        return False
    return _has_fp8_conversion(device.index if device.index is not None else torch.cuda.current_device())


def _blocks(kind: str, device: torch.device, override: tuple[int, int] | None) -> tuple[int, int]:
    if override is not None:
        return override
    return (_GPU_BLOCKS if device.type == "cuda" else _INTERPRETER_BLOCKS)[kind]


def _pool_args(pool: torch.Tensor) -> tuple[int, int, int, int]:
    """A checked pool's geometry as the kernels take it: block size, block and row strides, number of rows."""
    _check_pool(pool)
    return pool.shape[1], pool.stride(0), pool.stride(1), pool.shape[0] * pool.shape[1]


def _check_pool(pool: torch.Tensor) -> None:
    if (pool.dtype != torch.uint8 or pool.dim() != 3 or pool.shape[2] != NVFP4_ROW_BYTES or pool.stride(2) != 1
            or pool.shape[0] * pool.shape[1] == 0):
        raise ValueError(
            f"the NVFP4 pool is {tuple(pool.shape)} {pool.dtype} with strides {pool.stride()}; expected "
            f"[num_blocks, block_size, {NVFP4_ROW_BYTES}] uint8 with contiguous rows, not empty"
        )


def write(
    latent: torch.Tensor, slot_mapping: torch.Tensor, pool: torch.Tensor, *, blocks: tuple[int, int] | None = None
) -> None:
    """Quantise [T, 512] latent rows (bf16, fp16 or fp32) into pool slots; slots < 0 are skipped.

    A slot s is row s % block_size of block s // block_size, as in vLLM's slot mapping. No host synchronisation.
    """
    geometry = _pool_args(pool)
    if latent.dim() != 2 or latent.shape[1] != LATENT_DIM or latent.stride(1) != 1:
        raise ValueError(f"latent is {tuple(latent.shape)} with strides {latent.stride()}; expected [T, {LATENT_DIM}]")
    if slot_mapping.shape != (latent.shape[0],):
        raise ValueError(f"slot_mapping is {tuple(slot_mapping.shape)}; expected ({latent.shape[0]},)")
    num_tokens = latent.shape[0]
    if num_tokens == 0:
        return
    kinds = {torch.bfloat16: (0, torch.int32), torch.float16: (1, torch.int32), torch.float32: (2, torch.int64)}
    if latent.dtype not in kinds or latent.stride(0) % 2:
        raise ValueError(f"latent is {latent.dtype} with row stride {latent.stride(0)}; expected bf16, fp16 or fp32 "
                         "with an even row stride")
    kind, word = kinds[latent.dtype]
    block_t, warps = _blocks("write", pool.device, blocks)
    _write_kernel[(triton.cdiv(num_tokens, block_t),)](
        latent.view(word),
        latent.stride(0) // 2,
        slot_mapping,
        pool,
        *geometry,
        num_tokens,
        BLOCK_T=block_t,
        X_KIND=kind,
        HW=_hardware(pool.device),
        num_warps=warps,
    )


def new_scratch(rows: int, device: torch.device | str, *, zero_rope: bool = True) -> torch.Tensor:
    """Scratch pages [ceil(rows / 64), 64, 656] uint8; with zero_rope, the RoPE region (and everything else) zero."""
    pages = triton.cdiv(max(rows, 1), FP8_DS_MLA_PAGE_ROWS)
    make = torch.zeros if zero_rope else torch.empty
    return make(pages, FP8_DS_MLA_PAGE_ROWS, FP8_DS_MLA_ROW_BYTES, dtype=torch.uint8, device=device)


def gather_rows(
    pool: torch.Tensor,
    src: torch.Tensor,
    scratch: torch.Tensor,
    table: torch.Tensor | None,
    *,
    zero_rope: bool,
    blocks: tuple[int, int] | None = None,
) -> None:
    """Expand the pool rows that src names into scratch rows 0, 1, ... in src's row-major order.

    src is 1-D, or 2-D [T, K] with unit column stride and any row stride (read in place, never copied). A
    negative entry is skipped; table[i] (if given) becomes i, or -1 where skipped.
    """
    geometry = _pool_args(pool)
    if src.dim() == 1:
        src = src.unsqueeze(0)
    if src.dim() != 2 or (src.shape[1] > 1 and src.stride(1) != 1):
        raise ValueError(f"indices are {tuple(src.shape)} with strides {src.stride()}; expected [T, K] with rows "
                         "of consecutive entries")
    num_src = src.numel()
    if scratch.dtype != torch.uint8 or not scratch.is_contiguous() or scratch.shape[-1] != FP8_DS_MLA_ROW_BYTES:
        raise ValueError(f"scratch is {tuple(scratch.shape)} {scratch.dtype}; expected contiguous [P, 64, 656] uint8")
    if scratch.numel() // FP8_DS_MLA_ROW_BYTES < num_src:
        raise ValueError(f"scratch holds {scratch.numel() // FP8_DS_MLA_ROW_BYTES} rows; {num_src} are needed")
    if num_src == 0:
        return
    block_r, warps = _blocks("gather", pool.device, blocks)
    _gather_kernel[(triton.cdiv(num_src, block_r),)](
        pool,
        *geometry,
        src,
        max(src.shape[1], 1),
        src.stride(0),
        num_src,
        scratch.view(torch.int16),
        scratch.view(torch.float32),
        table if table is not None else src,
        BLOCK_R=block_r,
        WRITE_TABLE=table is not None,
        ZERO_ROPE=zero_rope,
        HW=_hardware(pool.device),
        num_warps=warps,
    )


class SyncFreeBuffers:
    """The persistent scratch and table of the fixed-shape path, one pair per (top-k width, device)."""

    def __init__(self, max_tokens: int = SYNC_FREE_MAX_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._buffers: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, topk: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Allocate on first use (call once before capturing a CUDA graph); the RoPE region is zeroed then."""
        key = (topk, torch.device(device))
        if key not in self._buffers:
            rows = self.max_tokens * topk
            self._buffers[key] = (new_scratch(rows, device), torch.empty(rows, dtype=torch.int32, device=device))
        return self._buffers[key]


SYNC_FREE = SyncFreeBuffers()


def _check_indices(indices: torch.Tensor) -> None:
    if indices.dim() != 2 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices are {tuple(indices.shape)} {indices.dtype}; expected [T, K] int32 or int64")


def gather_sync_free(
    pool: torch.Tensor,
    indices: torch.Tensor,
    *,
    buffers: SyncFreeBuffers = SYNC_FREE,
    blocks: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K] indices (T <= buffers.max_tokens) -> (persistent scratch [P, 64, 656], tables [T, K] int32).

    Entry (t, k) lands in scratch row t * K + k; padding (< 0) keeps table -1. The scratch is shared by every call
    with the same K on the device: its rows are valid until the next call.
    """
    _check_indices(indices)
    num_tokens, topk = indices.shape
    if num_tokens > buffers.max_tokens:
        raise ValueError(f"{num_tokens} tokens; the sync-free gather takes at most {buffers.max_tokens}")
    scratch, table = buffers.get(topk, pool.device)
    gather_rows(pool, indices, scratch, table, zero_rope=False, blocks=blocks)
    return scratch, table[: num_tokens * topk].view(num_tokens, topk)


def gather_dedup(
    pool: torch.Tensor, indices: torch.Tensor, *, blocks: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K] indices -> (fresh scratch holding each selected row once, tables [T, K] int32). Synchronises."""
    _check_indices(indices)
    flat = indices.reshape(-1)
    valid = flat >= 0
    # Clamp before deduplicating, so an index past the pool is the same row as the pool's last.
    src = torch.where(valid, flat.clamp(max=pool.shape[0] * pool.shape[1] - 1), -1)
    union, inverse = torch.unique(src, return_inverse=True)
    # A padding entry (-1) sorts first and becomes a skipped scratch row that no table entry points at.
    scratch = new_scratch(union.numel(), pool.device, zero_rope=False)
    gather_rows(pool, union, scratch, None, zero_rope=True, blocks=blocks)
    tables = torch.where(valid, inverse, -1).to(torch.int32).view(indices.shape)
    return scratch, tables


def gather(
    pool: torch.Tensor, indices: torch.Tensor, *, buffers: SyncFreeBuffers = SYNC_FREE
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selected rows as fp8_ds_mla scratch pages plus renumbered tables: sync-free up to max_tokens, else dedup."""
    if indices.shape[0] <= buffers.max_tokens:
        return gather_sync_free(pool, indices, buffers=buffers)
    return gather_dedup(pool, indices)
