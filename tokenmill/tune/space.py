"""The settings a tune sweeps: each knob a `serve` flag with its candidate values, a
configuration one value per knob. Candidates are ordered (smallest first) so the search can
step to a neighbour."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Config = dict[str, Any]  # serve flag name (dashes) -> value

# The default sweep: what moves a CPU server's latency/throughput trade-off the most.
DEFAULT_KNOBS: dict[str, tuple[Any, ...]] = {
    "max-num-seqs": (4, 8, 16, 32, 64),
    "max-num-batched-tokens": (256, 512, 1024, 2048),
    "weights": ("native", "int8"),
}
# `replicas` > 1 runs the trial as `tokenmill cluster --replicas N` (the router in front,
# the machine's threads split between the replicas unless `num-threads` sets them per
# replica): threads per replica x replicas at one total.
REPLICAS = "replicas"
MAX_CONFIGS = 100_000


@dataclass(frozen=True)
class Knob:
    flag: str
    values: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"space: {self.flag} has no candidate values")
        if len(set(map(repr, self.values))) != len(self.values):
            raise ValueError(f"space: {self.flag} repeats a value")


@dataclass(frozen=True)
class SearchSpace:
    knobs: tuple[Knob, ...]

    @classmethod
    def from_mapping(cls, mapping: dict[str, Any]) -> SearchSpace:
        """`{"max-num-seqs": [8, 16, 32], "speculative": [null, "ngram"]}`: null leaves the
        flag out (its default); a single value fixes the flag for every trial."""
        knobs = []
        for flag, values in mapping.items():
            flag = str(flag).replace("_", "-").removeprefix("--")
            if not isinstance(values, list | tuple):
                values = [values]
            if flag == REPLICAS and not all(
                v is None or (type(v) is int and 1 <= v <= 64) for v in values
            ):
                raise ValueError("space: replicas: values must be integers in [1, 64]")
            for v in values:
                if v is not None and (isinstance(v, bool) or not isinstance(v, str | int | float)):
                    raise ValueError(f"space: {flag}: values must be numbers, strings or null")
            knobs.append(Knob(flag, tuple(values)))
        space = cls(tuple(knobs))
        if space.size > MAX_CONFIGS:
            raise ValueError(f"space: {space.size} configurations (at most {MAX_CONFIGS})")
        return space

    @classmethod
    def default(cls, cores: int | None = None) -> SearchSpace:
        knobs: dict[str, Any] = {k: list(v) for k, v in DEFAULT_KNOBS.items()}
        cores = cores or os.cpu_count() or 1
        if cores >= 2:  # one replica on every core, or two on half each
            knobs[REPLICAS] = [1, 2]
        return cls.from_mapping(knobs)

    @property
    def size(self) -> int:
        n = 1
        for knob in self.knobs:
            n *= len(knob.values)
        return n

    def config(self, index: tuple[int, ...]) -> Config:
        return {k.flag: k.values[i] for k, i in zip(self.knobs, index, strict=True)}

    def index_of(self, config: Config) -> tuple[int, ...]:
        return tuple(k.values.index(config[k.flag]) for k in self.knobs)

    def all_indices(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(len(k.values)) for k in self.knobs))

    def coarse_indices(self) -> list[tuple[int, ...]]:
        """Each knob at its ends and middle (all values when there are at most three):
        the grid the search starts from."""
        picks = []
        for k in self.knobs:
            n = len(k.values)
            picks.append(sorted({0, n // 2, n - 1}))
        return list(itertools.product(*picks))

    def neighbours(self, index: tuple[int, ...]) -> list[tuple[int, ...]]:
        """One step up or down in one knob."""
        out = []
        for axis, knob in enumerate(self.knobs):
            for step in (-1, 1):
                j = index[axis] + step
                if 0 <= j < len(knob.values):
                    out.append(index[:axis] + (j,) + index[axis + 1 :])
        return out


def config_key(config: Config) -> str:
    """A stable id of a configuration (the trial store's key)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def num_replicas(config: Config) -> int:
    value = config.get(REPLICAS)
    return int(value) if value is not None else 1


def config_argv(config: Config) -> list[str]:
    """The configuration as flags (null values left out): `serve` flags, or `cluster` ones
    (with --replicas) when it asks for more than one replica."""
    return [
        arg
        for flag, value in config.items()
        if value is not None and not (flag == REPLICAS and num_replicas(config) == 1)
        for arg in (f"--{flag}", str(value))
    ]


def launch_command(config: Config) -> str:
    """The command a configuration (file) is for."""
    return "cluster" if num_replicas(config) > 1 else "serve"
