"""Repeated measurements of one speed: the benchmarks report their median with min..max."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class Samples:
    """Repeated measurements of one quantity (tokens/s)."""

    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else 0.0

    def span(self) -> str:
        return f"{min(self.runs):.1f}..{max(self.runs):.1f}" if self.runs else "-"

    def cell(self) -> str:
        """``median (min..max)``, or the lone value of a single run."""
        if len(self.runs) == 1:
            return f"{self.runs[0]:.1f}"
        return f"{self.median:.1f} ({self.span()})" if self.runs else "-"
