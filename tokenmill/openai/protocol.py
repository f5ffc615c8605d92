"""Request bodies of the OpenAI-compatible API (pydantic, strict types), plus vLLM-style
extensions; each generation request builds its own SamplingParams (to_sampling_params)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tokenmill.openai.errors import RequestError
from tokenmill.openai.unsupported import one_of, unsupported
from tokenmill.sampling_params import RepetitionDetection, RequestOutputKind, SamplingParams
from tokenmill.structured.spec import StructuredOutputsParams

MAX_N = 16
MAX_TOP_LOGPROBS = 20
# Every integer is bounded before it reaches the engine (msgpack frames and torch tensors
# take 64-bit values at most; none of these needs more than 31 bits).
INT32_MAX = 2**31 - 1
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIAS = 2048
MAX_TOOLS = 128  # OpenAI's limit on a request's functions

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
# Lists stop at their first bad item: a body of 100,000 bad token ids is one error, not
# 100,000 per union branch (which took seconds of the GIL to build and sort)
TokenIds = Annotated[list[TokenId], Field(fail_fast=True)]


class APIModel(BaseModel):
    # Strict: "0.5" is not a number and "yes" is not a boolean. Unknown fields are ignored,
    # as the OpenAI API does for fields it does not know.
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(APIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class TextContentPart(APIModel):
    type: Literal["text"]
    text: str


class FunctionCall(APIModel):
    name: str
    arguments: str


class ToolCall(APIModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(APIModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and v.get("type", "object") != "object":
            raise ValueError(
                f'must be a JSON schema of type "object" (arguments are an object), got type '
                f"{json.dumps(v['type'])[:40]}"
            )
        return v


class Tool(APIModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(APIModel):
    name: str


class NamedToolChoice(APIModel):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(APIModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(APIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsRequest(APIModel):
    """Extension (as vLLM's `structured_outputs`): exactly one of the four."""

    json_: dict[str, Any] | bool | None = Field(None, alias="json")
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] | None = None


class RepetitionDetectionRequest(APIModel):
    max_period: int = Field(32, ge=1, le=256)
    min_repeats: int = Field(4, ge=2, le=1000)
    min_span: int = Field(48, ge=2, le=100000)


def resolve_max_tokens(
    requested: int | None, prompt_len: int, max_model_len: int, param: str, default: int
) -> int:
    """Max tokens for this request (`default`, or what still fits, when not given); 400
    context_length_exceeded when prompt + max_tokens overflow."""
    if prompt_len >= max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt is "
            f"{prompt_len} tokens, leaving no room for the completion.",
            param="messages" if param != "max_tokens" else "prompt",
            code="context_length_exceeded",
        )
    if requested is None:
        return min(default, max_model_len - prompt_len)
    if prompt_len + requested > max_model_len:
        raise RequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the completion). "
            "Please reduce the prompt or the completion length.",
            param=param,
            code="context_length_exceeded",
        )
    return requested


