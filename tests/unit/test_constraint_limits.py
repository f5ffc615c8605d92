"""Output constraints that would take a process down are refused with a message naming the
limit, and compilation runs where deep recursion cannot crash the caller; constrained output
that is cut says so, and strings that cannot end yet are finished by the closing logic."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import llguidance
import pytest

from tests.hostile_inputs import lark_chain, nested_schema, ref_chain
from tests.tiny_models import embedded_tokenizer
from tokenmill.sampling_params import RepetitionDetection, SamplingParams
from tokenmill.structured.closing import char_tokens, path_to_close
from tokenmill.structured.grammar import GrammarCompiler, GrammarError
from tokenmill.structured.limits import schema_shape
from tokenmill.structured.loops import RepetitionDetector
from tokenmill.structured.spec import StructuredOutputsParams


@pytest.fixture(scope="module")
def compiler():
    tok = embedded_tokenizer()
    return GrammarCompiler(tok, tok.vocab_size)


@pytest.mark.parametrize(
    "spec,limit",
    [
        (StructuredOutputsParams(json=nested_schema(40)), "nested 81 levels deep; the limit is 64"),
        (StructuredOutputsParams(json=ref_chain(3000)), "3001 $ref; the limit is 1000"),
        (StructuredOutputsParams(grammar=lark_chain(3000)), "3002 rules; the limit is 2000"),
        (StructuredOutputsParams(regex="a" * 20000), "20000 bytes; the limit is 16384"),
        (StructuredOutputsParams(grammar="start: " + '"x" ' * 70000), "the limit is 262144"),
    ],
    ids=["depth", "refs", "rules", "regex", "grammar-bytes"],
)
def test_oversized_constraints_are_refused_by_name(compiler, spec, limit):
    with pytest.raises(GrammarError, match="too large") as err:
        compiler.compile(spec)
    assert limit in str(err.value)


@pytest.mark.parametrize(
    "spec,where",
    [
        (StructuredOutputsParams(regex="a{1000000}"), "the regex repeats 1000000 times"),
        (StructuredOutputsParams(regex="[a-z]{3,20001}"), "the regex repeats 20001 times"),
        (StructuredOutputsParams(regex="a{" + "9" * 5000 + "}"), "repeats 1000000000 times"),
        (
            StructuredOutputsParams(json={"type": "string", "pattern": "^a{1000000}$"}),
            "a pattern repeats 1000000 times",
        ),
        (
            StructuredOutputsParams(
                json={"type": "object", "patternProperties": {"^x{50000}$": {}}}
            ),
            "a pattern repeats 50000 times",
        ),
        (StructuredOutputsParams(grammar='start: "a"~100000'), "the grammar repeats 100000"),
        (StructuredOutputsParams(grammar="start: /b{0,99999}/"), "the grammar repeats 99999"),
    ],
    ids=["regex", "regex-range", "regex-huge-number", "pattern", "pattern-key", "lark", "lark-re"],
)
def test_huge_repetition_counts_are_refused(compiler, spec, where):
    """llguidance unrolls counted repetition: a count in the millions breaks its lexer in
    the middle of generation; hundreds of thousands stall a whole engine step."""
    with pytest.raises(GrammarError, match="too large") as err:
        compiler.compile(spec)
    assert where in str(err.value) and "the limit is 10000" in str(err.value)


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputsParams(
            json={
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a",
            }  # fmt: skip
        ),
        StructuredOutputsParams(grammar='start: start "x"'),
        StructuredOutputsParams(grammar="start: a\na: b\nb: a"),
        StructuredOutputsParams(regex="[^\\x00-\\U0010FFFF]"),
    ],
    ids=["ref-cycle", "left-recursion-only", "rule-cycle", "empty-class"],
)
def test_constraints_no_text_satisfies_are_refused(compiler, spec):
    """llguidance compiles these; its first token mask is empty. Refused up front (HTTP 400),
    instead of a generation whose every token is rejected."""
    with pytest.raises(GrammarError, match="admits no output"):
        compiler.compile(spec)


@pytest.mark.parametrize("regex", ["\x13\x1e\x12", "ab\x13", "say \x16"])
def test_forced_text_the_vocabulary_cannot_write_is_refused(compiler, regex):
    """SmolLM2 has no token for some control bytes; llguidance's mask then offers one the
    matcher rejects once sampled (the long fuzz run's finding: a failure mid-stream)."""
    with pytest.raises(GrammarError, match="vocabulary cannot produce"):
        compiler.compile(StructuredOutputsParams(regex=regex))
    compiler.compile(StructuredOutputsParams(regex="ab\x1e"))  # a byte it has


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputsParams(regex="(a{1000}){1000}"),
        StructuredOutputsParams(regex="((a{100}){100}){100}"),
        StructuredOutputsParams(regex="(x{9000}y){20}"),
        StructuredOutputsParams(json={"type": "string", "pattern": "^(ab{500}){500}$"}),
    ],
    ids=["nested", "nested-3", "group", "pattern"],
)
def test_nested_repetition_counts_multiply_into_the_limit(compiler, spec):
    """Every count under the limit, their product a million atoms: each such request held
    an engine step ~0.7 s (every user's tokens waited) before llguidance gave up."""
    with pytest.raises(GrammarError, match="too large") as err:
        compiler.compile(spec)
    assert "unrolls to" in str(err.value) and "the limit is 100000" in str(err.value)


