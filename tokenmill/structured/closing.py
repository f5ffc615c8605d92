"""Closing a constrained JSON output before its token budget runs out.

When a constrained request nears max_tokens (or keeps looping), sampling is narrowed, among
the tokens the grammar allows, to the ones that finish the document soonest: close the open
string, then the innermost array/object, and end the sequence when the document is whole.
A string that cannot end yet (a format or pattern still unmet) is finished by the shortest
run of characters the grammar accepts before its closing quote (path_to_close).
"""

from __future__ import annotations

import torch

EOS = ""  # marker: the document is complete, end the sequence


def next_closer(text: str) -> str | None:
    """The character that best moves this (partial) JSON text towards completion;
    EOS when it is complete; None when a value must come first (no preference)."""
    stack: list[str] = []
    in_string = escaped = False
    last = ""
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                last = '"'
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
            last = ch
        elif ch in "}]":
            if stack:
                stack.pop()
            last = ch
        elif not ch.isspace():
            last = ch
    if in_string:
        return '"'
    if not stack:
        return EOS if last else None
    if last in ("{", ","):  # a key or an item may follow: closing the container is shortest
        return "}" if stack[-1] == "{" else ("]" if last == "{" or stack[-1] == "[" else None)
    if last in (":", "["):
        return "]" if last == "[" else '"'  # a value is due: an empty string is the shortest
    return "}" if stack[-1] == "{" else "]"


def token_starts(tokens_text: list[str]) -> dict[str, torch.Tensor]:
    """For each closing character, the token ids whose text (stripped) starts with it and
    holds only closing punctuation."""
    closing = set('"}]')  # no comma: a comma commits to one more item or key
    out: dict[str, list[int]] = {c: [] for c in '"}]'}
    for token_id, text in enumerate(tokens_text):
        t = text.strip()
        if t and t[0] in out and set(t) <= closing:
            out[t[0]].append(token_id)
    return {c: torch.tensor(ids, dtype=torch.long) for c, ids in out.items()}


# Characters tried, in order, to reach the end of a string that cannot end yet (a
# `format: email` string needs "@" and a domain first, a date its remaining digits):
# structure first, then digits and letters.
_FILL_ORDER = "@:.-/TZ+0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_ "
_MAX_FILL = 48


def char_tokens(tokens_text: list[str]) -> dict[str, int]:
    """Single-character tokens: character -> token id (the first with that exact text)."""
    wanted = set(_FILL_ORDER) | set('"}]')
    out: dict[str, int] = {}
    for token_id, text in enumerate(tokens_text):
        if text in wanted and text not in out:
            out[text] = token_id
    return out


def path_to_close(matcher, chars: dict[str, int], closer: str) -> int | None:
    """The next token of a short run of single characters after which the grammar accepts
    `closer`; None when no such run is found. Greedy: at each step the first character of
    _FILL_ORDER the grammar accepts, avoiding an immediate repeat when another fits."""
    end = chars.get(closer)
    if end is None:
        return None
    path: list[int] = []
    for _ in range(_MAX_FILL):
        if matcher.validate_tokens([*path, end]) == len(path) + 1:
            return path[0] if path else end
        step = None
        for c in _FILL_ORDER:
            t = chars.get(c)
            if t is None or matcher.validate_tokens([*path, t]) != len(path) + 1:
                continue
            if not path or path[-1] != t:
                step = t
                break
            step = step if step is not None else t
        if step is None:
            return None
        path.append(step)
    return None
