"""Workload structure: shared prefixes, multi-turn growth, files, traces."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import pytest

from tests.bench.fakes import FakeMaker, FakeServer
from tokenmill.bench.config import LoadSpec
from tokenmill.bench.lengths import LengthDist
from tokenmill.bench.runner import prepare, run_load
from tokenmill.bench.workloads import WorkloadSpec, build_workload


def build(spec: WorkloadSpec, seed: int = 0):
    return asyncio.run(build_workload(spec, FakeMaker(), seed))


def test_random_workload_lengths_and_determinism():
    spec = WorkloadSpec(
        "random", 20, LengthDist.parse("uniform:5-9"), LengthDist.parse("normal:16,2")
    )
    w = build(spec, seed=3)
    assert w.num_requests == 20
    for s in w.sessions:
        (turn,) = s.turns
        assert 5 <= turn.input_tokens <= 9 and len(turn.text.split()) == turn.input_tokens
        assert turn.output_tokens >= 1
    assert w == build(spec, seed=3)
    assert w != build(spec, seed=4)


def test_shared_prefix_structure():
    spec = WorkloadSpec(
        "shared-prefix", num_groups=3, prompts_per_group=4, prefix_len=10, suffix_len=3
    )
    w = build(spec)
    assert w.num_requests == 12
    by_group = defaultdict(list)
    for s in w.sessions:
        by_group[s.group].append(s.turns[0])
    assert sorted(by_group) == [0, 1, 2]
    prefixes = set()
    for turns in by_group.values():
        assert len(turns) == 4
        words = [t.text.split() for t in turns]
        assert all(
            t.input_tokens == 13 and len(ws) == 13 for t, ws in zip(turns, words, strict=True)
        )
        prefix = {tuple(ws[:10]) for ws in words}
        assert len(prefix) == 1  # the group shares its prefix
        assert len({tuple(ws[10:]) for ws in words}) == 4  # and has distinct suffixes
        prefixes |= prefix
    assert len(prefixes) == 3  # groups differ
    assert [s.group for s in w.sessions] != sorted(s.group for s in w.sessions)  # shuffled


def test_multi_turn_carries_earlier_turns_and_replies():
    spec = WorkloadSpec("multi-turn", num_requests=6, turns=3, input_len=LengthDist.parse("4"))
    w = build(spec)
    assert len(w.sessions) == 2 and w.num_requests == 6
    server = FakeServer(service_s=0.0)
    recs = asyncio.run(run_load(w, LoadSpec("concurrency", concurrency=2), server, endpoint="chat"))
    assert len(recs) == 6 and all(r.success for r in recs)
    last = [p for p in server.sent if p.session_id == 0 and p.turn == 2][0]
    turns = w.sessions[0].turns
    assert [m["role"] for m in last.messages] == ["user", "assistant"] * 2 + ["user"]
    assert [m["content"] for m in last.messages] == [
        turns[0].text, "reply-0-0", turns[1].text, "reply-0-1", turns[2].text,
    ]  # fmt: skip
    sizes = [len(p.messages) for p in server.sent if p.session_id == 1]
    assert sizes == [1, 3, 5]


def test_multi_turn_completions_prompt_concatenates_history():
    w = build(WorkloadSpec("multi-turn", num_requests=2, turns=2, input_len=LengthDist.parse("3")))
    req = prepare(w.sessions[0], 1, [(w.sessions[0].turns[0].text, "R0")], "completions", 0.0)
    assert req.prompt == "\n".join([w.sessions[0].turns[0].text, "R0", w.sessions[0].turns[1].text])


def test_failed_turn_fails_the_rest_of_the_conversation():
    w = build(WorkloadSpec("multi-turn", num_requests=3, turns=3))
    server = FakeServer(service_s=0.0, fail={(0, 0)})
    recs = asyncio.run(run_load(w, LoadSpec("concurrency", concurrency=1), server, endpoint="chat"))
    assert len(recs) == 3 and not any(r.success for r in recs)
    assert [r.error for r in recs][1:] == ["skipped: turn 0 failed"] * 2
    assert len(server.sent) == 1


def test_jsonl_workload(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [
        "plain string prompt",
        {"prompt": "hi", "max_tokens": 7},
        {"messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "q"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    w = build(WorkloadSpec("jsonl", num_requests=4, path=str(path)))
    turns = [s.turns[0] for s in w.sessions]
    assert [t.text for t in turns] == ["plain string prompt", "hi", "q", "plain string prompt"]
    assert turns[1].output_tokens == 7
    assert turns[2].context == ({"role": "system", "content": "be terse"},)
    chat = prepare(w.sessions[2], 0, [], "chat", 0.0)
    assert [m["role"] for m in chat.messages] == ["system", "user"]


def test_trace_workload(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 5000, "input_length": 6, "output_length": 3},
        {"timestamp": 5500, "input_length": 2, "output_length": 9},
        {"timestamp": 7000, "input_length": 4, "output_length": 1},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    w = build(WorkloadSpec("trace", num_requests=3, path=str(path), trace_time_unit="ms"))
    assert [s.arrival_s for s in w.sessions] == pytest.approx([0.0, 0.5, 2.0])
    assert [(s.turns[0].input_tokens, s.turns[0].output_tokens) for s in w.sessions] == [
        (6, 3), (2, 9), (4, 1),
    ]  # fmt: skip
    server = FakeServer(service_s=0.0)
    recs = asyncio.run(run_load(w, LoadSpec("trace"), server))
    assert sorted(r.start_s for r in recs) == pytest.approx([0.0, 0.5, 2.0], abs=0.03)


def test_workload_spec_validation():
    with pytest.raises(ValueError, match="dataset"):
        WorkloadSpec("jsonl")
