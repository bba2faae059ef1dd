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
    """int32 holding an e4m3 byte -> its fp32 value (0x80 is -0, as torch's float8_e4m3fn decodes it).

    The sign is set as a bit, not by negating: Triton before triton-lang/triton#10270 (3.6, the GPU image's)
    emits a float's unary minus as 0.0 - x, which leaves +0 at +0, where 3.9 (the interpreter's venv) emits an
    IEEE negation; a bit is the same on every version.
    """
    exponent = (byte >> 3) & 15
    mantissa = byte & 7
    normal = (((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125, normal)
    return (magnitude.to(tl.int32, bitcast=True) | ((byte & 128) << 24)).to(tl.float32, bitcast=True)


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
def _claim_kernel(slot_ptr, winner_ptr, num_pool_rows, num_tokens, BLOCK_T: tl.constexpr):
    """The first pass of the claim write: winner[slot] = the largest token index naming that slot.

    winner is the persistent slot map (`WriteWinners`), -1 everywhere between writes: the write kernel that
    follows resets every entry this pass raised."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = tokens < num_tokens
    slot = tl.load(slot_ptr + tokens, mask=in_range, other=-1).to(tl.int64)
    live = in_range & (slot >= 0) & (slot < num_pool_rows)
    tl.atomic_max(winner_ptr + tl.where(live, slot, 0), tokens, mask=live)


@triton.jit
def _writers(slot_ptr, winner_ptr, slot, tokens, live, num_tokens, BLOCK_T: tl.constexpr, DUPLICATES: tl.constexpr,
             SCAN_BLOCK: tl.constexpr):
    """Which of this program's live tokens write their row. Duplicate slots: only the last token of the batch
    that names a slot writes it, so the row holds that token's codes and scales (two writers of one row would
    interleave their two stores). See `write`."""
    if DUPLICATES == 1:  # scan: is the slot named by a later token? The tokens after this block, read in chunks.
        later = tl.zeros((BLOCK_T,), tl.int32)
        for start in range(tl.program_id(0) * BLOCK_T + 1, num_tokens, SCAN_BLOCK):
            others = start + tl.arange(0, SCAN_BLOCK)
            other_slot = tl.load(slot_ptr + others, mask=others < num_tokens, other=-1).to(tl.int64)
            match = (other_slot[None, :] == slot[:, None]) & (others[None, :] > tokens[:, None])
            later = tl.maximum(later, tl.max(match.to(tl.int32), axis=1))
        live = live & (later == 0)
    elif DUPLICATES == 2:  # claim: _claim_kernel left the slot's last token in the slot map
        winner = tl.load(winner_ptr + tl.where(live, slot, 0), mask=live, other=-1)
        live = live & (winner == tokens)
    return live


@triton.jit
def _writers_kernel(slot_ptr, winner_ptr, out_ptr, num_pool_rows, num_tokens, BLOCK_T: tl.constexpr,
                    DUPLICATES: tl.constexpr, SCAN_BLOCK: tl.constexpr):
    """out[t] = 1 where the write kernel lets token t write (the tests' view of `_writers`: under the
    interpreter, programs and stores run in order, so the last token wins a slot even when every token writes)."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = tokens < num_tokens
    slot = tl.load(slot_ptr + tokens, mask=in_range, other=-1).to(tl.int64)
    live = in_range & (slot >= 0) & (slot < num_pool_rows)
    live = _writers(slot_ptr, winner_ptr, slot, tokens, live, num_tokens, BLOCK_T, DUPLICATES, SCAN_BLOCK)
    tl.store(out_ptr + tokens, live.to(tl.int8), mask=in_range)


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
    winner_ptr,
    BLOCK_T: tl.constexpr,
    X_KIND: tl.constexpr,
    HW: tl.constexpr,
    DUPLICATES: tl.constexpr,
    SCAN_BLOCK: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_range = tokens < num_tokens
    slot = tl.load(slot_ptr + tokens, mask=in_range, other=-1).to(tl.int64)
    # A slot past the pool is skipped like a negative one: the kernel never writes outside the pool.
    live = in_range & (slot >= 0) & (slot < num_pool_rows)
    live = _writers(slot_ptr, winner_ptr, slot, tokens, live, num_tokens, BLOCK_T, DUPLICATES, SCAN_BLOCK)
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
    if DUPLICATES == 2:
        # The winner puts its slot's entry back to -1. A loser of that slot reads either the winner's index or
        # -1, never its own, whenever it runs.
        tl.store(winner_ptr + tl.where(live, slot, 0), tl.full((BLOCK_T,), -1, tl.int32), mask=live)


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
    scale_bytes = tl.load(pool_ptr + row[:, None, None] + 256 + scale_index[None], mask=live[:, None, None],
                          other=0).to(tl.int32)
    # A block whose scale is zero of either sign (0x00 or 0x80; the write never stores one, its floor being
    # 2**-9, so only a never-written row has one) decodes to +0 everywhere, as `reference.nvfp4_dequantize`:
    # its codes and its scale's sign are dropped, so no code's sign (nor the -0's) can make a -0.
    zero_block = (scale_bytes & 127) == 0
    codes = tl.where(zero_block[:, :, :, None], 0, codes)
    scale_bytes = tl.where(zero_block, 0, scale_bytes)
    # The decoded codes are value * 2**-126; times scale * 2**100 they are value * 2**-26, exactly (a code times
    # a scale has at most 6 significant bits, and nothing reaches fp32's subnormals). The tile scale is taken
    # from amax * 2**26 and the quotients, scale-free, come out exactly as from the unscaled values.
    block_scale = (_e4m3_decode(scale_bytes) * 1.2676506002282294e30)[:, :, :, None]
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


@triton.jit
def _union_entries_kernel(
    src_ptr,
    src_width,
    src_row_stride,
    num_pool_rows,
    marks_ptr,
    ends_ptr,
    table_ptr,
    num_tokens,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    REMAP: tl.constexpr,
):
    """Program (block of tokens, chunk of the top-k). Without REMAP: mark each selected (clamped) pool row in the
    byte map. With REMAP: table = the row's place in the union, ends[row] - 1 (ends the inclusive prefix sum of
    the marks), -1 for padding."""
    token = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    column = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    in_range = (token < num_tokens)[:, None] & (column < src_width)[None, :]
    entry = token.to(tl.int64)[:, None] * src_row_stride + column[None, :]
    src = tl.load(src_ptr + entry, mask=in_range, other=-1).to(tl.int64)
    live = in_range & (src >= 0)
    src = tl.maximum(tl.minimum(src, num_pool_rows - 1), 0)
    if REMAP:
        place = tl.load(ends_ptr + src, mask=live, other=0) - 1
        out = token.to(tl.int64)[:, None] * src_width + column[None, :]
        tl.store(table_ptr + out, tl.where(live, place, -1), mask=in_range)
    else:
        tl.store(marks_ptr + src, tl.full((BLOCK_T, BLOCK_K), 1, tl.uint8), mask=live)


@triton.jit
def _union_compact_kernel(marks_ptr, ends_ptr, num_pool_rows, union_ptr, BLOCK: tl.constexpr):
    """union[ends[row] - 1] = row for every marked pool row: the union in ascending row order."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = rows < num_pool_rows
    marked = tl.load(marks_ptr + rows, mask=in_range, other=0) != 0
    place = tl.load(ends_ptr + rows, mask=marked, other=1) - 1
    tl.store(union_ptr + place, rows, mask=marked)


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


class WriteWinners:
    """The claim write's slot map: one int32 per pool row, -1 between writes, one per device (shared by every
    pool of at most its rows, like the gather's persistent scratch: correct for one stream at a time)."""

    def __init__(self) -> None:
        self._maps: dict[torch.device, torch.Tensor] = {}
        # Maps a larger pool replaced stay allocated: a CUDA graph captured before still writes through them.
        self._superseded: list[torch.Tensor] = []

    def get(self, rows: int, device: torch.device) -> torch.Tensor:
        """Allocate (all -1) on first use or when a larger pool comes. Write once, with the largest pool, before
        capturing a graph: growing the map allocates, which a capture refuses."""
        key = torch.device(device)
        if key.type == "cuda" and key.index is None:
            key = torch.device("cuda", torch.cuda.current_device())
        if key not in self._maps or self._maps[key].numel() < rows:
            if key.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"the claim write's slot map for {rows} pool rows would be allocated during "
                                   "a CUDA graph capture; write once with the largest pool before capturing")
            if key in self._maps:
                self._superseded.append(self._maps[key])
            self._maps[key] = torch.full((rows,), -1, dtype=torch.int32, device=key)
        return self._maps[key]

    def reset(self, device: torch.device) -> None:
        """Every entry back to -1 (after a write that stopped between the claim and the write kernel)."""
        for key, winner in self._maps.items():
            if key.type == torch.device(device).type:
                winner.fill_(-1)


