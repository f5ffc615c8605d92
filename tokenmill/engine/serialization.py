"""msgpack encoding of the messages that cross the API <-> engine-core process boundary."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack

from tokenmill.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from tokenmill.pooling_params import PoolingParams
from tokenmill.sampling_params import RepetitionDetection, RequestOutputKind, SamplingParams
from tokenmill.stats import SchedulerStats, SpecDecodeStats
from tokenmill.structured.spec import StructuredOutputsParams

_PARAM_FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]
_OUTPUT_FIELDS = [f.name for f in dataclasses.fields(EngineCoreOutput)]
_STATS_FIELDS = [f.name for f in dataclasses.fields(SchedulerStats)]


def _params_to_list(p: SamplingParams) -> list[Any]:
    values = []
    for name in _PARAM_FIELDS:
        v = getattr(p, name)
        if isinstance(v, RequestOutputKind):
            v = v.value
        elif name == "logit_bias" and v is not None:
            v = [[k, b] for k, b in v.items()]
        elif isinstance(v, StructuredOutputsParams):
            v = v.to_wire()
        elif isinstance(v, RepetitionDetection):
            v = [v.max_period, v.min_repeats, v.min_span]
        values.append(v)
    return values


def _params_from_list(values: list[Any]) -> SamplingParams:
    kw = dict(zip(_PARAM_FIELDS, values, strict=True))
    kw["output_kind"] = RequestOutputKind(kw["output_kind"])
    if kw.get("logit_bias") is not None:
        kw["logit_bias"] = {int(k): float(b) for k, b in kw["logit_bias"]}
    if kw.get("structured_outputs") is not None:
        kw["structured_outputs"] = StructuredOutputsParams.from_wire(kw["structured_outputs"])
    if isinstance(kw.get("repetition_detection"), list):
        kw["repetition_detection"] = RepetitionDetection(*kw["repetition_detection"])
    return SamplingParams(**kw)


def encode_request(req: EngineCoreRequest) -> bytes:
    return msgpack.packb(
        [
            req.request_id,
            req.prompt_token_ids,
            _params_to_list(req.sampling_params),
            req.arrival_time,
            req.priority,
            req.cache_salt,
            req.kv_transfer_params,
            req.pooling_params.to_wire() if req.pooling_params is not None else None,
            req.lora_name,
        ]
    )


def decode_request(data: bytes) -> EngineCoreRequest:
    rid, ids, params, arrival, priority, salt, kv, pooling, lora = msgpack.unpackb(
        data, strict_map_key=False
    )
    pooling_params = PoolingParams.from_wire(pooling) if pooling is not None else None
    return EngineCoreRequest(
        rid, ids, _params_from_list(params), arrival, priority, salt, kv, pooling_params, lora
    )


def _stat_to_wire(value: Any) -> Any:
    if isinstance(value, SpecDecodeStats):
        return dataclasses.astuple(value)
    return value


def encode_outputs(outs: EngineCoreOutputs) -> bytes:
    return msgpack.packb(
        [
            [[getattr(o, name) for name in _OUTPUT_FIELDS] for o in outs.outputs],
            [_stat_to_wire(getattr(outs.stats, name)) for name in _STATS_FIELDS],
        ]
    )


def decode_outputs(data: bytes) -> EngineCoreOutputs:
    outputs, stats = msgpack.unpackb(data, strict_map_key=False)
    decoded = []
    for values in outputs:
        kw = dict(zip(_OUTPUT_FIELDS, values, strict=True))
        for key in ("new_logprobs", "prompt_logprobs"):
            if kw[key] is not None:
                kw[key] = [tuple(entry) for entry in kw[key]]
        decoded.append(EngineCoreOutput(**kw))
    kw = dict(zip(_STATS_FIELDS, stats, strict=True))
    if kw.get("spec_decode") is not None:
        kw["spec_decode"] = SpecDecodeStats(*kw["spec_decode"])
    return EngineCoreOutputs(decoded, SchedulerStats(**kw))


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj)


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, strict_map_key=False)
