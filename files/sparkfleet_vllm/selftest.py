"""GPU self-test of a sparkfleet image: the NVFP4 kernels' validation, then the plugin's hooks as vLLM calls them.

  python3 -m sparkfleet_vllm.selftest      exit 0 when every check passed; needs an NVIDIA GPU

The hooks are called with what vLLM 0.33.0 hands them: the cache write with a bf16 latent and the 288-byte pool;
the read with the pool as a float8 view of 64-row pages and the indexer's int32 [T, 2176] table with -1 padding.
The read hook must run without host synchronisation and replay from a CUDA graph for T <= 192 (decode and small
mixed steps are captured), and must hand stock dtypes their inputs untouched.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from . import hooks
from .seams import DTYPE

TOPK_WIDTH = 2176  # vLLM 0.33's index buffer: round_up(2048 + kpool 16 - 1, 128)


def check_hooks(device: str) -> list[str]:
    import torch
    from sparkfleet_nvfp4 import bench, reference
    from sparkfleet_nvfp4.layout import NVFP4_ROW_BYTES

    checks = bench.Checks()
    rows = 64 * 1024
    pool = torch.zeros(rows // 64, 64, NVFP4_ROW_BYTES, dtype=torch.uint8, device=device)
    latent = bench.random_latent(rows, torch.bfloat16, device)
    slots = torch.arange(rows, device=device)
    print("the plugin's hooks (as vLLM 0.33.0 calls them)")
    nope = torch.empty(rows, 1, 0, device=device)  # k_pe of a NoPE model, as vLLM hands it
    written = hooks.write(latent, nope, pool, slots, DTYPE)
    want = torch.zeros_like(pool)
    reference.write(latent, slots, want)
    checks.check("write hook == reference", written and torch.equal(pool, want), bench.difference(pool, want))
    untouched = torch.zeros(4, 64, 656, dtype=torch.uint8, device=device)
    checks.check("write hook leaves fp8_ds_mla to vLLM",
                 not hooks.write(latent[:8], nope[:8], untouched, slots[:8], "fp8_ds_mla") and not untouched.any())

    impl = SimpleNamespace(kv_cache_dtype=DTYPE)
    as_float8 = pool.view(torch.float8_e4m3fn)
    # An eager step with a whole prefill chunk comes first, as in vLLM's warm-up: the dedup path, and the allocation.
    big = bench.random_indices(2048, TOPK_WIDTH, rows, device, padding=True)
    scratch, tables = hooks.mqa_inputs(impl, as_float8, big)
    ok = torch.equal(reference.resolved(scratch, tables), reference.resolved(*reference.gather(pool, big)))
    checks.check(f"read hook T=2048 K={TOPK_WIDTH} (dedup) == reference", ok)

    static_idx = bench.random_indices(64, TOPK_WIDTH, rows, device, padding=True)
    hooks.mqa_inputs(impl, as_float8, static_idx)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        hooks.mqa_inputs(impl, as_float8, static_idx)
        synced = ""
    except RuntimeError as exc:
        synced = str(exc).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    checks.check("read hook T=64 without host synchronisation", not synced, synced)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        hooks.mqa_inputs(impl, as_float8, static_idx)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_scratch, out_tables = hooks.mqa_inputs(impl, as_float8, static_idx)
    replays_ok = True
    for _i in range(3):
        static_idx.copy_(bench.random_indices(64, TOPK_WIDTH, rows, device, padding=True))
        graph.replay()
        torch.cuda.synchronize()
        want = reference.resolved(*reference.gather(pool, static_idx))
        replays_ok &= torch.equal(reference.resolved(out_scratch, out_tables), want)
    checks.check(f"read hook T=64 K={TOPK_WIDTH} captured in a CUDA graph, 3 replays == reference", replays_ok)

    stock = hooks.mqa_inputs(SimpleNamespace(kv_cache_dtype="fp8_ds_mla"), untouched, static_idx)
    checks.check("read hook hands fp8_ds_mla its inputs untouched", stock[0] is untouched and stock[1] is static_idx)
    return checks.failed


def main() -> int:
    import torch
    from sparkfleet_nvfp4 import bench

    if not torch.cuda.is_available():
        print("no CUDA device: the self-test needs the node's GPU (docker run --gpus all)", file=sys.stderr)
        return 2
    status = bench.main(["--validate-only"])
    failed = check_hooks("cuda")
    print(f"hooks: {'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if status or failed else 0


if __name__ == "__main__":
    sys.exit(main())
