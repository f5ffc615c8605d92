"""A quantization plan: the scheme most weights run in, per-group overrides (the groups a
search keeps in higher precision), and the calibration text. `--weights S` is the plan
with scheme S and nothing else; `--quant-plan FILE` loads one written by `quant search`.

Schemes:
  native            the file's GGUF blocks as stored (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K)
  float32, bfloat16 float weights (bf16: bf16 GEMM inputs, fp32 accumulation)
  int8              W8A8: per-channel int8 weights, per-row int8 activations
  q8_0 ... q4_0     quantized at load into GGUF blocks that the native kernels run (the
                    output layer stays q8_0 in the 4/5-bit ones, as in llama.cpp's files)
Overrides give a group (groups.py) its own format: float32, int8, a format made at load or
native (the file's blocks). bfloat16 is a whole-model compute mode and takes none. A plan
whose every layer is int8 runs the fused int8 method; any other mix runs the native method,
where each linear layer runs its own format."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tokenmill.quant.groups import matches
from tokenmill.quant.schemes import AT_LOAD_FORMATS, CALIBRATED_SCHEMES, GROUP_FORMATS, SCHEMES

PLAN_VERSION = 1
# Formats whose plans keep the output layer (lm_head, or the tied embedding) in q8_0 unless
# an override says otherwise, like llama-quantize's Q4_0 / Q4_1 / Q5_0 / Q5_1 files.
LOW_BIT_FORMATS = ("q5_1", "q5_0", "q4_1", "q4_0")


@dataclass(frozen=True)
class QuantPlan:
    scheme: str = "float32"
    # (group pattern, format): first match wins; formats from GROUP_FORMATS
    overrides: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # None: no calibration; "builtin": the packaged text; else a path to a text file
    calibration: str | None = None
    # Input channels per linear layer kept in float32 (the largest by calibration), for
    # the packed formats made at load; 0: none.
    outlier_channels: int = 0

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme: unsupported value {self.scheme!r} (one of {SCHEMES})")
        if self.overrides and self.scheme == "bfloat16":
            raise ValueError("overrides: bfloat16 runs every layer the same way")
        for pattern, fmt in self.overrides:
            if not isinstance(pattern, str) or not pattern:
                raise ValueError("overrides: group patterns must be non-empty strings")
            if fmt not in GROUP_FORMATS:
                raise ValueError(
                    f"overrides: format {fmt!r} for {pattern!r} is not one of {GROUP_FORMATS}"
                )
        if self.calibration is not None:
            if self.loads_packed:
                raise ValueError(
                    "calibration: native groups keep the file's weights as they are; "
                    "calibration applies to formats made at load"
                )
            if not set(self.formats) & set(CALIBRATED_SCHEMES):
                raise ValueError(
                    f"calibration: scheme {self.scheme} keeps the weights as they are; "
                    f"calibration applies to the schemes made at load {CALIBRATED_SCHEMES}"
                )
            if self.calibration != "builtin" and not Path(self.calibration).is_file():
                raise ValueError(f"calibration: {self.calibration!r} is not a file")

        if not isinstance(self.outlier_channels, int) or not 0 <= self.outlier_channels <= 256:
            raise ValueError("outlier_channels: an integer in [0, 256]")
        if self.outlier_channels and self.calibration is None:
            raise ValueError("outlier_channels: chosen by calibration; give a calibration text")
        if self.outlier_channels and not set(self.formats) & set(AT_LOAD_FORMATS):
            raise ValueError("outlier_channels: applies to the packed formats made at load")

    @property
    def loads_packed(self) -> bool:
        """The file's packed blocks are read as they are (else every weight is dequantized)."""
        return self.scheme == "native" or any(fmt == "native" for _, fmt in self.overrides)

    @property
    def method(self) -> str:
        """The linear method that runs this plan (linear.get_linear_method)."""
        if self.overrides or self.scheme in ("native", *AT_LOAD_FORMATS):
            return "native"
        return self.scheme

    @property
    def formats(self) -> tuple[str, ...]:
        return (self.scheme, *(fmt for _, fmt in self.overrides))

    def format_for(self, group: str) -> str:
        for pattern, fmt in self.overrides:
            if matches(group, pattern):
                return fmt
        if group == "lm_head" and self.scheme in LOW_BIT_FORMATS:
            return "q8_0"  # as llama-quantize does: the output layer stays 8-bit
        return self.scheme

    def describe(self) -> str:
        parts = [self.scheme]
        parts += [f"{pattern}={fmt}" for pattern, fmt in self.overrides]
        if self.calibration:
            parts.append(f"calibrated on {self.calibration}")
        if self.outlier_channels:
            parts.append(f"{self.outlier_channels} outlier channels in float32")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        return {
            "version": PLAN_VERSION,
            "scheme": self.scheme,
            "overrides": [list(o) for o in self.overrides],
            "calibration": self.calibration,
            "outlier_channels": self.outlier_channels,
        }

    @classmethod
    def from_dict(cls, data: dict) -> QuantPlan:
        if not isinstance(data, dict) or data.get("version") != PLAN_VERSION:
            raise ValueError(f"quant plan: expected an object with version {PLAN_VERSION}")
        overrides = data.get("overrides") or []
        if not isinstance(overrides, list) or not all(
            isinstance(o, list) and len(o) == 2 for o in overrides
        ):
            raise ValueError("quant plan: overrides must be a list of [pattern, format] pairs")
        return cls(
            scheme=data.get("scheme", "float32"),
            overrides=tuple((str(p), str(f)) for p, f in overrides),
            calibration=data.get("calibration"),
            outlier_channels=data.get("outlier_channels", 0),
        )


def read_plan(path: str | Path) -> tuple[QuantPlan, dict]:
    """A plan file written by `tokenmill quant search` and what the search measured."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"quant plan {path}: {e}") from None
    return QuantPlan.from_dict(data), data.get("measured", {})


def write_plan(path: str | Path, plan: QuantPlan, measured: dict | None = None) -> None:
    data = plan.to_dict()
    if measured:
        data["measured"] = measured
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
