"""Speculative decoding with n-gram prompt lookup: the proposer, greedy verification, and the
engine's outputs with speculation on equal to those with it off (alone, batched with
non-speculating requests, under preemption, on prefix-cache hits), block accounting checked
after every step."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

from tests.tiny_models import make_hf_model
from tests.unit.test_invariance import run_checked
from tests.unit.test_model_parity import write_gguf
from tokenmill import LLM, SamplingParams
from tokenmill.config import MAX_SPEC_ROWS, SpeculativeConfig
from tokenmill.engine.serialization import decode_outputs, encode_outputs
from tokenmill.messages import EngineCoreOutputs
from tokenmill.request import Request
from tokenmill.sampling.sampler import Sampler
from tokenmill.scheduler.output import ScheduledRequest
from tokenmill.spec.draft_policy import (
    FRESH_STEPS,
    MIN_CHAIN_PROB,
    Acceptance,
    Calibration,
    DraftPolicy,
    StepTimes,
    context_bucket,
    expected_tokens,
)
from tokenmill.spec.drafts import Drafts
from tokenmill.spec.ngram import NgramProposer
from tokenmill.spec.verify import accept_drafts
from tokenmill.stats import SchedulerStats, SpecDecodeStats
from tokenmill.worker.model_runner import ModelRunner

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


def test_ngram_lookup_equals_a_plain_scan():
    """The vectorized lookup (candidate ends where the last token recurs) against the plain
    definition: the longest n first, the most recent earlier occurrence, k tokens after it."""

    def scan(tokens, min_n, max_n, k):
        if k <= 0 or len(tokens) <= min_n:
            return []
        for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
            for s in range(len(tokens) - n - 1, -1, -1):
                if tokens[s : s + n] == tokens[-n:]:
                    return tokens[s + n : s + n + k]
        return []

    rng = random.Random(0)
    proposer = NgramProposer(2, 5, 7)
    for _ in range(1000):
        tokens = [rng.randrange(rng.choice([2, 3, 50])) for _ in range(rng.randrange(1, 60))]
        for limit in (0, 1, 3, 7):
            assert proposer.propose(tokens, limit) == scan(tokens, 2, 5, min(7, limit)), tokens


@pytest.mark.parametrize("window", [8192, 24])
def test_the_incremental_ngram_index_equals_the_scan(monkeypatch, window):
    """A decoding request's NgramIndex (extended by each step's new tokens; rebuilt past twice
    the search window, or when handed a shorter sequence) drafts what the scan of the last
    MAX_SEARCH_TOKENS tokens drafts, step after step."""
    from tokenmill.spec import ngram, ngram_index

    monkeypatch.setattr(ngram, "MAX_SEARCH_TOKENS", window)
    monkeypatch.setattr(ngram_index, "MAX_SEARCH_TOKENS", window)
    rng = random.Random(1)
    proposer = NgramProposer(2, 5, 7)
    for _ in range(60):
        vocab = rng.choice([2, 3, 20, 200])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        index = proposer.new_index()
        for _ in range(rng.randrange(1, 120)):
            limit = rng.choice([1, 3, 7])
            drafts = proposer.propose(tokens, limit, index=index)
            assert drafts == proposer.propose(tokens, limit), (tokens, limit)
            # the next step's tokens: an accepted run of the drafts (copying), or a new token
            tokens += drafts[: rng.randrange(len(drafts) + 1)] + [rng.randrange(vocab)]
        assert len(index.tables[2]) <= 2 * window + 1
    index = proposer.new_index()  # handed another, shorter sequence: rebuilt, still right
    assert proposer.propose([1, 2, 3, 1, 2, 3, 1, 2], 3, index=index) == [3, 1, 2]
    assert proposer.propose([5, 6, 5], 3, index=index) == proposer.propose([5, 6, 5], 3)


def test_greedy_verification_accepts_the_matching_prefix_plus_one():
    assert accept_drafts([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all pass: bonus token
    assert accept_drafts([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # second draft rejected
    assert accept_drafts([5, 6, 7], [4, 6, 7, 8]) == [4]  # nothing accepted: the target's
    assert accept_drafts([], [3]) == [3]


def test_speculative_config_is_validated():
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig("medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=8)
    with pytest.raises(ValueError, match="ngram"):
        SpeculativeConfig(ngram_min=3, ngram_max=2)


def test_spec_stats_cross_the_process_boundary():
    stats = SpecDecodeStats()
    stats.record(4, 2, "draft_head")
    stats.record(3, 3, "ngram")
    stats.record(1, 0, "ngram")
    assert stats.accepted_per_pos == [2, 2, 1, 0] and stats.accepted_lengths == [1, 0, 1, 1, 0]
    assert stats.draft_tokens_by_proposer == {"draft_head": 4, "ngram": 4}
    assert stats.accepted_tokens_by_proposer == {"draft_head": 2, "ngram": 3}
    assert stats.mean_acceptance_length == 1 + 5 / 3
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
    needs_features = False
    scores_drafts = False

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

    def draft(self, token_ids, state, max_tokens: int, min_chain_prob: float = 0.0) -> Drafts:
        return Drafts(self.propose(token_ids, max_tokens))


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


# float32 (the torch per-layer path) in the slow suite: the default keeps the native path
@pytest.fixture(
    scope="module", params=["native-q4_1", pytest.param("float32", marks=pytest.mark.slow)]
)
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
    if spec:  # every draft verified (the auto policy sizes them by measured step times)
        spec_kw["speculative_draft_policy"] = extra.pop("speculative_draft_policy", "fixed")
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
    llm.engine.core.drafter.proposer = ScriptedProposer(*reference)
    return llm


def test_speculation_is_lossless_alone_and_batched(model_path, reference):
    prompts, expected = reference
    for max_num_seqs in (1, 3, 12):
        spec = scripted(model_path, reference, max_num_seqs=max_num_seqs)
        assert run_checked(spec, prompts) == expected, max_num_seqs
        stats = spec.engine.core.drafter.stats
        if max_num_seqs == 12:  # 12 decoding requests: more rows than MAX_SPEC_ROWS, no drafts
            assert stats.num_drafts == 0
        else:  # full, partial and no acceptance all happened
            assert stats.num_accepted_tokens > 0, max_num_seqs
            assert stats.accepted_lengths[0] > 0 and stats.accepted_lengths[5] > 0  # 0 / all 5
            assert stats.num_accepted_tokens < stats.num_draft_tokens


def test_greedy_rows_read_out_their_argmax_alone_with_the_same_tokens(
    native_path, native_reference, monkeypatch
):
    """Greedy decode and verification rows find the lm_head's argmax from the integer-dot
    high-byte estimate (PackedLinear.greedy_argmax): the same tokens as full logits, alone,
    batched and speculating; rows that want logprobs (or any other logit reader) still get
    full logits."""
    from tokenmill.kernels import ops
    from tokenmill.model.linear import PackedLinear

    if ops.int_dot_kind() == 0:
        pytest.skip("no integer-dot kernel on this machine")
    prompts, _ = native_reference
    calls = []
    original = PackedLinear.greedy_argmax

    def counted(self, x):
        calls.append(x.shape[0])
        return original(self, x)

    monkeypatch.setattr(PackedLinear, "greedy_argmax", counted)
    monkeypatch.setenv("TOKENMILL_GREEDY_ARGMAX", "0")  # every logit computed
    expected = run_checked(make_llm(native_path, False, max_num_seqs=1), prompts)
    spec_full = scripted(native_path, (prompts, expected), max_num_seqs=6)
    assert run_checked(spec_full, prompts) == expected and not calls
    monkeypatch.setenv("TOKENMILL_GREEDY_ARGMAX", "1")
    # from one row on (by default steps of 1-2 greedy rows read out every logit: faster there)
    monkeypatch.setattr("tokenmill.model.linear.GREEDY_ARGMAX_MIN_ROWS", 1)
    for spec, max_num_seqs in ((False, 1), (False, 6), (True, 1), (True, 6)):
        if spec:
            llm = scripted(native_path, (prompts, expected), max_num_seqs=max_num_seqs)
        else:
            llm = make_llm(native_path, False, max_num_seqs=max_num_seqs)
        calls.clear()
        assert run_checked(llm, prompts) == expected, (spec, max_num_seqs)
        assert calls, (spec, max_num_seqs)
        assert max_num_seqs == 1 or max(calls) > 1  # several rows at once
        if spec:
            assert llm.engine.core.drafter.stats.num_accepted_tokens > 0
    monkeypatch.delenv("TOKENMILL_GREEDY_ARGMAX")
    monkeypatch.undo()  # the default threshold: a 1-row greedy readout computes the logits
    lm_head = make_llm(native_path, False, max_num_seqs=1).engine.core.model.lm_head
    hidden = torch.randn(8, lm_head.weight.cols)
    assert lm_head.greedy_argmax(hidden[:1]) is None and lm_head.greedy_argmax(hidden[:2]) is None
    assert torch.equal(lm_head.greedy_argmax(hidden[:3]), lm_head(hidden[:3]).max(dim=1).indices)
    monkeypatch.setattr(PackedLinear, "greedy_argmax", counted)
    with_logprobs = make_llm(native_path, False, max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=2, ignore_eos=True)
    calls.clear()
    out = with_logprobs.generate([{"prompt_token_ids": prompts[0]}], params)[0].outputs[0]
    assert not calls and len(out.logprobs) == 8


def test_every_sampling_option_gives_what_it_gives_without_speculation(native_path):
    """Seeded sampling (top-k / top-p / min-p), logprobs, penalties, logit bias and min_tokens
    all speculate: each verified position samples as if the drafts before it had been
    sampled, with the uniform a seeded request would draw there, so tokens and logprobs are
    the same with speculation on and off (batched with greedy requests)."""
    prompts = repetitive_prompts(10, seed=3)
    kinds = [
        GREEDY,
        SamplingParams(temperature=0.8, seed=7, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=1, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.7, min_p=0.05, seed=2, max_tokens=30, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, presence_penalty=0.5, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=4, max_tokens=30, frequency_penalty=0.4,
                       repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, logit_bias={100: 2.0, 200: -5.0}, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, min_tokens=10),
        GREEDY,
    ]  # fmt: skip
    inputs = [{"prompt_token_ids": p} for p in prompts]
    plain = make_llm(native_path, False, max_num_seqs=1)
    expected = plain.generate(inputs, kinds)
    outputs = [o.outputs[0].token_ids for o in expected]
    for max_num_seqs in (1, 4):
        spec = make_llm(native_path, True, max_num_seqs=max_num_seqs)
        spec.engine.core.drafter.proposer = ScriptedProposer(prompts, outputs)
        ours = spec.generate(inputs, kinds)
        for kind, x, y in zip(kinds, ours, expected, strict=True):
            if max_num_seqs == 1:  # the same rows on the same kernels: the same bits
                assert x.outputs[0].token_ids == y.outputs[0].token_ids, kind
                assert x.outputs[0].logprobs == y.outputs[0].logprobs, kind
            else:
                # batched, a decode row beside another request's prefill runs the fp32 GEMM
                # (not the integer-dot GEMV): logits move by ~1e-4
                assert x.outputs[0].token_ids == y.outputs[0].token_ids, kind
                assert logprob_gap(x.outputs[0].logprobs, y.outputs[0].logprobs) < 1e-3, kind
        stats = spec.engine.core.drafter.stats
        assert stats.num_accepted_tokens > 0 and stats.accepted_lengths[0] > 0
        spec.engine.core.check_invariants()


def logprob_gap(a, b) -> float:
    """Largest difference between two outputs' logprobs (None: none asked for)."""
    if a is None or b is None:
        assert a is b
        return 0.0
    gap = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        gap = max(gap, *(abs(x[t].logprob - y[t].logprob) for t in x))
    return gap


