"""The NVFP4 KV-cache formats in plain PyTorch: the definition the Triton kernels are tested against.

Also the attention the decode kernels compute: sparse-MLA decode over the selected rows, in fp32.

Written for clarity, not speed; runs on the CPU or a GPU. Every rounding here is IEEE round-to-nearest-even:
torch's cast to float8_e4m3fn for e4m3, and ties-to-even on the e2m1 grid (what the hardware's cvt.rn.e2m1x2
does), so a value exactly between two e2m1 magnitudes goes to the one with an even index.
"""

from __future__ import annotations

import math

import torch

from .layout import (
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_MAX,
    E4M3_MIN,
    FLT_MIN,
    FP8_DS_MLA_PAGE_ROWS,
    FP8_DS_MLA_ROW_BYTES,
    FP8_DS_MLA_SCALE_OFFSET,
    FP8_DS_MLA_TILE,
    FP8_DS_MLA_TILES,
    LATENT_DIM,
    NVFP4_CODE_BYTES,
    NVFP4_GROUP,
    NVFP4_GROUPS,
    NVFP4_ROW_BYTES,
)

# e2m1 magnitude thresholds on |x| / scale: above each boundary the index goes up by one. At a tie the even index
# wins, so the boundaries after an even index (0.25, 1.25, 2.5, 5.0) need strictly more, the others do not.
_ROUND_UP_STRICT = (0.25, 1.25, 2.5, 5.0)
_ROUND_UP_AT_TIE = (0.75, 1.75, 3.5)


