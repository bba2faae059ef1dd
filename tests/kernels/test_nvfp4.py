"""The NVFP4 KV-cache kernels under Triton's interpreter (CPU tensors) against the PyTorch reference.

The kernels' fp8 rounding runs in integer arithmetic here (on a GPU the hardware conversion; bench.py proves the
two give the same bytes there), so every comparison is byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
from sparkfleet_nvfp4 import kernels, reference
from sparkfleet_nvfp4.layout import (
    E2M1_VALUES,
    FLT_MIN,
    FP8_DS_MLA_ROW_BYTES,
    NVFP4_ROW_BYTES,
    SYNC_FREE_MAX_TOKENS,
)

BLOCK = 64


def latent_rows(tokens: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """O(1) rows with, every 8th row, zeros, tiny values, huge values, one outlier per block, the dtype's
    largest value (and its negative), small multiples of powers of two (exact ties after scaling), and +-inf."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 512, generator=gen)
    if tokens >= 8:
        x[0::8] = 0.0
        x[1::8] *= 1e-4
        x[2::8] *= 3000.0
        x[3::8, ::16] = 40.0
        biggest = torch.finfo(dtype).max if dtype != torch.float32 else 1e30
        x[4::8, ::2], x[4::8, 1::2] = biggest, -biggest
        x[5::8] = torch.randint(-12, 13, x[5::8].shape, generator=gen) * 2.0 ** torch.randint(
            -6, 4, x[5::8].shape, generator=gen
        )
        x[6::8, ::3], x[6::8, 1::3] = float("inf"), float("-inf")
    return x.to(dtype)