def sample_verified(target_logits: torch.Tensor, drafts: list[int], n: int, temperature: float):
    """n requests that all drafted `drafts`, verified by the model runner's own code on
    given target logits (row i: the logits after drafts[:i]). Returns each request's tokens."""
    runner = object.__new__(ModelRunner)
    runner.model = SimpleNamespace(compute_logits=lambda rows: rows)  # hidden = logits
    runner.sampler = Sampler()
    runner.keep_features = False
    params = SamplingParams(temperature=temperature, max_tokens=8)
    k = len(drafts) + 1
    verify = [
        (ScheduledRequest(Request(str(i), [1, 2, 3], params, [], 64), k, [], list(drafts)), i * k)
        for i in range(n)
    ]
    sampled: dict[str, list[int]] = {}
    runner._verify(target_logits.repeat(n, 1), verify, sampled, {}, {})
    return [sampled[str(i)] for i in range(n)]


def chi_square_p(observed: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(observed), minlength=probs.numel()).double()
    expected = probs.double() * counts.sum()
    keep = expected >= 5  # the rest pooled into one bin
    obs = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    exp = torch.cat([expected[keep], expected[~keep].sum().view(1)])
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def test_sampled_verification_keeps_the_target_distribution():
    """Rejection sampling with drafted tokens: the first token follows the target's p0, the
    second (where the first draft was accepted) p1, the third p2, over 30000 requests, by a
    chi-square test; the test itself rejects a verifier that resamples a rejected position
    from p rather than from p without the draft."""
    torch.manual_seed(0)
    vocab, temperature = 12, 0.8
    logits = torch.randn(3, vocab) * 1.5
    drafts = [int(logits[0].argsort()[-2]), int(logits[1].argmax())]  # a likely, a likelier
    out = sample_verified(logits, drafts, 30000, temperature)
    probs = (logits / temperature).softmax(dim=1)
    assert chi_square_p([t[0] for t in out], probs[0]) > 1e-3
    second = [t[1] for t in out if t[0] == drafts[0]]
    third = [t[2] for t in out if t[:2] == drafts]
    assert len(second) > 3000 and len(third) > 1000
    assert chi_square_p(second, probs[1]) > 1e-3
    assert chi_square_p(third, probs[2]) > 1e-3
    assert all(len(t) == 1 for t in out if t[0] != drafts[0])  # a rejection ends the step
    # a wrong verifier: accept with probability p(d), else resample from p (d included)
    u = torch.rand(30000)
    redraw = torch.multinomial(probs[0], 30000, replacement=True)
    wrong = torch.where(u < probs[0, drafts[0]], drafts[0], redraw).tolist()
    assert chi_square_p(wrong, probs[0]) < 1e-6