WRITE_WINNERS = WriteWinners()

# Duplicate slots (`write`): up to this many tokens the write kernel scans the later tokens' slots itself (one
# launch, O(T^2 / 2) slot comparisons, read from the cache); above, a claim pass and the slot map (two launches,
# O(T)). An estimate, not yet measured on a GPU: bench.py --write-duplicates times both and the unchecked write.
WRITE_SCAN_MAX_TOKENS = 1024
_DUPLICATE_METHODS = {"unchecked": 0, "scan": 1, "claim": 2}
_SCAN_BLOCK = 256


def default_duplicates(num_tokens: int) -> str:
    """How `write` finds the last token naming a slot when not told: by the number of tokens, never the data."""
    return "scan" if num_tokens <= WRITE_SCAN_MAX_TOKENS else "claim"


def write(
    latent: torch.Tensor,
    slot_mapping: torch.Tensor,
    pool: torch.Tensor,
    *,
    blocks: tuple[int, int] | None = None,
    duplicates: str | None = None,
    winners: WriteWinners = WRITE_WINNERS,
) -> None:
    """Quantise [T, 512] latent rows (bf16, fp16 or fp32) into pool slots; slots < 0 are skipped.

    A slot s is row s % block_size of block s // block_size, as in vLLM's slot mapping. No host synchronisation,
    no allocation but the slot map's (on the first claim write, and again for a larger pool): safe inside a CUDA
    graph once a claim write with the largest pool has run.

    A slot named by several tokens holds the whole row (codes and scales) of the last of them in the batch, as
    `reference.write`. `duplicates` picks how the kernel finds the last one (by default from the number of
    tokens, never from the data): "scan" (each token compares its slot with the later tokens', in the one write
    kernel), "claim" (a pass of atomic max of the token index into the slot map `winners`, whose entries the
    write then puts back to -1), or "unchecked" (every token writes: only for slot mappings known to be distinct,
    as the kernel before this rule; duplicates then tear rows on a GPU).
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
    if latent.storage_offset() % 2:
        raise ValueError(f"latent starts at element {latent.storage_offset()} of its storage; expected an even "
                         "offset (the kernel reads it as pairs of elements)")
    words = latent.view(word)  # (every argument is made before the claim pass, which the write kernel must follow)
    if duplicates is None:
        duplicates = default_duplicates(num_tokens)
    if duplicates not in _DUPLICATE_METHODS:
        raise ValueError(f"duplicates is {duplicates!r}; expected one of {', '.join(_DUPLICATE_METHODS)}")
    if slot_mapping.stride(0) != 1 and num_tokens > 1:
        slot_mapping = slot_mapping.contiguous()
    block_t, warps = _blocks("write", pool.device, blocks)
    grid = (triton.cdiv(num_tokens, block_t),)
    winner = slot_mapping  # not read unless claiming
    if duplicates == "claim":
        winner = winners.get(geometry[3], pool.device)
        claim_t = 1024 if pool.device.type == "cuda" else 4096
        claim_grid = (triton.cdiv(num_tokens, claim_t),)
        _claim_kernel[claim_grid](slot_mapping, winner, geometry[3], num_tokens, BLOCK_T=claim_t, num_warps=4)
    try:
        _write_kernel[grid](
            words,
            latent.stride(0) // 2,
            slot_mapping,
            pool,
            *geometry,
            num_tokens,
            winner,
            BLOCK_T=block_t,
            X_KIND=kind,
            HW=_hardware(pool.device),
            DUPLICATES=_DUPLICATE_METHODS[duplicates],
            SCAN_BLOCK=_SCAN_BLOCK,
            num_warps=warps,
        )
    except BaseException:
        # The claim raised entries that only the write kernel puts back: a map left so would keep later claim
        # writes from ever writing those slots.
        if duplicates == "claim":
            winners.reset(pool.device)
        raise


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


def gather_union(
    pool: torch.Tensor, indices: torch.Tensor, *, blocks: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, K] indices -> (fresh scratch holding each selected row once, tables [T, K] int32), without a sort.

    The contract of `reference.union`: scratch row i holds the i-th smallest selected (clamped) pool row, and
    each entry's table value is its row's place in that order (-1 for padding); the same rows and bytes as
    `gather_dedup`. The union is found by mark and prefix sum over the pool's rows: a byte per pool row set for
    every selected row, its inclusive prefix sum (torch.cumsum), each entry remapped through it and the marked
    rows compacted into a list, which `gather_rows` expands. One host synchronisation, to read the union's size
    (the scratch's), after everything but the expansion is queued.
    """
    _check_indices(indices)
    geometry = _pool_args(pool)
    num_rows = geometry[3]
    num_tokens, topk = indices.shape
    if topk > 1 and indices.stride(1) != 1:
        indices = indices.contiguous()
    device = pool.device
    marks = torch.zeros(num_rows, dtype=torch.uint8, device=device)
    tables = torch.empty(num_tokens, topk, dtype=torch.int32, device=device)
    # A program takes `block` entries: a chunk of one token's top-k, or whole rows of several tokens.
    block = 1024 if device.type == "cuda" else 16384
    block_k = min(triton.next_power_of_2(max(topk, 1)), block)
    block_t = block // block_k
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(topk, block_k))
    entries = (indices, topk, indices.stride(0), num_rows)
    if num_tokens and topk:
        _union_entries_kernel[grid](*entries, marks, marks, tables, num_tokens, BLOCK_T=block_t, BLOCK_K=block_k,
                                    REMAP=False, num_warps=4)
    ends = torch.cumsum(marks, 0, dtype=torch.int32)
    union = torch.empty(num_rows, dtype=torch.int32, device=device)
    if num_tokens and topk:
        _union_entries_kernel[grid](*entries, marks, ends, tables, num_tokens, BLOCK_T=block_t, BLOCK_K=block_k,
                                    REMAP=True, num_warps=4)
    _union_compact_kernel[(triton.cdiv(num_rows, block),)](marks, ends, num_rows, union, BLOCK=block, num_warps=4)
    count = int(ends[-1])  # the one host synchronisation
    scratch = new_scratch(count, device, zero_rope=False)
    gather_rows(pool, union[:count], scratch, None, zero_rope=True, blocks=blocks)
    return scratch, tables


