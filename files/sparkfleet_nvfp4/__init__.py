"""NVFP4 KV cache for MLA latents: 288-byte rows in the pool, expanded on read into the fp8_ds_mla pages that the
stock SM120 sparse-MLA attention kernel accepts.

- `kernels.write`   [T, 512] latent + slot mapping -> NVFP4 rows in the pool (Triton)
- `kernels.gather`  pool + [T, K] top-k rows -> fp8_ds_mla scratch pages + renumbered tables (Triton)
- `reference`       the same in plain PyTorch, the definition the kernels are tested against
- `layout`          the byte layouts as constants
- `bench`           GPU validation and benchmark: python -m sparkfleet_nvfp4.bench
"""

__version__ = "1.0.0"