def test_speculation_under_preemption_and_on_prefix_cache_hits(native_path, native_reference):
    model_path, reference = native_path, native_reference
    prompts, expected = reference
    tight = scripted(model_path, reference, max_num_seqs=4, num_kv_blocks=8)
    assert run_checked(tight, prompts) == expected
    assert tight.engine.core.scheduler.num_preemptions > 0
    assert tight.engine.core.drafter.stats.num_accepted_tokens > 0
    cached = scripted(model_path, reference, max_num_seqs=4)
    assert run_checked(cached, prompts) == expected
    assert run_checked(cached, prompts) == expected  # again: the prompts hit the prefix cache
    assert cached.engine.core.kv_manager.stats.hits > 0


def test_a_stop_inside_the_accepted_drafts_ends_the_request_there(native_path, native_reference):
    """A stop token among accepted drafts: the tokens verified after it are dropped and the
    request's computed count stops at its last kept token (it once ran past its blocks' hashes
    when the dropped tokens crossed a block boundary)."""
    prompts, expected = native_reference
    for block_size in (4, 16):
        for j in (3, 6, 9):
            stops = [out[j] for out in expected]
            params = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=stops)
            plain = make_llm(native_path, False, block_size=block_size)
            spec = scripted(native_path, native_reference, block_size=block_size, max_num_seqs=3)
            assert run_checked(spec, prompts, params) == run_checked(plain, prompts, params)
            assert spec.engine.core.drafter.stats.num_accepted_tokens > 0


