"""Every `TOKENMILL_*` environment variable tokenmill reads, in one typed table (as vLLM's
vllm/envs.py): its name, parser, documentation and, for a kernel switch, the engine setting
it overrides. Nothing else in tokenmill/ reads these variables (tests/unit/test_envs.py).

A kernel switch's variable is the default of its engine setting: `--no-int-dot`, a `--config`
key or `LLM(int_dot=False)` win over it, and the value in force is in EngineConfig (and in
/server_info). The rest are process settings: where the cache lives, the API key, ..."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ANY_ROWS = "any"  # TOKENMILL_INT_DOT_MAX_ROWS: no limit


@dataclass(frozen=True)
class EnvVar:
    name: str
    parse: Callable[[str], Any]  # the variable's text -> its value (None: as if unset)
    doc: str
    field: str | None = None  # "kernel_config.int_dot": the EngineConfig setting it sets

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        """The parsed value; None where the variable is unset."""
        raw = (os.environ if environ is None else environ).get(self.name)
        return None if raw is None else self.parse(raw)


def _off_at(off: str) -> Callable[[str], bool]:
    """A switch that is on unless the variable is exactly `off` (as always read)."""
    return lambda raw: raw != off


def _on_at(on: str) -> Callable[[str], bool]:
    return lambda raw: raw == on


def _text(raw: str) -> str | None:
    return raw or None  # an empty value: unset


def _verbatim(raw: str) -> str:
    return raw  # an empty key is an error where it is used, not silently no key


def parse_rows(raw: str, where: str = "TOKENMILL_INT_DOT_MAX_ROWS") -> int | str | None:
    """A number of rows (1 or more) or 'any'; empty: unset (the measured limit)."""
    value = raw.strip()
    if not value:
        return None
    if value == ANY_ROWS:
        return ANY_ROWS
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{where}: a number of rows (1 or more) or 'any', got {raw!r}")
    return int(value)


ACTIVATION_BITS = (8, 16, 24)  # TOKENMILL_INT_DOT_ACTIVATION_BITS: the integer-dot precisions


def parse_activation_bits(raw: str, where: str = "TOKENMILL_INT_DOT_ACTIVATION_BITS") -> int | None:
    """8, 16 or 24; empty: unset (the default)."""
    value = raw.strip()
    if not value:
        return None
    if value not in {str(b) for b in ACTIVATION_BITS}:
        raise ValueError(f"{where}: 8, 16 or 24, got {raw!r}")
    return int(value)


INT_DOT = EnvVar(
    "TOKENMILL_INT_DOT", _off_at("0"),
    "0: decode rows of packed weights run the fp32 GEMV, not the integer-dot GEMV",
    "kernel_config.int_dot",
)  # fmt: skip
INT_DOT_MAX_ROWS = EnvVar(
    "TOKENMILL_INT_DOT_MAX_ROWS", parse_rows,
    "N or 'any': up to how many rows the integer-dot kernel runs (default: measured once "
    "per machine, model/row_kernels.py)",
    "kernel_config.int_dot_max_rows",
)  # fmt: skip
INT_DOT_ACTIVATION_BITS = EnvVar(
    "TOKENMILL_INT_DOT_ACTIVATION_BITS", parse_activation_bits,
    "8, 16 or 24: the activations' precision in every integer-dot kernel (decode GEMV, GEMM, "
    "greedy argmax; default 16)",
    "kernel_config.int_dot_activation_bits",
)  # fmt: skip
GREEDY_ARGMAX = EnvVar(
    "TOKENMILL_GREEDY_ARGMAX", _off_at("0"),
    "0: greedy rows compute every logit instead of the lm_head's argmax kernel",
    "kernel_config.greedy_argmax",
)  # fmt: skip
FUSED_DECODE = EnvVar(
    "TOKENMILL_FUSED_DECODE", _off_at("0"),
    "0: decode steps run layer by layer, not in one native call",
    "kernel_config.fused_decode",
)  # fmt: skip
PREFETCH = EnvVar(
    "TOKENMILL_PREFETCH", _off_at("0"),
    "0: no start-up prefetch of native weights while torch is imported",
    "kernel_config.prefetch",
)  # fmt: skip
DISABLE_KERNELS = EnvVar(
    "TOKENMILL_DISABLE_KERNELS", _on_at("1"),
    "1: no native kernels in this process (pure torch), as on a machine without a compiler",
)  # fmt: skip
CACHE = EnvVar(
    "TOKENMILL_CACHE", _text,
    "where tokenmill keeps what it builds and measures (default: ~/.cache/tokenmill)",
)  # fmt: skip
API_KEY = EnvVar(
    "TOKENMILL_API_KEY", _verbatim,
    "the API key of `serve`, `router` and `cluster` (also --api-key / --api-key-file)",
)  # fmt: skip
ADMIN_KEY = EnvVar(
    "TOKENMILL_ADMIN_KEY", _verbatim,
    "the gateway's admin key (the default of its config's admin_key_env)",
)  # fmt: skip
LLAMA_CPP_BIN = EnvVar(
    "TOKENMILL_LLAMA_CPP_BIN", _text,
    "llama.cpp's bin directory (or llama-server itself) for `bench --compare`",
)  # fmt: skip

VARIABLES: tuple[EnvVar, ...] = (
    INT_DOT, INT_DOT_MAX_ROWS, INT_DOT_ACTIVATION_BITS, GREEDY_ARGMAX, FUSED_DECODE, PREFETCH, DISABLE_KERNELS, CACHE,
    API_KEY, ADMIN_KEY, LLAMA_CPP_BIN,
)  # fmt: skip


def overrides(section: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """{field: value} of the set variables that override fields of this EngineConfig
    section ("kernel_config")."""
    out = {}
    for var in VARIABLES:
        if var.field is not None and var.field.startswith(section + "."):
            value = var.get(environ)
            if value is not None:
                out[var.field.split(".", 1)[1]] = value
    return out


def named(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """A variable a configuration names (the gateway's admin_key_env), read as text."""
    return (os.environ if environ is None else environ).get(name)
