"""Resident vs streamed routed experts: tokens/s, cache hit rate, bytes read per token, peak RSS.

Each configuration runs in its own child process (``python -m ds4mlx.bench.experts``) because
peak RSS is per process. Two states, each timed over decode steps only:
- "warm": a warm-up generation on another prompt first fills the expert cache (and the OS page
  cache), as in a long-running session; the timed generation then starts from that cache.
- "cold": the model file's pages are dropped with posix_fadvise(DONTNEED) before loading, and
  the expert cache starts empty, so the timed steps include first reads from the disk.
Hit rate and bytes per token count the timed steps alone. With ``runs`` > 1 every configuration
is measured that many times, in rounds over all configurations (so that the machine's drift
reaches them alike); t/s is the median, shown with min..max.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ds4mlx.bench.samples import Samples


@dataclass
class ExpertRun:
    """One configuration: ``budget`` is "resident" or the cache's share of the routed experts."""

    budget: str
    cold: bool
    tps: float
    hit_rate: float
    bytes_per_token: float
    peak_rss: int
    gbps: float
    dropped: bool  # the cold run could drop the file's pages
    routed: int  # routed-expert bytes as computed
    tps_runs: list[float] = field(default_factory=list)  # every timed run's t/s

    def as_json(self) -> dict:
        return asdict(self)


WARMUP_PROMPT = list(range(1, 17))
TIMED_PROMPT = list(range(17, 33))


def _decode(session, logits, n_tokens: int) -> None:
    """``n_tokens`` greedy steps after ``logits``."""
    for _ in range(n_tokens):
        logits = session.feed([int(logits[-1].argmax())])


def _measure_here(path: str, budget: str, cold: bool, routed: int, n_tokens: int) -> ExpertRun:
    """The child's side: load, warm up unless cold, prefill the timed prompt, then time
    ``n_tokens`` greedy decode steps."""
    import ds4mlx
    from ds4mlx.generation import ExpertOptions
    from ds4mlx.memory import peak_rss_bytes

    dropped = False
    if cold and hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        dropped = True
    experts = (
        None
        if budget == "resident"
        else ExpertOptions(stream=True, cache_gib=float(budget) * routed / 2**30)
    )
    model = ds4mlx.load_model(path, weights_dtype="native", experts=experts)
    try:
        if not cold:
            warmup = model.new_session()
            _decode(warmup, warmup.feed(WARMUP_PROMPT), n_tokens)
        session = model.new_session()
        logits = session.feed(TIMED_PROMPT)
        start_stats = model.expert_stats()
        if start_stats is None:
            raise SystemExit(f"{path} has no routed experts")
        started = time.perf_counter()
        _decode(session, logits, n_tokens)
        seconds = time.perf_counter() - started
        stats = model.expert_stats()
    finally:
        model.close()
    hits = stats.hits - start_stats.hits
    needed = hits + stats.misses - start_stats.misses
    return ExpertRun(
        budget,
        cold,
        n_tokens / seconds,
        hits / needed if needed else 1.0,
        (stats.bytes_read - start_stats.bytes_read) / n_tokens,
        peak_rss_bytes(),
        stats.read_gbps,
        dropped,
        stats.routed_bytes,
    )


def measure(path: Path | str, budget: str, cold: bool, routed: int, n_tokens: int) -> ExpertRun:
    """One configuration in a child process; RuntimeError with its log if it fails."""
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "ds4mlx.bench.experts",
            str(path),
            budget,
            "1" if cold else "0",
            str(routed),
            str(n_tokens),
        ],
        capture_output=True,
        text=True,
    )
    if child.returncode:
        raise RuntimeError(f"experts run {budget} failed:\n{child.stderr[-2000:]}")
    return ExpertRun(**json.loads(child.stdout.strip().splitlines()[-1]))


def _combined(runs: Sequence[ExpertRun]) -> ExpertRun:
    """One configuration's runs as one row: median t/s and read speed, the highest peak RSS.
    Hit rate and bytes per token are the same in every run (routing is deterministic)."""
    speeds = Samples([r.tps for r in runs])
    return replace(
        runs[0],
        tps=speeds.median,
        tps_runs=speeds.runs,
        gbps=Samples([r.gbps for r in runs]).median,
        peak_rss=max(r.peak_rss for r in runs),
    )


def bench_experts(
    path: Path | str,
    shares: Sequence[float] = (1.0, 0.5, 0.25, 0.10),
    n_tokens: int = 16,
    colds: Sequence[bool] = (False, True),
    runs: int = 1,
    skipped: Callable[[str], None] = lambda _line: None,
) -> list[ExpertRun]:
    """Resident, then streamed at each share of the routed experts, per page-cache state, each
    ``runs`` times. A share too small for the store (under one layer's top-k experts, which a
    small model reaches at 10%) is reported through ``skipped`` instead of ending the
    benchmark."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    results = []
    for cold in colds:
        budgets = ["resident", *(str(share) for share in shares)]
        samples: dict[str, list[ExpertRun]] = {budget: [] for budget in budgets}
        routed = 0  # known once the resident run (always first) has loaded the model
        for _ in range(runs):
            for budget in list(budgets):
                try:
                    run = measure(path, budget, cold, routed, n_tokens)
                except RuntimeError as exc:
                    if budget == "resident" or "below the minimum" not in str(exc):
                        raise
                    budgets.remove(budget)
                    skipped(
                        f"(streamed at {float(budget) * 100:g}% not measured: "
                        f"{str(exc).strip().splitlines()[-1]})"
                    )
                    continue
                routed = run.routed
                samples[budget].append(run)
        results += [_combined(samples[budget]) for budget in budgets]
    return results


def markdown_table(results: Sequence[ExpertRun]) -> str:
    lines = [
        "| experts | caches | t/s | vs resident | hit rate | MiB/token | read GB/s | "
        "peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[bool, float] = {}
    for r in results:
        if r.budget == "resident":
            base[r.cold] = r.tps
        name = r.budget if r.budget == "resident" else f"streamed, {float(r.budget):.0%} cache"
        pages = ("cold" if r.dropped else "cold, pages kept") if r.cold else "warm"
        ratio = r.tps / base[r.cold] if base.get(r.cold) else 0.0
        lines.append(
            f"| {name} | {pages} | {Samples(r.tps_runs).cell()} | {ratio:.2f}x | "
            f"{r.hit_rate:.1%} | "
            f"{r.bytes_per_token / 2**20:.3f} | {r.gbps:.2f} | "
            f"{r.peak_rss / 2**20:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # the child of measure()
    _path, _budget, _cold, _routed, _tokens = sys.argv[1:6]
    print(
        json.dumps(
            _measure_here(_path, _budget, _cold == "1", int(_routed), int(_tokens)).as_json()
        )
    )
