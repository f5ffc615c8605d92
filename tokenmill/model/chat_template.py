"""Chat templates rendered the way Hugging Face transformers renders them: sandboxed jinja2."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

# Used when a model file carries no template (ChatML, as SmolLM2 and Qwen2 use).
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


# What the renderer sets itself (a caller's template variables may not replace them).
RENDERER_VARIABLES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
)
# A template's own failures for the values it was given (a 400, never a 500).
_RENDER_ERRORS = (TypeError, KeyError, AttributeError, ValueError, ArithmeticError, IndexError)


class ChatTemplateError(ValueError):
    """The template raised or could not be rendered for these messages."""


def _raise_exception(message: str) -> None:
    from jinja2 import TemplateError

    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators=None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` in a template, as transformers provides it (no attribute access beyond)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _generation_extension():
    """`{% generation %}...{% endgeneration %}` (transformers marks the assistant's tokens with
    it for training masks): renders its body as it is."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    return Generation


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _generation_extension()]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    return env.from_string(source)


class ChatTemplate:
    def __init__(
        self, source: str | None, bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        self.source = source or DEFAULT_CHAT_TEMPLATE
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""

    @property
    def _template(self):
        """Compiled on first use (the engine core never renders one; the server renders one
        at start-up, so a broken template is reported there)."""
        return _compile(self.source)

    @property
    def supports_tools(self) -> bool:
        return "tools" in self.source

    @property
    def reserved_variables(self) -> frozenset[str]:
        """Names a caller's variables may not take: the renderer's own and the template
        environment's globals (raise_exception, namespace, range, ...)."""
        return RENDERER_VARIABLES | frozenset(self._template.globals)

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """`variables`: extra template variables (chat_template_kwargs), one mapping so that
        no key can collide with a parameter; the renderer's own values win over them."""
        from jinja2 import TemplateError

        context = {
            **(variables or {}),
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "tools": tools,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        try:
            return self._template.render(context)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template error: {e}") from e
        except RecursionError as e:
            raise ChatTemplateError("chat template error: nested too deeply") from e
        except _RENDER_ERRORS as e:
            raise ChatTemplateError(f"messages do not fit the chat template: {e}") from e
