"""PNG charts of a speculation run: speed-up per prompt, and acceptance per draft position.

matplotlib is an optional dependency (the ``bench`` and ``test`` extras); it is imported only
here, with the non-interactive Agg backend so that plotting works without a display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ds4mlx.bench.speculation import SpecResult


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install -e '.[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_speculation(results: Sequence[SpecResult], directory: Path) -> list[Path]:
    """Writes ``speedup.png`` and ``acceptance.png`` into ``directory``; returns their paths."""
    plt = _pyplot()
    directory.mkdir(parents=True, exist_ok=True)
    drafters = list(dict.fromkeys(r.drafter for r in results))
    prompts = list(dict.fromkeys(r.prompt for r in results))
    written = []

    figure, axes = plt.subplots(figsize=(max(6.0, 1.1 * len(prompts) + 2), 4.2))
    width = 0.8 / max(len(drafters), 1)
    for i, drafter in enumerate(drafters):
        by_prompt = {r.prompt: r.speedup for r in results if r.drafter == drafter}
        xs = [p + (i - (len(drafters) - 1) / 2) * width for p in range(len(prompts))]
        axes.bar(xs, [by_prompt.get(p, 0.0) for p in prompts], width, label=drafter)
    axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes.set_xticks(range(len(prompts)), prompts, rotation=30, ha="right")
    axes.set_ylabel("speed-up vs target-only (×)")
    axes.set_title("Speculative decoding speed-up per prompt (greedy, median of runs)")
    written.append(_save(plt, figure, axes, directory / "speedup.png"))

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for drafter in drafters:
        # Pool the prompts: each position's rate weighted equally per prompt that reached it.
        per_position: dict[int, list[float]] = {}
        for r in results:
            if r.drafter == drafter:
                for k, rate in enumerate(r.position_acceptance):
                    per_position.setdefault(k, []).append(rate)
        if per_position:
            ks = sorted(per_position)
            axes.plot(
                [k + 1 for k in ks],
                [sum(per_position[k]) / len(per_position[k]) for k in ks],
                marker="o",
                label=drafter,
            )
    axes.xaxis.get_major_locator().set_params(integer=True)  # positions are whole numbers
    axes.set_xlabel("draft position")
    axes.set_ylabel("acceptance (share of drafts reaching it)")
    axes.set_ylim(0, 1.05)
    axes.set_title("Acceptance per draft position (mean over prompts)")
    written.append(_save(plt, figure, axes, directory / "acceptance.png"))
    return written


def _save(plt, figure, axes, path: Path) -> Path:
    """Legend, layout, PNG at ``path``; the figure is closed (pyplot keeps every open one)."""
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
