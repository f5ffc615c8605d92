from __future__ import annotations

import math

import torch

from tokenmill.request import Request
from tokenmill.sampling.penalties import apply_penalties
from tokenmill.sampling.sampler import (
    Sampler,
    apply_min_p,
    apply_top_k_top_p,
    gather_logprobs,
    inverse_cdf_sample,
)
from tokenmill.sampling_params import SamplingParams


def make_request(i: int = 0, prompt=(1, 2, 3), **kw) -> Request:
    return Request(f"r{i}", list(prompt), SamplingParams(**kw), [0], 1000)


def meta_for(reqs):
    from tokenmill.sampling.metadata import SamplingMetadata

    return SamplingMetadata.from_requests(reqs)


def test_top_k_keeps_exactly_k():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    out = apply_top_k_top_p(logits, torch.tensor([2, 0]), None)
    assert torch.isinf(out[0]).tolist() == [True, False, True, False, True]
    assert not torch.isinf(out[1]).any()  # k = 0 disables


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_top_k_top_p(probs.log(), None, torch.tensor([0.75]))
    assert torch.isinf(out[0]).tolist() == [False, False, True, True]
    out = apply_top_k_top_p(probs.log(), None, torch.tensor([0.1]))
    assert torch.isinf(out[0]).tolist() == [False, True, True, True]  # never empty


def test_min_p_relative_to_top_token():
    probs = torch.tensor([[0.6, 0.3, 0.07, 0.03]])
    out = apply_min_p(probs.log(), torch.tensor([0.2]))  # threshold 0.12
    assert torch.isinf(out[0]).tolist() == [False, False, True, True]


def test_penalties_match_openai_definition():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    out = apply_penalties(
        logits.clone(),
        prompt_token_ids=[[3]],
        output_token_ids=[[0, 0, 1]],
        presence_penalty=torch.tensor([0.5]),
        frequency_penalty=torch.tensor([0.25]),
        repetition_penalty=torch.tensor([2.0]),
    )
    # token 0: 2/2 (rep) - 2*0.25 - 0.5; token 1: -2*2 - 0.25 - 0.5; token 3 (prompt): 0.5/2
    assert torch.allclose(out, torch.tensor([[1.0 - 0.5 - 0.5, -4.0 - 0.25 - 0.5, 1.0, 0.25]]))


def test_greedy_and_seeded_sampling_reproducible():
    torch.manual_seed(0)
    logits = torch.randn(3, 1000)
    sampler = Sampler()
    reqs = [
        make_request(0, temperature=0),
        make_request(1, temperature=1.0, seed=7),
        make_request(2, temperature=0.8),
    ]
    first = sampler(logits, meta_for(reqs)).sampled_token_ids
    assert first[0] == logits[0].argmax()
    again = [make_request(1, temperature=1.0, seed=7)]
    second = sampler(logits[1:2], meta_for(again)).sampled_token_ids
    assert first[1] == second[0], "a seeded request draws the same token whatever the batch"


def test_sampling_follows_distribution():
    probs = torch.tensor([0.7, 0.2, 0.1])
    logits = probs.log().repeat(4000, 1)
    reqs = [make_request(i, temperature=1.0) for i in range(4000)]
    tokens = Sampler()(logits, meta_for(reqs)).sampled_token_ids
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03)


def test_temperature_scales_its_rows_only():
    """Rows at temperature 0.5 draw from p^2 (normalized), rows at 1 from p, greedy rows
    take the argmax, all in one batch."""
    probs = torch.tensor([0.7, 0.2, 0.1])
    logits = probs.log().repeat(8001, 1)
    temps = [0.5, 1.0] * 4000 + [0]
    tokens = Sampler()(logits, meta_for([make_request(i, temperature=t) for i, t in
                                         enumerate(temps)])).sampled_token_ids  # fmt: skip
    sharp = probs**2 / (probs**2).sum()
    for rows, want in ((slice(0, 8000, 2), sharp), (slice(1, 8000, 2), probs)):
        freq = torch.bincount(tokens[rows], minlength=3).float() / 4000
        assert torch.allclose(freq, want, atol=0.03), (freq, want)
    assert tokens[-1] == 0


def test_inverse_cdf_never_draws_a_masked_token():
    """Masked tokens (top-k, grammars) have probability 0 and are never drawn, whatever the
    uniform: here the masks sit at both ends and between the live tokens."""
    torch.manual_seed(1)
    probs = torch.zeros(20000, 8)
    probs[:, [1, 3, 6]] = torch.tensor([0.5, 0.3, 0.2])
    tokens = inverse_cdf_sample(probs)
    assert set(tokens.tolist()) == {1, 3, 6}
    freq = torch.bincount(tokens, minlength=8).float()[[1, 3, 6]] / 20000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.02)
    one_hot = torch.zeros(5, 4)
    one_hot[:, 3] = 1.0
    assert inverse_cdf_sample(one_hot).tolist() == [3] * 5


def test_min_tokens_blocks_stop_tokens():
    logits = torch.tensor([[0.0, 10.0, 1.0]])  # token 1 would win
    req = Request(
        "r", [2], SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[1]), [0], 100
    )
    assert Sampler()(logits, meta_for([req])).sampled_token_ids.item() == 2


def test_logprobs_sampled_first_with_rank():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    lp = logits.log_softmax(1)
    t = gather_logprobs(lp, torch.tensor([2]), k=2)
    assert t.token_ids[0].tolist() == [2, 1, 2]
    assert t.sampled_ranks.tolist() == [2]
    assert math.isclose(t.logprobs[0, 0].item(), lp[0, 2].item())
