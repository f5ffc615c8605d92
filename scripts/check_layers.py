#!/usr/bin/env python3
"""The package's structure, checked (CI runs it): every import inside tokenmill/ goes to a
unit its own unit may use (LAYERS), no modules import each other in a circle, and no
function is longer than MAX_FUNCTION_LINES.

A unit is a dotted path under tokenmill (a package or a module); a module belongs to the
longest unit that contains it. Every import counts, lazy ones and `if TYPE_CHECKING:` ones
included: a type is a dependency too.

    python scripts/check_layers.py          # exit 1 with one line per problem
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "tokenmill"
MAX_FUNCTION_LINES = 100

_TYPES = {
    "sampling_params", "pooling_params", "structured.spec", "outputs", "messages", "stats",
    "request", "lora_request",
}  # fmt: skip
_FOUNDATION = {"version", "platform", "cache_dirs", "ports", "console", "config_file", "envs"}
_CONFIG = {"config", "quant.plan", "quant.schemes", "quant.groups"}
_ENGINE_PARTS = {
    "kernels", "model", "quant.formats", "inputs", "structured", "sampling", "kv", "spec",
    "scheduler", "scheduler.output", "worker", "quant",
}  # fmt: skip


def _below(*units: str | set[str]) -> set[str]:
    out: set[str] = set()
    for u in units:
        out |= {u} if isinstance(u, str) else u
    return out


# unit -> the units it may import (bottom first). A unit may always import itself.
LAYERS: dict[str, set[str]] = {
    # foundation: machine facts, paths, the console, ports, config files, env overrides
    **{u: {"envs"} - {u} for u in _FOUNDATION},
    # neutral types: what a request asks for, what it produces, the engine core's messages
    "structured.spec": set(),
    "sampling_params": {"structured.spec"},
    "pooling_params": set(),
    "lora_request": set(),
    "outputs": set(),
    "stats": set(),
    "messages": {"sampling_params", "pooling_params", "stats"},
    "request": {"sampling_params", "pooling_params", "structured.spec"},
    "quant.schemes": set(),
    "quant.groups": set(),
    "quant.plan": {"quant.schemes", "quant.groups"},
    "config": _below(_FOUNDATION, _CONFIG - {"config"}, "sampling_params"),
    "scheduler.output": {"request", "messages"},
    # the engine's parts, bottom up
    "kernels": {"cache_dirs", "platform", "envs"},
    "model": _below(_FOUNDATION, _CONFIG, "kernels"),
    "quant.formats": _below(_FOUNDATION, _CONFIG, "kernels", "model"),
    "inputs": _below(_TYPES, "model"),
    "structured": _below(_TYPES, "model"),
    "sampling": _below(_TYPES, "structured"),
    "kv": _below(_FOUNDATION, _TYPES, _CONFIG, "scheduler.output"),
    "spec": _below(_FOUNDATION, _TYPES, _CONFIG, "kernels", "model", "quant.formats"),
    "scheduler": _below(_FOUNDATION, _TYPES, _CONFIG, "scheduler.output", "kv", "spec",
                        "structured"),  # fmt: skip
    "worker": _below(_FOUNDATION, _TYPES, _CONFIG, "scheduler.output", "kernels", "model",
                     "sampling", "structured", "spec"),  # fmt: skip
    # measuring weights' fidelity runs the model through the runner
    "quant": _below(_FOUNDATION, _TYPES, _CONFIG, _ENGINE_PARTS - {"quant"}),
    "engine": _below(_FOUNDATION, _TYPES, _CONFIG, _ENGINE_PARTS),
    # tools and applications on top of the engine
    "spec.training": _below(_FOUNDATION, _TYPES, _CONFIG, _ENGINE_PARTS, "engine"),
    "spec.cli": _below(_FOUNDATION, _TYPES, _CONFIG, _ENGINE_PARTS, "engine", "spec.training"),
    "quant.cli": _below(_FOUNDATION, _TYPES, _CONFIG, _ENGINE_PARTS, "engine"),
    "ui.theme": set(),
    # the OpenAI wire format (requests, response objects, stream events): server and gateway
    "openai": _below(_FOUNDATION, _TYPES),
    "gateway": _below(_FOUNDATION, "openai"),
    "ui": _below(_FOUNDATION, "ui.theme", "gateway"),
    "server": _below(_FOUNDATION, _TYPES, _CONFIG, _ENGINE_PARTS, "engine", "openai", "gateway",
                     "ui", "ui.theme"),  # fmt: skip
    "router": _below(_FOUNDATION, _TYPES, _CONFIG, "inputs", "kv", "model", "openai", "gateway",
                     "ui", "ui.theme", "server"),  # fmt: skip
    "cluster": _below(_FOUNDATION, "router", "gateway", "server", "ui"),
    "bench": _below(_FOUNDATION, "ui.theme", "model"),
    "tune": _below(_FOUNDATION, "bench"),
    # the command line and the package's public names: everything
    "cli": set(),  # filled below
    "": set(),  # tokenmill/__init__.py
}
_EVERYTHING = set(LAYERS)
LAYERS["cli"] = _EVERYTHING - {"cli"}
LAYERS[""] = {"version", "engine", "outputs", "sampling_params", "pooling_params", "lora_request"}


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def unit_of(module: str) -> str:
    """The longest unit containing `module` ("" is the package itself)."""
    parts = module.split(".") if module else []
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in LAYERS:
            return candidate
    return ""


def imports_of(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, module under tokenmill without the prefix, or a `from` import's base then
    base.name for each name) of every import; check() keeps the ones that are modules."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tokenmill" or alias.name.startswith("tokenmill."):
                    yield node.lineno, alias.name[len("tokenmill.") :]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".") if module else []
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            elif node.module == "tokenmill":
                target = ""
            elif (node.module or "").startswith("tokenmill."):
                target = node.module[len("tokenmill.") :]
            else:
                continue
            for alias in node.names:  # `from pkg import module` imports pkg.module
                yield node.lineno, f"{target}.{alias.name}" if target else alias.name


def long_functions(tree: ast.AST, rel: str) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                yield f"{rel}:{node.lineno}: {node.name}() is {lines} lines (at most {MAX_FUNCTION_LINES})"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def check() -> list[str]:
    problems: list[str] = []
    known = {name for name, _ in modules()}
    graph: dict[str, set[str]] = {}
    for name, path in modules():
        rel = str(path.relative_to(ROOT.parent))
        tree = ast.parse(path.read_text(), rel)
        problems += long_functions(tree, rel)
        own = unit_of(name)
        allowed = LAYERS[own] | {own}
        edges = graph.setdefault(name, set())
        for line, target in imports_of(tree, name, path.name == "__init__.py"):
            while target and target not in known:  # `from pkg.mod import name`: pkg.mod
                target = target.rpartition(".")[0]
            if target != name:
                edges.add(target)
            unit = unit_of(target)
            problem = (
                f"{rel}:{line}: {own or 'tokenmill'} may not import {unit or 'tokenmill'} "
                f"({'.'.join(filter(None, ['tokenmill', target]))})"
            )
            if unit not in allowed and problem not in problems:
                problems.append(problem)
    for component in cycles(graph):
        problems.append("import circle: " + " <-> ".join(f"tokenmill.{m}" for m in component))
    return problems


def main() -> int:
    problems = check()
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s); the allowed imports are LAYERS in {__file__}")
        return 1
    print(f"layers ok: {sum(1 for _ in modules())} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
