"""One reading of a Prometheus registry: every sample's value by name and labels, and sums
over label subsets, so the dashboard reads the same series /metrics exposes (nothing is
counted twice)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from tokenmill.ui.histogram import Buckets

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Reading:
    values: dict[str, dict[Labels, float]]

    @classmethod
    def of(cls, registry: CollectorRegistry) -> Reading:
        values: dict[str, dict[Labels, float]] = defaultdict(dict)
        for family in registry.collect():
            for s in family.samples:
                values[s.name][frozenset(s.labels.items())] = s.value
        return cls(dict(values))

    def total(self, name: str, **match: str) -> float:
        """The sum over the series of `name` whose labels include `match`."""
        want = set(match.items())
        return sum(v for labels, v in self.values.get(name, {}).items() if want <= labels)

    def by(self, name: str, label: str, **match: str) -> dict[str, float]:
        """Sums of `name` grouped by one label's value."""
        want = set(match.items())
        out: dict[str, float] = defaultdict(float)
        for labels, v in self.values.get(name, {}).items():
            if want <= labels:
                key = dict(labels).get(label)
                if key is not None:
                    out[key] += v
        return dict(out)

    def buckets(self, histogram: str, **match: str) -> Buckets:
        """Cumulative bucket counts of a histogram (summed over other labels), by bound."""
        sums = self.by(histogram + "_bucket", "le", **match)
        return tuple(sorted(((float(le), c) for le, c in sums.items()), key=lambda b: b[0]))
