"""The plugin's hooks (what the patched vLLM lines call) with the real kernels, on CPU under the interpreter."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from sparkfleet_nvfp4 import reference
from sparkfleet_nvfp4.layout import NVFP4_ROW_BYTES
from sparkfleet_vllm import hooks
from test_nvfp4 import BLOCK, filled_pool, latent_rows, topk_indices

NOPE = torch.empty(70, 1, 0)  # GLM-5.3-Flash's k_pe as vLLM hands it: [T, 1, 0]


def test_write_fills_the_288_byte_rows_for_the_nvfp4_dtype_only() -> None:
    latent = latent_rows(70)
    slots = torch.randperm(4 * BLOCK)[:70]
    slots[5] = -1  # padding
    pool = torch.zeros(4, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8)
    want = pool.clone()
    reference.write(latent, slots, want)
    assert hooks.write(latent, NOPE, pool, slots.view(70, 1), "sparkfleet_nvfp4") is True
    assert torch.equal(pool, want)

    stock = torch.zeros(4, BLOCK, 656, dtype=torch.uint8)
    assert hooks.write(latent, NOPE, stock, slots, "fp8_ds_mla") is False
    assert not stock.any()
    assert hooks.write(latent, NOPE, torch.empty(0, BLOCK, NVFP4_ROW_BYTES, dtype=torch.uint8), slots,
                       "sparkfleet_nvfp4") is True
    with pytest.raises(ValueError, match="found a RoPE key part of width 64; expected a NoPE MLA model"):
        hooks.write(latent, torch.zeros(70, 1, 64), pool, slots, "sparkfleet_nvfp4")


@pytest.mark.parametrize("tokens", [3, 193])
def test_the_read_hook_hands_the_attention_kernel_fp8_ds_mla_pages(tokens: int) -> None:
    pool = filled_pool(8)
    # vLLM hands the pool over as a float8 view of the [P, 64, 288] row pages.
    as_vllm_passes = pool.view(torch.float8_e4m3fn)
    indices = topk_indices(tokens, 128, 8 * BLOCK, seed=tokens)
    impl = SimpleNamespace(kv_cache_dtype="sparkfleet_nvfp4")
    scratch, tables = hooks.mqa_inputs(impl, as_vllm_passes, indices)
    assert scratch.dtype == torch.uint8 and scratch.shape[1:] == (64, 656)
    assert tables.shape == indices.shape and tables.dtype == torch.int32
    assert torch.equal(tables < 0, indices < 0)
    want_scratch, want_tables = reference.gather(pool, indices)
    assert torch.equal(reference.resolved(scratch, tables), reference.resolved(want_scratch, want_tables))


def test_the_read_hook_leaves_stock_dtypes_alone() -> None:
    kv_cache = torch.zeros(2, 64, 656, dtype=torch.uint8)
    indices = torch.zeros(3, 16, dtype=torch.int32)
    for dtype in ("fp8_ds_mla", "auto"):
        out = hooks.mqa_inputs(SimpleNamespace(kv_cache_dtype=dtype), kv_cache, indices)
        assert out[0] is kv_cache and out[1] is indices


def snapshot(free_gib: float, total_gib: float = 121.6) -> SimpleNamespace:
    return SimpleNamespace(device_="cuda:0", free_memory=int(free_gib * 2**30), total_memory=int(total_gib * 2**30))


def test_the_uma_check_warns_with_figures_on_integrated_gpus_only(monkeypatch, caplog) -> None:
    config = SimpleNamespace(gpu_memory_utilization=0.875)
    requested = int(0.875 * 121.6 * 2**30)
    # This machine has no GPU: the stock error stands.
    assert hooks.uma_startup_ok(snapshot(100.0), config, requested) is False
    monkeypatch.setattr(hooks, "_integrated", lambda: True)
    with caplog.at_level(logging.WARNING, logger="vllm.sparkfleet"):
        assert hooks.uma_startup_ok(snapshot(100.0), config, requested) is True
    assert "100.00 of 121.60 GiB" in caplog.text and "0.875 (106.40 GiB)" in caplog.text
    monkeypatch.setenv("SPARKFLEET_UMA_FREE_MEMORY_WARN", "0")
    assert hooks.uma_startup_ok(snapshot(100.0), config, requested) is False


def test_pdl_is_kept_to_sm9_and_sm10_unless_switched_off(monkeypatch) -> None:
    assert [hooks.pdl_allowed(major) for major in (9, 10, 12)] == [True, True, False]
    monkeypatch.setenv("SPARKFLEET_PDL_SM9_10_ONLY", "off")
    assert hooks.pdl_allowed(12) is True


PADDING = '{"tp": 3, "widths": [[10, 12], [2048, 2112]], "vocab": true}'


def test_a_shard_past_the_checkpoint_is_zero_filled_only_on_a_padded_group(monkeypatch) -> None:
    weight = torch.randn(10 * 4, 6)  # 10 heads of 4 rows
    monkeypatch.delenv(hooks.TP_PADDING_ENV, raising=False)
    assert hooks.shard_source(weight, 0, 32, 16) is weight  # not padded: stock narrow fails on its own
    monkeypatch.setenv(hooks.TP_PADDING_ENV, PADDING)
    assert hooks.shard_source(weight, 0, 16, 16) is weight  # inside the tensor: untouched
    padded = hooks.shard_source(weight, 0, 32, 16)  # rank 2 of 3, 4 heads of 4 rows: 2 real, 2 zero
    assert padded.shape == (48, 6) and torch.equal(padded[:40], weight) and not padded[40:].any()
    # Packed along the input dim (NVFP4: two values a byte) and its block scales keep the ratio 2048 : 2112.
    packed = torch.ones(8, 1024, dtype=torch.uint8)
    assert hooks.shard_source(packed, 1, 704, 352).shape == (8, 1056)
    scales = torch.ones(8, 128)
    assert hooks.shard_source(scales, 1, 88, 44).shape == (8, 132)
    assert hooks.shard_source(torch.tensor(1.0), 0, 0, 1).ndim == 0  # scalars are never cut


def test_a_checkpoint_the_padding_does_not_describe_is_refused_not_filled(monkeypatch) -> None:
    monkeypatch.setenv(hooks.TP_PADDING_ENV, PADDING)
    with pytest.raises(ValueError, match=r"width 36 along dim 0.*expected the checkpoint size of one of"):
        hooks.shard_source(torch.randn(36, 6), 0, 32, 16)
    monkeypatch.setenv(hooks.TP_PADDING_ENV, "{not json")
    with pytest.raises(ValueError, match=r"SPARKFLEET_TP_PADDING: found .*converge the group again"):
        hooks.shard_source(torch.randn(40, 6), 0, 32, 16)


def test_the_vocabulary_unit_is_lcm_64_tp_on_a_group_that_pads_it(monkeypatch) -> None:
    monkeypatch.delenv(hooks.TP_PADDING_ENV, raising=False)
    assert hooks.vocab_padding(64, 3) == 64
    monkeypatch.setenv(hooks.TP_PADDING_ENV, PADDING)
    assert hooks.vocab_padding(64, 3) == 192
    monkeypatch.setenv(hooks.TP_PADDING_ENV, '{"tp": 3, "widths": [[10, 12]], "vocab": false}')
    assert hooks.vocab_padding(64, 3) == 64
