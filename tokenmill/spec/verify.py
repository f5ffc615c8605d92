"""Verification of drafted tokens against the target model's own choices."""

from __future__ import annotations


def accept_greedy(drafts: list[int], targets: list[int]) -> list[int]:
    """Greedy verification. `targets[i]` is the target's argmax after the sequence plus
    drafts[:i] (len(drafts) + 1 of them). Drafts are accepted while each equals the target's
    choice at its position; the output is the accepted drafts plus the target's token after
    them (its correction, or a bonus token when every draft passed): exactly the tokens
    greedy decoding without drafts would produce, one step at a time."""
    out = [targets[0]]
    for i, draft in enumerate(drafts):
        if draft != targets[i]:
            break
        out.append(targets[i + 1])
    return out
