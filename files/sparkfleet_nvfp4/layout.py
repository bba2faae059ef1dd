"""Byte layouts of the two KV-cache row formats, as constants.

NVFP4 row (what the pool stores, per token and MLA layer): 288 bytes.
  [0, 256)    512 e2m1 codes, two per byte: element 2i in the low nibble, element 2i+1 in the high nibble;
              bit 3 of a nibble is the sign, bits 0-2 the magnitude index into E2M1_VALUES.
  [256, 288)  32 e4m3 block scales, one per 16 consecutive elements, in element order. No global scale.

fp8_ds_mla row (what the stock SM120 sparse-MLA kernel reads): 656 bytes, in pages of 64 rows.
  [0, 512)    512 fp8 e4m3 values, four tiles of 128.
  [512, 528)  four fp32 tile scales, raw (not rounded to a power of two); as floats, indices 128..131 of 164.
  [528, 656)  64 bf16 RoPE values: always zero for GLM-5.3-Flash, which is NoPE.
"""

LATENT_DIM = 512

NVFP4_GROUP = 16
NVFP4_GROUPS = LATENT_DIM // NVFP4_GROUP  # 32
NVFP4_CODE_BYTES = LATENT_DIM // 2  # 256
NVFP4_SCALE_OFFSET = NVFP4_CODE_BYTES  # 256
NVFP4_ROW_BYTES = NVFP4_CODE_BYTES + NVFP4_GROUPS  # 288

FP8_DS_MLA_TILE = 128
FP8_DS_MLA_TILES = LATENT_DIM // FP8_DS_MLA_TILE  # 4
FP8_DS_MLA_SCALE_OFFSET = LATENT_DIM  # 512
FP8_DS_MLA_ROPE_OFFSET = FP8_DS_MLA_SCALE_OFFSET + 4 * FP8_DS_MLA_TILES  # 528
FP8_DS_MLA_ROW_BYTES = 656
FP8_DS_MLA_PAGE_ROWS = 64

# The magnitudes a 3-bit e2m1 index stands for (the bit pattern is exponent:2, mantissa:1).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# The smallest positive e4m3 value (a subnormal). A block scale never goes below it: the often-quoted floor of
# 1e-8 rounds to zero in e4m3, and a zero scale would decode every element of its block as 0 * code = 0 at best.
E4M3_MIN = 2.0**-9
# vLLM's fp8_ds_mla writer floors a tile scale at FLT_MIN, the smallest normal fp32.
FLT_MIN = 1.1754943508222875e-38

# Steps of up to this many tokens use the fixed-shape gather (no dedup, no host sync, no allocation): the
# 128-token mixed-prefill cap plus 16 sequences x 4 speculative slots.
SYNC_FREE_MAX_TOKENS = 192

# A GB10's LPDDR5X bandwidth (bytes/s), for projections.
GB10_BANDWIDTH = 273e9
