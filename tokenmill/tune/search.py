"""Which configuration to measure next: a coarse grid (each knob at its ends and middle),
then refinement around the frontier (one step in one knob from each frontier point and the
current pick), until nothing new is worth measuring or the budget ends."""

from __future__ import annotations

from tokenmill.tune.frontier import pareto_frontier, pick
from tokenmill.tune.space import Config, SearchSpace, config_key
from tokenmill.tune.trials import Trial


def next_config(
    space: SearchSpace, done: dict[str, Trial], attainment: float = 0.9
) -> Config | None:
    """`done`: the measured configurations by key (TrialStore.measured())."""
    for index in space.coarse_indices():
        config = space.config(index)
        if config_key(config) not in done:
            return config
    points = [t.point() for t in done.values()]
    chosen = pick(points, attainment)
    anchors = [p.key for p in pareto_frontier(points)]
    if chosen is not None and chosen.key not in anchors:
        anchors.insert(0, chosen.key)
    by_key = {t.key: t for t in done.values()}
    for key in anchors:
        trial = by_key.get(key)
        if trial is None:
            continue
        try:
            at = space.index_of(trial.config)
        except (KeyError, ValueError):  # measured in an earlier, different space
            continue
        for index in space.neighbours(at):
            config = space.config(index)
            if config_key(config) not in done:
                return config
    return None
