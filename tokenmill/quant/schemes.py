"""Names of the weight schemes and formats (no heavy imports: configs and the API use them)."""

from __future__ import annotations

# Formats made at load from float weights: --weights name -> GGUF type name
AT_LOAD_FORMATS = {"q8_0": "Q8_0", "q5_1": "Q5_1", "q5_0": "Q5_0", "q4_1": "Q4_1", "q4_0": "Q4_0"}
# What one group can run in (plan overrides): float32, int8 (W8A8), a packed format made at
# load, or "native" (the file's own blocks).
GROUP_FORMATS = ("float32", "int8", *AT_LOAD_FORMATS, "native")
# fp8: W8A8 FP8 (per-channel weight scales, per-token activation scales), the GPU's
SCHEMES = ("native", "float32", "bfloat16", "int8", "fp8", *AT_LOAD_FORMATS)
# Schemes whose weights are computed at load from float ones (calibration applies).
CALIBRATED_SCHEMES = ("int8", *AT_LOAD_FORMATS)
# Effective bits per weight (block scales included), for size estimates.
BITS_PER_WEIGHT = {
    "float32": 32.0,
    "bfloat16": 16.0,
    "int8": 8.0,
    "fp8": 8.0,
    "q8_0": 8.5,
    "q5_1": 6.0,
    "q5_0": 5.5,
    "q4_1": 5.0,
    "q4_0": 4.5,
}
