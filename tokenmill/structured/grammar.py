"""Grammar-constrained decoding with llguidance: compile once (cached), one matcher per
request, a token bitmask per step, the matcher advanced by every sampled token."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import OrderedDict

import llguidance

from tokenmill.model.tokenizer import Tokenizer
from tokenmill.structured.json_options import JSON_OPTIONS
from tokenmill.structured.limits import DEFAULT_LIMITS, ConstraintLimits, check_limits
from tokenmill.structured.spec import StructuredOutputsParams
from tokenmill.structured.stack import LargeStackExecutor

logger = logging.getLogger(__name__)


class GrammarError(ValueError):
    """The schema / regex / grammar cannot be compiled (a client mistake: HTTP 400)."""


_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_ONE = (
    "items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems",
)  # fmt: skip


def strip_format(schema: object, fmt: str) -> object:
    """A copy of schema without `"format": fmt` (format is an annotation in JSON Schema unless
    format assertion is enabled, so dropping one the compiler does not know is sound)."""
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if not (k == "format" and v == fmt)}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strip_format(s, fmt) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strip_format(s, fmt) for name, s in out[key].items()}
    for key in _SUBSCHEMA_ONE:
        if key in out:
            out[key] = strip_format(out[key], fmt)
    return out


def to_llguidance_grammar(spec: StructuredOutputsParams) -> str:
    if spec.json is not None:
        schema = {"type": "object"} if spec.json is True else spec.json
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), defaults=JSON_OPTIONS
            )
        except ValueError as e:
            raise GrammarError(f"invalid JSON schema: {e}") from e
    if spec.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if spec.grammar is not None:
        return llguidance.LLMatcher.grammar_from_lark(spec.grammar)
    return llguidance.grammar_from("choice", json.dumps(list(spec.choice or ())))


class GrammarCompiler:
    """Per-tokenizer compiler with an LRU cache of validated grammars. Constraints are
    checked against `limits` first; llguidance runs on large-stack worker threads."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        cache_size: int = 512,
        ignore_unknown_formats: bool = False,
        limits: ConstraintLimits = DEFAULT_LIMITS,
    ) -> None:
        # ignore_unknown_formats: drop `format` values llguidance does not implement instead of
        # rejecting the schema (sound per JSON Schema, where format is an annotation, but then
        # those strings are not checked).
        self.ignore_unknown_formats = ignore_unknown_formats
        self.ll_tokenizer = llguidance.LLTokenizer(
            tokenizer.hf.to_str(), n_vocab=vocab_size, eos_token=tokenizer.eos_token_ids or None
        )
        self.vocab_size = vocab_size
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self.cache_size = cache_size
        self.limits = limits
        self._executor = LargeStackExecutor()

    def compile(self, spec: StructuredOutputsParams) -> str:
        """The validated llguidance grammar for spec; GrammarError names the problem."""
        return self._executor.run(self._compile, spec)

    async def acompile(self, spec: StructuredOutputsParams) -> str:
        """compile() without blocking the event loop."""
        return await asyncio.wrap_future(self._executor.submit(self._compile, spec))

    def _compile(self, spec: StructuredOutputsParams) -> str:
        try:
            check_limits(spec, self.limits)
        except ValueError as e:
            raise GrammarError(f"structured output ({spec.kind}) is too large: {e}") from e
        key = spec.cache_key()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        grammar = to_llguidance_grammar(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.ll_tokenizer
        )
        stripped: set[str] = set()
        while (
            is_error
            and self.ignore_unknown_formats
            and isinstance(spec.json, dict)
            and (fmt := _unknown_format(messages[0])) not in (None, *stripped)
        ):
            stripped.add(fmt)
            spec = StructuredOutputsParams(json=strip_format(spec.json, fmt))
            grammar = to_llguidance_grammar(spec)
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
                grammar, self.ll_tokenizer
            )
        if is_error:
            raise GrammarError(f"structured output ({spec.kind}) cannot be compiled: {messages[0]}")
        self._check_satisfiable(spec, grammar)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return grammar

    def _check_satisfiable(self, spec: StructuredOutputsParams, grammar: str) -> None:
        """GrammarError when no output can start: a rule that only refers to itself, a regex
        class with no member, a schema whose `$ref`s only point at each other. llguidance
        compiles those; the first token mask is where it finds them empty."""
        m = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if not m.is_error():
            m.compute_bitmask()
        if not m.is_error():
            # Text the constraint forces must be text this model can write: SmolLM2's vocabulary
            # has no token for some control bytes (\x13, \x14, ...), and llguidance's mask then
            # offers a token the matcher rejects as soon as it is sampled.
            forced = m.compute_ff_bytes()
            tokens = self.ll_tokenizer.tokenize_bytes(forced)
            if self.ll_tokenizer.decode_bytes(tokens) != forced:
                raise GrammarError(
                    f"structured output ({spec.kind}) requires text this model's vocabulary "
                    f"cannot produce ({forced[:40]!r})"
                )
        if m.is_error():
            reason = m.get_error().splitlines()[0]
            detail = "" if reason == "NoExtensionBias" else f" ({reason})"
            raise GrammarError(
                f"structured output ({spec.kind}) admits no output{detail}: no text satisfies "
                "it (e.g. a rule or $ref that only leads back to itself, an empty character class)"
            )

    def matcher(self, spec: StructuredOutputsParams) -> llguidance.LLMatcher:
        m = self._executor.run(self._matcher, spec)
        if m.is_error():
            raise GrammarError(
                f"structured output ({spec.kind}) cannot be compiled: {m.get_error()}"
            )
        return m

    def _matcher(self, spec: StructuredOutputsParams) -> llguidance.LLMatcher:
        return llguidance.LLMatcher(self.ll_tokenizer, self._compile(spec), log_level=0)

    def close(self) -> None:
        self._executor.shutdown()


def _unknown_format(message: str) -> str | None:
    prefix = "Unknown format: "
    i = message.find(prefix)
    return message[i + len(prefix) :].split()[0] if i != -1 else None
