"""Constrained generation on the embedded model: outputs validate with `jsonschema`; loops are cut."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from tokenmill import SamplingParams
from tokenmill.structured.grammar import GrammarCompiler, GrammarError
from tokenmill.structured.spec import StructuredOutputsParams

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "jsonschemabench-sample"


def representative_schemas(compiler: GrammarCompiler) -> list[tuple[str, dict]]:
    """Function-argument schemas (Glaive, BFCL: what tool calling sends) and handwritten edge
    cases, a spread of those that compile (the server and unit suites cover the rest)."""
    picked = []
    for prefix, step in (("Glaiveai2K", 10), ("BFCL_simple", 6), ("Handwritten", 8)):
        for path in sorted(SAMPLE.glob(f"{prefix}*"))[::step]:
            schema = json.loads(path.read_text())["schema"]
            if not isinstance(schema, dict):
                continue
            try:
                compiler.compile(StructuredOutputsParams(json=schema))
            except GrammarError:
                continue
            picked.append((path.name, schema))
    return picked


def test_generated_json_validates(embedded_llm):
    tok = embedded_llm.get_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size)
    schemas = representative_schemas(compiler)
    assert len(schemas) >= 6
    prompts, params, meta = [], [], []
    for name, schema in schemas:
        _, ids = embedded_llm.engine.processor.render_chat(
            [
                {
                    "role": "user",
                    "content": "Return a JSON document for this schema:\n"
                    + json.dumps(schema)[:1500],
                }
            ]
        )
        for temperature in (0.0, 0.8):
            prompts.append({"prompt_token_ids": ids})
            params.append(
                SamplingParams(
                    temperature=temperature,
                    seed=3,
                    max_tokens=400,
                    structured_outputs=StructuredOutputsParams(json=schema),
                )
            )
            meta.append((name, schema, temperature))
    outs = embedded_llm.generate(prompts, params)
    failures = []
    for out, (name, schema, temperature) in zip(outs, meta, strict=True):
        try:
            jsonschema.validate(json.loads(out.outputs[0].text), schema)
        except (json.JSONDecodeError, jsonschema.ValidationError) as e:
            failures.append((name, temperature, out.outputs[0].finish_reason, str(e)[:80]))
    assert failures == []


def test_choice_and_regex_outputs(embedded_llm):
    outs = embedded_llm.chat(
        [{"role": "user", "content": "Is water wet? Answer yes or no."}],
        [
            SamplingParams(
                temperature=0.8,
                seed=s,
                max_tokens=8,
                structured_outputs=StructuredOutputsParams(choice=("yes", "no")),
            )
            for s in range(1)
        ],
    )
    assert outs[0].outputs[0].text in ("yes", "no")
    out = embedded_llm.generate(
        "My phone number is", SamplingParams(temperature=1.0, seed=1, max_tokens=20,
                                             structured_outputs=StructuredOutputsParams(regex=r" \d{3}-\d{4}"))
    )[0].outputs[0]  # fmt: skip
    import re

    assert re.fullmatch(r" \d{3}-\d{4}", out.text), out.text


def test_greedy_loop_is_cut_well_before_max_tokens(embedded_llm):
    # At greedy the embedded model repeats this pattern indefinitely (measured: all 400
    # tokens without the cut-off).
    prompt = "List of numbers: 1, 1, 1, 1, 1,"
    loose = embedded_llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=160, repetition_detection=False)
    )
    assert loose[0].outputs[0].finish_reason == "length"
    cut = embedded_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=400))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == "repetition"
    assert len(cut.token_ids) <= 64
    assert embedded_llm.engine.core.scheduler.num_repetition_cutoffs >= 1
    # min_tokens holds the cut back as it holds back EOS, then the loop is cut at once
    held = embedded_llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=400, min_tokens=100)
    )
    assert held[0].outputs[0].stop_reason == "repetition"
    assert len(held[0].outputs[0].token_ids) == 100
