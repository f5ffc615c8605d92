"""scripts/check_layers.py, the structure CI enforces: the real tree passes, and a tree with
an upward import, a circle or a long function does not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_layers.py"


@pytest.fixture
def checker():
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_package_keeps_its_layers(checker):
    assert checker.check() == []


def test_upward_imports_circles_and_long_functions_are_found(checker, tmp_path, monkeypatch):
    root = tmp_path / "tokenmill"
    body = "\n".join(f"    x{i} = {i}" for i in range(101))
    write(root, {
        "__init__.py": "",
        "stats.py": "from tokenmill.engine.core import thing\n",  # neutral type -> engine
        "engine/__init__.py": "",
        "engine/core.py": "import tokenmill.engine.loop\nthing = 1\n",
        "engine/loop.py": "from tokenmill.engine import core\n",  # circle with core
        "kernels/__init__.py": f"def long():\n{body}\n",
        "model/__init__.py": "def f():\n    from tokenmill.kernels import x\n",  # allowed
    })  # fmt: skip
    monkeypatch.setattr(checker, "ROOT", root)
    problems = checker.check()
    assert any("stats may not import engine" in p for p in problems), problems
    assert any("import circle" in p and "engine.loop" in p for p in problems), problems
    assert any("long() is 102 lines" in p for p in problems), problems
    assert not any("model/__init__.py" in p for p in problems), problems
