"""How a field of EngineArgs becomes a command-line flag, a `--config` key and a setting of
EngineConfig: its metadata (`option()`), read by the parser builder and by the conversion
back (arg_utils.py). A default is written once: where `target` names an EngineConfig
setting with a default, the field's default is that one (in the flag's units)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, Field, dataclass
from typing import Any, Literal

from tokenmill import envs
from tokenmill.config import (
    CacheConfig,
    EngineConfig,
    KernelConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)

SECTIONS: dict[str, type] = {
    "": EngineConfig,
    "model_config": ModelConfig,
    "cache_config": CacheConfig,
    "scheduler_config": SchedulerConfig,
    "speculative_config": SpeculativeConfig,
    "kv_transfer_config": KVTransferConfig,
    "kernel_config": KernelConfig,
}
# Flag groups: every engine-running command gets ENGINE and KERNELS; `serve` KV_TRANSFER too.
ENGINE, KERNELS, KV_TRANSFER = "engine", "kernels", "prefill/decode disaggregation"
# "value": --flag VALUE; "off": --no-thing stores False; "toggle": --thing / --no-thing;
# "append": --flag VALUE, repeated (a tuple of them)
Kind = Literal["value", "off", "toggle", "append"]


@dataclass(frozen=True)
class Unit:
    """A flag in units of `size` of the setting's (GiB of bytes); `whole`: an integer flag."""

    size: int
    whole: bool = False


GIB, MIB = Unit(1 << 30), Unit(1 << 20, whole=True)


@dataclass(frozen=True)
class CliArg:
    target: str  # the EngineConfig setting: "cache_config.block_size", "num_threads"
    help: str | None
    flag: str  # "--kv-cache-memory"
    kind: Kind = "value"
    type: Callable[[str], Any] | None = None
    choices: Sequence[Any] | None = None
    metavar: str | None = None
    unit: Unit | None = None
    group: str = ENGINE

    def dest(self, name: str) -> str:
        """The argparse attribute: the field's name for switches, else the flag's."""
        return name if self.kind != "value" else self.flag[2:].replace("-", "_")

    def to_setting(self, value: Any) -> Any:
        if self.kind == "append":
            return tuple(value or ())
        return int(value * self.unit.size) if self.unit and value is not None else value


def config_default(target: str) -> Any:
    """The default of an EngineConfig setting (MISSING where a factory makes it)."""
    section, _, name = target.rpartition(".")
    return SECTIONS[section].__dataclass_fields__[name].default


def option(
    target: str,
    help: str | None = None,
    *,
    flag: str | None = None,
    default: Any = MISSING,
    kind: Kind = "value",
    type: Callable[[str], Any] | None = None,
    choices: Sequence[Any] | None = None,
    metavar: str | None = None,
    unit: Unit | None = None,
    group: str = ENGINE,
) -> Any:
    """An EngineArgs field that sets `target`. `flag`: default `--<target's name>`;
    `default`: default the target's own (divided by `unit`)."""
    if default is MISSING:
        default = config_default(target)
        if unit is not None:
            default = default // unit.size if unit.whole else default / unit.size
    name = target.rpartition(".")[2]
    meta = CliArg(target, help, flag or "--" + name.replace("_", "-"), kind, type,
                  choices, metavar, unit, group)  # fmt: skip
    return dataclasses.field(default=default, metadata={"cli": meta})


def cli_fields(cls: type) -> Iterator[tuple[Field, CliArg]]:
    for f in dataclasses.fields(cls):
        yield f, f.metadata["cli"]


def env_note(target: str) -> str:
    """' (also $TOKENMILL_X)' for a setting a variable overrides (envs.py)."""
    names = [v.name for v in envs.VARIABLES if v.field == target]
    return f" (also ${names[0]})" if names else ""


def add_arguments(
    parser: argparse.ArgumentParser, cls: type, groups: Sequence[str], titles: dict[str, str]
) -> None:
    """The flags of `cls`'s fields in these groups, each group under its title."""
    made = {g: parser.add_argument_group(titles.get(g, g)) for g in groups}
    for f, arg in cli_fields(cls):
        if arg.group not in made:
            continue
        g, help = made[arg.group], (arg.help or "") + env_note(arg.target) or None
        if arg.kind == "off":  # the dest, the field's name, is a `--config` key too
            g.add_argument(arg.flag, dest=f.name, action="store_false", help=help)
        elif arg.kind == "append":
            g.add_argument(
                arg.flag, dest=f.name, action="append", default=None, metavar=arg.metavar,
                help=help,
            )  # fmt: skip
        elif arg.kind == "toggle":
            g.add_argument(
                arg.flag, dest=f.name, action=argparse.BooleanOptionalAction,
                default=f.default, help=help,
            )  # fmt: skip
        else:
            g.add_argument(
                arg.flag, type=arg.type or _value_type(f), default=f.default,
                choices=list(arg.choices) if arg.choices else None, metavar=arg.metavar,
                help=help,
            )  # fmt: skip


def _value_type(f: Field) -> Callable[[str], Any] | None:
    """int or float from the field's annotation ("int | None" -> int); None: text."""
    words = str(f.type).replace(" ", "").split("|")
    return next((kind for kind in (int, float) if kind.__name__ in words), None)


def namespace_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields whose flags this command has, as parsed."""
    out = {}
    for f, arg in cli_fields(cls):
        dest = arg.dest(f.name)
        if hasattr(args, dest):
            out[f.name] = getattr(args, dest)
    return out
