"""Constraint shapes that used to crash a process (llguidance recursing past a thread's
stack): deep schemas, long `$ref` chains, long Lark rule chains."""

from __future__ import annotations


def nested_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def lark_chain(n: int) -> str:
    return "\n".join(["start: r0", *(f"r{i}: r{i + 1}" for i in range(n)), f'r{n}: "x"'])
