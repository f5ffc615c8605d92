"""The server's tokenizer over HTTP (vLLM's endpoints): /tokenize (a prompt, or messages
rendered as chat renders them), /detokenize, /tokenizer_info."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tokenmill.inputs.validation import first_outside
from tokenmill.openai.protocol import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest
from tokenmill.server.body import parse_body
from tokenmill.server.errors import bad_request
from tokenmill.server.serving_chat import render_prompt
from tokenmill.server.state import off_loop, server_state
from tokenmill.server.tokenizer_info import tokenizer_info

router = APIRouter()
REQUEST_BODIES = {"/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest}

# /tokenize fields that shape a chat prompt: with `prompt` they would change nothing
_CHAT_ONLY = ("add_generation_prompt", "continue_final_message", "tools", "chat_template_kwargs")


@router.post("/tokenize")
async def tokenize(request: Request):
    state = server_state(request)
    engine = state.engine
    req = await parse_body(request, TokenizeRequest, state.settings.max_body_bytes)
    state.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("exactly one of prompt or messages is required", param="prompt")
    _check_prompt_fields(req)
    if req.messages is not None:
        chat = ChatCompletionRequest(
            model=state.model_name,
            messages=req.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            tools=req.tools,
            chat_template_kwargs=req.chat_template_kwargs,
        )
        _, tokens = await render_prompt(state, chat)
    else:
        tokens = await off_loop(engine.tokenizer.encode, req.prompt, req.add_special_tokens)
    return {"count": len(tokens), "max_model_len": engine.max_model_len, "tokens": tokens}


@router.post("/detokenize")
async def detokenize(request: Request):
    state = server_state(request)
    engine = state.engine
    req = await parse_body(request, DetokenizeRequest, state.settings.max_body_bytes)
    state.check_model(req.model)
    vocab = engine.tokenizer.vocab_size
    bad = first_outside(req.tokens, vocab)
    if bad is not None:
        raise bad_request(
            f"tokens: id {bad} is outside the vocabulary [0, {vocab})", param="tokens"
        )
    text = await off_loop(engine.tokenizer.decode, req.tokens, False)
    return {"prompt": text}


@router.get("/tokenizer_info")
async def get_tokenizer_info(request: Request):
    """vLLM's shape: lets lm-eval and other clients tokenize with the server's tokenizer."""
    return tokenizer_info(server_state(request).engine)


def _check_prompt_fields(req: TokenizeRequest) -> None:
    """A chat-only field set (to other than its default, or empty) with `prompt` is a 400
    naming it."""
    if req.prompt is None:
        return
    for name in _CHAT_ONLY:
        value = getattr(req, name)
        if value != TokenizeRequest.model_fields[name].default and value not in ([], {}):
            raise bad_request(f"{name}: applies to messages, not to a prompt", param=name)