COPY_TASK = [
    {
        "role": "user",
        "content": "Repeat this passage exactly:\n\nThe committee met on Tuesday to review the "
        "annual budget. Members discussed the allocation of funds for road repairs, the new "
        "library wing, and the expansion of the public transit network.",
    }
]


def ngram_llm() -> LLM:
    """The embedded model with every n-gram draft verified."""
    return LLM(
        None,
        kv_cache_memory_gib=0.1,
        speculative="ngram",
        num_speculative_tokens=5,
        speculative_draft_policy="fixed",
    )


def test_ngram_speculation_on_a_copy_task_is_lossless(embedded_llm):
    """The embedded model asked to repeat a passage: n-gram lookup drafts most tokens."""
    params = SamplingParams(temperature=0, max_tokens=60)
    plain = embedded_llm.chat(COPY_TASK, params)[0].outputs[0]
    llm = ngram_llm()
    ours = llm.chat(COPY_TASK, params)[0].outputs[0]
    assert ours.token_ids == plain.token_ids and ours.text == plain.text
    stats = llm.engine.core.drafter.stats
    assert stats.mean_acceptance_length > 2, stats
    llm.engine.core.check_invariants()


def test_stop_strings_inside_accepted_drafts_end_the_output_there(embedded_llm):
    """Several tokens arrive per step under speculation: the output keeps the tokens up to the
    one that completed a stop string (as without speculation), not the rest of the step's."""
    llm = ngram_llm()
    for stop, include in (("library", False), ("funds for", True), ("Members", False)):
        params = SamplingParams(
            temperature=0, max_tokens=60, stop=[stop], include_stop_str_in_output=include,
            logprobs=2,
        )  # fmt: skip
        plain = embedded_llm.chat(COPY_TASK, params)[0].outputs[0]
        ours = llm.chat(COPY_TASK, params)[0].outputs[0]
        assert ours.token_ids == plain.token_ids, stop
        assert ours.text == plain.text and ours.finish_reason == plain.finish_reason == "stop"
        assert len(ours.logprobs) == len(ours.token_ids)
    assert llm.engine.core.drafter.stats.num_accepted_tokens > 0
    llm.engine.core.check_invariants()