def test_schema_enums_count_as_choices(compiler):
    many = {"type": "object", "properties": {
        "a": {"enum": [f"a{i}" for i in range(6000)]}, "b": {"enum": list(range(6000))}}}  # fmt: skip
    with pytest.raises(GrammarError, match="enums list 12000 values; the limit is 10000"):
        compiler.compile(StructuredOutputsParams(json=many))
    huge = {"type": "string", "enum": [f"value-{i}" for i in range(100_000)]}
    with pytest.raises(GrammarError, match="enums list 100000 values"):  # before any work
        compiler.compile(StructuredOutputsParams(json=huge))
    compiler.compile(StructuredOutputsParams(json={"enum": [f"v{i}" for i in range(10_000)]}))


def test_limits_leave_real_constraints_alone(compiler):
    compiler.compile(StructuredOutputsParams(json=nested_schema(20)))
    compiler.compile(StructuredOutputsParams(json=ref_chain(500)))
    compiler.compile(StructuredOutputsParams(grammar=lark_chain(1500)))
    compiler.compile(StructuredOutputsParams(regex="[0-9]{4}-[0-9]{2}-[0-9]{2}|x{10000}"))
    compiler.compile(StructuredOutputsParams(grammar='start: "a"~3 "b"~2..10000'))
    # recursion with a way out is fine
    compiler.compile(StructuredOutputsParams(grammar='start: "(" start ")" | "x"'))
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    compiler.compile(StructuredOutputsParams(json=tree))


def test_schema_shape_handles_any_depth_without_recursion():
    deep: dict = {}
    node = deep
    for _ in range(100_000):
        node["a"] = {}
        node = node["a"]
    assert schema_shape(deep) == (100_001, 0)


