"""Messages survive the msgpack trip between the API and engine-core processes."""

from __future__ import annotations

from tokenmill.engine.serialization import (
    decode_outputs,
    decode_request,
    encode_outputs,
    encode_request,
)
from tokenmill.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from tokenmill.sampling_params import RepetitionDetection, RequestOutputKind, SamplingParams
from tokenmill.stats import SchedulerStats
from tokenmill.structured.spec import StructuredOutputsParams


def test_request_round_trip():
    params = SamplingParams(
        n=2, temperature=0.3, top_p=0.9, top_k=5, min_p=0.1, seed=7, stop=["x", "yy"], stop_token_ids=[3],
        max_tokens=9, min_tokens=1, logprobs=2, prompt_logprobs=1, logit_bias={5: -1.5},
        structured_outputs=StructuredOutputsParams(json={"type": "object"}),
        repetition_detection=RepetitionDetection(8, 3, 20), output_kind=RequestOutputKind.DELTA,
    )  # fmt: skip
    req = EngineCoreRequest("r1", [1, 2, 3], params, 12.5, priority=2, cache_salt="tenant")
    assert decode_request(encode_request(req)) == req
    plain = EngineCoreRequest(
        "r2",
        [4],
        SamplingParams(structured_outputs=StructuredOutputsParams(choice=("a", "b"))),
        1.0,
    )
    assert decode_request(encode_request(plain)) == plain


def test_outputs_round_trip():
    outs = EngineCoreOutputs(
        [
            EngineCoreOutput(
                "r", [5, 6], [([5, 9], [-0.1, -2.0], 1)], None, "stop", "repetition", 16, 3.5
            )
        ],
        SchedulerStats(1, 2, 0.5, 3, 4, 100, 64, {"device": 48, "host": 16}, {"host": {"hits": 1}}),
    )
    assert decode_outputs(encode_outputs(outs)) == outs
