"""GPU validation and benchmark of the NVFP4 KV-cache kernels.

    PYTHONPATH=files python -m sparkfleet_nvfp4.bench [--sweep] [--json FILE]
    PYTHONPATH=files python -m sparkfleet_nvfp4.bench --union --write-duplicates   # issue #23, items 4 and 5

Validation (exit 1 on any failure): kernel == reference byte for byte (write in three input dtypes and on a
strided pool; gather on both paths, with padding, out-of-range indices, zero and extreme rows), the sync-free path
under torch.cuda.set_sync_debug_mode("error"), and a captured CUDA graph replayed on new inputs.

Benchmark: CUDA events, median of many runs after warm-up, every input rotated through a set larger than the L2
cache. Kernels that run inside CUDA graphs in vLLM (write, sync-free gather) are timed as graph replays, the way
they run there; the deduplicating prefill gather synchronises and is timed eagerly. Each case prints its time, the
bytes its kernels must move, the effective bandwidth, the device's copy bandwidth measured in the same run on the
same number of bytes, the ratio, the speed-up over the PyTorch reference, and the projected time on a GB10
(bytes / 273 GB/s / ratio). It never changes clocks, power or any other setting of the GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import warnings
from collections.abc import Callable

import torch
import triton

from . import kernels, reference
from .layout import FP8_DS_MLA_ROW_BYTES, GB10_BANDWIDTH, LATENT_DIM, NVFP4_ROW_BYTES

BLOCK_SIZE = 64
TARGETS = {"decode gather": 0.80, "write 65536 tokens": 0.65}
MIN_SPEEDUP = 5.0
# Sparse-MLA decode attention: a scale of 1/sqrt(576) (any value times the same); the tolerances of
# tests/kernels/test_fused.py (relative L2 error of the output over the live tokens, and lse's absolute error).
ATTENTION_SCALE = 1 / math.sqrt(576)
FUSED_BOUND = 4e-3
FP8_KERNEL_BOUND = 6e-3
FP8_MARGIN = 8
LSE_BOUND = 5e-3
FUSED_GOAL = 0.5  # fused <= 0.5 x (gather + fp8 attention)


def random_latent(tokens: int, dtype: torch.dtype, device: str, extremes: bool = True) -> torch.Tensor:
    """Latent rows of O(1) values; with extremes, every 8th row zero, tiny, huge, with an outlier per block, at
    the dtype's maximum, small multiples of powers of two (whose quotients often fall exactly on a tie), or
    +-inf."""
    x = torch.randn(tokens, LATENT_DIM, device=device, dtype=torch.float32)
    if extremes and tokens >= 8:
        x[5::8] = torch.randint(-12, 13, x[5::8].shape, device=device) * 2.0 ** torch.randint(
            -6, 4, x[5::8].shape, device=device)
        x[0::8] = 0.0
        x[1::8] *= 1e-4
        x[2::8] *= 3000.0
        x[3::8, ::16] = 40.0
        x[4::8] = torch.finfo(dtype).max if dtype != torch.float32 else 1e30
        x[6::8, ::3], x[6::8, 1::3] = float("inf"), float("-inf")
    return x.to(dtype)


def new_pool(rows: int, device: str) -> torch.Tensor:
    blocks = triton.cdiv(rows, BLOCK_SIZE)
    return torch.randint(0, 256, (blocks, BLOCK_SIZE, NVFP4_ROW_BYTES), dtype=torch.uint8, device=device)


def random_indices(tokens: int, topk: int, rows: int, device: str, padding: bool) -> torch.Tensor:
    idx = torch.randint(0, rows, (tokens, topk), dtype=torch.int32, device=device)
    if padding:
        lengths = torch.randint(1, topk + 1, (tokens,), device=device)
        idx[torch.arange(topk, device=device)[None, :] >= lengths[:, None]] = -1
        idx[:, 0] = rows + 12345  # out of range: clamped to the last row
    return idx


def difference(got: torch.Tensor, want: torch.Tensor) -> str:
    """Where two byte tensors of one shape differ: a count and the first position, for the FAIL line."""
    if got.shape != want.shape:
        return f"shapes {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (got != want).nonzero()
    if diff.numel() == 0:
        return ""
    first = tuple(diff[0].tolist())
    return f"{diff.shape[0]} bytes differ; first at {first}: {int(got[first])} != {int(want[first])}"


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}{'  ' + detail if detail else ''}", flush=True)
        if not ok:
            self.failed.append(name)


def validate(device: str) -> list[str]:
    checks = Checks()
    gen_rows = 100_032  # whole blocks: every row of the pools below is written before it is read
    print("validation (kernel == reference, byte for byte)")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for tokens in (1, 17, 2048):
            latent = random_latent(tokens, dtype, device)
            slots = torch.randperm(gen_rows, device=device)[:tokens]
            if tokens > 1:
                slots[1] = -1
            pool_k, pool_r = new_pool(gen_rows, device), None
            pool_r = pool_k.clone()
            kernels.write(latent, slots, pool_k)
            reference.write(latent, slots, pool_r)
            checks.check(f"write {str(dtype)[6:]} T={tokens}", torch.equal(pool_k, pool_r), difference(pool_k, pool_r))
    # A pool that is a strided view (every other block of a larger allocation), as a layer's slice may be.
    backing = torch.zeros(triton.cdiv(gen_rows, BLOCK_SIZE), 2, BLOCK_SIZE, NVFP4_ROW_BYTES, dtype=torch.uint8,
                          device=device)
    latent = random_latent(512, torch.bfloat16, device)
    slots = torch.randperm(gen_rows, device=device)[:512]
    strided = backing[:, 1]
    kernels.write(latent, slots, strided)
    expected = torch.zeros_like(strided)
    reference.write(latent, slots, expected)
    checks.check("write into a strided pool", torch.equal(strided, expected) and not backing[:, 0].any())
    idx = random_indices(64, 2048, gen_rows, device, padding=True)
    got = reference.resolved(*kernels.gather_sync_free(strided, idx))
    checks.check("gather from a strided pool", torch.equal(got, reference.resolved(*reference.gather(expected, idx))))

    pool = new_pool(gen_rows, device)
    kernels.write(random_latent(gen_rows, torch.bfloat16, device), torch.arange(gen_rows, device=device), pool)
    for tokens in (1, 3, 17, 64, 65, 148, 192, 193, 2048):
        idx = random_indices(tokens, 2048, gen_rows, device, padding=True)
        want = reference.resolved(*reference.gather(pool, idx))
        dedup = reference.resolved(*kernels.gather_dedup(pool, idx))
        checks.check(f"gather dedup     T={tokens} K=2048", torch.equal(dedup, want), difference(dedup, want))
        scratch, tables = kernels.gather_union(pool, idx)
        union = reference.resolved(scratch, tables)
        ok = torch.equal(union, want) and torch.equal(tables, reference.union(pool, idx)[1])
        checks.check(f"gather union     T={tokens} K=2048 (sort-free)", ok, difference(union, want))
        if tokens <= kernels.SYNC_FREE.max_tokens:
            scratch, tables = kernels.gather_sync_free(pool, idx)
            got = reference.resolved(scratch, tables)
            ok = torch.equal(got, want) and torch.equal(tables < 0, idx < 0)
            checks.check(f"gather sync-free T={tokens} K=2048", ok, difference(got, want))

    print("duplicate slots in one write: the last token's whole row (reference.write)")
    for tokens, duplicates in ((64, None), (2048, None), (65536, None), (2048, "scan"), (64, "claim")):
        latent = random_latent(tokens, torch.bfloat16, device)
        slots = torch.randint(0, max(tokens // 8, 2), (tokens,), device=device) * 7
        slots[3::11] = -1
        pool_k = new_pool(gen_rows, device)
        pool_r = pool_k.clone()
        kernels.write(latent, slots, pool_k, duplicates=duplicates)
        reference.write(latent, slots, pool_r)
        checks.check(f"write T={tokens} into {tokens // 8} slots x 7, duplicates={duplicates or 'default'}",
                     torch.equal(pool_k, pool_r), difference(pool_k, pool_r))
    torn, slots_hit = torn_rows_unchecked(device)
    print(f"  (info) the unchecked write, 65536 tokens into {slots_hit} slots: {torn} slots hold no single token's "
          "whole row")
    checks.check("claim map back to -1 after the writes",
                 bool((kernels.WRITE_WINNERS.get(gen_rows, torch.device(device)) == -1).all()))

    print("scale bytes 0x80 and 0x00 (e4m3 -0, +0) in never-written rows: +0 everywhere (fp8 byte 0x00)")
    # As tests/kernels/test_nvfp4.py's test_a_never_written_row_with_scale_byte_0x80_...: random codes (sign bits
    # included) under zero scales of both signs, whole rows of them and blocks among live ones; bytes compared.
    pool80 = new_pool(4096, device)
    pool80[..., 256:] = torch.randint(0x08, 0x60, pool80[..., 256:].shape, device=device, dtype=torch.uint8)
    pool80[:16, :, 256:] = 0x80
    pool80[16:32, :, 256:] = 0x00
    pool80[32:, :, 256::3] = 0x80
    pool80[32:, :, 257::5] = 0x00
    idx = random_indices(64, 2048, 4096, device, padding=True)
    want = reference.resolved(*reference.gather(pool80, idx))
    flat = idx.reshape(-1).long()
    src = flat.clamp(0, 4095)
    zero = ((pool80.view(-1, NVFP4_ROW_BYTES)[src, 256:] & 0x7F) == 0) & (flat >= 0)[:, None]  # [entries, 32]
    checks.check("reference: zero-scaled blocks are fp8 byte 0x00 throughout",
                 bool(zero.any()) and not want[:, :512].reshape(-1, 32, 16)[zero].any())
    for name, result in (("sync-free", kernels.gather_sync_free(pool80, idx)),
                         ("dedup", kernels.gather_dedup(pool80, idx)), ("union", kernels.gather_union(pool80, idx))):
        got = reference.resolved(*result)
        checks.check(f"gather {name} of 0x80/0x00-scaled rows == reference", torch.equal(got, want),
                     difference(got, want))
    q = torch.randn(8, 16, LATENT_DIM, device=device, dtype=torch.bfloat16)
    zero_idx = torch.arange(8 * 64, device=device, dtype=torch.int32).view(8, 64) % 2048  # rows of zero scales
    out, lse = kernels.sparse_mla_decode(q, pool80, zero_idx, ATTENTION_SCALE, out_dtype=torch.float32)
    checks.check("fused decode over zero-scaled rows: zero keys (out 0, lse log 64)",
                 bool((out == 0).all()) and bool(((lse - math.log(64)).abs() <= LSE_BOUND).all()))

    print("no host synchronisation on the sync-free path")
    latent = random_latent(64, torch.bfloat16, device)
    slots = torch.randperm(gen_rows, device=device)[:64]
    idx = random_indices(64, 2048, gen_rows, device, padding=True)
    kernels.write(latent, slots, pool)
    kernels.write(latent, slots, pool, duplicates="claim")
    kernels.gather_sync_free(pool, idx)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        kernels.write(latent, slots, pool)
        kernels.write(latent, slots, pool, duplicates="claim")
        kernels.gather_sync_free(pool, idx)
        synced = ""
    except RuntimeError as exc:
        synced = str(exc).splitlines()[0]
    try:
        kernels.gather_dedup(pool, idx)
        dedup_synced = False
    except RuntimeError:
        dedup_synced = True
    finally:
        torch.cuda.set_sync_debug_mode(0)
    checks.check("write (scan and claim) + sync-free gather under set_sync_debug_mode('error')", not synced, synced)
    checks.check("the check is live: the dedup path (torch.unique) is caught by it", dedup_synced)
    idx_big = random_indices(2048, 2048, gen_rows, device, padding=True)
    union_syncs = count_syncs(lambda: kernels.gather_union(pool, idx_big))
    dedup_syncs = count_syncs(lambda: kernels.gather_dedup(pool, idx_big))
    checks.check(f"union: {union_syncs} host synchronisation(s) (at most 1); dedup has {dedup_syncs}",
                 union_syncs == 1)

    print("CUDA graph capture and replay")
    static_latent = latent.clone()
    static_slots = slots.clone()
    static_idx = idx.clone()
    graph_pool = pool.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.write(static_latent, static_slots, graph_pool)
        kernels.gather_sync_free(graph_pool, static_idx)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.write(static_latent, static_slots, graph_pool)
        out_scratch, out_tables = kernels.gather_sync_free(graph_pool, static_idx)
    for replay in range(3):
        static_latent.copy_(random_latent(64, torch.bfloat16, device))
        static_slots.copy_(torch.randperm(gen_rows, device=device)[:64])
        static_idx.copy_(random_indices(64, 2048, gen_rows, device, padding=True))
        want_pool = graph_pool.clone()
        reference.write(static_latent, static_slots, want_pool)
        graph.replay()
        torch.cuda.synchronize()
        ok = torch.equal(graph_pool, want_pool) and torch.equal(
            reference.resolved(out_scratch, out_tables), reference.resolved(*reference.gather(want_pool, static_idx)))
        checks.check(f"graph replay {replay + 1} on new inputs == reference", ok)

    print("CUDA graph: the claim write with duplicate slots")
    dup_latent = random_latent(4096, torch.bfloat16, device)
    dup_slots = torch.randint(0, 512, (4096,), device=device)
    with torch.cuda.stream(stream):
        kernels.write(dup_latent, dup_slots, graph_pool, duplicates="claim")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.write(dup_latent, dup_slots, graph_pool, duplicates="claim")
    for replay in range(3):
        dup_latent.copy_(random_latent(4096, torch.bfloat16, device))
        dup_slots.copy_(torch.randint(0, 512, (4096,), device=device) * (replay + 1))
        want_pool = graph_pool.clone()
        reference.write(dup_latent, dup_slots, want_pool)
        graph.replay()
        torch.cuda.synchronize()
        checks.check(f"claim-write graph replay {replay + 1} on new duplicate slots == reference",
                     torch.equal(graph_pool, want_pool))
    return checks.failed


def torn_rows_unchecked(device: str) -> tuple[int, int]:
    """The hazard the rule removes, shown: 65536 tokens into 512 slots with the unchecked write. -> (slots whose
    row equals none of its tokens' own rows, slots written)."""
    tokens, distinct = 65536, 512
    latent = random_latent(tokens, torch.bfloat16, device, extremes=False)
    slots = torch.randint(0, distinct, (tokens,), device=device)
    pool = torch.zeros(distinct // BLOCK_SIZE, BLOCK_SIZE, NVFP4_ROW_BYTES, dtype=torch.uint8, device=device)
    kernels.write(latent, slots, pool, duplicates="unchecked")
    own = reference.nvfp4_quantize(latent)
    rows = pool.view(-1, NVFP4_ROW_BYTES)
    whole = (rows[slots] == own).all(dim=1).to(torch.int32)
    matched = torch.zeros(distinct, dtype=torch.int32, device=device).index_add_(0, slots, whole)
    hit = torch.zeros(distinct, dtype=torch.bool, device=device)
    hit[slots] = True
    return int((hit & (matched == 0)).sum()), int(hit.sum())


def count_syncs(call: Callable[[], object]) -> int:
    """How many host synchronisations one call makes (after a warm-up call), by set_sync_debug_mode('warn')."""
    call()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def attention_case(pool: torch.Tensor, tokens: int, heads: int, topk: int, device: str, seed: int,
                   idx_dtype: torch.dtype = torch.int32) -> tuple[torch.Tensor, torch.Tensor]:
    """A bf16 query and top-k indices with padding, an index past the pool, and (T > 1) a last token that is
    all padding."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q = (torch.randn(tokens, heads, LATENT_DIM, device=device, generator=gen) * 2).to(torch.bfloat16)
    idx = random_indices(tokens, topk, reference.pool_rows(pool), device, padding=True)
    if tokens > 1:
        idx[-1] = -1
    return q, idx.to(idx_dtype)


def attention_errors(out: torch.Tensor, lse: torch.Tensor, want: torch.Tensor, want_lse: torch.Tensor,
                     live: torch.Tensor) -> tuple[float, float, bool]:
    """(relative L2 error of out over the live tokens, max |lse error| there, empty tokens give 0 and -inf)."""
    error = float((out.float() - want)[live].norm() / want[live].norm())
    lse_error = float((lse - want_lse)[live].abs().max())
    empty = ~live
    empty_ok = bool((out[empty] == 0).all() and torch.isneginf(lse[empty]).all())
    return error, lse_error, empty_ok


def validate_attention(device: str) -> list[str]:
    """The fused NVFP4 decode kernel and the fp8 baseline against the fp32 reference, sync-free and in a graph."""
    checks = Checks()
    rows = 100_032
    pool = new_pool(rows, device)
    kernels.write(random_latent(rows, torch.bfloat16, device, extremes=False), torch.arange(rows, device=device),
                  pool)
    scale = ATTENTION_SCALE
    print(f"validation: sparse-MLA decode (fused <= {FUSED_BOUND} and {FP8_MARGIN}x inside the fp8 path's own "
          f"error; fp8 kernel <= {FP8_KERNEL_BOUND} of its reference; |lse| <= {LSE_BOUND})")
    # (tokens, heads, top-k, splits, blocks, index dtype): one token; the bench's 32 x 2048, split and not; 22
    # heads (TP3) in one masked block and in blocks of 16 (a tail of 6); int64; a top-k not a multiple of a chunk.
    cases = [(1, 16, 2048, None, None, torch.int32), (32, 16, 2048, None, None, torch.int32),
             (32, 16, 2048, 1, None, torch.int32), (96, 22, 2048, None, None, torch.int64),
             (5, 22, 2048, None, (16, 32, 4, 2), torch.int32), (7, 16, 777, 3, None, torch.int64)]
    for number, (tokens, heads, topk, splits, blocks, idx_dtype) in enumerate(cases):
        q, idx = attention_case(pool, tokens, heads, topk, device, seed=number, idx_dtype=idx_dtype)
        live = (idx >= 0).any(dim=1)
        want, want_lse = reference.sparse_mla_decode(q, pool, idx, scale)
        fp8_want, fp8_want_lse = reference.sparse_mla_decode_fp8(q, *reference.gather(pool, idx), scale)
        fp8_error = attention_errors(fp8_want, fp8_want_lse, want, want_lse, live)[0]
        out, lse = kernels.sparse_mla_decode(q, pool, idx, scale, out_dtype=torch.float32, splits=splits,
                                             blocks=blocks)
        error, lse_error, empty_ok = attention_errors(out, lse, want, want_lse, live)
        name = f"T={tokens} H={heads} K={topk} splits={splits or 'auto'} {str(idx_dtype)[6:]}"
        checks.check(f"fused    {name}", error <= FUSED_BOUND and error * FP8_MARGIN <= fp8_error
                     and lse_error <= LSE_BOUND and empty_ok,
                     f"error {error:.2e} (fp8 path {fp8_error:.2e}), lse {lse_error:.1e}")
        out8, lse8 = kernels.gather_then_decode_fp8(q, pool, idx, scale, out_dtype=torch.float32, splits=splits,
                                                    blocks=blocks)
        error8, lse_error8, empty_ok8 = attention_errors(out8, lse8, fp8_want, fp8_want_lse, live)
        checks.check(f"fp8 attn {name}", error8 <= FP8_KERNEL_BOUND and lse_error8 <= LSE_BOUND and empty_ok8,
                     f"error {error8:.2e}, lse {lse_error8:.1e}")
    q, idx = attention_case(pool, 32, 16, 2048, device, seed=99)
    out, _unused = kernels.sparse_mla_decode(q, pool, idx, scale)
    want, _unused = reference.sparse_mla_decode(q, pool, idx, scale)
    live = (idx >= 0).any(dim=1)
    error = float((out.float() - want)[live].norm() / want[live].norm())
    checks.check("fused, bf16 output", out.dtype == torch.bfloat16 and error <= FUSED_BOUND + 2**-9, f"{error:.2e}")

    print("no host synchronisation, CUDA graph capture and replay (attention)")
    kernels.gather_then_decode_fp8(q, pool, idx, scale)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        kernels.sparse_mla_decode(q, pool, idx, scale)
        kernels.gather_then_decode_fp8(q, pool, idx, scale)
        synced = ""
    except RuntimeError as exc:
        synced = str(exc).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    checks.check("fused and gather + fp8 attention under set_sync_debug_mode('error')", not synced, synced)
    static_q, static_idx = q.clone(), idx.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.sparse_mla_decode(static_q, pool, static_idx, scale)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out, graph_lse = kernels.sparse_mla_decode(static_q, pool, static_idx, scale)
    for replay in range(3):
        new_q, new_idx = attention_case(pool, 32, 16, 2048, device, seed=100 + replay)
        static_q.copy_(new_q)
        static_idx.copy_(new_idx)
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = reference.sparse_mla_decode(new_q, pool, new_idx, scale)
        error, lse_error, empty_ok = attention_errors(graph_out, graph_lse, want, want_lse,
                                                      (new_idx >= 0).any(dim=1))
        checks.check(f"fused graph replay {replay + 1} on new inputs",
                     error <= FUSED_BOUND + 2**-9 and lse_error <= LSE_BOUND and empty_ok, f"{error:.2e}")
    return checks.failed


def median_graph_ms(calls: list[Callable[[], object]], runs: int, warmup: int) -> float:
    """Capture every call once into one graph; the median replay time divided by the number of calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _i in range(warmup):
        graph.replay()
    times = []
    for _i in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    return statistics.median(times)


def median_eager_ms(calls: list[Callable[[], object]], runs: int, warmup: int) -> float:
    """Median time of single calls, cycling through the list (each call's inputs are different buffers)."""
    for i in range(warmup):
        calls[i % len(calls)]()
    torch.cuda.synchronize()
    times = []
    for i in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        calls[i % len(calls)]()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(nbytes: int, rotations: int, runs: int, warmup: int, device: str) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) for copies of nbytes / 2 each."""
    half = max(nbytes // 2, 1)
    pairs = [(torch.empty(half, dtype=torch.uint8, device=device), torch.empty(half, dtype=torch.uint8, device=device))
             for _i in range(rotations)]
    for src, _dst in pairs:
        src.random_(0, 256)
    ms = median_graph_ms([lambda s=s, d=d: d.copy_(s) for s, d in pairs], runs, warmup)
    return 2 * half / (ms * 1e-3)


def rotations_for(footprint: int, l2_bytes: int) -> int:
    """Enough input sets that one pass over them is at least four times the L2 cache."""
    return max(2, -(-4 * l2_bytes // max(footprint, 1)))


class Bench:
    """The benchmark cases; each keeps its inputs only while it runs."""

    def __init__(self, args: argparse.Namespace, device: str) -> None:
        self.args, self.device = args, device
        self.l2 = torch.cuda.get_device_properties(device).L2_cache_size
        self.results: list[dict] = []
        self.attention: list[dict] = []

    def report(self, case: str, ms: float, nbytes: int, ref_ms: float) -> dict:
        copy = copy_bandwidth(nbytes, rotations_for(nbytes, self.l2), self.args.runs, self.args.warmup, self.device)
        bandwidth = nbytes / (ms * 1e-3)
        ratio = bandwidth / copy
        result = {
            "case": case, "ms": ms, "bytes": nbytes, "bandwidth": bandwidth, "copy_bandwidth": copy,
            "ratio": ratio, "reference_ms": ref_ms, "speedup": ref_ms / ms,
            "gb10_ms": nbytes / GB10_BANDWIDTH / ratio * 1e3, "target_ratio": TARGETS.get(case),
        }
        self.results.append(result)
        return result

    def filled_pools(self, count: int) -> list[torch.Tensor]:
        rows = self.args.pool_rows
        pools = [new_pool(rows, self.device) for _i in range(count)]
        for pool in pools:
            latent = random_latent(rows, torch.bfloat16, self.device, extremes=False)
            kernels.write(latent, torch.arange(rows, device=self.device), pool)
        return pools

    def decode(self) -> None:
        """32 sequences x top-2048 from a 200K-row pool, through the sync-free path as vLLM's graphs run it."""
        args, device = self.args, self.device
        entries = args.decode_tokens * args.topk
        n = rotations_for(args.pool_rows * NVFP4_ROW_BYTES + entries * (8 + FP8_DS_MLA_ROW_BYTES), self.l2)
        pools = self.filled_pools(n)
        # Distinct rows, as 32 sequences of their own select: every counted row read is a read from memory.
        idx = [torch.randperm(args.pool_rows, device=device)[:entries].to(torch.int32).view(args.decode_tokens, -1)
               for _i in range(n)]
        buffers = [kernels.SyncFreeBuffers(max_tokens=args.decode_tokens) for _i in range(n)]
        ms = median_graph_ms(
            [lambda i=i: kernels.gather_sync_free(pools[i], idx[i], buffers=buffers[i]) for i in range(n)],
            args.runs, args.warmup)
        ref_ms = median_eager_ms([lambda i=i: reference.gather(pools[i], idx[i]) for i in range(n)], args.ref_runs, 2)
        # Per entry: the 288-byte row read; 512 fp8 + 16 scale bytes written (RoPE zeroed once); index and table.
        self.report("decode gather", ms, entries * (NVFP4_ROW_BYTES + 528 + 4 + 4), ref_ms)

    def prefill(self) -> None:
        """The union of a 2048 x 2048 index matrix over the same pool, eager (torch.unique synchronises)."""
        args, device = self.args, self.device
        n = 4
        pools = self.filled_pools(n)
        idx = [random_indices(args.prefill_tokens, args.topk, args.pool_rows, device, False) for _i in range(n)]
        union = statistics.mean(int(torch.unique(i).numel()) for i in idx)
        ms = median_eager_ms([lambda i=i: kernels.gather_dedup(pools[i], idx[i]) for i in range(n)],
                             max(args.runs // 4, 10), 3)
        ref_ms = median_eager_ms([lambda: reference.gather(pools[0], idx[0])], max(args.ref_runs // 4, 2), 1)
        # Indices read and tables written, each selected row read once and written once in full (fresh scratch).
        nbytes = int(idx[0].numel() * (4 + 4) + union * (NVFP4_ROW_BYTES + FP8_DS_MLA_ROW_BYTES))
        self.report("prefill union gather", ms, nbytes, ref_ms)["union_rows"] = union

    def write(self, tokens: int) -> None:
        """bf16 latent rows into random slots."""
        args, device = self.args, self.device
        pool_rows = max(args.pool_rows, tokens)
        per_set = tokens * (2 * LATENT_DIM + 8 + NVFP4_ROW_BYTES)
        n = rotations_for(per_set, self.l2)
        pools = [new_pool(pool_rows, device) for _i in range(n)]
        latents = [random_latent(tokens, torch.bfloat16, device, extremes=False) for _i in range(n)]
        slots = [torch.randperm(pool_rows, device=device)[:tokens] for _i in range(n)]
        ms = median_graph_ms([lambda i=i: kernels.write(latents[i], slots[i], pools[i]) for i in range(n)],
                             args.runs, args.warmup)
        ref_ms = median_eager_ms([lambda i=i: reference.write(latents[i], slots[i], pools[i]) for i in range(n)],
                                 args.ref_runs, 2)
        self.report(f"write {tokens} tokens", ms, per_set, ref_ms)


def attention_bytes(kind: str, tokens: int, heads: int, topk: int, splits: int) -> int:
    """The bytes a decode-attention step must move: per entry its index (or table entry) and the row bytes read
    (288 for NVFP4; 512 e4m3 + 16 scale bytes of the fp8_ds_mla row); per (token, head) the bf16 query and output
    and the lse; with splits, each split's partial state (512 fp32 + m, l) written and read back."""
    row = NVFP4_ROW_BYTES if kind == "nvfp4" else 528
    state = tokens * heads * (2 * LATENT_DIM * 2 + 4)
    partial = tokens * heads * splits * (LATENT_DIM * 4 + 8) * 2 if splits > 1 else 0
    return tokens * topk * (4 + row) + state + partial


def attention_bench(bench: Bench, tokens: int) -> dict:
    """Fused NVFP4 decode attention against (b) the sync-free gather + the same attention over the fp8 rows."""
    args, device = bench.args, bench.device
    heads, topk, scale = args.heads, args.topk, ATTENTION_SCALE
    entries = tokens * topk
    footprint = args.pool_rows * NVFP4_ROW_BYTES + entries * (4 + FP8_DS_MLA_ROW_BYTES)
    n = rotations_for(footprint, bench.l2)
    pools = bench.filled_pools(n)
    idx = [torch.randperm(args.pool_rows, device=device)[:entries].to(torch.int32).view(tokens, topk)
           for _i in range(n)]
    qs = [torch.randn(tokens, heads, LATENT_DIM, device=device).to(torch.bfloat16) for _i in range(n)]
    buffers = [kernels.SyncFreeBuffers(max_tokens=tokens) for _i in range(n)]
    gathered = [kernels.gather_sync_free(pools[i], idx[i], buffers=buffers[i]) for i in range(n)]
    splits = kernels._attention_plan("nvfp4", qs[0], topk, None, None)[4]
    splits8 = kernels._attention_plan("fp8", qs[0], topk, None, None)[4]

    def timed(call: Callable[[int], object]) -> float:
        return median_graph_ms([lambda i=i: call(i) for i in range(n)], args.runs, args.warmup)

    fused_ms = timed(lambda i: kernels.sparse_mla_decode(qs[i], pools[i], idx[i], scale))
    gather_ms = timed(lambda i: kernels.gather_sync_free(pools[i], idx[i], buffers=buffers[i]))
    attend_ms = timed(lambda i: kernels.sparse_mla_decode_fp8(qs[i], *gathered[i], scale))

    def baseline(i: int) -> None:
        scratch, tables = kernels.gather_sync_free(pools[i], idx[i], buffers=buffers[i])
        kernels.sparse_mla_decode_fp8(qs[i], scratch, tables, scale)

    baseline_ms = timed(baseline)
    ref_ms = median_eager_ms([lambda i=i: reference.sparse_mla_decode(qs[i], pools[i], idx[i], scale)
                              for i in range(n)], max(args.ref_runs // 3, 2), 1)
    gather_bytes = entries * (NVFP4_ROW_BYTES + 528 + 4 + 4)
    attend_bytes = attention_bytes("fp8", tokens, heads, topk, splits8)
    label = f"{tokens} x {topk}, {heads} heads"
    fused = bench.report(f"(a) fused NVFP4 attention, {label}, {splits} splits", fused_ms,
                         attention_bytes("nvfp4", tokens, heads, topk, splits), ref_ms)
    bench.report(f"(b1) gather to fp8_ds_mla, {label}", gather_ms, gather_bytes, ref_ms)
    bench.report(f"(b2) fp8 attention, {label}, {splits8} splits", attend_ms, attend_bytes, ref_ms)
    base = bench.report(f"(b) gather + fp8 attention, {label}", baseline_ms, gather_bytes + attend_bytes, ref_ms)
    summary = {"tokens": tokens, "heads": heads, "topk": topk, "fused_ms": fused_ms, "baseline_ms": baseline_ms,
               "gather_ms": gather_ms, "fp8_attention_ms": attend_ms, "fused_over_baseline": fused_ms / baseline_ms,
               "fused_gb10_ms": fused["gb10_ms"], "baseline_gb10_ms": base["gb10_ms"],
               "fused_gb10_floor_ms": fused["bytes"] / GB10_BANDWIDTH * 1e3,
               "baseline_gb10_floor_ms": base["bytes"] / GB10_BANDWIDTH * 1e3}
    bench.attention.append(summary)
    return summary


def attention_sweep(args: argparse.Namespace, device: str) -> None:
    """Time the attention kernels over (BLOCK_K, warps) and splits at 32 x 2048; the benchmark then runs
    each kernel with its fastest shape (the sweep finds the default blocks' best split count only)."""
    bench = Bench(args, device)
    tokens, topk, heads = args.decode_tokens, args.topk, args.heads
    n = rotations_for(args.pool_rows * NVFP4_ROW_BYTES + tokens * topk * 660, bench.l2)
    pools = bench.filled_pools(n)
    idx = [torch.randperm(args.pool_rows, device=device)[: tokens * topk].to(torch.int32).view(tokens, topk)
           for _i in range(n)]
    qs = [torch.randn(tokens, heads, LATENT_DIM, device=device).to(torch.bfloat16) for _i in range(n)]
    gathered = [kernels.gather_sync_free(pools[i], idx[i], buffers=kernels.SyncFreeBuffers(max_tokens=tokens))
                for i in range(n)]
    block_h = min(max(triton.next_power_of_2(heads), 16), 32)
    best: dict[str, tuple[float, tuple[int, int, int], int]] = {}

    def time_both(block_k: int, warps: int, stages: int, per_sm: int) -> None:
        blocks = (block_h, block_k, warps, stages)
        saved = dict(kernels._PROGRAMS_PER_SM)
        kernels._PROGRAMS_PER_SM.update(nvfp4=per_sm, fp8=per_sm)
        line = f"  ({block_k:2d}, {warps}, {stages}, {per_sm:2d})"
        try:
            splits = kernels._attention_plan("nvfp4", qs[0], topk, None, blocks)[4]
            fused = median_graph_ms([lambda i=i: kernels.sparse_mla_decode(
                qs[i], pools[i], idx[i], ATTENTION_SCALE, blocks=blocks) for i in range(n)],
                args.runs // 4, args.warmup)
            fp8 = median_graph_ms([lambda i=i: kernels.sparse_mla_decode_fp8(
                qs[i], *gathered[i], ATTENTION_SCALE, blocks=blocks) for i in range(n)],
                args.runs // 4, args.warmup)
            print(f"{line} {splits:2d} splits: fused {fused:.4f}  fp8 {fp8:.4f}", flush=True)
            for kind, ms in (("nvfp4", fused), ("fp8", fp8)):
                if kind not in best or ms < best[kind][0]:
                    best[kind] = (ms, (block_k, warps, stages), per_sm)
        except Exception as exc:  # a shape that does not compile is reported, not fatal
            print(f"{line} failed: {str(exc).splitlines()[0][:100]}", flush=True)
        finally:
            kernels._PROGRAMS_PER_SM.update(saved)

    print(f"sweep: decode attention {tokens} x {topk}, {heads} heads "
          "(BLOCK_K, warps, stages, programs per SM) -> ms")
    for block_k in (16, 32, 64):
        for warps in (4, 8):
            time_both(block_k, warps, 2, kernels._PROGRAMS_PER_SM["nvfp4"])
    default = kernels._GPU_ATTENTION["nvfp4"]
    for per_sm in (1, 4):
        time_both(*default, per_sm)
    # The benchmark below runs each kernel with its fastest shape here: both tuned alike, like for like.
    for kind, (ms, shape, per_sm) in best.items():
        kernels._GPU_ATTENTION[kind] = shape
        kernels._PROGRAMS_PER_SM[kind] = per_sm
        print(f"  fastest {kind}: (BLOCK_K, warps, stages) {shape}, {per_sm} programs per SM: {ms:.4f} ms")


def print_attention(summaries: list[dict]) -> None:
    """The side-by-side verdict: fused against (b), and the GB10 projections by both methods."""
    if not summaries:
        return
    print("\nfused NVFP4 attention vs (b) gather + fp8 attention (goal: fused <= 0.5 x (b))")
    print("GB10 projection: bytes / 273 GB/s / (this GPU's ratio to a same-size copy) [the project's formula], and "
          "bytes / 273 GB/s [the bandwidth floor, if GB10 is bandwidth-bound]")
    header = ("case", "fused ms", "(b) ms", "gather ms", "fp8 attn ms", "fused / (b)", "goal",
              "GB10 fused ms", "GB10 (b) ms", "GB10 floor fused", "GB10 floor (b)")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in summaries:
        cells = (f"{r['tokens']} x {r['topk']}, {r['heads']} heads", f"{r['fused_ms']:.4f}", f"{r['baseline_ms']:.4f}",
                 f"{r['gather_ms']:.4f}", f"{r['fp8_attention_ms']:.4f}", f"{r['fused_over_baseline']:.2f}",
                 "met" if r["fused_over_baseline"] <= FUSED_GOAL else "missed", f"{r['fused_gb10_ms']:.3f}",
                 f"{r['baseline_gb10_ms']:.3f}", f"{r['fused_gb10_floor_ms']:.3f}",
                 f"{r['baseline_gb10_floor_ms']:.3f}")
        print("| " + " | ".join(cells) + " |")


UNION_GOAL_GB10_MS = 2.8  # issue #23, item 4: the prefill union at 2048 x 2048, projected on a GB10


def union_bench(args: argparse.Namespace, device: str) -> list[dict]:
    """The prefill union, old (gather_dedup: torch.unique) against new (gather_union: mark and prefix sum), side
    by side and eager (both synchronise), on the same 4 rotated inputs; and the expansion alone (gather_rows of
    the union into a ready scratch), the part both share. Bytes as the prefill case counts them: the indices read
    and the tables written once, each union row read (288) and written (656) once."""
    bench = Bench(args, device)
    n = 4
    pools = bench.filled_pools(n)
    runs = max(args.runs // 4, 10)
    rows_out = []
    for tokens in args.union_tokens:
        idx = [random_indices(tokens, args.topk, args.pool_rows, device, False) for _i in range(n)]
        unions = [reference.union(pools[i], idx[i])[0].to(torch.int32) for i in range(n)]
        union = statistics.mean(u.numel() for u in unions)
        nbytes = int(idx[0].numel() * (4 + 4) + union * (NVFP4_ROW_BYTES + FP8_DS_MLA_ROW_BYTES))
        scratches = [kernels.new_scratch(u.numel(), device, zero_rope=False) for u in unions]
        old_ms = median_eager_ms([lambda p=p, x=x: kernels.gather_dedup(p, x) for p, x in zip(pools, idx, strict=True)],
                                 runs, 3)
        new_ms = median_eager_ms([lambda p=p, x=x: kernels.gather_union(p, x) for p, x in zip(pools, idx, strict=True)],
                                 runs, 3)
        expand_ms = median_eager_ms([lambda p=p, u=u, o=o: kernels.gather_rows(p, u, o, None, zero_rope=True)
                                     for p, u, o in zip(pools, unions, scratches, strict=True)], runs, 3)
        label = f"{tokens} x {args.topk}, {union / 1e3:.1f}K rows"
        old = bench.report(f"union old (torch.unique) {label}", old_ms, nbytes, old_ms)
        new = bench.report(f"union new (mark + prefix sum) {label}", new_ms, nbytes, old_ms)
        expand = bench.report(f"expansion alone {label}", expand_ms,
                              int(union * (NVFP4_ROW_BYTES + FP8_DS_MLA_ROW_BYTES)), old_ms)
        rows_out.append({"tokens": tokens, "topk": args.topk, "union_rows": union, "old": old, "new": new,
                         "expand": expand})
    print(f"\nprefill union, old vs new (eager, median of {runs}; GB10 = bytes / 273 GB/s / ratio to a same-size "
          f"copy on this GPU; goal at 2048 x {args.topk}: GB10 <= {UNION_GOAL_GB10_MS} ms)")
    header = ("case", "ms", "MB", "GB/s", "copy GB/s", "ratio", "GB10 ms", "old / this")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows_out:
        for key in ("old", "new", "expand"):
            x = r[key]
            print("| " + " | ".join((x["case"], f"{x['ms']:.4f}", f"{x['bytes'] / 1e6:.1f}",
                                     f"{x['bandwidth'] / 1e9:.0f}", f"{x['copy_bandwidth'] / 1e9:.0f}",
                                     f"{x['ratio']:.1%}", f"{x['gb10_ms']:.3f}", f"{x['speedup']:.2f}x")) + " |")
    for r in rows_out:
        if r["tokens"] == 2048:
            met = r["new"]["gb10_ms"] <= UNION_GOAL_GB10_MS
            print(f"union goal at 2048 x {r['topk']}: GB10 {r['new']['gb10_ms']:.3f} ms (old {r['old']['gb10_ms']:.3f})"
                  f" against <= {UNION_GOAL_GB10_MS}: {'met' if met else 'missed'}")
    return rows_out


def write_duplicates_bench(args: argparse.Namespace, device: str) -> list[dict]:
    """The write's duplicate rule, priced: the same bf16 write (distinct slots, as vLLM's steps have) with no
    check ("unchecked", the kernel before the rule), with the in-kernel scan of the later tokens' slots, and with
    the claim pass plus slot map; graph replays, as vLLM runs the write."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    out = []
    print("\nwrite with duplicate-slot handling (ms per call, graph replays; distinct slots)")
    header = ("tokens", "unchecked", "scan", "claim", "default", "default / unchecked")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for tokens in args.dup_write_tokens:
        pool_rows = max(args.pool_rows, tokens)
        n = min(rotations_for(tokens * (2 * LATENT_DIM + 8 + NVFP4_ROW_BYTES), l2), 32)
        pools = [new_pool(pool_rows, device) for _i in range(n)]
        latents = [random_latent(tokens, torch.bfloat16, device, extremes=False) for _i in range(n)]
        slots = [torch.randperm(pool_rows, device=device)[:tokens] for _i in range(n)]
        sets = list(zip(latents, slots, pools, strict=True))
        times = {}
        for method in ("unchecked", "scan", "claim"):
            if method == "scan" and tokens > 8192:
                continue
            times[method] = median_graph_ms([lambda x=x, s=s, p=p, m=method: kernels.write(x, s, p, duplicates=m)
                                             for x, s, p in sets], args.runs, args.warmup)
        default = kernels.default_duplicates(tokens)
        cells = (str(tokens), *(f"{times[m]:.4f}" if m in times else "-" for m in ("unchecked", "scan", "claim")),
                 f"{default} {times[default]:.4f}", f"{times[default] / times['unchecked']:.2f}")
        print("| " + " | ".join(cells) + " |", flush=True)
        out.append({"tokens": tokens, **times, "default": default})
    return out


def benchmark(args: argparse.Namespace, device: str) -> Bench:
    bench = Bench(args, device)
    for tokens in args.attention_tokens:
        attention_bench(bench, tokens)
    if not args.attention_only:
        bench.decode()
        bench.prefill()
        for tokens in args.write_tokens:
            bench.write(tokens)
    return bench


def sweep(args: argparse.Namespace, device: str) -> None:
    """Time the kernels over block shapes, to choose kernels._GPU_BLOCKS."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    rows, topk = args.pool_rows, args.topk
    entries = args.decode_tokens * topk
    n = rotations_for(rows * NVFP4_ROW_BYTES + entries * 664, l2)
    pools = [new_pool(rows, device) for _i in range(n)]
    src = [random_indices(args.decode_tokens, topk, rows, device, padding=False).reshape(-1) for _i in range(n)]
    scratch = [kernels.new_scratch(entries, device) for _i in range(n)]
    tables = [torch.empty(entries, dtype=torch.int32, device=device) for _i in range(n)]
    print("sweep: decode gather (rows per program, warps) -> ms")
    for block in (1, 2, 4, 8, 16):
        for warps in (1, 2, 4, 8):
            calls = [lambda i=i, b=(block, warps): kernels.gather_rows(pools[i], src[i], scratch[i], tables[i],
                                                                       zero_rope=False, blocks=b) for i in range(n)]
            print(f"  ({block:2d}, {warps}) {median_graph_ms(calls, args.runs, args.warmup):.4f}", flush=True)
    calls = [lambda i=i: kernels.gather_rows(pools[i], src[i], scratch[i], tables[i], zero_rope=True)
             for i in range(n)]
    print(f"  default, also writing the 128 RoPE zero bytes of each row: "
          f"{median_graph_ms(calls, args.runs, args.warmup):.4f}", flush=True)
    tokens = 65536
    n = rotations_for(tokens * 1320, l2)
    pools = [new_pool(rows, device) for _i in range(n)]
    latents = [random_latent(tokens, torch.bfloat16, device, extremes=False) for _i in range(n)]
    slots = [torch.randperm(rows, device=device)[:tokens] for _i in range(n)]
    print("sweep: write 65536 tokens (tokens per program, warps) -> ms")
    for block in (1, 2, 4, 8):
        for warps in (1, 2, 4, 8):
            calls = [lambda i=i, b=(block, warps): kernels.write(latents[i], slots[i], pools[i], blocks=b)
                     for i in range(n)]
            print(f"  ({block:2d}, {warps}) {median_graph_ms(calls, args.runs, args.warmup):.4f}", flush=True)


def print_table(results: list[dict]) -> None:
    header = ("case", "time ms", "MB moved", "GB/s", "copy GB/s", "ratio", "target", "ref ms", "speed-up",
              "GB10 ms")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in results:
        target = f">= {r['target_ratio']:.0%}" if r["target_ratio"] else "-"
        cells = (r["case"], f"{r['ms']:.4f}", f"{r['bytes'] / 1e6:.1f}", f"{r['bandwidth'] / 1e9:.0f}",
                 f"{r['copy_bandwidth'] / 1e9:.0f}", f"{r['ratio']:.1%}", target, f"{r['reference_ms']:.3f}",
                 f"{r['speedup']:.1f}x", f"{r['gb10_ms']:.3f}")
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--pool-rows", type=int, default=200_000)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--write-tokens", type=int, nargs="+", default=[2048, 65536])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--ref-runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--heads", type=int, default=16, help="query heads per rank (64 heads at TP4)")
    parser.add_argument("--attention-tokens", type=int, nargs="*", default=[32, 96],
                        help="decode attention cases, tokens x --topk (32 x 2048 = 65,536 rows, the published case)")
    parser.add_argument("--attention-only", action="store_true",
                        help="validate and time the decode attention alone (not the write and gathers)")
    parser.add_argument("--sweep", action="store_true", help="time block shapes instead of the benchmark")
    parser.add_argument("--sweep-attention", action="store_true",
                        help="time the attention kernels' block shapes and splits before the benchmark")
    parser.add_argument("--skip-validation", action="store_true")
    parser.add_argument("--validate-only", action="store_true",
                        help="the validation alone, no benchmark (the image's self-test); exit 1 when it fails")
    parser.add_argument("--union", action="store_true",
                        help="issue #23 item 4: validate, then time the prefill union old vs new (not the rest)")
    parser.add_argument("--union-tokens", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--write-duplicates", action="store_true",
                        help="issue #23 item 5: validate, then time the write's duplicate handling (not the rest)")
    parser.add_argument("--dup-write-tokens", type=int, nargs="+",
                        default=[64, 192, 512, 1024, 2048, 8192, 65536])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the validation and benchmark need a real NVIDIA GPU", file=sys.stderr)
        return 2
    device = "cuda"
    props = torch.cuda.get_device_properties(device)
    print(f"device: {props.name}, sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB, "
          f"L2 {props.L2_cache_size / 2**20:.0f} MiB, {props.multi_processor_count} SMs; "
          f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}")
    torch.manual_seed(0)
    if args.sweep:
        sweep(args, device)
        return 0
    failed = []
    focused = args.union or args.write_duplicates
    if not args.skip_validation and not focused:
        failed += validate_attention(device)
    if not args.skip_validation and not args.attention_only:
        print("== kernels with the GPU's fp8 conversion (how they run in the image)")
        failed += validate(device)
        # The integer emulation is what CI checks under the interpreter: prove it is the same bytes on the GPU.
        os.environ["SPARKFLEET_NVFP4_EMULATE"] = "1"
        print("== kernels with the integer fp8 emulation (what CI runs under TRITON_INTERPRET=1)")
        failed += [f"{name} (emulated)" for name in validate(device)]
        del os.environ["SPARKFLEET_NVFP4_EMULATE"]
    if args.validate_only:
        print(f"validation: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
        return 1 if failed or args.skip_validation else 0
    if focused:
        figures = {}
        if args.write_duplicates:
            figures["write_duplicates"] = write_duplicates_bench(args, device)
        if args.union:
            figures["union"] = union_bench(args, device)
        print(f"validation: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"device": props.name, "failed": failed, **figures}, fh, indent=2, default=str)
        return 1 if failed else 0
    if args.sweep_attention:
        attention_sweep(args, device)
    bench = benchmark(args, device)
    results = bench.results
    print_table(results)
    print_attention(bench.attention)
    missed = [r["case"] for r in results if r["target_ratio"] and r["ratio"] < r["target_ratio"]]
    missed += [f"{r['case']} speed-up" for r in results if r["case"] in TARGETS and r["speedup"] < MIN_SPEEDUP]
    missed += [f"fused attention {s['tokens']} x {s['topk']} at {s['fused_ms'] / s['baseline_ms']:.2f} x (b) (goal 0.5)"
               for s in bench.attention if s["fused_ms"] > 0.5 * s["baseline_ms"]]
    print(f"validation: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
    print(f"targets: {'all met' if not missed else 'missed: ' + ', '.join(missed)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": props.name, "results": results, "attention": bench.attention, "failed": failed,
                       "missed": missed}, fh, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
