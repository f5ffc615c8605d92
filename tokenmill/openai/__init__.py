"""The OpenAI API's wire format, shared by the server (which builds it) and the gateway and
router (which read and rewrite it), so that each field name is written in one place:

    protocol.py              request bodies of chat, completions, tokenize, detokenize
                             (pydantic), each with its to_sampling_params()
    responses_protocol.py    the request body of /v1/responses
    unsupported.py           fields this server knows but does not implement (a 400)
    completion_objects.py    chat.completion / text_completion objects, stream chunks,
                             usage, tool calls, finish reasons (names and small builders)
    responses_objects.py     the Responses API's response object, items, parts, usage and
                             stream events (names and small builders)
    errors.py                the error envelope; RequestError (a 400 naming the field)

A low layer: it imports pydantic and the neutral request types (sampling_params,
structured.spec), never FastAPI or the engine. The object modules are plain dicts and
strings (the gateway rewrites every streamed chunk; nothing there is validated)."""
