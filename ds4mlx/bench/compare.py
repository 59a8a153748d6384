"""The regression gate: this run's metrics against a stored baseline, like ds4's release QA.

Metrics are named the same way in both reports (``ds4mlx.bench.suite.metrics``). Speeds (higher
is better): more than 5% slower than the baseline is flagged "investigate", more than 10% slower
"regression". Held-out NLL (names ending in "nll", nats/token, lower is better) is deterministic
for a given model file, so it gets absolute bounds: 0.01 nats worse is "investigate", 0.05 nats
"regression". Only regressions fail the gate. Metrics present on one side only are listed but
never fail it: a new drafter or an absent asset is not a slowdown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

INVESTIGATE = 0.05
REGRESSION = 0.10
NLL_INVESTIGATE = 0.01
NLL_REGRESSION = 0.05


@dataclass(frozen=True)
class Comparison:
    metric: str
    baseline: float | None
    current: float | None

    @property
    def is_nll(self) -> bool:
        return self.metric.endswith("nll")

    @property
    def change(self) -> float | None:
        """Relative change of a speed, current vs baseline (-0.12 = 12% slower); for an NLL
        the difference in nats (+0.02 = worse)."""
        if self.baseline is None or self.current is None:
            return None
        if self.is_nll:
            return self.current - self.baseline
        if self.baseline <= 0:
            return None
        return self.current / self.baseline - 1.0

    @property
    def verdict(self) -> str:
        if self.baseline is None:
            return "new"
        if self.current is None:
            return "missing"
        if self.is_nll:
            # Rounded so that exactly 0.01 or 0.05 nats worse sits on the lenient side.
            worse = round(self.current - self.baseline, 9)
            if worse > NLL_REGRESSION:
                return "regression"
            if worse > NLL_INVESTIGATE:
                return "investigate"
            return "ok"
        # Thresholds scale the baseline (rather than comparing the relative change) so that
        # exactly 5% or 10% slower sits on the lenient side of the line despite rounding.
        if self.current < self.baseline * (1 - REGRESSION):
            return "regression"
        if self.current < self.baseline * (1 - INVESTIGATE):
            return "investigate"
        return "ok"


def compare(baseline: Mapping[str, float], current: Mapping[str, float]) -> list[Comparison]:
    names = list(baseline) + [name for name in current if name not in baseline]
    return [Comparison(name, baseline.get(name), current.get(name)) for name in names]


def has_regression(comparisons: list[Comparison]) -> bool:
    return any(c.verdict == "regression" for c in comparisons)


def markdown_table(comparisons: list[Comparison]) -> str:
    lines = ["| metric | baseline | current | change | verdict |", "|---|---:|---:|---:|---|"]
    for c in comparisons:
        digits = 4 if c.is_nll else 2
        base = "-" if c.baseline is None else f"{c.baseline:.{digits}f}"
        current = "-" if c.current is None else f"{c.current:.{digits}f}"
        if c.change is None:
            change = "-"
        else:
            change = f"{c.change:+.4f} nats" if c.is_nll else f"{c.change:+.1%}"
        lines.append(f"| {c.metric} | {base} | {current} | {change} | {c.verdict} |")
    return "\n".join(lines)
