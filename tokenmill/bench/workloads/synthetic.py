"""Generated workloads: random lengths, shared prefixes, multi-turn chats."""

from __future__ import annotations

from tokenmill.bench.prompts import PromptMaker
from tokenmill.bench.workloads.base import (
    Session,
    Turn,
    Workload,
    WorkloadSpec,
    gather_limited,
    sub_rng,
)


async def random_workload(spec: WorkloadSpec, maker: PromptMaker, seed: int) -> Workload:
    rng = sub_rng(seed, 0)
    ins = spec.input_len.sample(rng, spec.num_requests)
    outs = spec.output_len.sample(rng, spec.num_requests)

    def factory(i: int):
        return lambda: maker.make(sub_rng(seed, 1, i), ins[i])

    made = await gather_limited([factory(i) for i in range(spec.num_requests)])
    sessions = tuple(Session(i, (Turn(text, n, outs[i]),)) for i, (text, n) in enumerate(made))
    return Workload("random", sessions, maker.kind, spec.describe())


async def shared_prefix_workload(spec: WorkloadSpec, maker: PromptMaker, seed: int) -> Workload:
    """num_groups prefixes, each followed by prompts_per_group distinct suffixes; shuffled."""
    groups, per = spec.num_groups, spec.prompts_per_group
    prefixes = await gather_limited(
        [(lambda g=g: maker.make(sub_rng(seed, 2, g), spec.prefix_len)) for g in range(groups)]
    )
    suffixes = await gather_limited(
        [
            (lambda g=g, j=j: maker.make(sub_rng(seed, 3, g, j), spec.suffix_len))
            for g in range(groups)
            for j in range(per)
        ]
    )
    outs = spec.output_len.sample(sub_rng(seed, 0), groups * per)
    items = []
    for k, (suffix, n_suffix) in enumerate(suffixes):
        g = k // per
        prefix, n_prefix = prefixes[g]
        sep = "" if prefix[-1:].isspace() or suffix[:1].isspace() else " "
        items.append((g, Turn(prefix + sep + suffix, n_prefix + n_suffix, outs[k])))
    sub_rng(seed, 4).shuffle(items)
    sessions = tuple(Session(i, (turn,), group=g) for i, (g, turn) in enumerate(items))
    return Workload("shared-prefix", sessions, maker.kind, spec.describe())


async def multi_turn_workload(spec: WorkloadSpec, maker: PromptMaker, seed: int) -> Workload:
    """ceil(num_requests / turns) conversations of `turns` user turns each.

    Each later turn is sent with the whole conversation so far: earlier user turns and the
    assistant replies actually received (added by the runner at send time).
    """
    n_conv = -(-spec.num_requests // spec.turns)
    rng = sub_rng(seed, 0)
    ins = spec.input_len.sample(rng, n_conv * spec.turns)
    outs = spec.output_len.sample(rng, n_conv * spec.turns)
    made = await gather_limited(
        [(lambda k=k: maker.make(sub_rng(seed, 5, k), ins[k])) for k in range(len(ins))]
    )
    sessions = []
    for c in range(n_conv):
        span = range(c * spec.turns, (c + 1) * spec.turns)
        sessions.append(Session(c, tuple(Turn(made[k][0], made[k][1], outs[k]) for k in span)))
    return Workload("multi-turn", tuple(sessions), maker.kind, spec.describe())