def filled_pool(blocks: int, seed: int = 1) -> torch.Tensor:
    pool = torch.zeros(blocks, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    reference.write(latent_rows(blocks * BLOCK, seed=seed), torch.arange(blocks * BLOCK), pool)
    return pool


def topk_indices(tokens: int, topk: int, rows: int, seed: int = 2) -> torch.Tensor:
    """Random rows with -1 padding after a random length per token, and one index past the pool per token."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, rows, (tokens, topk), generator=gen, dtype=torch.int32)
    lengths = torch.randint(1, topk + 1, (tokens,), generator=gen)
    idx[torch.arange(topk)[None, :] >= lengths[:, None]] = -1
    idx[:, 0] = rows + 7
    return idx


# ---- write ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 3, 17, 64, 65, 148, 192, 193, 2048])
def test_write_matches_reference(dtype: torch.dtype, tokens: int) -> None:
    gen = torch.Generator().manual_seed(tokens)
    latent = latent_rows(tokens, dtype)
    slots = torch.randperm(40 * BLOCK, generator=gen)[:tokens]
    slots[1::5] = -1  # skipped: those rows keep their old bytes
    before = torch.randint(0, 256, (40, BLOCK, NVFP4_ROW_BYTES), generator=gen, dtype=torch.uint8)
    got, want = before.clone(), before.clone()
    kernels.write(latent, slots, got)
    reference.write(latent, slots, want)
    assert torch.equal(got, want)
    untouched = torch.ones(40 * BLOCK, dtype=torch.bool)
    untouched[slots[slots >= 0].long()] = False
    assert torch.equal(got.view(-1, NVFP4_ROW_BYTES)[untouched], before.view(-1, NVFP4_ROW_BYTES)[untouched])


def whole_rows(latent: torch.Tensor) -> torch.Tensor:
    """Each token's own 288-byte row, as a write of it alone would leave it."""
    return reference.nvfp4_quantize(latent)


@pytest.mark.parametrize("duplicates", [None, "scan", "claim"])
@pytest.mark.parametrize("tokens", [5, 64, 300, 2048])
def test_duplicate_slots_hold_the_last_tokens_whole_row(duplicates: str | None, tokens: int) -> None:
    """Many tokens name the same few slots (with padding among them): each slot holds exactly the row of the last
    token naming it, codes and scales alike, as the reference; the other rows keep their bytes. Both ways of
    finding the last token (the default picks by the number of tokens: 2048 claims, the others scan)."""
    gen = torch.Generator().manual_seed(tokens)
    latent = latent_rows(tokens, torch.float32, seed=tokens)
    slots = torch.randint(0, max(tokens // 4, 2), (tokens,), generator=gen) * 3
    slots[2::9] = -1
    before = torch.randint(0, 256, (max(tokens // BLOCK, 1) * 3 + 1, BLOCK, NVFP4_ROW_BYTES), generator=gen,
                           dtype=torch.uint8)
    got, want = before.clone(), before.clone()
    winners = kernels.WriteWinners()
    kernels.write(latent, slots, got, duplicates=duplicates, winners=winners)
    reference.write(latent, slots, want)
    assert torch.equal(got, want)
    rows, own = got.view(-1, NVFP4_ROW_BYTES), whole_rows(latent)
    live = slots >= 0
    assert slots[live].unique().numel() < live.sum()  # the case is real: there are duplicates
    for slot in slots[live].unique().tolist():
        last = int((slots == slot).nonzero().max())
        assert torch.equal(rows[slot], own[last])
    # the claim's slot map is back to -1 everywhere, ready for the next write (or a graph replay)
    for slot_map in winners._maps.values():
        assert (slot_map == -1).all()


@pytest.mark.parametrize("duplicates", ["scan", "claim"])
def test_exactly_the_last_token_naming_a_slot_is_let_write(duplicates: str) -> None:
    """What the write kernel's filter lets write, seen directly: under the interpreter a write where every token
    writes also ends with the last token's row (programs and stores run in order), so only this tells a filter
    that lets every duplicate write from one that lets the last alone. Blocks of 4 tokens, so that a slot's later
    duplicate is often in another program; padding and slots past the pool never write."""
    gen = torch.Generator().manual_seed(7)
    pool_rows = 40
    slots = torch.randint(-1, pool_rows + 4, (37,), generator=gen).to(torch.int32)
    want = reference.last_writers(slots) & (slots < pool_rows)
    winner = kernels.WriteWinners().get(pool_rows, torch.device("cpu"))
    if duplicates == "claim":
        kernels._claim_kernel[(1,)](slots, winner, pool_rows, slots.numel(), BLOCK_T=64)
    rules = {"unchecked": 0, "scan": 1, "claim": 2}
    seen = {}
    for rule in ("unchecked", duplicates):
        out = torch.full((slots.numel(),), 7, dtype=torch.int8)
        grid = (triton.cdiv(slots.numel(), 4),)
        kernels._writers_kernel[grid](slots, winner, out, pool_rows, slots.numel(), BLOCK_T=4,
                                      DUPLICATES=rules[rule], SCAN_BLOCK=8)
        seen[rule] = out.bool()
    assert torch.equal(seen[duplicates], want)
    assert not torch.equal(seen["unchecked"], want)  # the case has duplicates the filter must hold back


def test_duplicates_across_program_blocks_and_past_the_pool() -> None:
    """The GPU's blocks of 2 tokens: the later duplicate sits in another program; a slot past the pool (skipped)
    does not hide an earlier token of a valid slot, nor does padding."""
    latent = latent_rows(9, torch.float32, seed=4)
    slots = torch.tensor([7, 3, 7, -1, 3, 2 * BLOCK, 5, 7, 5])
    for duplicates in ("scan", "claim"):
        got = torch.zeros(2, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
        kernels.write(latent, slots, got, blocks=(2, 1), duplicates=duplicates, winners=kernels.WriteWinners())
        rows, own = got.view(-1, NVFP4_ROW_BYTES), whole_rows(latent)
        assert torch.equal(rows[7], own[7]) and torch.equal(rows[3], own[4]) and torch.equal(rows[5], own[8])
        assert not rows[[0, 1, 2, 4, 6]].any() and not rows[8:].any()


def test_an_unknown_duplicate_rule_is_refused() -> None:
    pool = torch.zeros(1, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    with pytest.raises(ValueError, match="'first'"):
        kernels.write(torch.zeros(1, 512), torch.tensor([0]), pool, duplicates="first")


def test_slots_past_the_pool_are_skipped_not_written() -> None:
    latent = latent_rows(4)
    slots = torch.tensor([0, 2 * BLOCK, 2 * BLOCK + 5, 2**40])  # the pool holds 2 * BLOCK rows
    pool = torch.zeros(2, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    kernels.write(latent, slots, pool)
    want = torch.zeros_like(pool)
    reference.write(latent[:1], slots[:1], want)
    assert torch.equal(pool, want) and pool[0, 0].any()


def test_write_gpu_block_shape_and_strided_pool() -> None:
    """The GPU's small blocks (masked tails) and a pool that is every other block of a larger allocation."""
    backing = torch.zeros(10, 2, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    pool = backing[:, 1]
    latent = latent_rows(37)
    slots = torch.randperm(10 * BLOCK, generator=torch.Generator().manual_seed(3))[:37]
    kernels.write(latent, slots, pool, blocks=(4, 2))
    want = torch.zeros(10, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    reference.write(latent, slots, want)
    assert torch.equal(pool, want)
    assert not backing[:, 0].any()


def test_e2m1_ties_go_to_the_even_code() -> None:
    """A block whose largest value is 6 has scale 1: its elements are the e2m1 grid, its midpoints and a few
    values just beside them."""
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    # Nearest even index at each tie: 0.25->0, 0.75->1.0, 1.25->1.0, 1.75->2.0, 2.5->2.0, 3.5->4.0, 5.0->4.0
    expected_tie_values = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    row = torch.zeros(1, 512)
    row[0, :16] = torch.tensor([6.0, *ties, *(-t for t in ties), 0.0])
    row[0, 16:32] = torch.tensor([6.0, *(t + 1e-3 for t in ties), *(t - 1e-3 for t in ties), -0.0])
    pool = torch.zeros(1, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    kernels.write(row, torch.tensor([0]), pool)
    decoded = reference.nvfp4_dequantize(pool[0, 0])
    assert pool[0, 0, 256].item() == 0x38  # e4m3 1.0
    assert decoded[1:8].tolist() == expected_tie_values
    assert decoded[8:15].tolist() == [-v for v in expected_tie_values]
    table = list(E2M1_VALUES)
    above = [table[min(table.index(v) + 1, 7)] if v < t else v for v, t in zip(expected_tie_values, ties, strict=True)]
    assert decoded[17:24].tolist() == above
    want = reference.nvfp4_quantize(row)
    assert torch.equal(pool[0, 0], want[0])


def test_roundtrip_error_is_within_the_nvfp4_bound() -> None:
    """Within range, |x - decode(encode(x))| <= s * (half the e2m1 gap at |x| / s), s the stored block scale;
    the gap above 6 covers the scale's own rounding (amax / s <= 6 * (1 + 2**-4)). Beyond 6 * 448, values
    saturate at +-2688."""
    keep = (torch.arange(512) % 8 != 4) & (torch.arange(512) % 8 != 6)  # finite magnitudes only
    latent = latent_rows(512, torch.float32)[keep]
    pool = torch.zeros(8, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    kernels.write(latent, torch.arange(latent.shape[0]), pool)
    rows = pool.view(-1, NVFP4_ROW_BYTES)[: latent.shape[0]]
    decoded = reference.nvfp4_dequantize(rows)
    scale = rows[:, 256:].contiguous().view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=1)
    amax = latent.abs().view(-1, 32, 16).amax(dim=2).repeat_interleave(16, dim=1)
    in_range = amax <= 6 * 448
    scaled = latent.abs() / scale
    half_gap = torch.where(scaled < 2, 0.25, torch.where(scaled < 4, 0.5, 1.0))
    error = (latent - decoded).abs()
    assert in_range.float().mean() > 0.8 and (~in_range).any()
    assert (error <= half_gap * scale)[in_range].all()
    # and the bound is the right one: reached (to within 10 %) but not exceeded, well below it on average
    ratio = (error / (half_gap * scale))[in_range]
    assert ratio.max() > 0.9 and ratio.mean() < 0.7
    big = ~in_range & (latent.abs() >= 6 * 448)
    assert big.any() and torch.equal(decoded[big], torch.sign(latent[big]) * 2688.0)


# ---- gather --------------------------------------------------------------------------------------------------


# One token, a few, a tile's worth and one past it, and the most the path takes (a decode batch of 16 sequences x 4
# speculative slots + the 128-token prefill cap): the sizes its grid and its scratch change at. The interpreter
# costs about 0.15 s per 1000 entries, so the production top-k (2048) up to 17 tokens and narrower rows above
# (whose T * K is no multiple of the interpreter's 1024-row program: tails too); bench.py runs 2048 at every T.
@pytest.mark.parametrize(("tokens", "topk"), [(1, 2048), (3, 2048), (17, 2048), (64, 150), (65, 150), (192, 100)])
def test_sync_free_gather_matches_reference(tokens: int, topk: int) -> None:
    pool = filled_pool(60)
    idx = topk_indices(tokens, topk, 60 * BLOCK, seed=tokens)
    if tokens == 17:
        idx = idx.long()  # int64 indices are read as they are
    buffers = kernels.SyncFreeBuffers()
    scratch, tables = kernels.gather_sync_free(pool, idx, buffers=buffers)
    want_scratch, want_tables = reference.gather(pool, idx)
    assert torch.equal(tables, want_tables)  # same renumbering: t * K + k, -1 for padding
    assert torch.equal(reference.resolved(scratch, tables), reference.resolved(want_scratch, want_tables))
    # The RoPE region of every row of the persistent scratch is zero (zeroed once, never written).
    assert not scratch[..., 528:].any()


@pytest.mark.parametrize(("tokens", "topk"), [(1, 2048), (65, 256), (192, 64), (193, 256), (2048, 24)])
def test_dedup_gather_matches_reference(tokens: int, topk: int) -> None:
    pool = filled_pool(60)
    idx = topk_indices(tokens, topk, 60 * BLOCK, seed=tokens)
    scratch, tables = kernels.gather_dedup(pool, idx)
    want = reference.resolved(*reference.gather(pool, idx))
    assert torch.equal(reference.resolved(scratch, tables), want)
    assert torch.equal(tables < 0, idx < 0)
    used = tables[tables >= 0].long()
    # every selected row was expanded once: as many scratch rows used as distinct (clamped) rows selected
    distinct = torch.unique(idx[idx >= 0].clamp(max=60 * BLOCK - 1)).numel()
    assert torch.unique(used).numel() == distinct
    assert not scratch.view(-1, FP8_DS_MLA_ROW_BYTES)[used, 528:].any()


@pytest.mark.parametrize(("tokens", "topk"), [(1, 2048), (64, 128), (65, 256), (192, 128)])
def test_both_gather_paths_give_the_attention_kernel_the_same_bytes(tokens: int, topk: int) -> None:
    pool = filled_pool(20)
    idx = topk_indices(tokens, topk, 20 * BLOCK, seed=100 + tokens)
    sync_free = reference.resolved(*kernels.gather_sync_free(pool, idx, buffers=kernels.SyncFreeBuffers()))
    assert torch.equal(sync_free, reference.resolved(*kernels.gather_dedup(pool, idx)))
    assert torch.equal(sync_free, reference.resolved(*kernels.gather(pool, idx)))


@pytest.mark.parametrize(("tokens", "topk"), [(1, 2048), (65, 256), (193, 256), (2048, 24), (3, 5)])
def test_sort_free_union_matches_the_reference_contract(tokens: int, topk: int) -> None:
    """gather_union: the same rows and bytes as the reference and as gather_dedup, and the tables of
    `reference.union` (scratch row i is the i-th smallest selected row), with nothing beyond the union."""
    pool = filled_pool(60)
    idx = topk_indices(tokens, topk, 60 * BLOCK, seed=tokens)
    scratch, tables = kernels.gather_union(pool, idx)
    rows, want_tables = reference.union(pool, idx)
    assert torch.equal(tables, want_tables)
    assert scratch.shape == (-(-rows.numel() // 64), 64, FP8_DS_MLA_ROW_BYTES)
    want = reference.resolved(*reference.gather(pool, idx))
    assert torch.equal(reference.resolved(scratch, tables), want)
    assert torch.equal(reference.resolved(*kernels.gather_dedup(pool, idx)), want)
    flat = scratch.view(-1, FP8_DS_MLA_ROW_BYTES)[: rows.numel()]
    block_size = pool.shape[1]
    expanded = reference.fp8_ds_mla_encode(reference.nvfp4_dequantize(pool[rows // block_size, rows % block_size]))
    assert torch.equal(flat, expanded)  # RoPE region zero included


def test_sort_free_union_of_padding_only_strided_and_int64_indices() -> None:
    pool = filled_pool(4)
    scratch, tables = kernels.gather_union(pool, torch.full((3, 8), -1, dtype=torch.int32))
    assert scratch.shape == (1, 64, FP8_DS_MLA_ROW_BYTES) and (tables == -1).all()
    padded = torch.full((5, 300), -1, dtype=torch.int64)
    padded[:, :256] = topk_indices(5, 256, 4 * BLOCK, seed=8)
    view = padded[:, :260]
    scratch, tables = kernels.gather_union(pool, view)
    assert torch.equal(tables, reference.union(pool, view)[1])
    assert torch.equal(reference.resolved(scratch, tables), reference.resolved(*reference.gather(pool, view)))


def test_index_rows_padded_like_vllm_are_read_in_place() -> None:
    """vLLM pads each token's index row (2048 top-k + kpool tail to 2176); the kernels take the view as it is."""
    pool = filled_pool(20)
    padded = torch.full((5, 2176), -1, dtype=torch.int32)
    padded[:, :2048] = topk_indices(5, 2048, 20 * BLOCK, seed=7)
    view = padded[:, :2048]
    want = reference.resolved(*reference.gather(pool, view.contiguous()))
    sync_free = kernels.gather_sync_free(pool, view, buffers=kernels.SyncFreeBuffers())
    assert torch.equal(reference.resolved(*sync_free), want)
    assert torch.equal(reference.resolved(*kernels.gather_dedup(pool, view)), want)


def test_indices_past_the_pool_read_its_last_row_and_nothing_beyond() -> None:
    """The pool is a view followed by bytes that are not part of it: an unclamped read would show them."""
    backing = torch.full((5, BLOCK, NVFP4_ROW_BYTES), 0x7F, dtype=torch.uint8)
    pool = backing[:4]
    pool.copy_(filled_pool(4))
    rows = 4 * BLOCK
    idx = torch.tensor([[rows, rows + 1, 2**31 - 1, rows - 1, -1, -5]], dtype=torch.int32)
    for scratch, tables in (kernels.gather_sync_free(pool, idx, buffers=kernels.SyncFreeBuffers()),
                            kernels.gather_dedup(pool, idx), kernels.gather_union(pool, idx)):
        got = reference.resolved(scratch, tables)
        last = reference.resolved(*reference.gather(pool, torch.tensor([[rows - 1]], dtype=torch.int32)))[0]
        assert all(torch.equal(got[k], last) for k in range(4))
        assert tables[0, 4:].tolist() == [-1, -1]


def test_gpu_block_shape_with_masked_tails() -> None:
    pool = filled_pool(8)
    idx = topk_indices(5, 37, 8 * BLOCK, seed=5)
    scratch = kernels.new_scratch(idx.numel(), "cpu")
    table = torch.empty(idx.numel(), dtype=torch.int32)
    kernels.gather_rows(pool, idx.reshape(-1), scratch, table, zero_rope=False, blocks=(8, 2))
    assert torch.equal(reference.resolved(scratch, table.view(5, 37)), reference.resolved(*reference.gather(pool, idx)))


def test_sync_free_buffers_are_reused_not_reallocated() -> None:
    pool = filled_pool(4)
    buffers = kernels.SyncFreeBuffers(max_tokens=8)
    first, _tables = kernels.gather_sync_free(pool, topk_indices(8, 16, 4 * BLOCK), buffers=buffers)
    second, tables = kernels.gather_sync_free(pool, topk_indices(3, 16, 4 * BLOCK, seed=9), buffers=buffers)
    assert first.data_ptr() == second.data_ptr()
    assert second.shape == (2, 64, FP8_DS_MLA_ROW_BYTES)  # (8 * 16 + 63) // 64 pages
    assert tables.shape == (3, 16) and tables.is_contiguous()
    other, _tables = kernels.gather_sync_free(pool, topk_indices(2, 32, 4 * BLOCK), buffers=buffers)
    assert other.data_ptr() != first.data_ptr()  # another top-k width has its own buffer


def test_more_tokens_than_the_sync_free_path_takes_is_refused() -> None:
    pool = filled_pool(1)
    idx = torch.zeros(SYNC_FREE_MAX_TOKENS + 1, 4, dtype=torch.int32)
    with pytest.raises(ValueError, match="at most 192"):
        kernels.gather_sync_free(pool, idx)


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        (torch.zeros(2, BLOCK, 656, dtype=torch.uint8), r"expected \[num_blocks, block_size, 288\] uint8"),
        (torch.zeros(2, BLOCK, 288, dtype=torch.int8), "torch.int8"),
        (torch.zeros(2, 288, BLOCK, dtype=torch.uint8).transpose(1, 2), "contiguous rows"),
        (torch.zeros(0, BLOCK, 288, dtype=torch.uint8), "not empty"),
    ],
)
def test_a_wrong_pool_is_refused_with_what_was_found(pool: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kernels.write(torch.zeros(1, 512), torch.tensor([0]), pool)
    with pytest.raises(ValueError, match=message):
        kernels.gather_sync_free(pool, torch.zeros(1, 4, dtype=torch.int32))


@pytest.mark.parametrize(
    ("latent", "message"),
    [
        (torch.zeros(1, 576)[:, :512].to(torch.int32), "torch.int32"),
        (torch.zeros(1, 513)[:, :512].to(torch.bfloat16), "row stride 513"),
        (torch.zeros(1, 256), r"expected \[T, 512\]"),
    ],
)
def test_a_wrong_latent_is_refused_with_what_was_found(latent: torch.Tensor, message: str) -> None:
    pool = torch.zeros(1, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    with pytest.raises(ValueError, match=message):
        kernels.write(latent, torch.tensor([0]), pool)
    assert not pool.any()


def test_fp8_ties_go_to_the_even_code_in_the_normal_and_subnormal_range() -> None:
    """Rows built byte by byte so that tile scales are powers of two (a tile's largest value is 4 * 112 * 2**j,
    so its scale is 2**j): the fp8 quotients are then the exact products code * block scale / 2**j, many of them
    exactly between two e4m3 values, in the normal and in the subnormal range."""
    gen = torch.Generator().manual_seed(21)
    rows = 256
    codes = torch.randint(0, 256, (rows, 256), generator=gen, dtype=torch.uint8)
    scales = torch.randint(1, 0x7F, (rows, 32), generator=gen, dtype=torch.uint8)  # positive finite e4m3
    scales[scales > 0x69] = 0x69  # at most 72: 6 * 72 stays below each tile's 448 * 2**j maximum
    for tile in range(4):
        # The first group of each tile: magnitudes up to 4.0 only, and its first element exactly 4.0 ...
        signs = torch.randint(0, 2, (rows, 8, 2), generator=gen) << 3
        nibbles = torch.randint(0, 7, (rows, 8, 2), generator=gen) | signs
        codes[:, tile * 64 : tile * 64 + 8] = (nibbles[..., 0] | (nibbles[..., 1] << 4)).to(torch.uint8)
        codes[:, tile * 64] = (codes[:, tile * 64] & 0xF0) | 0x06
        scales[:, tile * 8] = 0x6E + 8 * (torch.arange(rows) % 3)  # ... times 112 * 2**j, j = 0, 1, 2
    pool = torch.cat([codes, scales], dim=1).reshape(4, BLOCK, NVFP4_ROW_BYTES)
    idx = torch.arange(rows, dtype=torch.int32).view(4, BLOCK)
    got = reference.resolved(*kernels.gather_sync_free(pool, idx, buffers=kernels.SyncFreeBuffers()))
    want = reference.resolved(*reference.gather(pool, idx))
    assert torch.equal(got, want)
    assert torch.equal(got, torch.from_numpy(vllm_writer(reference.nvfp4_dequantize(pool.view(-1, 288)).numpy())))
    # the case is real: count the exact ties (in float64, where the quotients are exact)
    values = reference.nvfp4_dequantize(pool.view(-1, 288)).double().view(rows, 4, 128)
    tile_scale = values.abs().amax(dim=2, keepdim=True) / 448
    q = (values / tile_scale).abs()
    normal = q >= 2**-6
    step = torch.where(normal, 2.0 ** (torch.floor(torch.log2(q.clamp(min=2**-6))) - 3), 2.0**-9)
    tie = torch.frac(q / step) == 0.5
    assert torch.equal(tile_scale.log2(), torch.round(tile_scale.log2()))  # the construction held
    assert (tie & normal).sum() > 100 and (tie & ~normal & (q > 0)).sum() > 20


def test_a_never_written_row_with_scale_byte_0x80_decodes_as_the_reference() -> None:
    """e4m3 0x80 is -0 (float8_e4m3fn's NaNs are 0x7F and 0xFF). A block whose scale is zero of either sign (0x80
    or 0x00, which the write never stores: only a never-written row holds one) decodes to +0 everywhere, whatever
    its codes' signs: fp8 byte 0x00, never 0x80. A tile of such blocks has amax 0 and tile scale FLT_MIN; a tile
    mixing them with live blocks has +0 in their places. All three gathers give the reference's bytes, compared
    as bytes; the random codes include sign bits, so a kernel that kept the product's sign of zero (+-0 x +-0)
    would leave 0x80 bytes and fail here, whatever Triton emits for a float's negation."""
    gen = torch.Generator().manual_seed(80)
    pool = torch.randint(0, 256, (1, BLOCK, NVFP4_ROW_BYTES), generator=gen, dtype=torch.uint8)
    pool[0, :16, 256:] = 0x80  # rows 0-15: every scale -0, as a pool filled with 0x80 would hold
    pool[0, 16:32, 256:] = 0x00  # rows 16-31: every scale +0
    pool[0, 32:, 256:] = torch.randint(0x08, 0x60, (BLOCK - 32, 32), generator=gen, dtype=torch.uint8)
    pool[0, 32:, 256::3] = 0x80  # rows 32-63: some blocks of each tile -0, some +0, the rest live
    pool[0, 32:, 257::5] = 0x00
    zero = (pool[0, :, 256:] & 0x7F) == 0  # [64 rows, 32 blocks]
    signed = ((pool[0, :, :256] & 0x88) != 0).any(dim=1)
    assert signed[:32].all()  # the case is real: sign bits in the codes of the zero-scaled rows
    values = reference.nvfp4_dequantize(pool[0]).view(BLOCK, 32, 16)
    assert (values[zero] == 0).all() and not torch.signbit(values[zero]).any()
    assert (values[~zero] != 0).any()
    idx = torch.arange(BLOCK, dtype=torch.int32).view(2, BLOCK // 2)
    want = reference.resolved(*reference.gather(pool, idx))
    fp8 = want[:, :512].view(BLOCK, 32, 16)
    assert not fp8[zero].any()  # +0: byte 0x00 in every zero-scaled block
    assert not want[:32, :512].any() and (want[:32, 512:528].contiguous().view(torch.float32) == FLT_MIN).all()
    assert fp8[~zero].any()
    for scratch, tables in (kernels.gather_sync_free(pool, idx, buffers=kernels.SyncFreeBuffers()),
                            kernels.gather_dedup(pool, idx), kernels.gather_union(pool, idx)):
        assert torch.equal(reference.resolved(scratch, tables), want)


# ---- the fp8_ds_mla bytes against vLLM's writer arithmetic ----------------------------------------------------


def e4m3_table() -> np.ndarray:
    """The 127 non-negative finite e4m3 values, by code (0x00..0x7E), from the format's definition."""
    values = []
    for code in range(0x7F):
        exponent, mantissa = code >> 3, code & 7
        values.append(mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return np.array(values, dtype=np.float64)


def e4m3_bytes(x: np.ndarray) -> np.ndarray:
    """Nearest e4m3 code to each float32 (ties to the even code), saturating at 448, sign kept (also for 0)."""
    table = e4m3_table()
    magnitude = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    upper = np.clip(np.searchsorted(table, magnitude), 1, len(table) - 1)
    lower = upper - 1
    d_low, d_up = magnitude - table[lower], table[upper] - magnitude
    code = np.where(d_low < d_up, lower, np.where(d_up < d_low, upper, np.where(lower % 2 == 0, lower, upper)))
    return (code | (np.signbit(x).astype(np.int64) << 7)).astype(np.uint8)


def vllm_writer(values: np.ndarray) -> np.ndarray:
    """vLLM's fp8_ds_mla cache writer on [N, 512] float32: per 128-value tile, scale = max(amax / 448, FLT_MIN)
    in float32, fp8 = e4m3(x / scale), the four scales as raw float32 at byte 512, 128 zero bytes of RoPE."""
    tiles = values.astype(np.float32).reshape(-1, 4, 128)
    amax = np.abs(tiles).max(axis=2)
    scale = np.maximum(amax / np.float32(448.0), np.float32(FLT_MIN)).astype(np.float32)
    fp8 = e4m3_bytes((tiles / scale[:, :, None]).astype(np.float32)).reshape(-1, 512)
    out = np.zeros((values.shape[0], FP8_DS_MLA_ROW_BYTES), dtype=np.uint8)
    out[:, :512] = fp8
    out[:, 512:528] = scale.astype("<f4").view(np.uint8).reshape(-1, 16)
    return out


def test_fp8_ds_mla_bytes_match_an_independent_vllm_writer() -> None:
    pool = filled_pool(8, seed=11)
    idx = torch.arange(8 * BLOCK, dtype=torch.int32).view(8, BLOCK)
    values = reference.nvfp4_dequantize(pool.view(-1, NVFP4_ROW_BYTES)).numpy()
    want = torch.from_numpy(vllm_writer(values))
    assert torch.equal(reference.fp8_ds_mla_encode(torch.from_numpy(values)), want)
    got = reference.resolved(*kernels.gather_dedup(pool, idx))
    assert torch.equal(got, want)
    # the scales are raw float32, not powers of two
    scales = want[:, 512:528].contiguous().view(torch.float32)
    assert (torch.frexp(scales).mantissa != 0.5).any()
