"""The sparse-MLA decode kernels under Triton's interpreter (CPU tensors) against the fp32 PyTorch reference.

`kernels.sparse_mla_decode` reads the 288-byte NVFP4 rows directly; `kernels.sparse_mla_decode_fp8` is the same
design over the gather's 656-byte fp8_ds_mla rows (the baseline). Neither is byte-exact: both round the softmax
weights to bf16 for the tensor-core product (and the fp8 kernel its keys too). The tolerance is therefore
justified against the error the fp8 path itself carries, measured in each test: the fused kernel must be at
least 8 times closer to the fp32 reference than the exact fp8 path (reference gather, then fp32 attention) is,
and within 4e-3 (about twice a bf16 rounding, 2**-9) in any case.

Kept tiny (a few tokens, K <= 64): each kernel launch costs about half a second here.
"""

from __future__ import annotations

import math

import pytest
import torch
from sparkfleet_nvfp4 import kernels, reference
from sparkfleet_nvfp4.layout import NVFP4_ROW_BYTES

BLOCK = 64
SCALE = 1 / math.sqrt(576)
# The fused kernel's bound: bf16 weights (2**-9 relative each on a GPU; the interpreter truncates, 2**-8) and, for
# a bf16 output, its own rounding. Measured here: about 2e-3 relative, against 3e-2 for the fp8 path.
FUSED_BOUND = 4e-3
# The fp8 kernel rounds its weights twice (p, then p x the fp32 tile scale) for its exact e4m3 operands.
FP8_KERNEL_BOUND = 6e-3
LSE_BOUND = 5e-3
FP8_MARGIN = 8


def pool_of(blocks: int, seed: int, extremes: bool = False) -> torch.Tensor:
    """A pool written from O(1) latents; with extremes, every 8th row zero, tiny, huge or saturating."""
    gen = torch.Generator().manual_seed(seed)
    latent = torch.randn(blocks * BLOCK, 512, generator=gen)
    if extremes:
        latent[0::8] = 0.0
        latent[1::8] *= 1e-4
        latent[2::8] *= 30.0
        latent[6::8, ::3] = float("inf")
    pool = torch.zeros(blocks, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    reference.write(latent, torch.arange(blocks * BLOCK), pool)
    return pool


def query(tokens: int, heads: int, seed: int, width: int = 512) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, heads, width, generator=gen) * 2).to(torch.bfloat16)