class ChatMessage(APIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # an earlier assistant turn's reasoning, sent back (vLLM's names for it)
    reasoning_content: str | None = None
    reasoning: str | None = None
    function_call: unsupported("the legacy function_call; send tool_calls") = None

    @model_validator(mode="after")
    def _tool_result_names_its_call(self) -> ChatMessage:
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def text(self) -> str | None:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content

    def to_template_dict(self) -> dict[str, Any]:
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.text() or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [tc.model_dump() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning_content if self.reasoning_content is not None else self.reasoning
        if reasoning is not None:
            # under every name templates read it, as transformers passes it: Qwen3's
            # `reasoning_content`, GPT-OSS's `thinking`
            out |= {"reasoning_content": reasoning, "thinking": reasoning, "reasoning": reasoning}
        return out


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
StopType = StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None


class SamplingKnobs(APIModel):
    """Sampling knobs every generation endpoint takes (chat, completions, responses)."""

    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: StopType = None
    # extensions (as vLLM)
    top_k: int = Field(0, ge=-1, le=INT32_MAX)  # and <= the vocabulary (checked with the model)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, ge=0.01, le=10)
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    stop_token_ids: Annotated[TokenIds, Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: int = Field(0, ge=-INT32_MAX, le=INT32_MAX)
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    repetition_detection: bool | RepetitionDetectionRequest | None = None

    def _sampling_params(self, max_tokens: int, stream: bool, **fields: Any) -> SamplingParams:
        """SamplingParams of these knobs and the endpoint's own `fields` (n, temperature,
        logprobs, the output constraint, ...); ValueError names a field the engine refuses."""
        detection = self.repetition_detection
        if isinstance(detection, RepetitionDetectionRequest):
            detection = RepetitionDetection(
                detection.max_period, detection.min_repeats, detection.min_span
            )
        return SamplingParams(
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=self.stop,
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            ignore_eos=self.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,  # above max_tokens: a 400 naming it (as vLLM)
            skip_special_tokens=self.skip_special_tokens,
            repetition_detection=detection,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
            **fields,
        )


class SamplingFields(SamplingKnobs):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    logit_bias: Annotated[dict[str, float], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # extensions (as vLLM)
    response_format: ResponseFormat | None = None
    # prefill/decode disaggregation, set by the router (tokenmill/kv/connector/params.py)
    kv_transfer_params: dict[str, Any] | None = None
    structured_outputs: StructuredOutputsRequest | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM extensions this server does not implement
    use_beam_search: unsupported("beam search") = None
    length_penalty: unsupported("beam search's length_penalty", one_of(1)) = None
    bad_words: unsupported("bad_words (logit_bias can ban token ids)") = None
    allowed_token_ids: unsupported(
        "allowed_token_ids (guided_choice, guided_regex or a grammar constrain the output)"
    ) = None
    prompt_logprobs: unsupported("prompt_logprobs (/v1/completions: echo with logprobs)") = None
    truncate_prompt_tokens: unsupported("prompt truncation") = None
    return_tokens_as_token_ids: unsupported("token ids in place of logprobs' tokens") = None
    logits_processors: unsupported("custom logits processors") = None
    guided_whitespace_pattern: unsupported("a JSON whitespace pattern") = None

    def _choice_params(
        self,
        max_tokens: int,
        logprobs: int | None,
        structured_outputs: StructuredOutputsParams | None,
        **fields: Any,
    ) -> SamplingParams:
        if self.stream_options is not None and not self.stream:  # as OpenAI and vLLM
            raise RequestError("stream_options: only allowed when stream is true", "stream_options")
        return self._sampling_params(
            max_tokens,
            self.stream,
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            logit_bias={int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None,
            logprobs=logprobs,
            structured_outputs=structured_outputs,
            **fields,
        )

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        for key, value in v.items():
            if not key.isdigit() or len(key) > 10:
                raise ValueError(f"keys must be token ids, got {key[:20]!r}")
            if not -100 <= value <= 100:
                raise ValueError(f"values must be in [-100, 100], got {value}")
        return v


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # None: several calls may be parsed, but a forced choice (required / named) makes one
    parallel_tool_calls: bool | None = None
    # extensions
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # a template variable, as vLLM passes it (GPT-OSS's template writes it into its system turn)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # Trusted callers only (the server must allow it): control-token strings in messages
    # become control tokens instead of text.
    special_tokens_in_content: bool = False
    # OpenAI's fields this server does not implement
    audio: unsupported("audio output") = None
    modalities: unsupported('output modalities other than ["text"]', one_of(["text"])) = None
    functions: unsupported("the legacy functions; send tools") = None
    function_call: unsupported("the legacy function_call; send tool_choice") = None
    web_search_options: unsupported("web search") = None
    verbosity: unsupported("verbosity other than medium", one_of("medium")) = None
    # vLLM's
    chat_template: unsupported("a per-request chat template (the model's is used)") = None
    documents: unsupported("documents for the chat template (put them in messages)") = None
    echo: unsupported("echo on chat (/v1/completions echoes prompts)") = None
    add_special_tokens: unsupported(
        "special tokens on top of the chat template's (it places its own)"
    ) = None

    def to_sampling_params(
        self,
        prompt_len: int,
        max_model_len: int,
        default_max_tokens: int,
        structured_outputs: StructuredOutputsParams | None = None,
    ) -> SamplingParams:
        """The whole SamplingParams of this request: max tokens resolved against the
        context (`default_max_tokens`, or what fits, when not given), top logprobs, the
        output constraint (compiled and checked by the caller), loop cut-off. RequestError:
        a 400 naming the field; another ValueError: a value the engine refuses ("field:
        reason")."""
        given = self.max_completion_tokens is not None
        max_tokens = resolve_max_tokens(
            self.max_completion_tokens if given else self.max_tokens,
            prompt_len,
            max_model_len,
            "max_completion_tokens" if given else "max_tokens",
            default_max_tokens,
        )
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs: requires logprobs to be true", "top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._choice_params(max_tokens, logprobs, structured_outputs)


class CompletionRequest(SamplingFields):
    # emptiness (no prompt, an empty prompt) is checked with the tokenizer: a 400 naming it
    prompt: (
        str
        | TokenIds
        | Annotated[list[str], Field(fail_fast=True)]
        | Annotated[list[TokenIds], Field(fail_fast=True)]
    )
    suffix: str | None = None
    max_tokens: int | None = Field(16, ge=1, le=INT32_MAX)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    # vLLM's: prompts always get the tokenizer's special tokens here
    add_special_tokens: unsupported(
        "prompts without the tokenizer's special tokens", lambda v: v in (None, True)
    ) = None

    def to_sampling_params(
        self,
        prompt_len: int,
        max_model_len: int,
        default_max_tokens: int,
        structured_outputs: StructuredOutputsParams | None = None,
    ) -> SamplingParams:
        """The whole SamplingParams of one of the request's prompts: max tokens resolved
        against the context, logprobs (of the prompt too when it is echoed), the output
        constraint (compiled and checked by the caller), loop cut-off."""
        max_tokens = resolve_max_tokens(
            self.max_tokens, prompt_len, max_model_len, "max_tokens", default_max_tokens
        )
        prompt_logprobs = self.logprobs if self.echo else None
        return self._choice_params(
            max_tokens, self.logprobs, structured_outputs, prompt_logprobs=prompt_logprobs
        )


class TokenizeRequest(APIModel):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = True
    # as chat renders them, so the count is the one a chat request would have
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: unsupported("token strings (POST /detokenize decodes ids)") = None


class KVDigestsRequest(APIModel):
    token_ids: Annotated[TokenIds, Field(max_length=1 << 20)]
    cache_salt: str | None = Field(None, min_length=1, max_length=256)


class DetokenizeRequest(APIModel):
    model: str | None = None
    tokens: TokenIds
