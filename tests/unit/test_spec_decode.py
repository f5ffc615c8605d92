"""Speculative decoding with n-gram prompt lookup: the proposer, greedy verification, and the
engine's outputs with speculation on equal to those with it off (alone, batched with
non-speculating requests, under preemption, on prefix-cache hits), block accounting checked
after every step."""

from __future__ import annotations

import random

import pytest

from tests.tiny_models import make_hf_model
from tests.unit.test_invariance import run_checked
from tests.unit.test_model_parity import write_gguf
from tokenmill import LLM, SamplingParams
from tokenmill.config import SpeculativeConfig
from tokenmill.engine.core_types import EngineCoreOutputs, SchedulerStats, SpecDecodeStats
from tokenmill.engine.serialization import decode_outputs, encode_outputs
from tokenmill.spec.ngram import NgramProposer
from tokenmill.spec.verify import accept_greedy

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def test_ngram_proposes_what_followed_the_latest_earlier_occurrence():
    p = NgramProposer(min_n=2, max_n=4, k=3)
    assert p.propose([1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 1, 2, 3], 3) == [7, 7, 1]  # latest match
    assert p.propose([5, 1, 2, 8, 1, 2], 3) == [8, 1, 2]
    assert p.propose([5, 1, 2, 8, 1, 2], 1) == [8]  # max_tokens bounds k
    assert p.propose([1, 2, 3, 4], 3) == []  # no earlier occurrence of any suffix
    assert p.propose([1, 2], 3) == []  # too short to hold a suffix and a match
    assert p.propose([4, 4, 4], 3) == [4]  # overlapping occurrence, one token after it
    # the longest matching suffix wins: (7, 1, 2) occurred before (8, ...), not (1, 2) -> 9
    assert p.propose([7, 1, 2, 8, 1, 2, 9, 7, 1, 2], 1) == [8]
    assert NgramProposer(2, 4, 5).propose([1, 2, 3, 1, 2], 5) == [3, 1, 2]  # runs to the end


