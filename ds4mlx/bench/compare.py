"""The regression gate: this run's speeds against a stored baseline, like ds4's release QA.

Every compared metric is a speed (higher is better) named the same way in both reports (see
``ds4mlx.bench.report.metrics``). A metric more than 5% slower than the baseline is flagged
"investigate", more than 10% slower "regression"; only regressions fail the gate. Metrics present on
one side only are listed but never fail it: a new drafter or an absent asset is not a slowdown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

INVESTIGATE = 0.05
REGRESSION = 0.10


@dataclass(frozen=True)
class Comparison:
    metric: str
    baseline: float | None
    current: float | None

    @property
    def change(self) -> float | None:
        """Relative change, current vs baseline (-0.12 = 12% slower)."""
        if self.baseline is None or self.current is None or self.baseline <= 0:
            return None
        return self.current / self.baseline - 1.0

    @property
    def verdict(self) -> str:
        if self.baseline is None:
            return "new"
        if self.current is None:
            return "missing"
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
        base = "-" if c.baseline is None else f"{c.baseline:.2f}"
        current = "-" if c.current is None else f"{c.current:.2f}"
        change = "-" if c.change is None else f"{c.change:+.1%}"
        lines.append(f"| {c.metric} | {base} | {current} | {change} | {c.verdict} |")
    return "\n".join(lines)
