"""The offline API on the embedded model: vLLM-shaped outputs, sampling controls, bad input."""

from __future__ import annotations

import math
import random

import pytest

from tokenmill import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16)


def test_generate_output_shape(embedded_llm):
    out = embedded_llm.generate("The capital of France is", GREEDY)[0]
    tok = embedded_llm.get_tokenizer()
    assert out.prompt_token_ids == tok.encode("The capital of France is")
    assert out.finished and len(out.outputs) == 1
    c = out.outputs[0]
    assert c.text == tok.decode(c.token_ids)
    assert c.finish_reason in ("stop", "length") and 0 < len(c.token_ids) <= 16
    assert "Paris" in c.text


def test_chat_uses_template_and_stops_at_eos(embedded_llm):
    out = embedded_llm.chat(
        [{"role": "user", "content": "What is 2+2? Answer with one number."}],
        SamplingParams(temperature=0, max_tokens=64),
    )[0]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason is None
    assert "4" in out.outputs[0].text
    assert out.outputs[0].token_ids[-1] == 2  # <|im_end|>, not rendered into text
    assert "<|im_end|>" not in out.outputs[0].text


def test_seed_reproducible_and_batch_independent(embedded_llm):
    # 24 tokens whatever EOS does (a first-token EOS would make any two seeds agree)
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=24, min_tokens=24)
    a = embedded_llm.generate("Tell me a story about a dragon.", params)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=24)] * 3
    batch = embedded_llm.generate(
        ["Tell me a story about a dragon.", "Hello", "Write code", "Numbers:"], [params, *others]
    )
    assert batch[0].outputs[0].token_ids == a
    c = (
        embedded_llm.generate("Tell me a story about a dragon.", params.clone(seed=99))[0]
        .outputs[0]
        .token_ids
    )
    assert c != a


def test_n_samples_distinct_and_reproducible(embedded_llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=20)
    first = embedded_llm.generate("List some fruits:", params)[0]
    second = embedded_llm.generate("List some fruits:", params)[0]
    assert [o.index for o in first.outputs] == [0, 1, 2]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in second.outputs]
    assert len({tuple(o.token_ids) for o in first.outputs}) > 1


def test_stop_strings_and_token_ids(embedded_llm):
    base = embedded_llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=20))[
        0
    ].outputs[0]
    assert " 5" in base.text
    cut = embedded_llm.generate(
        "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=20, stop=[" 5"])
    )[0]
    c = cut.outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == " 5"
    assert c.text == base.text[: base.text.index(" 5")]
    token = base.token_ids[2]
    by_id = embedded_llm.generate(
        "Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[token])
    )[0].outputs[0]
    assert by_id.stop_reason == token and by_id.token_ids == base.token_ids[:3]


def test_max_tokens_min_tokens_ignore_eos(embedded_llm):
    msgs = [{"role": "user", "content": "Say hi."}]
    short = embedded_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert short.finish_reason == "stop"
    forced = embedded_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[
        0
    ].outputs[0]
    assert forced.finish_reason == "length" and len(forced.token_ids) == 64
    n = len(short.token_ids)
    longer = embedded_llm.chat(
        msgs, SamplingParams(temperature=0, max_tokens=64, min_tokens=n + 5)
    )[0].outputs[0]
    assert len(longer.token_ids) >= n + 5


def test_logprobs_and_prompt_logprobs(embedded_llm):
    out = embedded_llm.generate(
        "The capital of France is",
        SamplingParams(temperature=0, max_tokens=5, logprobs=3, prompt_logprobs=2),
    )[0]
    c = out.outputs[0]
    assert len(c.logprobs) == 5
    total = 0.0
    for token, position in zip(c.token_ids, c.logprobs, strict=True):
        assert token in position and position[token].rank == 1  # greedy picks the top token
        assert 3 <= len(position) <= 4
        total += position[token].logprob
    assert math.isclose(c.cumulative_logprob, total, rel_tol=1e-5)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(out.prompt_token_ids)
    for token, position in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:], strict=True):
        assert token in position and position[token].logprob <= 0


@pytest.mark.parametrize(
    "prompt,kwargs,field",
    [
        ("", {}, "prompt"),
        ("word " * 9000, {}, "prompt"),
        ("hi", {"max_tokens": 0}, "max_tokens"),
        ("hi", {"max_tokens": -1}, "max_tokens"),
        ("hi", {"top_p": 1.5}, "top_p"),
        ("hi", {"top_p": 0}, "top_p"),
        ("hi", {"temperature": -1}, "temperature"),
        ("hi", {"stop": 42}, "stop"),
        ("hi", {"stop": [None]}, "stop"),
    ],
)
def test_bad_input_raises_and_engine_keeps_running(embedded_llm, prompt, kwargs, field):
    engine = embedded_llm.engine
    rid = engine.new_request_id()
    engine.add_request(
        rid, "Once upon a time", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )
    engine.step()
    with pytest.raises(ValueError) as err:
        embedded_llm.generate(prompt, SamplingParams(**kwargs))
    assert str(err.value).startswith(f"{field}:")
    done = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done = out
    assert done is not None and done.request_id == rid and len(done.outputs[0].token_ids) == 8
    engine.core.check_invariants()


def test_batch_of_32_mixed_lengths_matches_alone(embedded_llm):
    rng = random.Random(0)
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "was",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "at",
        "from",
        "it",
        "his",
        "an",
        "were",
        "are",
        "which",
        "be",
        "this",
    ]
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 120))) for _ in range(32)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    alone = [embedded_llm.generate(p, params)[0].outputs[0].token_ids for p in prompts[:8]]
    batch = embedded_llm.generate(prompts, params)
    assert [b.outputs[0].token_ids for b in batch[:8]] == alone