def test_greedy_verification_accepts_the_matching_prefix_plus_one():
    assert accept_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all pass: bonus token
    assert accept_greedy([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # second draft rejected
    assert accept_greedy([5, 6, 7], [4, 6, 7, 8]) == [4]  # nothing accepted: the target's
    assert accept_greedy([], [3]) == [3]


def test_speculative_config_is_validated():
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig("medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=8)
    with pytest.raises(ValueError, match="ngram"):
        SpeculativeConfig(ngram_min=3, ngram_max=2)


def test_spec_stats_cross_the_process_boundary():
    stats = SpecDecodeStats()
    stats.record(4, 2)
    stats.record(3, 3)
    assert stats.accepted_per_pos == [2, 2, 1, 0] and stats.accepted_lengths == [0, 0, 1, 1, 0]
    assert stats.mean_acceptance_length == 1 + 5 / 2
    back = decode_outputs(encode_outputs(EngineCoreOutputs([], SchedulerStats(spec_decode=stats))))
    assert back.stats.spec_decode == stats
    assert decode_outputs(encode_outputs(EngineCoreOutputs())).stats.spec_decode is None


def repetitive_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a phrase, so n-gram lookup finds drafts from the first step."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        phrase = [rng.randrange(20, 40000) for _ in range(rng.randrange(3, 12))]
        prompts.append((phrase * rng.randrange(2, 6))[: rng.randrange(8, 60)])
    return prompts


class ScriptedProposer:
    """Drafts from known greedy outputs, one position in 7 wrong: exercises full, partial
    and no acceptance on a random tiny model (whose outputs n-gram lookup rarely predicts)."""

    name = "scripted"

    def __init__(self, prompts: list[list[int]], outputs: list[list[int]]) -> None:
        self.known = {tuple(p): out for p, out in zip(prompts, outputs, strict=True)}

    def propose(self, token_ids, max_tokens: int) -> list[int]:
        for prompt, out in self.known.items():
            if tuple(token_ids[: len(prompt)]) == prompt and len(token_ids) - len(prompt) <= len(
                out
            ):
                done = len(token_ids) - len(prompt)
                drafts = list(out[done : done + max_tokens])
                return [t + 1 if (len(token_ids) + i) % 7 == 0 else t for i, t in enumerate(drafts)]
        return []


@pytest.fixture(scope="module")
def native_path(tmp_path_factory):
    """A tiny model as native Q4_1 (decode steps on the fused native path)."""
    path = tmp_path_factory.mktemp("spec") / "tiny-Q4_1.gguf"
    source = make_hf_model(
        "llama", hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    write_gguf(source, path, "Q4_1")
    return str(path), {"weights": "native"}


@pytest.fixture(scope="module", params=["native-q4_1", "float32"])
def model_path(request, tiny_llama_dir, native_path):
    """The native tiny model, and a float32 one (torch GEMMs, per-layer path)."""
    return (
        native_path
        if request.param == "native-q4_1"
        else (str(tiny_llama_dir), {"weights": "float32"})
    )


def make_llm(model_path, spec: bool, **extra) -> LLM:
    path, kw = model_path
    spec_kw = {"speculative": "ngram", "num_speculative_tokens": 5} if spec else {}
    return LLM(path, kv_cache_memory_gib=0.1, **kw, **spec_kw, **extra)


def greedy_alone(model_path, prompts: list[list[int]]):
    plain = make_llm(model_path, False, max_num_seqs=1)
    return prompts, [run_checked(plain, [p])[0] for p in prompts]


@pytest.fixture(scope="module")
def reference(model_path):
    return greedy_alone(model_path, repetitive_prompts(12))


@pytest.fixture(scope="module")
def native_reference(native_path):
    return greedy_alone(native_path, repetitive_prompts(12))


def scripted(model_path, reference, **extra) -> LLM:
    llm = make_llm(model_path, True, **extra)
    llm.engine.core.scheduler.proposer = ScriptedProposer(*reference)
    return llm


def test_speculation_is_lossless_alone_and_batched(model_path, reference):
    prompts, expected = reference
    for max_num_seqs in (1, 3, 12):
        spec = scripted(model_path, reference, max_num_seqs=max_num_seqs)
        assert run_checked(spec, prompts) == expected, max_num_seqs
        stats = spec.engine.core.scheduler.spec_stats
        if max_num_seqs == 12:  # 12 decoding requests: more rows than MAX_SPEC_ROWS, no drafts
            assert stats.num_drafts == 0
        else:  # full, partial and no acceptance all happened
            assert stats.num_accepted_tokens > 0, max_num_seqs
            assert stats.accepted_lengths[0] > 0 and stats.accepted_lengths[5] > 0  # 0 / all 5
            assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_non_speculating_requests_in_the_same_batch_are_unchanged(native_path, native_reference):
    """Sampled (seeded), logprobs, penalized and min_tokens requests do not speculate;
    batched with speculating ones they give what they give without speculation."""
    model_path, reference = native_path, native_reference
    prompts = reference[0][:6]
    kinds = [
        GREEDY,
        SamplingParams(temperature=0.8, seed=7, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, presence_penalty=0.5, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, min_tokens=10),
        GREEDY,
    ]
    plain = make_llm(model_path, False, max_num_seqs=6)
    spec = scripted(model_path, reference, max_num_seqs=6)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    a = spec.generate(inputs, kinds)
    b = plain.generate(inputs, kinds)
    for x, y in zip(a, b, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        assert x.outputs[0].logprobs == y.outputs[0].logprobs
    assert spec.engine.core.scheduler.spec_stats.num_accepted_tokens > 0


def test_speculation_under_preemption_and_on_prefix_cache_hits(native_path, native_reference):
    model_path, reference = native_path, native_reference
    prompts, expected = reference
    tight = scripted(model_path, reference, max_num_seqs=4, num_kv_blocks=8)
    assert run_checked(tight, prompts) == expected
    assert tight.engine.core.scheduler.num_preemptions > 0
    assert tight.engine.core.scheduler.spec_stats.num_accepted_tokens > 0
    cached = scripted(model_path, reference, max_num_seqs=4)
    assert run_checked(cached, prompts) == expected
    assert run_checked(cached, prompts) == expected  # again: the prompts hit the prefix cache
    assert cached.engine.core.kv_manager.stats.hits > 0


def test_ngram_speculation_on_a_copy_task_is_lossless(embedded_llm):
    """The embedded model asked to repeat a passage: n-gram lookup drafts most tokens."""
    passage = (
        "The committee met on Tuesday to review the annual budget. Members discussed the "
        "allocation of funds for road repairs, the new library wing, and the expansion of the "
        "public transit network."
    )
    messages = [{"role": "user", "content": f"Repeat this passage exactly:\n\n{passage}"}]
    params = SamplingParams(temperature=0, max_tokens=60)
    plain = embedded_llm.chat(messages, params)[0].outputs[0]
    llm = LLM(None, kv_cache_memory_gib=0.1, speculative="ngram", num_speculative_tokens=5)
    ours = llm.chat(messages, params)[0].outputs[0]
    assert ours.token_ids == plain.token_ids and ours.text == plain.text
    stats = llm.engine.core.scheduler.spec_stats
    assert stats.mean_acceptance_length > 2, stats
    llm.engine.core.check_invariants()


def test_drafts_never_run_past_max_tokens_or_the_context():
    llm = LLM(
        None, kv_cache_memory_gib=0.1, max_model_len=40, speculative="ngram",
        num_speculative_tokens=7,
    )  # fmt: skip
    sched = llm.engine.core.scheduler
    original = sched.proposer.propose
    calls = []

    def spy(token_ids, max_tokens):
        calls.append((len(token_ids), max_tokens))
        return original(token_ids, max_tokens)

    sched.proposer.propose = spy
    prompt = [1, 2, 3, 4] * 6
    for max_tokens, expected_len in ((9, 9), (None, 40 - len(prompt))):
        calls.clear()
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        out = llm.generate([{"prompt_token_ids": prompt}], params)
        assert len(out[0].outputs[0].token_ids) == expected_len
        assert calls
        for length, limit in calls:
            produced = length - len(prompt)
            assert limit <= expected_len - produced - 1 and limit <= 40 - length
    assert sched.spec_stats.num_accepted_tokens > 0
    llm.engine.core.check_invariants()
