"""Verification of drafted tokens against the target model's own choices."""

from __future__ import annotations


def accept_drafts(drafts: list[int], targets: list[int]) -> list[int]:
    """`targets[i]` is the token the target model picks after the sequence plus drafts[:i]
    (len(drafts) + 1 of them), each with the request's own sampling rule. Drafts are accepted
    while each equals the target's pick at its position; the output is the accepted drafts
    plus the target's pick after them (its correction, or a bonus token when every draft
    passed).

    Greedy: exactly the tokens decoding without drafts produces, one step at a time.
    Sampling: our proposers draft deterministically (q = a point mass on the draft d), so
    standard speculative rejection sampling accepts d with probability min(1, p(d) / q(d)) =
    p(d) and otherwise resamples from normalize(max(0, p - q)) = p without d. Drawing the
    target's token x ~ p and accepting d iff x == d is that same rule: P(accept) = p(d), and
    a rejected position yields x ~ p conditioned on x != d. Each position's draw uses the
    uniform non-speculative decoding would use there (a seeded request's next one), so
    seeded outputs are the same with speculation on and off."""
    out = [targets[0]]
    for i, draft in enumerate(drafts):
        if draft != targets[i]:
            break
        out.append(targets[i + 1])
    return out
