"""Closing a constrained JSON output before its token budget runs out.

When a constrained request nears max_tokens (or keeps looping), sampling is narrowed, among
the tokens the grammar allows, to the ones that finish the document soonest: close the open
string, then the innermost array/object, and end the sequence when the document is whole.
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
