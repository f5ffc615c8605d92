"""Grammars from the JSON Schema sample: every schema that compiles accepts its valid
instances and rejects its invalid ones (walking the tokenized instance through the matcher)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.tiny_models import embedded_tokenizer
from tokenmill.sampling_params import RepetitionDetection
from tokenmill.structured.grammar import GrammarCompiler, GrammarError
from tokenmill.structured.loops import RepetitionDetector
from tokenmill.structured.spec import StructuredOutputsParams

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "jsonschemabench-sample"
# llguidance limitation, not ours: allOf intersecting an object that lists `metadata` in
# `properties` with one that does not rejects the (valid) `metadata` object.
KNOWN_REJECTED_VALID = {"JsonSchemaStore---briefcase-schema.json": 2}


def sample_files() -> list[Path]:
    return sorted(p for p in SAMPLE.iterdir() if p.name != "README.md")


def test_schema_sample_accepts_valid_rejects_invalid(capsys):
    tok = embedded_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size)
    failures: Counter[str] = Counter()
    rejected_valid: Counter[str] = Counter()
    accepted_invalid: list[str] = []
    n_valid = n_invalid = compiled = 0
    files = sample_files()
    for path in files:
        doc = json.loads(path.read_text())
        schema = doc["schema"] if isinstance(doc["schema"], dict) else {}
        spec = StructuredOutputsParams(json=schema)
        try:
            compiler.compile(spec)
        except GrammarError as e:
            failures[str(e).split("compiled: ")[-1].split("\n")[0][:60]] += 1
            continue
        compiled += 1
        for test in doc["tests"]:
            matcher = compiler.matcher(spec)
            ids = tok.encode(json.dumps(test["data"], ensure_ascii=False), add_special_tokens=False)
            accepted = matcher.consume_tokens(ids) and matcher.is_accepting()
            if test["valid"]:
                n_valid += 1
                if not accepted:
                    rejected_valid[path.name] += 1
            else:
                n_invalid += 1
                if accepted:
                    accepted_invalid.append(path.name)
    with capsys.disabled():  # the compile-failure count is reported, not hidden
        print(
            f"\nschema sample: {len(files)} schemas, {compiled} compile, {sum(failures.values())} rejected by "
            f"the compiler {dict(failures.most_common(6))}; {n_valid} valid instances "
            f"({sum(rejected_valid.values())} rejected), {n_invalid} invalid ({len(accepted_invalid)} accepted)"
        )
    assert compiled >= 350 and n_valid >= 450 and n_invalid >= 600
    assert accepted_invalid == []
    assert dict(rejected_valid) == KNOWN_REJECTED_VALID


def test_invalid_schema_error_names_the_problem():
    tok = embedded_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size)
    with pytest.raises(GrammarError, match="not"):
        compiler.compile(
            StructuredOutputsParams(json={"type": "object", "not": {"required": ["a"]}})
        )
    with pytest.raises(GrammarError):
        compiler.compile(StructuredOutputsParams(regex="(unclosed"))
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json=True, regex="a")


def test_choice_and_regex_matchers():
    tok = embedded_tokenizer()
    compiler = GrammarCompiler(tok, tok.vocab_size)
    m = compiler.matcher(StructuredOutputsParams(choice=("yes", "no")))
    assert m.consume_tokens(tok.encode("no", add_special_tokens=False)) and m.is_accepting()
    m = compiler.matcher(StructuredOutputsParams(regex=r"\d{3}-\d{4}"))
    assert not m.consume_tokens(tok.encode("12a", add_special_tokens=False))


@pytest.mark.parametrize(
    "tokens,period",
    [
        ([1, 2, 3] + [7] * 48, 1),
        ([5, 6] + [1, 2, 3, 4] * 12, 4),
        (list(range(40)) + [9, 8] * 24, 2),
    ],
)
def test_repetition_detector_finds_cycles(tokens, period):
    det = RepetitionDetector(RepetitionDetection(max_period=32, min_repeats=4, min_span=48))
    found = [det.update(tokens[: i + 1]) for i in range(len(tokens))]
    hits = [i for i, f in enumerate(found) if f]
    assert hits, "cycle not found"
    assert found[hits[0]] == period
    assert hits[0] + 1 == len(tokens), "found exactly when the span reaches min_span"


def test_repetition_detector_ignores_non_loops():
    det = RepetitionDetector(RepetitionDetection(max_period=32, min_repeats=4, min_span=48))
    text = list(range(300))  # no repeats
    assert not any(det.update(text[: i + 1]) for i in range(len(text)))
    det = RepetitionDetector(RepetitionDetection(max_period=8, min_repeats=4, min_span=48))
    long_cycle = list(range(20)) * 6  # period 20 > max_period
    assert not any(det.update(long_cycle[: i + 1]) for i in range(len(long_cycle)))
    det = RepetitionDetector(RepetitionDetection(max_period=32, min_repeats=4, min_span=48))
    three_times = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16] * 3  # only 3 repeats
    assert not any(det.update(three_times[: i + 1]) for i in range(len(three_times)))
