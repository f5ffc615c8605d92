"""The `tokenmill` command line as a whole: no abbreviated flags in any (sub)command, and a
closed output pipe (`tokenmill keys list | head`) ends a command quietly."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenmill.cli import EXIT_BROKEN_PIPE, build_parser

REPO = Path(__file__).resolve().parents[2]


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the command line with the words that reach it ("keys", "create")."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def required_args(parser: argparse.ArgumentParser) -> list[str]:
    """Values for the arguments the command cannot go without (a choice, else "1")."""
    out: list[str] = []
    for a in parser._actions:
        value = str(a.choices[0]) if a.choices else "1"
        if a.option_strings:
            out += [a.option_strings[0], value] if a.required else []
        elif a.nargs not in ("?", "*", argparse.REMAINDER):
            out.append(value)
    return out


LEAVES = [(path, p) for path, p in commands(build_parser()) if path and not has_subcommands(p)]
GROUPS = [(path, p) for path, p in commands(build_parser()) if has_subcommands(p)]


def test_the_walk_finds_every_command():
    names = {" ".join(path) for path, _ in LEAVES}
    assert {"serve", "router", "cluster", "bench", "tune", "keys create", "keys list",
            "usage", "quant eval", "gateway migrate"} <= names  # fmt: skip


@pytest.mark.parametrize("path", [path for path, _ in LEAVES], ids=" ".join)
def test_an_abbreviated_flag_is_an_error(path, capsys):
    parser = dict(LEAVES)[path]
    argv = [*path, *required_args(parser)]
    build_parser().parse_args(argv)  # whole, the same command parses
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*argv, "--hel"])  # was --help (exit 0)
    assert exit_.value.code == 2
    assert "unrecognized arguments: --hel" in capsys.readouterr().err


@pytest.mark.parametrize("path", [path for path, _ in GROUPS], ids=lambda p: " ".join(p) or "-")
def test_an_abbreviated_flag_is_an_error_before_a_subcommand(path):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*path, "--hel"])
    assert exit_.value.code == 2


@pytest.mark.parametrize(
    "typed", [["--max-num-seq", "8"], ["--max-num-seq=8"], ["--kv-cache", "1"]]
)
def test_serve_refuses_the_abbreviation_the_user_typed(typed, capsys):
    assert build_parser().parse_args(["serve", "--max-num-seqs", "8"]).max_num_seqs == 8
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", *typed])
    assert exit_.value.code == 2 and typed[0] in capsys.readouterr().err


def test_every_benchmark_script_refuses_abbreviations():
    for script in sorted((REPO / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("ArgumentParser"):
                keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
                assert keywords.get("allow_abbrev") == "False", script.name


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["keys", "list"], EXIT_BROKEN_PIPE),
        (["usage"], EXIT_BROKEN_PIPE),  # a rich table
        (["usage", "--json"], EXIT_BROKEN_PIPE),
        (["--help"], 0),  # argparse drops what it cannot write, then exits 0
    ],
)
def test_a_closed_pipe_ends_the_command_quietly(tmp_path, args, code):
    db = ["--database", str(tmp_path / "gw.sqlite3")] if args[0] != "--help" else []
    if db:  # reading keys or usage takes a database that is there
        from tokenmill.gateway.store.database import open_database
        from tokenmill.gateway.store.migrations import migrate

        migrate(open_database(db[1]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenmill.cli", *args, *db],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    proc.stdout.close()  # the reader is gone before the command writes a byte
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()
    assert proc.returncode == code