def test_drafts_never_run_past_max_tokens_or_the_context():
    llm = LLM(
        None, kv_cache_memory_gib=0.1, max_model_len=40, speculative="ngram",
        speculative_draft_policy="fixed",
        num_speculative_tokens=7,
    )  # fmt: skip
    drafter = llm.engine.core.drafter
    original = drafter.proposer.propose
    calls = []

    def spy(token_ids, max_tokens, **kw):
        calls.append((len(token_ids), max_tokens))
        return original(token_ids, max_tokens, **kw)

    drafter.proposer.propose = spy
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
    assert drafter.stats.num_accepted_tokens > 0
    llm.engine.core.check_invariants()


def test_step_times_are_measured_and_extrapolated_until_measured():
    times = StepTimes()
    assert times.estimate(3) == pytest.approx(1.7)  # the prior: 0.35 of a step per extra row
    for _ in range(3):
        times.observe(1, 0.010)
    assert times.estimate(1) == 0.010 and times.estimate(3) == pytest.approx(0.017)
    times.observe(3, 0.500)  # a first slow step of a new shape: not trusted alone
    times.observe(3, 0.030)
    assert times.estimate(3) == pytest.approx(0.017)
    times.observe(3, 0.031)  # measured: rows cost more than the prior says
    assert times.estimate(3) == 0.031  # the median
    assert times.estimate(4) == pytest.approx(0.031 / 1.7 * 2.05)  # from the nearest measured
    times.observe(9, 1.0)  # beyond the verification rows: ignored
    assert times.measured(MAX_SPEC_ROWS) is None
    # another context size is measured on its own (attention grows with the context)
    assert times.estimate(3, context_tokens=3000) == pytest.approx(1.7)
    for _ in range(3):
        times.observe(1, 0.020, context_tokens=3000)
    assert times.estimate(3, context_tokens=3000) == pytest.approx(0.034)
    assert times.estimate(3, context_tokens=500) == 0.031
    assert [context_bucket(n) for n in (0, 1023, 1024, 2047, 2048, 10**9)] == [0, 0, 1, 1, 2, 7]


def test_the_draft_policy_drafts_only_where_it_pays():
    times = StepTimes()
    for rows, ms in enumerate([4.0, 5.4, 6.8, 8.2, 9.6, 11.0, 12.4, 13.8], start=1):
        for _ in range(3):
            times.observe(rows, ms / 1000)  # each extra row: 0.35 of a 1-row step
    policy = DraftPolicy(times)
    policy.start_step(1)
    assert policy.num_drafts(0.2, 5) == 0  # chat-like acceptance: off
    k = policy.num_drafts(0.9, 7)  # copy-like acceptance: several
    assert 3 <= k <= 7
    assert policy.num_drafts(0.9, 2) == 2  # bounded by what was proposed
    policy.commit(0.9, k)
    assert policy.rows == 1 + k
    busy = DraftPolicy(times)
    busy.start_step(7)  # seven rows already: one more costs as much, yields a fraction
    assert busy.num_drafts(0.5, 1) == 0
    fixed = DraftPolicy(times, adaptive=False)
    fixed.start_step(1)
    assert fixed.num_drafts(0.0, 5) == 5
    assert expected_tokens(0.5, 2) == 1.75


