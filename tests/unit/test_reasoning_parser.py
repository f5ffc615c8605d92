"""The <think> reasoning split: whole and streamed in every chunking give the same result."""

from __future__ import annotations

import pytest

from tokenmill.structured.reasoning import (
    ReasoningParser,
    prompt_opens_thinking,
    resolve_reasoning_parser,
    split_reasoning,
)

CASES = [
    ("<think>\nLet me add.\n</think>\n\nIt is 4.", False, "\nLet me add.\n", "It is 4."),
    ("It is 4.", False, None, "It is 4."),  # thinking switched off
    ("  <think>a < b</think>yes", False, "a < b", "yes"),
    ("<think>cut off in the midd", False, "cut off in the midd", ""),
    ("step one</think>\n\nanswer", True, "step one", "answer"),  # prompt opened <think>
    ("<thinking is not a tag", False, None, "<thinking is not a tag"),
    ("<think></think>\n\n<tool_call>{}</tool_call>", False, "", "<tool_call>{}</tool_call>"),
]


@pytest.mark.parametrize("text,opened,reasoning,content", CASES)
def test_split_whole_and_streamed(text, opened, reasoning, content):
    assert split_reasoning(text, opened) == (reasoning, content)
    for size in (1, 2, 3, 7):
        parser = ReasoningParser(opened)
        got_r, got_c = "", ""
        for i in range(0, len(text), size):
            d = parser.feed(text[i : i + size])
            got_r, got_c = got_r + d.reasoning, got_c + d.content
        d = parser.finish()
        assert (got_r + d.reasoning, got_c + d.content) == (reasoning or "", content)


DEEPSEEK_R1 = [  # vLLM's deepseek_r1: an output without the opener is reasoning up to </think>
    ("step one\n</think>\n\nanswer", "step one\n", "answer"),
    ("<think>\nr</think>a", "\nr", "a"),
    ("still thinking when cut", "still thinking when cut", ""),
    ("<thi", "<thi", ""),
]


@pytest.mark.parametrize("text,reasoning,content", DEEPSEEK_R1)
def test_deepseek_r1_assumes_the_thinking_opened(text, reasoning, content):
    assert split_reasoning(text, assume_thinking=True) == (reasoning, content)
    for size in (1, 2, 5):
        parser = ReasoningParser(assume_thinking=True)
        got_r, got_c = "", ""
        for i in range(0, len(text), size):
            d = parser.feed(text[i : i + size])
            got_r, got_c = got_r + d.reasoning, got_c + d.content
        d = parser.finish()
        assert (got_r + d.reasoning, got_c + d.content) == (reasoning, content)


def test_prompt_state_and_choice():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert resolve_reasoning_parser("auto", "{{ '<think>' }}...</think>") == "qwen3"
    assert resolve_reasoning_parser("auto", "{{ messages }}") is None
    assert resolve_reasoning_parser("none", "</think>") is None
    with pytest.raises(ValueError, match="reasoning-parser"):
        resolve_reasoning_parser("magic", None)
