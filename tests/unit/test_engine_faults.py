"""Faults stay with the request that caused them: a step that raises fails only its culprit
(the rest re-run, with identical tokens); the engine core answers every request frame;
configurations that could never schedule a prompt are refused at start."""

from __future__ import annotations

import msgpack
import pytest

from tokenmill import LLM, SamplingParams
from tokenmill.engine.arg_utils import build_engine_config
from tokenmill.engine.core import EngineCore
from tokenmill.engine.core_proc import EngineCoreProc
from tokenmill.engine.serialization import decode_outputs, encode_outputs, encode_request
from tokenmill.messages import EngineCoreOutputs, EngineCoreRequest


def run(llm: LLM, items: list[tuple[list[int], SamplingParams]], poison=None) -> dict:
    """Runs the prompts in one batch; `poison(request)` corrupts one engine request after
    validation, as a bug or an unchecked value would. Returns id -> (tokens, finish)."""
    engine = llm.engine
    ids = []
    for prompt, params in items:
        rid = engine.new_request_id()
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
        ids.append(rid)
    if poison is not None:
        poison(engine.core.scheduler.requests[ids[-1]])
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                c = out.outputs[0]
                done[out.request_id] = (c.token_ids, c.finish_reason)
        engine.core.check_invariants()
    assert engine.core.kv_manager.num_free_blocks == engine.core.num_blocks
    return [done[r] for r in ids]


def _huge_top_k(request) -> None:  # integer overflow building the sampling tensors
    request.sampling_params.top_k = 2**63


def _huge_logprobs(request) -> None:  # fails after the batch's rows were sampled
    request.sampling_params.logprobs = 10**6


@pytest.mark.parametrize("poison", [_huge_top_k, _huge_logprobs], ids=["top_k", "logprobs"])
def test_a_failing_request_fails_alone(tiny_llama_dir, poison):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05)
    good = [
        ([5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)),
        ([9, 10, 11], SamplingParams(temperature=0.9, seed=7, max_tokens=12, ignore_eos=True)),
        ([12] * 20, SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)),
    ]
    bad = ([13, 14], SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True))
    reference = run(llm, good)
    results = run(llm, [*good, bad], poison)
    assert results[:3] == reference  # same tokens, seeded ones included
    assert all(finish == "length" for _, finish in results[:3])
    assert results[3] == ([], "error")
    # and the engine keeps serving
    assert run(llm, good) == reference


def test_no_chunked_prefill_needs_a_budget_for_the_longest_prompt(tiny_llama_dir):
    config = build_engine_config(
        str(tiny_llama_dir),
        kv_cache_memory_gib=0.05,
        enable_chunked_prefill=False,
        max_num_batched_tokens=64,
        max_model_len=256,
    )
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineCore(config)
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, enable_chunked_prefill=False,
              max_num_batched_tokens=256, max_model_len=256)  # fmt: skip
    assert llm.engine.core.max_model_len == 256
    out = llm.generate([[7] * 200], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4


class _Sink:
    """Stands in for the output socket."""

    def __init__(self) -> None:
        self.frames: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes]) -> None:
        self.frames.append(frames)


def test_every_request_frame_gets_an_answer(tiny_llama_dir):
    core = EngineCore(build_engine_config(str(tiny_llama_dir), kv_cache_memory_gib=0.05))
    proc = EngineCoreProc.__new__(EngineCoreProc)
    proc.core, proc.rejected, proc.output = core, [], _Sink()
    good = EngineCoreRequest("ok", [1, 2, 3], SamplingParams(max_tokens=2), 0.0)
    # undecodable payload, a request whose params fail validation, a mismatched id frame
    proc._handle([b"ADD", b"garbage", b"\x93\xff\x00"])
    bad_params = msgpack.unpackb(encode_request(good))
    bad_params[2][0] = 0  # n = 0
    bad_params[0] = "bad-n"
    proc._handle([b"ADD", b"bad-n", msgpack.packb(bad_params)])
    proc._handle([b"ADD", b"other", encode_request(good)])
    proc._handle([b"ABORT", b"\xc1"])  # a bad abort frame is ignored, not fatal
    proc._handle([b"ADD", b"no-payload"])
    proc._handle([b"ADD", b"ok", encode_request(good)])
    rejected = {o.request_id: o for o in proc.rejected}
    assert set(rejected) == {"garbage", "bad-n", "other", "no-payload"}
    assert all(o.finish_reason == "error" and o.stop_reason for o in rejected.values())
    assert "n" in rejected["bad-n"].stop_reason
    assert core.scheduler.requests.keys() == {"ok"}
    # the rejections travel back as outputs like any other
    wire = decode_outputs(encode_outputs(EngineCoreOutputs(list(proc.rejected))))
    assert [o.finish_reason for o in wire.outputs] == ["error"] * 4


@pytest.mark.parametrize("stop", ["", ["x", ""]])
def test_empty_stop_string_is_rejected(stop):
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=stop)


@pytest.mark.parametrize(
    "field,value",
    [("repetition_penalty", 1e-300), ("repetition_penalty", 0.0), ("temperature", float("nan")),
     ("top_p", float("nan")), ("presence_penalty", float("inf"))],
)  # fmt: skip
def test_non_finite_or_degenerate_knobs_are_rejected(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
