"""tokenmill/envs.py is the one reader of TOKENMILL_* variables, and a kernel switch's
variable sets its EngineConfig setting (a flag or keyword winning over it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tokenmill import envs
from tokenmill.engine.arg_spec import SECTIONS, cli_fields
from tokenmill.engine.arg_utils import EngineArgs

PACKAGE = Path(__file__).resolve().parents[2] / "tokenmill"
NAME = re.compile(r"TOKENMILL_[A-Z0-9_]+")
# a value for each kernel switch's variable, and the setting it gives
OVERRIDES = {
    "TOKENMILL_INT_DOT": ("0", False),
    "TOKENMILL_INT_DOT_MAX_ROWS": ("64", 64),
    "TOKENMILL_INT_DOT_ACTIVATION_BITS": ("24", 24),
    "TOKENMILL_GREEDY_ARGMAX": ("0", False),
    "TOKENMILL_FUSED_DECODE": ("0", False),
    "TOKENMILL_PREFETCH": ("0", False),
}


def test_no_module_but_envs_names_a_variable():
    """Every TOKENMILL_* name is a constant of envs.py: no other module can read one."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "envs.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and NAME.fullmatch(text):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {text}")
    assert found == []


def test_the_table_names_each_variable_once_with_its_doc_and_setting():
    names = [v.name for v in envs.VARIABLES]
    assert len(names) == len(set(names)) and all(NAME.fullmatch(n) for n in names)
    assert all(v.doc for v in envs.VARIABLES)
    targets = {arg.target for _, arg in cli_fields(EngineArgs)}
    for var in envs.VARIABLES:
        if var.field is not None:
            section, _, name = var.field.rpartition(".")
            assert name in SECTIONS[section].__dataclass_fields__, var.name
            assert var.field in targets, var.name  # a flag sets it too
    assert {v.name for v in envs.VARIABLES if v.field} == set(OVERRIDES)


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_each_variable_sets_its_field_and_a_keyword_wins(name, monkeypatch):
    raw, value = OVERRIDES[name]
    var = next(v for v in envs.VARIABLES if v.name == name)
    field = var.field.split(".", 1)[1]
    default = getattr(EngineArgs().create_engine_config().kernel_config, field)
    monkeypatch.setenv(name, raw)
    assert getattr(EngineArgs().create_engine_config().kernel_config, field) == value
    wins = {"int_dot_max_rows": "any", "int_dot_activation_bits": 8}.get(field, True)
    config = EngineArgs(**{field: wins}).create_engine_config()
    assert getattr(config.kernel_config, field) == wins != value
    monkeypatch.delenv(name)
    assert getattr(EngineArgs().create_engine_config().kernel_config, field) == default


def test_switches_keep_their_old_readings(monkeypatch):
    """Off only at exactly "0" (on for "false", "" ...); kernels disabled only at "1"."""
    for raw, on in (("0", False), ("1", True), ("false", True), ("", True)):
        monkeypatch.setenv("TOKENMILL_INT_DOT", raw)
        assert envs.INT_DOT.get() is on
    monkeypatch.setenv("TOKENMILL_DISABLE_KERNELS", "yes")
    assert envs.DISABLE_KERNELS.get() is False
    for raw, rows in (("", None), (" any ", "any"), ("80", 80)):
        assert envs.parse_rows(raw) == rows
    for bad in ("0", "-5", "many", "1e3"):
        monkeypatch.setenv("TOKENMILL_INT_DOT_MAX_ROWS", bad)
        with pytest.raises(ValueError, match="TOKENMILL_INT_DOT_MAX_ROWS"):
            EngineArgs().create_engine_config()