def test_a_row_count_not_chosen_lately_is_measured_again():
    """A verdict on a row count expires: slow first steps of 2 rows do not keep the policy off
    2-row steps for good (it extrapolates again, so it tries them again)."""
    times = StepTimes()
    for _ in range(3):
        times.observe(1, 0.004)
        times.observe(2, 0.010)  # slow once (a cold start, a noisy neighbour)
    assert times.estimate(2) == 0.010
    for _ in range(FRESH_STEPS):
        times.observe(1, 0.004)  # hundreds of steps without 2 rows
    assert times.measured(2) is None
    assert times.estimate(2) == pytest.approx(0.004 * 1.35)  # the prior again: explored
    for _ in range(3):
        times.observe(2, 0.0045)
    assert times.estimate(2) == 0.0045


def test_a_proposer_s_drafting_time_counts_against_its_drafts():
    """The head's drafts cost the head's time as well as verification rows: measured per
    draft, it shortens the chains (and stops drafts that only pay when they are free)."""
    times = StepTimes()
    for rows, ms in enumerate([4.0, 4.6, 5.6, 6.6, 7.6, 8.6, 9.6, 10.6], start=1):
        for _ in range(3):
            times.observe(rows, ms / 1000)
    policy = DraftPolicy(times)
    policy.start_step(1)
    free = policy.num_drafts(0.6, 7)
    assert free >= 2
    policy.drafted("proposer", 2, 0.002)  # 1 ms per draft
    assert policy.draft_costs["proposer"].per_draft() == pytest.approx(0.001)
    policy.start_step(1)
    costed = policy.num_drafts(0.6, 7, policy.draft_costs["proposer"].per_draft())
    assert 0 < costed < free
    assert policy.num_drafts(0.6, 7, 0.004) == 0  # a draft as dear as a step: none
    policy.drafted("lookup", 0, 0.001)  # a lookup that found nothing: time spent, no cost
    assert policy.draft_costs["lookup"].per_draft() == 0.0
    assert policy.drafting == pytest.approx(0.001)  # this step's drafting time so far
    # a slow first chain (a cold start) prices the head out; unasked, the verdict expires
    slow = policy.draft_costs["proposer"]
    slow.observe(1, 0.050)
    assert policy.num_drafts(0.6, 7, slow.per_draft()) == 0
    for _ in range(FRESH_STEPS - 1):
        slow.idle()
    assert slow.per_draft() > 0.004
    slow.idle()
    assert slow.per_draft() == 0.0 and policy.num_drafts(0.6, 7, slow.per_draft()) > 0


def test_a_head_s_drafts_are_sized_by_their_calibrated_probabilities():
    """A draft head scores each draft; the policy verifies a chain as far as its drafts'
    measured acceptance at those scores pays (1 + P_1 + ... + P_k tokens for k rows), and
    learns that acceptance per score bin from the verifications."""
    times = StepTimes()
    for rows, ms in enumerate([4.0, 5.2, 6.4, 7.6, 8.8, 10.0, 11.2, 12.4], start=1):
        for _ in range(3):
            times.observe(rows, ms / 1000)  # each extra row: 0.3 of a 1-row step
    policy = DraftPolicy(times)
    cal = policy.calibration
    assert cal.rate(0.95) == pytest.approx(0.85) and cal.rate(0.55) == pytest.approx(0.45)
    policy.start_step(1)
    assert policy.num_scored_drafts([0.98, 0.97, 0.96, 0.25, 0.9]) == 3  # stops at the doubt
    assert policy.num_scored_drafts([0.3, 0.99]) == 0  # a first draft unlikely: none
    assert policy.num_scored_drafts([]) == 0
    # the head's cut-off: a row costs 0.3 of this step, so a draft below that never pays
    assert policy.min_chain_prob() == pytest.approx(0.3)
    policy.commit_scored([0.98, 0.97, 0.96], 2)
    assert policy.rows == 3 and policy.tokens == pytest.approx(1 + 0.85 + 0.85**2)
    busy = DraftPolicy(times)
    busy.start_step(8)
    assert busy.min_chain_prob() >= MIN_CHAIN_PROB
    # measured: the 0.9-1.0 bin is right every time, the 0.5-0.6 bin never
    for _ in range(200):
        cal.record([0.95, 0.55], 1)  # first accepted, second rejected
    assert cal.rate(0.95) > 0.97 and cal.rate(0.55) < 0.05
    assert cal.best_rate() == cal.rate(0.99)
    cal.record([0.95, 0.95, 0.15], 0)  # only the first draft was tested: a failure
    assert cal.trials[1] == 0.0  # the untested 0.1-0.2 draft counts nowhere
    # a head that stopped paying everywhere (copying): not drafting, the evidence fades
    for _ in range(300):
        for b in range(10):
            cal.record([b / 10 + 0.05], 0)
    assert policy.num_drafts(cal.best_rate(), 7) == 0
    for _ in range(1000):
        cal.idle()
    assert policy.num_drafts(cal.best_rate(), 7) > 0  # tried again
    fixed = DraftPolicy(times, adaptive=False)
    fixed.start_step(1)
    assert fixed.num_scored_drafts([0.1, 0.1]) == 2
    assert isinstance(Calibration().chain([0.95, 0.95])[1], float)