def gather(
    pool: torch.Tensor, indices: torch.Tensor, *, buffers: SyncFreeBuffers = SYNC_FREE
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selected rows as fp8_ds_mla scratch pages plus renumbered tables: sync-free up to max_tokens, else dedup."""
    if indices.shape[0] <= buffers.max_tokens:
        return gather_sync_free(pool, indices, buffers=buffers)
    return gather_dedup(pool, indices)


# ---- sparse-MLA decode attention -------------------------------------------------------------------------------
#
# Both kernels run one program per (token, block of heads, split of the top-k): the program reads each of its
# selected rows once for all heads of the block, dequantises it in registers, and runs an online softmax over
# chunks of BLOCK_K rows (scores and the weighted sum of rows as bf16 x bf16 -> fp32 tensor-core products).
# With one split it writes the output and lse itself; with several (flash-decode), each split writes its
# unnormalised partial state and `_combine_kernel` merges them. Softmax runs in base 2: the scores are scaled by
# softmax_scale * log2(e), and lse is converted back to the natural log at the end.
#
# Keys are values (MLA): the 512-wide latent. The NVFP4 kernel splits each row into its even elements (the low
# nibbles) and odd elements (the high nibbles), so it needs no interleaving: q and the output are read and written
# as even and odd halves, and q . k = q_even . k_even + q_odd . k_odd.

_LOG2E = 1.4426950408889634
# The NVFP4 kernel keeps its rows as value * 2**-26 (see _gather_kernel: code * 2**-126 times scale * 2**100);
# its scores and output are scaled back by 2**26.
_NVFP4_ROW_SCALE = 67108864.0


@triton.jit
def _dot(a, b, acc, TENSOR_CORES: tl.constexpr):
    """acc + a @ b with a and b rounded to bf16 and fp32 accumulation.

    On a GPU the tensor cores' bf16 product. Triton's interpreter gets bf16 products wrong (and truncates instead
    of rounding to bf16), so there the same bf16 operands are multiplied as fp32 in IEEE arithmetic.
    """
    if TENSOR_CORES:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        return tl.dot(a.to(tl.bfloat16).to(tl.float32), b.to(tl.bfloat16).to(tl.float32), acc,
                      input_precision="ieee")


@triton.jit
def _softmax_step(scores, live, m_i, l_i):
    """One chunk of the online softmax (base 2): -> (weights p, rescale factor for the old state, new m, new l).

    Padding entries weigh 0. While every entry so far is padding, m stays -inf and l 0; exp2 is never taken of
    -inf - -inf. The weights are rounded to bf16 (the product's operand) before they are summed into l, so that
    the output is normalised by the weights it was summed with: the rounding errors then do not add up to a bias.
    """
    scores = tl.where(live[None, :], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None]).to(tl.bfloat16).to(tl.float32)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _finish(m_i, l_i, out_scale):
    """-> (the factor the accumulated output is multiplied by, lse in the natural log); 0 and -inf if l is 0."""
    empty = l_i == 0.0
    factor = tl.where(empty, 0.0, out_scale / tl.where(empty, 1.0, l_i))
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    return factor, lse


@triton.jit
def _nvfp4_decode_kernel(
    q_ptr,
    q_token_stride,
    q_head_stride,
    pool_ptr,
    block_size,
    pool_block_stride,
    pool_row_stride,
    num_pool_rows,
    idx_ptr,
    idx_row_stride,
    topk,
    rows_per_split,
    num_heads,
    qk_scale,
    out_ptr,
    out_token_stride,
    out_head_stride,
    lse_ptr,
    part_ptr,
    part_ml_ptr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    TENSOR_CORES: tl.constexpr,
):
    token = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    head_live = heads < num_heads
    half = tl.arange(0, 256)  # element pair j: elements 2j (even half) and 2j + 1 (odd half)
    q_row = q_ptr + token.to(tl.int64) * q_token_stride + heads[:, None] * q_head_stride + 2 * half[None, :]
    q_even = tl.load(q_row, mask=head_live[:, None], other=0.0)
    q_odd = tl.load(q_row + 1, mask=head_live[:, None], other=0.0)

    group = tl.arange(0, 32)
    byte_index = group[:, None] * 8 + tl.arange(0, 8)[None, :]  # [32, 8]: byte j of the row holds pair j
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc_even = tl.zeros((BLOCK_H, 256), tl.float32)
    acc_odd = tl.zeros((BLOCK_H, 256), tl.float32)
    start = split * rows_per_split
    end = tl.minimum(start + rows_per_split, topk)
    idx_row = idx_ptr + token.to(tl.int64) * idx_row_stride
    for k0 in range(start, end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        src = tl.load(idx_row + ks, mask=ks < end, other=-1).to(tl.int64)
        live = src >= 0
        # Clamp into the pool, as the gather does: a stray index never makes the kernel read outside it.
        row = _pool_row(tl.maximum(tl.minimum(src, num_pool_rows - 1), 0), block_size, pool_block_stride,
                        pool_row_stride)
        codes = tl.load(pool_ptr + row[:, None, None] + byte_index[None], mask=live[:, None, None],
                        other=0).to(tl.int32)  # [BLOCK_K, 32, 8]
        scale_bytes = tl.load(pool_ptr + row[:, None] + 256 + group[None, :], mask=live[:, None], other=0)
        # code * 2**-126 times scale * 2**100: value * 2**-26, exact in fp32 and in bf16 (at most 6 significant
        # bits, far from either's subnormals), so the bf16 keys are the reference's keys exactly.
        block_scale = (_e4m3_decode(scale_bytes.to(tl.int32)) * 1.2676506002282294e30)[:, :, None]
        k_even = tl.reshape(_e2m1_decode(codes, 0) * block_scale, (BLOCK_K, 256)).to(tl.bfloat16)
        k_odd = tl.reshape(_e2m1_decode(codes, 4) * block_scale, (BLOCK_K, 256)).to(tl.bfloat16)
        scores = _dot(q_even, tl.trans(k_even), tl.zeros((BLOCK_H, BLOCK_K), tl.float32), TENSOR_CORES)
        scores = _dot(q_odd, tl.trans(k_odd), scores, TENSOR_CORES) * qk_scale
        p, alpha, m_i, l_i = _softmax_step(scores, live, m_i, l_i)
        acc_even = _dot(p, k_even, acc_even * alpha[:, None], TENSOR_CORES)
        acc_odd = _dot(p, k_odd, acc_odd * alpha[:, None], TENSOR_CORES)

    if SPLIT:
        # Partial state [T, H, splits]: the unnormalised output (in the rows' scale) and (m, l).
        state = (token * num_heads + heads).to(tl.int64) * tl.num_programs(2) + split
        part = part_ptr + state[:, None] * 512 + 2 * half[None, :]
        tl.store(part, acc_even, mask=head_live[:, None])
        tl.store(part + 1, acc_odd, mask=head_live[:, None])
        tl.store(part_ml_ptr + state * 2, m_i, mask=head_live)
        tl.store(part_ml_ptr + state * 2 + 1, l_i, mask=head_live)
    else:
        factor, lse = _finish(m_i, l_i, 67108864.0)
        out = out_ptr + token.to(tl.int64) * out_token_stride + heads[:, None] * out_head_stride + 2 * half[None, :]
        tl.store(out, (acc_even * factor[:, None]).to(out_ptr.dtype.element_ty), mask=head_live[:, None])
        tl.store(out + 1, (acc_odd * factor[:, None]).to(out_ptr.dtype.element_ty), mask=head_live[:, None])
        tl.store(lse_ptr + token * num_heads + heads, lse, mask=head_live)


@triton.jit
def _fp8_tile(fp8_ptr, entry, live, column, TILE: tl.constexpr):
    """Tile TILE (elements 128 * TILE ...) of the selected fp8_ds_mla rows as bf16 [BLOCK_K, 128], exactly."""
    values = tl.load(fp8_ptr + entry[:, None] * 656 + TILE * 128 + column[None, :], mask=live[:, None], other=0.0)
    return values.to(tl.bfloat16)


@triton.jit
def _fp8_decode_kernel(
    q_ptr,
    q_token_stride,
    q_head_stride,
    fp8_ptr,
    scale_ptr,
    num_scratch_rows,
    table_ptr,
    table_row_stride,
    topk,
    rows_per_split,
    num_heads,
    qk_scale,
    out_ptr,
    out_token_stride,
    out_head_stride,
    lse_ptr,
    part_ptr,
    part_ml_ptr,
    BLOCK_H: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    TENSOR_CORES: tl.constexpr,
):
    """The fp8_ds_mla rows' tile scales are arbitrary fp32, so a key times its scale is not exact in bf16. The
    kernel keeps the e4m3 values (exact in bf16) as the tensor-core operand and applies the scales outside the
    products: to each tile's partial score, and to the weights of each tile's part of the output."""
    token = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    head_live = heads < num_heads
    column = tl.arange(0, 128)
    q_row = q_ptr + token.to(tl.int64) * q_token_stride + heads[:, None] * q_head_stride + column[None, :]
    q0 = tl.load(q_row, mask=head_live[:, None], other=0.0)
    q1 = tl.load(q_row + 128, mask=head_live[:, None], other=0.0)
    q2 = tl.load(q_row + 256, mask=head_live[:, None], other=0.0)
    q3 = tl.load(q_row + 384, mask=head_live[:, None], other=0.0)

    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc0 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc1 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc2 = tl.zeros((BLOCK_H, 128), tl.float32)
    acc3 = tl.zeros((BLOCK_H, 128), tl.float32)
    start = split * rows_per_split
    end = tl.minimum(start + rows_per_split, topk)
    table_row = table_ptr + token.to(tl.int64) * table_row_stride
    for k0 in range(start, end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        entry = tl.load(table_row + ks, mask=ks < end, other=-1).to(tl.int64)
        live = entry >= 0
        entry = tl.maximum(tl.minimum(entry, num_scratch_rows - 1), 0)
        # Bytes 0-511: e4m3 values; floats 128-131 of the row's 164: the tile scales. RoPE (zero) is not read.
        k0_ = _fp8_tile(fp8_ptr, entry, live, column, 0)
        k1_ = _fp8_tile(fp8_ptr, entry, live, column, 1)
        k2_ = _fp8_tile(fp8_ptr, entry, live, column, 2)
        k3_ = _fp8_tile(fp8_ptr, entry, live, column, 3)
        scale_row = scale_ptr + entry * 164 + 128
        s0 = tl.load(scale_row, mask=live, other=0.0)
        s1 = tl.load(scale_row + 1, mask=live, other=0.0)
        s2 = tl.load(scale_row + 2, mask=live, other=0.0)
        s3 = tl.load(scale_row + 3, mask=live, other=0.0)
        zero = tl.zeros((BLOCK_H, BLOCK_K), tl.float32)
        scores = _dot(q0, tl.trans(k0_), zero, TENSOR_CORES) * s0[None, :]
        scores += _dot(q1, tl.trans(k1_), zero, TENSOR_CORES) * s1[None, :]
        scores += _dot(q2, tl.trans(k2_), zero, TENSOR_CORES) * s2[None, :]
        scores += _dot(q3, tl.trans(k3_), zero, TENSOR_CORES) * s3[None, :]
        p, alpha, m_i, l_i = _softmax_step(scores * qk_scale, live, m_i, l_i)
        acc0 = _dot(p * s0[None, :], k0_, acc0 * alpha[:, None], TENSOR_CORES)
        acc1 = _dot(p * s1[None, :], k1_, acc1 * alpha[:, None], TENSOR_CORES)
        acc2 = _dot(p * s2[None, :], k2_, acc2 * alpha[:, None], TENSOR_CORES)
        acc3 = _dot(p * s3[None, :], k3_, acc3 * alpha[:, None], TENSOR_CORES)

    if SPLIT:
        state = (token * num_heads + heads).to(tl.int64) * tl.num_programs(2) + split
        part = part_ptr + state[:, None] * 512 + column[None, :]
        tl.store(part, acc0, mask=head_live[:, None])
        tl.store(part + 128, acc1, mask=head_live[:, None])
        tl.store(part + 256, acc2, mask=head_live[:, None])
        tl.store(part + 384, acc3, mask=head_live[:, None])
        tl.store(part_ml_ptr + state * 2, m_i, mask=head_live)
        tl.store(part_ml_ptr + state * 2 + 1, l_i, mask=head_live)
    else:
        factor, lse = _finish(m_i, l_i, 1.0)
        out = out_ptr + token.to(tl.int64) * out_token_stride + heads[:, None] * out_head_stride + column[None, :]
        dtype = out_ptr.dtype.element_ty
        tl.store(out, (acc0 * factor[:, None]).to(dtype), mask=head_live[:, None])
        tl.store(out + 128, (acc1 * factor[:, None]).to(dtype), mask=head_live[:, None])
        tl.store(out + 256, (acc2 * factor[:, None]).to(dtype), mask=head_live[:, None])
        tl.store(out + 384, (acc3 * factor[:, None]).to(dtype), mask=head_live[:, None])
        tl.store(lse_ptr + token * num_heads + heads, lse, mask=head_live)


@triton.jit
def _combine_kernel(
    part_ptr,
    part_ml_ptr,
    num_splits,
    num_heads,
    out_scale,
    out_ptr,
    out_token_stride,
    out_head_stride,
    lse_ptr,
    SPLITS: tl.constexpr,
):
    """Merge the splits' partial states of one (token, head): weights 2**(m_s - max m), then as `_finish`."""
    state = tl.program_id(0)
    token = state // num_heads
    head = state % num_heads
    split = tl.arange(0, SPLITS)
    base = state.to(tl.int64) * num_splits
    m_s = tl.load(part_ml_ptr + (base + split) * 2, mask=split < num_splits, other=float("-inf"))
    m_max = tl.max(m_s, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    column = tl.arange(0, 512)
    merged = tl.zeros((512,), tl.float32)
    total = m_safe * 0.0
    for one in range(0, num_splits):
        weight = tl.exp2(tl.load(part_ml_ptr + (base + one) * 2) - m_safe)
        total += weight * tl.load(part_ml_ptr + (base + one) * 2 + 1)
        merged += weight * tl.load(part_ptr + (base + one) * 512 + column)
    factor, lse = _finish(m_safe, total, out_scale)
    out = out_ptr + token.to(tl.int64) * out_token_stride + head * out_head_stride + column
    tl.store(out, (merged * factor).to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + state, lse)


# (BLOCK_K rows per chunk, warps, pipeline stages) on a GPU; the head block is the heads rounded up to a power of
# two, at least 16 (the tensor cores' smallest M) and at most 32 (registers). Not yet measured on a GPU: run
# bench.py --sweep-attention there, which times the alternatives and benchmarks with the fastest.
_GPU_ATTENTION = {"nvfp4": (32, 4, 2), "fp8": (32, 4, 2)}
_INTERPRETER_ATTENTION = (64, 4, 1)
# Flash-decode: the top-k is split until there are about this many programs per multiprocessor.
_PROGRAMS_PER_SM = {"nvfp4": 2, "fp8": 2}


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _attention_plan(
    kind: str, q: torch.Tensor, topk: int, splits: int | None, blocks: tuple[int, int, int, int] | None
) -> tuple[int, int, int, int, int, int]:
    """-> (BLOCK_H, BLOCK_K, warps, stages, splits, rows per split), from the shapes alone (never the data)."""
    num_tokens, num_heads = q.shape[0], q.shape[1]
    if blocks is not None:
        block_h, block_k, warps, stages = blocks
    else:
        block_h = min(max(triton.next_power_of_2(num_heads), 16), 32)
        block_k, warps, stages = _GPU_ATTENTION[kind] if q.device.type == "cuda" else _INTERPRETER_ATTENTION
    chunks = max(triton.cdiv(topk, block_k), 1)
    if splits is None:
        # Flash-decode: split the top-k until there are _PROGRAMS_PER_SM programs per multiprocessor (one split on
        # the interpreter, whose programs run one after another).
        programs = num_tokens * triton.cdiv(num_heads, block_h)
        if q.device.type == "cuda":
            index = q.device.index if q.device.index is not None else torch.cuda.current_device()
            splits = triton.cdiv(_PROGRAMS_PER_SM[kind] * _multiprocessors(index), max(programs, 1))
        else:
            splits = 1
    splits = min(max(splits, 1), chunks)
    rows_per_split = triton.cdiv(chunks, splits) * block_k
    return block_h, block_k, warps, stages, triton.cdiv(max(topk, 1), rows_per_split), rows_per_split


def _check_query(q: torch.Tensor) -> None:
    if (q.dim() != 3 or q.shape[2] not in (LATENT_DIM, LATENT_DIM + 64) or q.stride(2) != 1
            or q.dtype not in (torch.bfloat16, torch.float16, torch.float32)):
        raise ValueError(f"q is {tuple(q.shape)} {q.dtype} with strides {q.stride()}; expected [T, H, "
                         f"{LATENT_DIM}] or [T, H, {LATENT_DIM + 64}] (bf16, fp16 or fp32) with unit last stride")


def _attention(kernel, kind: str, q: torch.Tensor, source: tuple, idx: torch.Tensor, softmax_scale: float,
               out_scale: float, out_dtype: torch.dtype, splits: int | None,
               blocks: tuple[int, int, int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch one of the two decode kernels (and the combine when split); returns (out, lse)."""
    _check_query(q)
    _check_indices(idx)
    if idx.shape[0] != q.shape[0] or (idx.shape[1] > 1 and idx.stride(1) != 1):
        raise ValueError(f"indices are {tuple(idx.shape)} with strides {idx.stride()}; expected [{q.shape[0]}, K] "
                         "with rows of consecutive entries")
    num_tokens, num_heads = q.shape[0], q.shape[1]
    topk = idx.shape[1]
    out = torch.empty(num_tokens, num_heads, LATENT_DIM, dtype=out_dtype, device=q.device)
    lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=q.device)
    if num_tokens == 0 or num_heads == 0:
        return out, lse
    block_h, block_k, warps, stages, num_splits, rows_per_split = _attention_plan(kind, q, topk, splits, blocks)
    split = num_splits > 1
    # The partial states: a fresh allocation whose size depends on the shapes only (safe under graph capture).
    part = torch.empty(num_tokens * num_heads * num_splits * LATENT_DIM if split else 1, dtype=torch.float32,
                       device=q.device)
    part_ml = torch.empty(num_tokens * num_heads * num_splits * 2 if split else 1, dtype=torch.float32,
                          device=q.device)
    kernel[(num_tokens, triton.cdiv(num_heads, block_h), num_splits)](
        q, q.stride(0), q.stride(1),
        *source,
        idx, idx.stride(0), topk, rows_per_split, num_heads, softmax_scale * _LOG2E,
        out, out.stride(0), out.stride(1), lse, part, part_ml,
        BLOCK_H=block_h, BLOCK_K=block_k, SPLIT=split, TENSOR_CORES=q.device.type == "cuda",
        num_warps=warps, num_stages=stages,
    )
    if split:
        _combine_kernel[(num_tokens * num_heads,)](
            part, part_ml, num_splits, num_heads, out_scale, out, out.stride(0), out.stride(1), lse,
            SPLITS=triton.next_power_of_2(num_splits), num_warps=4,
        )
    return out, lse


def sparse_mla_decode(
    q: torch.Tensor,
    pool: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    splits: int | None = None,
    blocks: tuple[int, int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-MLA decode attention read straight from the 288-byte NVFP4 rows: no fp8 scratch is written.

    q [T, H, 512] (or [T, H, 576], whose RoPE part meets the NoPE model's zero key and is not read), the pool
    [num_blocks, block_size, 288] uint8 (any block and row strides), indices [T, K] int32 or int64 (negative =
    padding; past the pool = its last row; any row stride, read in place). Returns (out [T, H, 512] out_dtype,
    lse [T, H] fp32, natural log); a token whose entries are all padding gets out 0 and lse -inf.

    Each selected row is read once per (token, block of heads) and dequantised in registers. No host sync and
    no allocation whose size depends on the data: safe inside a captured CUDA graph (call once first, so Triton
    has compiled it). `splits` (flash-decode) and `blocks` (BLOCK_H, BLOCK_K, warps, stages) override the plan.
    """
    _check_indices(indices)
    geometry = _pool_args(pool)
    q_scale = softmax_scale * _NVFP4_ROW_SCALE  # the kernel's rows are value * 2**-26
    return _attention(_nvfp4_decode_kernel, "nvfp4", q, (pool, *geometry), indices, q_scale, _NVFP4_ROW_SCALE,
                      out_dtype, splits, blocks)


def sparse_mla_decode_fp8(
    q: torch.Tensor,
    scratch: torch.Tensor,
    tables: torch.Tensor,
    softmax_scale: float,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    splits: int | None = None,
    blocks: tuple[int, int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same attention design over fp8_ds_mla scratch rows [P, 64, 656] through tables [T, K] (negative =
    padding), as the gather leaves them: the second half of the baseline `gather` + attention.

    Reads bytes 0-527 of each row (the e4m3 latent and the tile scales), not the zero RoPE region; the stock
    kernel, which knows nothing of NoPE, reads all 656.
    """
    if scratch.dtype != torch.uint8 or not scratch.is_contiguous() or scratch.shape[-1] != FP8_DS_MLA_ROW_BYTES:
        raise ValueError(f"scratch is {tuple(scratch.shape)} {scratch.dtype}; expected contiguous [P, 64, 656] uint8")
    rows = scratch.numel() // FP8_DS_MLA_ROW_BYTES
    source = (scratch.view(torch.float8_e4m3fn), scratch.view(torch.float32), rows)
    return _attention(_fp8_decode_kernel, "fp8", q, source, tables, softmax_scale, 1.0, out_dtype, splits, blocks)


def gather_then_decode_fp8(
    q: torch.Tensor, pool: torch.Tensor, indices: torch.Tensor, softmax_scale: float, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """The baseline: today's sync-free gather into fp8_ds_mla scratch, then `sparse_mla_decode_fp8`."""
    scratch, tables = gather_sync_free(pool, indices)
    return sparse_mla_decode_fp8(q, scratch, tables, softmax_scale, **kwargs)
