"""Reasoning split from the answer: `<think>...</think>` (Qwen3, DeepSeek-R1 style), as vLLM's
reasoning parsers report it (`reasoning_content` beside `content`).

One incremental parser serves streaming and whole responses: text is fed in any chunking and
the same split comes out. An output that opens with `<think>` (or whose prompt ends inside an
open `<think>`, as templates that start the thinking themselves do) is reasoning until
`</think>`; everything after it, and any output that does not open with `<think>` (thinking
switched off: `chat_template_kwargs: {"enable_thinking": false}`), is content. The
`deepseek_r1` parser, as vLLM's, takes an output without the opener as reasoning up to
`</think>` too (DeepSeek-R1 models often leave `<think>` out).
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"
HARMONY = "openai_gptoss"  # GPT-OSS's harmony channels (structured/harmony.py; vLLM's name)
REASONING_PARSERS = ("qwen3", "deepseek_r1", HARMONY)
REASONING_PARSER_CHOICES = ("auto", "none", *REASONING_PARSERS)


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


def _held(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    """Feeds text, returns what became reasoning and content so far (partial tags held)."""

    def __init__(self, prompt_opens_thinking: bool = False, assume_thinking: bool = False) -> None:
        """`assume_thinking`: an output that does not open with <think> starts in it anyway."""
        self.state = "reasoning" if prompt_opens_thinking else "start"
        self.assume_thinking = assume_thinking
        self.buffer = ""
        self.after_end = False  # newlines right after </think> are no content

    def feed(self, text: str) -> ReasoningDelta:
        self.buffer += text
        out = ReasoningDelta()
        while self.buffer:
            if self.state == "start":
                head = self.buffer.lstrip()
                if head.startswith(THINK_START):
                    self.buffer = head[len(THINK_START) :]
                    self.state = "reasoning"
                elif THINK_START.startswith(head):
                    break  # could still open with <think>: wait for more
                else:
                    self.state = "reasoning" if self.assume_thinking else "content"
            elif self.state == "reasoning":
                end = self.buffer.find(THINK_END)
                if end < 0:
                    keep = _held(self.buffer, THINK_END)
                    out.reasoning += self.buffer[: len(self.buffer) - keep]
                    self.buffer = self.buffer[len(self.buffer) - keep :]
                    break
                out.reasoning += self.buffer[:end]
                self.buffer = self.buffer[end + len(THINK_END) :]
                self.state, self.after_end = "content", True
            else:
                if self.after_end:
                    self.buffer = self.buffer.lstrip("\n")
                    if not self.buffer:
                        break
                    self.after_end = False
                out.content += self.buffer
                self.buffer = ""
        return out

    def finish(self) -> ReasoningDelta:
        """What was held back at the end: an unfinished thought stays reasoning."""
        rest, self.buffer = self.buffer, ""
        if self.state == "reasoning" or (self.state == "start" and self.assume_thinking):
            return ReasoningDelta(reasoning=rest)
        return ReasoningDelta(content=rest.lstrip("\n") if self.after_end else rest)


def split_reasoning(
    text: str, prompt_opens_thinking: bool = False, assume_thinking: bool = False
) -> tuple[str | None, str]:
    """(reasoning or None when there was none, content) of a whole output."""
    parser = ReasoningParser(prompt_opens_thinking, assume_thinking)
    a, b = parser.feed(text), parser.finish()
    reasoning = a.reasoning + b.reasoning
    opened = prompt_opens_thinking or assume_thinking or text.lstrip().startswith(THINK_START)
    return (reasoning if opened else None), a.content + b.content


def prompt_opens_thinking(prompt: str) -> bool:
    """The rendered prompt ends inside a `<think>` block the template opened."""
    return prompt.rfind(THINK_START) > prompt.rfind(THINK_END)


def resolve_reasoning_parser(name: str, chat_template_source: str | None) -> str | None:
    """The parser in force for --reasoning-parser `name`: "auto" picks the harmony parser
    for a chat template in harmony's format (GPT-OSS), the think-tag parser for one that
    speaks <think>; "none" turns it off."""
    if name == "none":
        return None
    if name == "auto":
        source = chat_template_source or ""
        if "<|channel|>" in source:
            return HARMONY
        return "qwen3" if THINK_END in source else None
    if name not in REASONING_PARSERS:
        raise ValueError(
            f"reasoning-parser: unknown {name!r} (one of {', '.join(REASONING_PARSER_CHOICES)})"
        )
    return name