def test_acceptance_estimate_follows_recent_drafts():
    a = Acceptance()
    assert a.rate() == pytest.approx(0.7)  # the first prior
    for _ in range(10):
        a.record(4, 0)
    assert a.rate() < 0.3
    for _ in range(10):
        a.record(4, 4)
    assert a.rate() > 0.9
    for _ in range(10):
        a.record(4, 0)
    low = a.rate()
    for _ in range(20):  # steps without drafts: the failures fade, the prior comes back
        a.idle()
    assert low < 0.45 and low + 0.15 < a.rate() <= 0.7


def test_a_new_request_starts_from_the_server_wide_acceptance():
    """A proposer that does not pay for this traffic is not tried afresh at every request:
    the server's recent rate is a new request's prior; it drifts back up while nobody drafts."""
    policy = DraftPolicy(StepTimes())
    assert policy.acceptance(Acceptance()) == pytest.approx(0.7)
    for _ in range(40):  # earlier requests: every draft rejected
        policy.record(Acceptance(), 3, 0)
    fresh = Acceptance()
    assert policy.acceptance(fresh) < 0.1
    for _ in range(3):  # its own drafts pass: its estimate follows them
        policy.record(fresh, 3, 3)
    assert policy.acceptance(fresh) > 0.7
    low = policy.acceptance(Acceptance())
    assert low < 0.3
    for _ in range(400):  # request-steps without drafts
        policy.idle(Acceptance())
    assert policy.acceptance(Acceptance()) > low + 0.1


def test_each_draft_source_keeps_its_own_server_wide_acceptance():
    """A draft head's failing drafts do not talk the server out of the n-gram lookup it tries
    first, nor the other way round."""
    policy = DraftPolicy(StepTimes())
    for _ in range(40):
        policy.record(Acceptance(), 3, 0, "proposer")
        policy.record(Acceptance(), 3, 3, "lookup")
    assert policy.acceptance(Acceptance(), "proposer") < 0.1
    assert policy.acceptance(Acceptance(), "lookup") > 0.9
    assert policy.acceptance(Acceptance()) == policy.acceptance(Acceptance(), "proposer")


def test_the_auto_policy_stops_drafting_for_a_request_whose_drafts_fail(
    native_path, native_reference
):
    """Every draft wrong, verification rows costed as on a CPU: after a few steps the request
    speculates no more, and its output is still the one without speculation."""
    prompts, expected = native_reference
    wrong = [[t + 1 for t in out] for out in expected]
    llm = make_llm(native_path, True, max_num_seqs=1, speculative_draft_policy="auto")
    drafter = llm.engine.core.drafter
    drafter.proposer = ScriptedProposer(prompts[:1], wrong[:1])
    drafter.proposer.propose = lambda ids, n, known=drafter.proposer.known: list(
        next(iter(known.values()))[len(ids) - len(prompts[0]) :][:n]
    )
    for rows in range(1, MAX_SPEC_ROWS + 1):
        for _ in range(3):
            drafter.step_times.observe(rows, 0.004 * (1 + 0.45 * (rows - 1)))
    drafter.step_times.observe = lambda *_: None  # keep the costs above
    assert run_checked(llm, prompts[:1]) == expected[:1]
    stats = drafter.stats
    assert 0 < stats.num_drafts <= 5 and stats.num_accepted_tokens == 0