@pytest.mark.parametrize("kind", ["compile", "matcher"])
def test_deep_grammars_compile_off_the_callers_stack(kind):
    """With the limits lifted, a 3,000-rule chain overflows an 8 MB thread stack inside
    llguidance (a segfault); on the compiler's large-stack threads it compiles."""
    script = textwrap.dedent(f"""
        from tests.hostile_inputs import lark_chain, ref_chain
        from tests.tiny_models import embedded_tokenizer
        from tokenmill.structured.grammar import GrammarCompiler
        from tokenmill.structured.limits import ConstraintLimits
        from tokenmill.structured.spec import StructuredOutputsParams
        tok = embedded_tokenizer()
        unlimited = ConstraintLimits(max_schema_refs=10**6, max_grammar_rules=10**6)
        c = GrammarCompiler(tok, tok.vocab_size, limits=unlimited)
        for spec in (StructuredOutputsParams(grammar=lark_chain(3000)),
                     StructuredOutputsParams(json=ref_chain(3000))):
            c.{kind}(spec)
        print("compiled")
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-2000:]


# ---------------------------------------------------------------- closing strings


@pytest.fixture(scope="module")
def chars():
    tok = embedded_tokenizer()
    texts = [tok.decode([t], skip_special_tokens=False) for t in range(tok.vocab_size)]
    return char_tokens(texts)


@pytest.mark.parametrize(
    "fmt,prefix",
    [("email", "abcabcabcabc"), ("date", "20"), ("date-time", "2024-01-0"), ("uuid", "123e"),
     ("ipv4", "10."), ("uri", "http"), ("time", "1")],
)  # fmt: skip
def test_a_string_that_cannot_end_yet_is_closed(compiler, chars, fmt, prefix):
    tok = embedded_tokenizer()
    schema = {"type": "object", "properties": {"x": {"type": "string", "format": fmt}},
              "required": ["x"]}  # fmt: skip
    grammar = compiler.compile(StructuredOutputsParams(json=schema))
    matcher = llguidance.LLMatcher(compiler.ll_tokenizer, grammar, log_level=0)
    assert matcher.consume_tokens(tok.encode_as_text('{"x": "' + prefix))
    quote = chars['"']
    steps = 0
    while not matcher.validate_tokens([quote]):
        token = path_to_close(matcher, chars, '"')
        assert token is not None, f"no way to close the {fmt} string after {steps} steps"
        assert matcher.consume_token(token)
        steps += 1
        assert steps <= 48
    assert matcher.consume_token(quote)
    assert matcher.consume_tokens(tok.encode_as_text("}"))
    assert matcher.is_accepting()


# ---------------------------------------------------------------- scheduler decisions


class _Grammar:
    """A matcher stand-in: accepts every token, complete only when told."""

    def __init__(self, accepting: bool) -> None:
        self.accepting = accepting

    def consume_token(self, token: int) -> bool:
        return True

    def is_stopped(self) -> bool:
        return False

    def is_accepting(self) -> bool:
        return self.accepting


def _looping_request(max_tokens: int, accepting: bool):
    from tokenmill.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    request = Request("r", [1, 2, 3], params, [], 1000)
    request.grammar = _Grammar(accepting)
    request.repetition = RepetitionDetector(RepetitionDetection(4, 2, 4))
    return request


def _scheduler():
    from tokenmill.config import SchedulerConfig
    from tokenmill.kv.manager import KVCacheManager
    from tokenmill.scheduler.scheduler import Scheduler

    return Scheduler(SchedulerConfig(), KVCacheManager(8, 16), 1000)


def _feed(scheduler, request, tokens: list[int]) -> int:
    for i, token in enumerate(tokens):
        request.append_output_token(token)
        if scheduler._check_stop(request, token):
            return i + 1
    return len(tokens)


class _BrokenGrammar(_Grammar):
    """A matcher that breaks on its next token (as llguidance does on a resource limit)."""

    def consume_token(self, token: int) -> bool:
        return False

    def get_error(self) -> str:
        return "lexer error: too many expressions constructed\n<state>..."


def test_a_grammar_that_breaks_mid_way_fails_the_request_not_stop():
    from tokenmill.structured.spec import CONSTRAINT_FAILED

    request = _looping_request(max_tokens=50, accepting=False)
    request.grammar = _BrokenGrammar(False)
    assert _feed(_scheduler(), request, [7, 8, 9]) == 1
    assert request.finish_reason == "error"
    assert (
        request.stop_reason == CONSTRAINT_FAILED + "lexer error: too many expressions constructed"
    )


@pytest.mark.parametrize("accepting,finish", [(False, "length"), (True, "stop")])
def test_a_cut_off_constrained_output_says_whether_it_is_complete(accepting, finish):
    request = _looping_request(max_tokens=500, accepting=accepting)
    request.loop_breaks, request.closing = 2, True  # loops already broken twice
    _feed(_scheduler(), request, [7, 8] * 10)
    assert request.finish_reason == finish and request.stop_reason == "repetition"


def test_loop_breaking_never_goes_past_max_tokens():
    request = _looping_request(max_tokens=6, accepting=False)
    produced = _feed(_scheduler(), request, [7, 8] * 10)
    assert produced == 6 and request.num_output_tokens == 6
    assert request.finish_reason == "length"