def padded_indices(tokens: int, topk: int, rows: int, seed: int) -> torch.Tensor:
    """Random rows; token 0 padded after half its entries, the last token all padding, one index past the pool."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, rows, (tokens, topk), generator=gen, dtype=torch.int32)
    idx[0, topk // 2 :] = -1
    idx[0, 1] = rows + 5  # read as the pool's last row
    idx[-1] = -1
    return idx


def relative_error(got: torch.Tensor, want: torch.Tensor, live: torch.Tensor) -> float:
    return float((got.float() - want)[live].norm() / want[live].norm())


@pytest.mark.parametrize(("splits", "extremes"), [(1, False), (3, True)])
def test_fused_decode_matches_the_reference_far_inside_the_fp8_paths_error(splits: int, extremes: bool) -> None:
    """One split (the kernel finishes itself) and three (flash-decode partial states and the combine); padding,
    an index past the pool, and a token whose entries are all padding: out 0, lse -inf."""
    pool = pool_of(8, seed=splits, extremes=extremes)
    q = query(3, 4, seed=splits)
    idx = padded_indices(3, 64, 8 * BLOCK, seed=splits)
    want, want_lse = reference.sparse_mla_decode(q, pool, idx, SCALE)
    out, lse = kernels.sparse_mla_decode(q, pool, idx, SCALE, out_dtype=torch.float32, splits=splits,
                                         blocks=(16, 16, 4, 1))
    live = torch.tensor([True, True, False])
    fp8_out, _unused = reference.sparse_mla_decode_fp8(q, *reference.gather(pool, idx), SCALE)
    fp8_error = relative_error(fp8_out, want, live)
    error = relative_error(out, want, live)
    assert error <= FUSED_BOUND and error * FP8_MARGIN <= fp8_error, (error, fp8_error)
    assert (lse[:2] - want_lse[:2]).abs().max() <= LSE_BOUND
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.isneginf(lse[2]).all() and torch.isneginf(want_lse[2]).all()


def test_fp8_attention_matches_its_reference_over_the_gathered_rows() -> None:
    """The baseline: the Triton gather, then the fp8 kernel, against fp32 attention over the same fp8 rows."""
    pool = pool_of(8, seed=4)
    q = query(3, 4, seed=4)
    idx = padded_indices(3, 64, 8 * BLOCK, seed=4)
    want, want_lse = reference.sparse_mla_decode_fp8(q, *reference.gather(pool, idx), SCALE)
    out, lse = kernels.gather_then_decode_fp8(q, pool, idx, SCALE, out_dtype=torch.float32, splits=2,
                                              blocks=(16, 16, 4, 1))
    live = torch.tensor([True, True, False])
    assert relative_error(out, want, live) <= FP8_KERNEL_BOUND
    assert (lse[:2] - want_lse[:2]).abs().max() <= LSE_BOUND
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()


def test_int64_indices_in_a_padded_buffer_a_tail_block_of_heads_and_a_576_wide_query() -> None:
    """int64 indices read in place from a wider -1-padded buffer (as vLLM's), 20 heads in blocks of 16 (a tail of
    4), a strided query 576 wide whose RoPE part (garbage here) meets the NoPE model's zero key and is ignored,
    and the default bf16 output."""
    pool = pool_of(4, seed=5)
    buffer = torch.full((2, 48), -1, dtype=torch.int64)
    buffer[:, :32] = torch.randint(0, 4 * BLOCK, (2, 32), generator=torch.Generator().manual_seed(5))
    buffer[1, 20:32] = -1
    idx = buffer[:, :40]
    backing = query(2, 2 * 20, seed=5, width=576)
    q = backing[:, ::2]  # head stride 2 x 576
    want, want_lse = reference.sparse_mla_decode(q, pool, idx, SCALE)
    out, lse = kernels.sparse_mla_decode(q, pool, idx, SCALE, blocks=(16, 32, 4, 1))
    assert out.dtype == torch.bfloat16 and out.shape == (2, 20, 512)
    # a bf16 output adds its own rounding (2**-8 relative here, where the interpreter truncates)
    assert relative_error(out, want, torch.ones(2, dtype=torch.bool)) <= FUSED_BOUND + 2**-8
    assert (lse - want_lse).abs().max() <= LSE_BOUND


def test_a_wrong_query_or_index_shape_is_refused_with_what_was_found() -> None:
    pool = pool_of(1, seed=6)
    idx = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"q is \(2, 4, 500\)"):
        kernels.sparse_mla_decode(torch.zeros(2, 4, 500), pool, idx, SCALE)
    with pytest.raises(ValueError, match=r"indices are \(2, 8\)"):
        kernels.sparse_mla_decode(torch.zeros(3, 4, 512), pool, idx, SCALE)


def test_rows_with_scale_byte_0x80_weigh_as_zero_keys_as_in_the_reference() -> None:
    """Never-written rows whose scale bytes are 0x80 (e4m3 -0) or 0x00: the reference dequantises their blocks to
    +0, so a row of them is a zero key, score 0 and nothing added to the output; the fused kernel agrees (its keys
    there are zeros: the product of a code and a zero scale, whose sign no score or sum can show)."""
    pool = pool_of(2, seed=7)
    pool[1, :, 256:] = 0x80
    pool[1, 1::4, 256:] = 0x00
    pool[0, ::2, 256::2] = 0x80  # half the blocks of every other row too
    pool[0, 1::2, 257::4] = 0x00
    q = query(2, 4, seed=7)
    idx = torch.arange(2 * 64, dtype=torch.int32).view(2, 64) % (2 * BLOCK)
    idx[1] = torch.arange(BLOCK, 2 * BLOCK)  # the second token sees only zero keys: a uniform softmax of 0
    want, want_lse = reference.sparse_mla_decode(q, pool, idx, SCALE)
    out, lse = kernels.sparse_mla_decode(q, pool, idx, SCALE, out_dtype=torch.float32, blocks=(16, 16, 4, 1))
    assert relative_error(out[:1], want[:1], torch.ones(1, dtype=torch.bool)) <= FUSED_BOUND
    assert (out[1] == 0).all() and (want[1] == 0).all()
    assert (lse - want_lse).abs().max() <= LSE_BOUND
    assert torch.allclose(want_lse[1], torch.full((4,), math.log(64)))