def test_constrained_output_speculates_within_its_grammar(native_path):
    """JSON-schema and regex requests: drafts cut at the first token the grammar rejects,
    each position verified under its own mask (the matcher advanced through the drafts before
    it, rolled back after); output identical to decoding without drafts, and valid."""
    import jsonschema

    from tokenmill.structured.spec import StructuredOutputsParams

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["name", "n"],
    }
    kinds = [
        SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=schema)),
        SamplingParams(temperature=0.8, seed=5, max_tokens=60,
                       structured_outputs=StructuredOutputsParams(json=schema)),
        SamplingParams(temperature=0, max_tokens=40,
                       structured_outputs=StructuredOutputsParams(regex=r"[a-z]{3,8}( [a-z]{3,8}){2,5}")),
    ]  # fmt: skip
    prompts = repetitive_prompts(3, seed=11)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    plain = make_llm(native_path, False, max_num_seqs=1)
    expected = plain.generate(inputs, kinds)
    outputs = [o.outputs[0].token_ids for o in expected]
    spec = make_llm(native_path, True, max_num_seqs=1)
    proposer = ScriptedProposer(prompts, outputs)  # one draft in 7 off by one token id
    proposed = []
    spec.engine.core.drafter.proposer = proposer
    original = proposer.propose
    proposer.propose = lambda ids, n: proposed.append(original(ids, n)) or proposed[-1]
    ours = spec.generate(inputs, kinds)
    for x, y in zip(ours, expected, strict=True):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
    for o in ours[:2]:
        jsonschema.validate(json.loads(o.outputs[0].text), schema)
    stats = spec.engine.core.drafter.stats
    assert stats.num_accepted_tokens > 0
    # the off-by-one drafts broke the grammar: cut before verification
    assert sum(map(len, proposed)) > stats.num_draft_tokens
    spec.engine.core.check_invariants()


def test_constrained_drafts_stop_where_closing_starts(native_path):
    """Constrained output closes by a rule of its own once few tokens are left (the closing
    reserve); no verified position may lie past that point, or it would be sampled without
    the rule (a draft head once ran JSON past it and gave different output)."""
    from tokenmill.scheduler.scheduler import closing_reserve
    from tokenmill.structured.spec import StructuredOutputsParams

    regex = StructuredOutputsParams(regex=r"[a-z]{3,8}( [a-z]{3,8}){2,30}")
    prompts = repetitive_prompts(2, seed=3)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    for max_tokens in (30, 60):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=regex)
        plain = make_llm(native_path, False, max_num_seqs=1)
        expected = [o.outputs[0].token_ids for o in plain.generate(inputs, params)]
        spec = make_llm(native_path, True, max_num_seqs=1)
        proposer = ScriptedProposer(prompts, [list(o) for o in expected])
        calls = []
        original = proposer.propose

        def spy(ids, n, original=original, calls=calls):
            prompt = next(p for p in prompts if list(ids[: len(p)]) == p)
            calls.append((len(ids) - len(prompt), n))
            return original(ids, n)

        proposer.propose = spy
        spec.engine.core.drafter.proposer = proposer
        ours = [o.outputs[0].token_ids for o in spec.generate(inputs, params)]
        assert ours == expected
        assert calls and spec.engine.core.drafter.stats.num_accepted_tokens > 0
        for produced, n in calls:
            assert n <= max_tokens - produced - closing_reserve(max_tokens) - 1
        spec.engine.core.check_invariants()


def test_the_lookup_before_a_draft_head_is_on_unless_switched_off_on_the_command_line():
    import argparse

    from tokenmill.engine.arg_utils import EngineArgs, add_engine_args

    def spec(*argv: str):
        p = argparse.ArgumentParser()
        add_engine_args(p)
        args = EngineArgs.from_cli_args(p.parse_args(["--speculator", "head.safetensors", *argv]))
        return args.create_engine_config().speculative_config

    assert spec().method == "draft_head" and spec().lookup_first
    assert not spec("--no-speculative-lookup").lookup_first
