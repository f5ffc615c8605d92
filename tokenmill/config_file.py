"""`--config FILE`: a command's flags from a YAML, JSON or TOML file (as vLLM's `--config`).

Keys are the command's flag names, with dashes or underscores (`max-num-seqs: 64`,
`max_num_seqs: 64`); a switch takes true/false (`no-warm-up: true` or `warm_up: false`), a
repeatable flag a list. The settings become command-line arguments placed before the ones
typed, so they are checked exactly as typed flags are; a flag typed on the command line
replaces the file's setting (a list too)."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

MAX_CONFIG_BYTES = 1 << 20


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ValueError(f"config: cannot read {path}: {e.strerror}") from None
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"config: {path} is {size} bytes (at most {MAX_CONFIG_BYTES})")
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            values = json.loads(text)
        elif suffix == ".toml":
            values = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text)
        else:
            raise ValueError(f"config: {path}: expected a .yaml, .yml, .json or .toml file")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"config: {path} does not parse: {e}") from None
    except Exception as e:  # yaml.YAMLError and friends
        if isinstance(e, ValueError):
            raise
        raise ValueError(f"config: {yaml_error(path, e)}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"config: {path} must hold a mapping of flag names to values")
    return values


def yaml_error(path: str | Path, error: Exception) -> str:
    """A YAML syntax error as `FILE, line L, column C: problem` on one line (PyYAML's own
    text spans several lines and names the file "<unicode string>")."""
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return f"{path} does not parse as YAML: {str(error).splitlines()[0]}"
    problem = getattr(error, "problem", None) or "does not parse as YAML"
    text = f"{path}, line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, start = getattr(error, "context", None), getattr(error, "context_mark", None)
    if context and start is not None and (start.line, start.column) != (mark.line, mark.column):
        text += f" ({context} from line {start.line + 1}, column {start.column + 1})"
    return text


def setting_keys(
    parser: argparse.ArgumentParser,
) -> tuple[dict[str, argparse.Action], dict[str, argparse.Action]]:
    """The keys a file may set for this command: its long options without dashes
    (`max-num-seqs`, `no-warm-up`) and their dests (`max_num_seqs`, `warm_up`), but
    `--config` itself; a key with underscores matches either as dashes too."""
    by_option: dict[str, argparse.Action] = {}
    by_dest: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        if action.dest == "config":
            continue
        for option in action.option_strings:
            if option.startswith("--"):
                by_option[option[2:]] = action
        by_dest.setdefault(action.dest, action)
    return by_option, by_dest


def config_argv(
    parser: argparse.ArgumentParser,
    values: dict[str, Any],
    source: str,
    typed: frozenset[str] = frozenset(),
) -> list[str]:
    """The settings as this parser's command-line arguments, but for the flags among
    `typed` (given on the command line: those win, lists included)."""
    by_option, by_dest = setting_keys(parser)
    argv: list[str] = []
    for key, value in values.items():
        name = str(key).replace("_", "-")
        action = by_option.get(name)
        as_option = action is not None  # `no-warm-up: true` names the switch itself
        if action is None:
            action = by_dest.get(str(key).replace("-", "_"))
        if action is None:
            raise ValueError(f"config: {source}: unknown setting {key!r}")
        named = "--" + name if as_option else None
        arguments = _as_arguments(action, value, named, f"{source}: {key}")
        if not typed & set(action.option_strings):
            argv += arguments
    return argv


def _as_arguments(action: argparse.Action, value: Any, named: str | None, where: str) -> list[str]:
    """`named`: the option the key named (`no-warm-up`), None for a dest (`warm_up`)."""
    option = next(
        (o for o in action.option_strings if o.startswith("--")), action.option_strings[0]
    )
    switch = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)
    if isinstance(action, switch) and not isinstance(value, bool):
        raise ValueError(f"config: {where}: expected true or false, got {value!r}")
    if isinstance(action, argparse.BooleanOptionalAction):  # --thing / --no-thing
        on, off = action.option_strings[:2]
        return [on if value != (named == off) else off]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        wanted = value if named else value == action.const
        return [option] if wanted else []
    if isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*"):
        items = value if isinstance(value, list) else [value]
        if isinstance(action, argparse._AppendAction):
            return [arg for item in items for arg in (option, _scalar(item, where))]
        return [option, *(_scalar(item, where) for item in items)]
    return [option, _scalar(value, where)]


def _scalar(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"config: {where}: expected a number or a string, got {value!r}")
    return str(value)


def add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help="flags from a YAML, JSON or TOML file (keys: flag names); typed flags win",
    )


def expand_config(argv: list[str], commands: dict[str, argparse.ArgumentParser]) -> list[str]:
    """argv with the settings of `--config FILE` (given after a command) inserted right
    after the command name."""
    position = next((i for i, a in enumerate(argv) if a in commands), None)
    if position is None:
        return argv
    rest = argv[position + 1 :]
    path = None
    for i, arg in enumerate(rest):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(rest):
            path = rest[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    if path is None:
        return argv
    parser = commands[argv[position]]
    typed = frozenset(a.split("=", 1)[0] for a in rest if a.startswith("-"))
    inserted = config_argv(parser, load_config_file(path), path, typed)
    return [*argv[: position + 1], *inserted, *rest]
