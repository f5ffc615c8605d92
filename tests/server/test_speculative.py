"""`serve --speculative ngram`: the same greedy output as the offline engine without
speculation, parsed by the official client, streaming too; the speculator in /server_info and
the spec_decode series in /metrics."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from tests.server.conftest import start_server
from tokenmill import LLM, SamplingParams

PASSAGE = (
    "The committee met on Tuesday to review the annual budget. Members discussed the "
    "allocation of funds for road repairs, the new library wing, and the expansion of the "
    "public transit network."
)
MESSAGES = [{"role": "user", "content": f"Repeat this passage exactly:\n\n{PASSAGE}"}]


def metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def test_served_ngram_speculation(tmp_path):
    expected = (
        LLM(None, kv_cache_memory_gib=0.1)
        .chat(MESSAGES, SamplingParams(temperature=0, max_tokens=60))[0]
        .outputs[0]
        .text
    )
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=11, max_tokens=60)
    expected_sampled = LLM(None, kv_cache_memory_gib=0.1).chat(MESSAGES, sampled)[0].outputs[0].text
    srv = start_server(tmp_path, "--speculative", "ngram", "--num-speculative-tokens", "5")
    try:
        client = OpenAI(base_url=srv.v1, api_key="unused")
        model = client.models.list().data[0].id
        reply = client.chat.completions.create(
            model=model, messages=MESSAGES, temperature=0, max_tokens=60
        )
        assert reply.choices[0].message.content == expected
        stream = client.chat.completions.create(
            model=model, messages=MESSAGES, temperature=0, max_tokens=60, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert streamed == expected
        # a seeded sampled request draws the same tokens with speculation on and off
        reply = client.chat.completions.create(
            model=model, messages=MESSAGES, temperature=0.8, top_p=0.95, seed=11, max_tokens=60
        )
        assert reply.choices[0].message.content == expected_sampled
        info = httpx.get(f"{srv.base_url}/server_info").json()
        assert info["speculative"]["method"] == "ngram"
        assert info["speculative"]["num_speculative_tokens"] == 5
        text = httpx.get(f"{srv.base_url}/metrics").text
        drafts = metric(text, "tokenmill:spec_decode_num_drafts_total")
        drafted = metric(text, "tokenmill:spec_decode_num_draft_tokens_total")
        accepted = metric(text, "tokenmill:spec_decode_num_accepted_tokens_total")
        assert drafts > 0 and 0 < accepted <= drafted
        per_pos = metric(text, "tokenmill:spec_decode_num_accepted_tokens_per_pos_total")
        assert per_pos == accepted
        assert metric(text, "tokenmill:spec_decode_acceptance_length_count") == drafts
        assert 'proposer="ngram"' in text
        by = "tokenmill:spec_decode_num_{}_by_proposer_total"
        assert metric(text, by.format("draft_tokens")) == drafted
        assert metric(text, by.format("accepted_tokens")) == accepted
    finally:
        assert srv.stop() == 0


@pytest.mark.slow  # a server start (the offline engine tests the same error)
def test_serve_refuses_a_speculator_made_for_another_model(tmp_path):
    """A draft head file for another model (or not a draft head at all) stops the server at
    start-up with a clear message, not at the first request."""
    junk = tmp_path / "head.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(RuntimeError, match="not a tokenmill draft head"):
        start_server(tmp_path, "--speculator", str(junk))