def _divide(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor, correctly rounded. On CUDA, torch divides by a Python number as x * (1 / divisor), which is
    not the IEEE quotient; a tensor divisor is."""
    return x / torch.full_like(x, divisor)


def e2m1_index(magnitude: torch.Tensor) -> torch.Tensor:
    """The e2m1 magnitude index (0..7) nearest to each non-negative value, ties to even, saturating at 6."""
    index = torch.zeros(magnitude.shape, dtype=torch.uint8, device=magnitude.device)
    for boundary in _ROUND_UP_STRICT:
        index += (magnitude > boundary).to(torch.uint8)
    for boundary in _ROUND_UP_AT_TIE:
        index += (magnitude >= boundary).to(torch.uint8)
    return index


# NaN latents are undefined (the kernels' max ignores NaN where torch's propagates it); +-inf saturate to +-6.


def nvfp4_quantize(latent: torch.Tensor) -> torch.Tensor:
    """[..., 512] float latent -> [..., 288] uint8 NVFP4 rows."""
    if latent.shape[-1] != LATENT_DIM:
        raise ValueError(f"latent rows have {latent.shape[-1]} values; expected {LATENT_DIM}")
    lead = latent.shape[:-1]
    x = latent.float().reshape(*lead, NVFP4_GROUPS, NVFP4_GROUP)
    amax = x.abs().amax(dim=-1)
    scale = _divide(amax, E2M1_MAX).clamp(min=E4M3_MIN, max=E4M3_MAX).to(torch.float8_e4m3fn)
    # Quantise against the scale as stored, so decoding reproduces the grid the codes were chosen on.
    q = x / scale.float().unsqueeze(-1)
    codes = e2m1_index(q.abs()) | (torch.signbit(x).to(torch.uint8) << 3)
    pairs = codes.reshape(*lead, NVFP4_CODE_BYTES, 2)
    packed = pairs[..., 0] | (pairs[..., 1] << 4)
    return torch.cat([packed, scale.view(torch.uint8)], dim=-1)


def nvfp4_dequantize(rows: torch.Tensor) -> torch.Tensor:
    """[..., 288] uint8 NVFP4 rows -> [..., 512] float32 (exact: every product fits in fp32).

    A block whose scale is zero of either sign (byte 0x00, or 0x80, e4m3's -0) decodes to +0 everywhere, whatever
    its codes' signs. The write never stores such a scale (its floor is 2**-9): only a never-written row holds
    one, and it must read as zeros; the sign of those zeros is immaterial to attention, so it is fixed at +0
    (fp8 byte 0x00 after the gather) rather than left to the product +-0 x +-0."""
    if rows.shape[-1] != NVFP4_ROW_BYTES:
        raise ValueError(f"NVFP4 rows have {rows.shape[-1]} bytes; expected {NVFP4_ROW_BYTES}")
    lead = rows.shape[:-1]
    packed = rows[..., :NVFP4_CODE_BYTES]
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*lead, LATENT_DIM)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=rows.device)
    magnitude = table[(codes & 0x07).long()]
    values = torch.where((codes & 0x08) != 0, -magnitude, magnitude)
    scale = rows[..., NVFP4_CODE_BYTES:].contiguous().view(torch.float8_e4m3fn).float()
    blocks = values.reshape(*lead, NVFP4_GROUPS, NVFP4_GROUP) * scale.unsqueeze(-1)
    blocks = torch.where((scale == 0).unsqueeze(-1), 0.0, blocks)
    return blocks.reshape(*lead, LATENT_DIM)


def fp8_ds_mla_encode(values: torch.Tensor) -> torch.Tensor:
    """[..., 512] float32 -> [..., 656] uint8 fp8_ds_mla rows, with vLLM's writer arithmetic and zero RoPE."""
    lead = values.shape[:-1]
    tiles = values.float().reshape(*lead, FP8_DS_MLA_TILES, FP8_DS_MLA_TILE)
    scale = _divide(tiles.abs().amax(dim=-1), E4M3_MAX).clamp(min=FLT_MIN)
    fp8 = (tiles / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    out = torch.zeros(*lead, FP8_DS_MLA_ROW_BYTES, dtype=torch.uint8, device=values.device)
    out[..., :LATENT_DIM] = fp8.view(torch.uint8).reshape(*lead, LATENT_DIM)
    out[..., FP8_DS_MLA_SCALE_OFFSET : FP8_DS_MLA_SCALE_OFFSET + 16] = scale.contiguous().view(torch.uint8)
    return out


def pool_rows(pool: torch.Tensor) -> int:
    """How many token rows a [num_blocks, block_size, 288] pool holds."""
    return pool.shape[0] * pool.shape[1]


def last_writers(slot_mapping: torch.Tensor) -> torch.Tensor:
    """Which tokens of a write are written: those with a slot >= 0 that no later token of the batch names.

    The rule for duplicate slots: the last occurrence in the batch wins, and its whole row (codes and scales) is
    what the slot holds. Found by a stable sort, so that the last token of each run of equal slots is the latest.
    """
    slots = slot_mapping.long()
    ordered, order = torch.sort(slots, stable=True)
    last_of_run = torch.ones_like(ordered, dtype=torch.bool)
    last_of_run[:-1] = ordered[1:] != ordered[:-1]
    keep = torch.zeros_like(slots, dtype=torch.bool)
    keep[order[last_of_run]] = True
    return keep & (slots >= 0)


def write(latent: torch.Tensor, slot_mapping: torch.Tensor, pool: torch.Tensor) -> None:
    """Quantise [T, 512] latent rows into pool[slot // block_size, slot % block_size]; slots < 0 are skipped.

    A slot named by several tokens gets the whole row of the last of them (`last_writers`)."""
    block_size = pool.shape[1]
    keep = last_writers(slot_mapping)
    slots = slot_mapping[keep].long()
    pool[slots // block_size, slots % block_size] = nvfp4_quantize(latent[keep])


def gather(pool: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand the rows that [T, K] top-k indices select into fp8_ds_mla scratch pages.

    Returns (scratch [P, 64, 656] uint8, tables [T, K] int32). Entry (t, k) goes to scratch row t * K + k and its
    table entry says so; a negative index is padding (table -1, its scratch row left zero). Indices past the pool
    are clamped to its last row.
    """
    num_tokens, topk = indices.shape
    block_size = pool.shape[1]
    flat = indices.reshape(-1).long()
    valid = flat >= 0
    src = flat.clamp(0, pool_rows(pool) - 1)
    rows = fp8_ds_mla_encode(nvfp4_dequantize(pool[src // block_size, src % block_size]))
    pages = -(-(num_tokens * topk) // FP8_DS_MLA_PAGE_ROWS)
    scratch = torch.zeros(pages * FP8_DS_MLA_PAGE_ROWS, FP8_DS_MLA_ROW_BYTES, dtype=torch.uint8, device=pool.device)
    scratch[: num_tokens * topk] = torch.where(valid.unsqueeze(-1), rows, 0)
    positions = torch.arange(num_tokens * topk, device=pool.device)
    tables = torch.where(valid, positions, -1).to(torch.int32).reshape(num_tokens, topk)
    return scratch.reshape(pages, FP8_DS_MLA_PAGE_ROWS, FP8_DS_MLA_ROW_BYTES), tables


def union(pool: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill union's contract: (the distinct pool rows [T, K] indices select, ascending, int64; tables
    [T, K] int32 giving each entry's position in that list, -1 for padding). Indices past the pool count as its
    last row. A union gather expands row union[i] into scratch row i."""
    flat = indices.reshape(-1).long()
    valid = flat >= 0
    rows, inverse = torch.unique(flat[valid].clamp(max=pool_rows(pool) - 1), return_inverse=True)
    tables = torch.full_like(flat, -1)
    tables[valid] = inverse
    return rows, tables.to(torch.int32).reshape(indices.shape)


def resolved(scratch: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """The 656-byte row each (token, k) entry points at, as the attention kernel sees it; zeros for padding.

    Two gathers are equivalent when this is equal for both, however their scratch rows are numbered.
    """
    flat = scratch.reshape(-1, FP8_DS_MLA_ROW_BYTES)
    table = tables.reshape(-1).long()
    return torch.where((table >= 0)[:, None], flat[table.clamp(min=0)], 0)


def fp8_ds_mla_decode(rows: torch.Tensor) -> torch.Tensor:
    """[..., 656] uint8 fp8_ds_mla rows -> [..., 512] float32 latent: each e4m3 value times its tile's fp32 scale
    (exact in fp32 up to the product's rounding). The RoPE region is not read: it is zero for a NoPE model."""
    if rows.shape[-1] != FP8_DS_MLA_ROW_BYTES:
        raise ValueError(f"fp8_ds_mla rows have {rows.shape[-1]} bytes; expected {FP8_DS_MLA_ROW_BYTES}")
    lead = rows.shape[:-1]
    values = rows[..., :LATENT_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scale = rows[..., FP8_DS_MLA_SCALE_OFFSET : FP8_DS_MLA_SCALE_OFFSET + 16].contiguous().view(torch.float32)
    tiles = values.reshape(*lead, FP8_DS_MLA_TILES, FP8_DS_MLA_TILE) * scale.unsqueeze(-1)
    return tiles.reshape(*lead, LATENT_DIM)


def sparse_mla_attention(
    q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [T, H, D] over the rows kv [T, K, 512] (each token its own K rows) where valid [T, K].

    D is 512, or 576 with the RoPE part last: GLM-5.3-Flash is NoPE (`qk_rope_head_dim` 0), so neither row
    format stores a RoPE key (the 288-byte row has none, the fp8_ds_mla row zeros), and the query's RoPE part, if
    passed, meets a zero key and adds nothing. Keys and values are the same latent rows, as in MLA.

    Returns (out [T, H, 512] float32, lse [T, H] float32), lse the natural log of the sum of exp(scores). A token
    with no valid row gets out 0 and lse -inf (the log of an empty sum), so that merging its state with another
    attention state by lse gives it zero weight.
    """
    if q.dim() != 3 or q.shape[-1] not in (LATENT_DIM, LATENT_DIM + 64):
        raise ValueError(f"q is {tuple(q.shape)}; expected [T, H, {LATENT_DIM}] or [T, H, {LATENT_DIM + 64}]")
    query = q[..., :LATENT_DIM].float()
    scores = torch.einsum("thd,tkd->thk", query, kv) * softmax_scale
    scores = scores.masked_fill(~valid[:, None, :], -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    finite = torch.where(torch.isfinite(lse), lse, 0.0)
    weights = torch.where(valid[:, None, :], torch.exp(scores - finite[..., None]), 0.0)
    return torch.einsum("thk,tkd->thd", weights, kv), lse


def selected_rows(pool: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool rows [T, K] top-k indices select, as [T, K, 288] bytes, and which entries are valid (>= 0).
    Indices past the pool are clamped to its last row, as the gather does."""
    block_size = pool.shape[1]
    flat = indices.long()
    src = flat.clamp(0, pool_rows(pool) - 1)
    return pool[src // block_size, src % block_size], flat >= 0


def sparse_mla_decode(
    q: torch.Tensor, pool: torch.Tensor, indices: torch.Tensor, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-MLA decode straight from the NVFP4 pool: the rows [T, K] indices select (negative = padding,
    past the pool = its last row), dequantised to fp32, then `sparse_mla_attention`. Everything in fp32."""
    rows, valid = selected_rows(pool, indices)
    return sparse_mla_attention(q, nvfp4_dequantize(rows), valid, softmax_scale)


def sparse_mla_decode_fp8(
    q: torch.Tensor, scratch: torch.Tensor, tables: torch.Tensor, softmax_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same attention over fp8_ds_mla scratch rows through tables [T, K] (negative = padding), as the stock
    kernel would see them after the gather: the fp8 path's result, computed in fp32."""
    rows = resolved(scratch, tables).reshape(*tables.shape, FP8_DS_MLA_ROW_BYTES)
    return sparse_mla_attention(q, fp8_ds_mla_decode(rows), tables >= 0, softmax_scale)
