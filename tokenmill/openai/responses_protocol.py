"""Request bodies of /v1/responses: input items, function tools, text formats, and the
bounds every size and count is checked against before anything reaches the engine."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, Discriminator, Field, Tag

from tokenmill.openai.protocol import (
    INT32_MAX,
    APIModel,
    FunctionDefinition,
    SamplingKnobs,
    resolve_max_tokens,
)
from tokenmill.openai.unsupported import asks_nothing, one_of, unsupported
from tokenmill.sampling_params import SamplingParams
from tokenmill.structured.spec import StructuredOutputsParams

MAX_INPUT_ITEMS = 1024  # items in one request's input
MAX_CONTEXT_ITEMS = 4096  # with the previous responses' items prepended
MAX_CONTENT_PARTS = 256  # parts of one message
MAX_TEXT_CHARS = 1 << 20  # any one text (the body size bounds the sum)
MAX_TOOLS = 128
MAX_METADATA = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


def check_metadata(v: dict[str, str]) -> dict[str, str]:
    """OpenAI's limits on `metadata` (responses, batches)."""
    if len(v) > MAX_METADATA:
        raise ValueError(f"at most {MAX_METADATA} pairs, got {len(v)}")
    for key, value in v.items():
        if not 0 < len(key) <= MAX_METADATA_KEY:
            raise ValueError(f"keys must be 1 to {MAX_METADATA_KEY} characters")
        if len(value) > MAX_METADATA_VALUE:
            raise ValueError(f"values must be at most {MAX_METADATA_VALUE} characters")
    return v


Metadata = Annotated[dict[str, str], AfterValidator(check_metadata)]
RESPONSE_ID = r"^resp_[A-Za-z0-9]{1,64}$"
ITEM_ID = r"^[A-Za-z0-9_\-]{1,128}$"

Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
ItemId = Annotated[str, Field(pattern=ITEM_ID)]
CallId = Annotated[str, Field(min_length=1, max_length=256)]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


# Unions pick their branch up front, so an error names the field in the branch the value
# is for (not "not a string"); the branch tags are bracketed, which error locations drop.


def _text_or_list(value: Any) -> str:
    return "[text]" if isinstance(value, str) else "[list]"


def text_or(list_type: Any) -> Any:
    """A text or a list of parts."""
    return Annotated[
        Annotated[Text, Tag("[text]")] | Annotated[list_type, Tag("[list]")],
        Discriminator(_text_or_list),
    ]


def _typed(default: str | None) -> Any:
    def tag(value: Any) -> str | None:
        kind = (
            value.get("type", default) if isinstance(value, dict) else getattr(value, "type", None)
        )
        return f"[{kind}]" if isinstance(kind, str) else None

    return tag


def by_type(*models: Any, default: str | None = None, what: str) -> Any:
    """A union told apart by `type` (`default` when it is missing)."""
    names = [m.model_fields["type"].annotation.__args__[0] for m in models]
    branches = [Annotated[m, Tag(f"[{name}]")] for m, name in zip(models, names, strict=True)]
    supported = ", ".join(names)
    return Annotated[
        Union[tuple(branches)],  # noqa: UP007 (a union built at run time)
        Discriminator(
            _typed(default),
            custom_error_type=f"invalid_{what.replace(' ', '_')}",
            custom_error_message=f"unsupported {what} type (supported: {supported})",
        ),
    ]


class InputText(APIModel):
    type: Literal["input_text"]
    text: Text


class OutputText(APIModel):
    type: Literal["output_text"]
    text: Text


class Refusal(APIModel):
    type: Literal["refusal"]
    refusal: Text


ContentPart = by_type(InputText, OutputText, Refusal, what="content part")


class MessageItem(APIModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: text_or(Annotated[list[ContentPart], Field(max_length=MAX_CONTENT_PARTS)])
    id: ItemId | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in self.content)


class FunctionCallItem(APIModel):
    type: Literal["function_call"]
    call_id: CallId
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: Text
    id: ItemId | None = None
    status: ItemStatus | None = None


class FunctionCallOutputItem(APIModel):
    type: Literal["function_call_output"]
    call_id: CallId
    output: text_or(Annotated[list[InputText], Field(max_length=MAX_CONTENT_PARTS)])
    id: ItemId | None = None
    status: ItemStatus | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(p.text for p in self.output)


# messages may leave out `type`, as OpenAI allows
InputItem = by_type(
    MessageItem, FunctionCallItem, FunctionCallOutputItem, default="message", what="item"
)


class FunctionTool(FunctionDefinition):
    """Responses' flat function tool: {"type": "function", "name", "parameters", ...}."""

    type: Literal["function"]


class FunctionToolChoice(APIModel):
    type: Literal["function"]
    name: str


class FormatText(APIModel):
    type: Literal["text"]


class FormatJsonObject(APIModel):
    type: Literal["json_object"]


class FormatJsonSchema(APIModel):
    type: Literal["json_schema"]
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(APIModel):
    format: by_type(FormatText, FormatJsonObject, FormatJsonSchema, what="text format") | None = (
        None
    )
    verbosity: unsupported("verbosity other than medium", one_of("medium")) = None


def no_reasoning(value: Any) -> bool:
    """`reasoning` that asks for none (effort null or "none", no summary)."""
    if not isinstance(value, dict):
        return asks_nothing(value)
    return value.get("effort") in (None, "none") and asks_nothing(
        {k: v for k, v in value.items() if k != "effort"}
    )


class ResponsesRequest(SamplingKnobs):
    """POST /v1/responses (OpenAI's fields, plus the vLLM-style sampling extensions)."""

    model: str | None = None
    input: text_or(Annotated[list[InputItem], Field(min_length=1, max_length=MAX_INPUT_ITEMS)])
    instructions: Text | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: (
        Annotated[list[by_type(FunctionTool, what="tool")], Field(max_length=MAX_TOOLS)] | None
    ) = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: Metadata | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    store: bool = True
    previous_response_id: Annotated[str, Field(pattern=RESPONSE_ID)] | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    background: bool = False
    stream: bool = False
    # extension (as chat's): extra variables for the chat template
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's fields this server does not implement
    conversation: unsupported(
        "conversations (no Conversations API here: send the earlier turns in `input`, or "
        "continue from previous_response_id)"
    ) = None
    prompt: unsupported("stored prompt templates (send the text in `instructions`/`input`)") = None
    include: unsupported("extra output data (logprobs, reasoning, tool results)") = None
    top_logprobs: unsupported("logprobs in Responses (/v1/chat/completions returns them)") = None
    reasoning: unsupported("reasoning effort or summaries", no_reasoning) = None
    context_management: unsupported("context compaction (truncation: auto drops old turns)") = None

    def to_sampling_params(
        self,
        prompt_len: int,
        max_model_len: int,
        default_max_tokens: int,
        structured_outputs: StructuredOutputsParams | None = None,
    ) -> SamplingParams:
        """The whole SamplingParams of the response: max_output_tokens resolved against the
        context (as chat's max_tokens), the output constraint (text.format or a forced
        tool call: compiled and checked by the caller), loop cut-off; one output, no
        logprobs."""
        max_tokens = resolve_max_tokens(
            self.max_output_tokens, prompt_len, max_model_len, "max_output_tokens",
            default_max_tokens,
        )  # fmt: skip
        return self._sampling_params(
            max_tokens,
            self.stream,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            structured_outputs=structured_outputs,
        )
