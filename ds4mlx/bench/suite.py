"""``ds4 bench``: every benchmark section in one run, one report (Markdown, JSON, PNG charts).

Sections: decode (target-only decode and prefill at several context sizes, llama.cpp beside it
when importable), speculation (each drafter against target-only on the fixture prompts, with τ,
acceptance per position, pauses and greedy parity), experts (resident vs streamed at several cache
budgets, each in its own process for peak RSS) and quality (held-out NLL and logprob agreement
between paths). The JSON report carries a flat ``metrics`` map of speeds that ``--compare``
checks against a baseline report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ds4mlx.bench import decode, experts, quality, speculation
from ds4mlx.bench.machine import machine_description
from ds4mlx.generation import DrafterKind, SpeculationConfig
from ds4mlx.resources import data_dir

ASSETS = data_dir("assets")
SECTIONS = ("decode", "speculation", "experts", "quality")


#: Rounds of the quick bench's speculation section. Its rows must tell a drafter at 0.97x from
#: one at 1.0x, and one round's ratio is left to a few milliseconds of another process or of a
#: scheduler's probe: a drafter that never drafts (prompt lookup on a chat answer) reads each
#: round at 1.0 with a spread of 4%, and the median of six such rounds fell to 0.96 one time in
#: six (36 rounds, 2026-12-05). The median of n rounds spreads by about 1.25 x 4% / sqrt(n):
#: 24 rounds hold it to 1%, three of them between 0.97 and 1.0, for ~30 s more on the tiny
#: model than six (each round decodes 40 tokens six times).
QUICK_SPECULATION_ROUNDS = 24


@dataclass
class BenchConfig:
    model: Path = ASSETS / "ds4-tiny.gguf"
    dspark: Path = ASSETS / "ds4-tiny-dspark.gguf"
    dflash: Path = ASSETS / "ds4-tiny-dflash.gguf"
    mtp: Path = ASSETS / "ds4-tiny-mtp.gguf"
    mtp_draft: int = 3
    #: Prompt lookup's longest draft in the "lookup" and "dspark+lookup" rows (0: no rows).
    lookup: int = 7
    glm: Path | None = ASSETS / "glm-tiny.gguf"
    sections: tuple[str, ...] = SECTIONS
    runs: int = 3
    #: Rounds of the speculation section (None: ``runs``); see ``speculation.bench_prompt``.
    speculation_runs: int | None = None
    max_tokens: int = 64
    contexts: tuple[int, ...] = decode.PREFILL_CONTEXTS
    n_decode: int = 64
    prompts: tuple[str, ...] = (
        "hello",
        "redis",
        "math",
        "python_reverse",
        "c_add",
        "prose",
        "code",
        "copy",
    )
    expert_shares: tuple[float, ...] = (1.0, 0.5, 0.25, 0.10)
    expert_colds: tuple[bool, ...] = (False, True)
    expert_tokens: int = 16
    agreement_snippets: int = 5
    peers: bool = True
    threads: int = 2
    #: settings that are recorded in the report but do not steer a section
    notes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """Fewer runs, tokens and prompts, so the whole bench takes about a minute on 2 quiet
        cores (docs/performance.md): one timed run after the warm-up
        (``QUICK_SPECULATION_ROUNDS`` rounds of 40 tokens in the speculation section), prefill
        at 128 and 512 tokens, three prompts (a chat answer, a chat answer in code, prose),
        the dflash-layout file (the same drafter as DSpark in llama.cpp's layout) and the
        held-out code prompts left out, warm page cache only."""
        values: dict[str, Any] = dict(
            runs=1,
            speculation_runs=overrides.get("runs", QUICK_SPECULATION_ROUNDS),
            max_tokens=40,
            n_decode=32,
            contexts=(128, 512),
            expert_shares=(0.5, 0.25),
            expert_colds=(False,),
            expert_tokens=8,
            agreement_snippets=2,
            prompts=("redis", "python_reverse", "prose"),
            dflash=None,
        )
        values.update(overrides)
        return cls(**values)

    def runs_description(self) -> str:
        """How many runs the selected sections time, for the report's heading: the
        speculation section counts rounds of its own (``speculation_runs``)."""
        parts = []
        if any(section != "speculation" for section in self.sections):
            many = self.runs > 1
            parts.append(
                f"warm-up, then {'median (min..max) of ' if many else ''}{self.runs} timed "
                f"run{'s' * many}"
            )
        if "speculation" in self.sections:
            rounds = self.speculation_runs or self.runs
            parts.append(
                f"speculation: {rounds} round{'s' * (rounds > 1)} of runs decoded in turns"
            )
        return "; ".join(parts)


Progress = Callable[[str], None]


def selected_prompts(names: tuple[str, ...]) -> list[speculation.BenchPrompt]:
    everything = [
        *speculation.CHAT_PROMPTS,
        speculation.PROSE_PROMPT,
        *speculation.code_prompts(),
        *speculation.copy_prompts(),
    ]
    return [p for p in everything if p.name in names or p.name.split(":")[0] in names]


def _ds4_drafters(config: BenchConfig, progress: Progress) -> list[tuple[str, SpeculationConfig]]:
    drafters = []
    for name, kind, path, extra in (
        ("dspark", DrafterKind.DSPARK, config.dspark, {}),
        ("dspark (dflash file)", DrafterKind.DSPARK, config.dflash, {}),
        (
            f"mtp (draft {config.mtp_draft})",
            DrafterKind.MTP,
            config.mtp,
            {"mtp_draft": config.mtp_draft},
        ),
    ):
        if path is None:
            continue
        if Path(path).is_file():
            drafters.append((name, SpeculationConfig(kind, Path(path), **extra)))
        else:
            progress(f"({name} not measured: {path} does not exist)")
    if config.lookup:
        drafters.append(("lookup", SpeculationConfig(lookup=config.lookup)))
        if config.dspark is not None and Path(config.dspark).is_file():
            drafters.append(
                (
                    "dspark+lookup",
                    SpeculationConfig(
                        DrafterKind.DSPARK, Path(config.dspark), lookup=config.lookup
                    ),
                )
            )
    return drafters


def run_decode(config: BenchConfig, progress: Progress) -> tuple[dict, str]:
    import ds4mlx

    model = ds4mlx.load_model(config.model)
    rows = [decode.measure_ds4mlx(model, config.contexts, config.n_decode, config.runs)]
    notes = []
    if config.peers:
        peer = decode.measure_llamacpp(
            str(config.model),
            model.args.vocab_size,
            config.contexts,
            config.n_decode,
            config.runs,
            config.threads,
        )
        if isinstance(peer, str):
            notes.append(f"(llama.cpp peer not measured: {peer})")
        else:
            rows.append(peer)
    model.close()
    text = "\n".join([*notes, decode.markdown_table(rows)])
    return {"rows": [r.as_json() for r in rows]}, text


def run_speculation(
    config: BenchConfig, progress: Progress
) -> tuple[dict, str, list[speculation.SpecResult]]:
    import ds4mlx

    prompts = selected_prompts(config.prompts)
    runs = config.speculation_runs or config.runs
    results: list[speculation.SpecResult] = []
    drafters = _ds4_drafters(config, progress)
    if drafters:
        model = ds4mlx.load_model(config.model)
        results += speculation.bench_model(
            model,
            drafters,
            prompts,
            max_tokens=config.max_tokens,
            runs=runs,
            progress=progress,
        )
        model.close()
    if config.glm is not None and Path(config.glm).is_file():
        glm = ds4mlx.load_model(config.glm)
        results += speculation.bench_model(
            glm,
            [("glm nextn", SpeculationConfig(DrafterKind.NEXTN))],
            prompts,
            max_tokens=config.max_tokens,
            runs=runs,
            progress=progress,
        )
        glm.close()
    elif config.glm is not None:
        progress(f"(glm nextn not measured: {config.glm} does not exist)")
    rows = [*results, *speculation.summary_rows(results)]
    lines = [
        f"Per prompt a warm-up round, then {runs} round{'s' * (runs > 1)}, each a target-only "
        "run and one run per drafter decoded in turns, one decode step each (so all run under "
        "the same machine load), each run timed by its own steps; speed-up: the median "
        "(min..max) of the rounds' drafted / target-only ratios; by CPU time: the same "
        "ratios by the process's CPU seconds over the same steps (other processes' load adds "
        "wall-clock time, not CPU time: steadier on a shared machine, but the work done, not "
        "the wait, and blind to a GPU's); pauses: over the timed runs.\n",
        speculation.markdown_table(rows),
    ]
    if config.peers:
        # llama-cpp-python's API has no speculative decoding with a separate DSpark support
        # file; its target-only speed is in the decode section.
        lines.append(
            "\n(llama.cpp with the DSpark drafter not measured: llama-cpp-python "
            "exposes no speculative decoding with a separate drafter file)"
        )
    if not all(r.parity for r in results):
        lines.append(
            "\nPARITY FAILURE: a drafted run's greedy output differs from the target's own"
        )
    return {"rows": [r.as_json() for r in rows]}, "\n".join(lines), results


def run_experts(config: BenchConfig, progress: Progress) -> tuple[dict, str]:
    notes: list[str] = []
    rows = experts.bench_experts(
        config.model,
        config.expert_shares,
        config.expert_tokens,
        config.expert_colds,
        config.runs,
        skipped=notes.append,
    )
    text = "".join(f"{note}\n" for note in notes) + (
        f"{config.expert_tokens} decoded tokens per run, each configuration in its own "
        f"process (routed experts {rows[0].routed / 2**20:.1f} MiB)\n\n"
        + experts.markdown_table(rows)
    )
    return {"rows": [r.as_json() for r in rows]}, text


def run_quality(config: BenchConfig, progress: Progress) -> tuple[dict, str]:
    import ds4mlx
    from ds4mlx.generation import ExpertOptions

    model = ds4mlx.load_model(config.model)
    snippets = quality.load_snippets()
    nll = quality.heldout_nll(model, snippets)
    # A cache of ~half the routed experts: evictions happen, so the streamed path really reads.
    streamed = ds4mlx.load_model(
        config.model,
        experts=ExpertOptions(stream=True, cache_gib=quality.half_expert_cache_gib(model)),
    )
    worst: dict[str, float] = {}
    for text in snippets[: config.agreement_snippets]:
        ids = quality.snippet_ids(model, text)
        for path, diff in quality.logprob_agreement(model, ids, streamed=streamed).items():
            worst[path] = max(worst.get(path, 0.0), diff)
    streamed.close()
    model.close()
    lines = [
        f"held-out NLL: {nll.mean:.4f} nats/token over {len(snippets)} snippets "
        f"(up to {quality.MAX_TOKENS} tokens each)",
        "",
        f"| path (vs one batched prefill, {config.agreement_snippets} snippets) "
        "| max abs Δ logprob |",
        "|---|---:|",
    ]
    lines += [f"| {path} | {diff:.2e} |" for path, diff in worst.items()]
    return {"nll": nll.as_json(), "agreement": worst}, "\n".join(lines)


def metrics(report: dict) -> dict[str, float]:
    """The report's speeds (higher is better) and held-out NLL (lower is better) by stable
    names, for ``--compare``."""
    out: dict[str, float] = {}
    for row in report.get("decode", {}).get("rows", []):
        engine = row["engine"]
        out[f"decode {engine} t/s"] = decode.Samples(row["decode"]).median
        for n, runs in row["prefill"].items():
            out[f"prefill {n} {engine} t/s"] = decode.Samples(runs).median
    for row in report.get("speculation", {}).get("rows", []):
        key = f"{row['prompt']} / {row['drafter']}"
        out[f"spec {key} drafted t/s"] = row["drafted"]["median"]
        out[f"spec {key} speed-up"] = row["speedup"]
    for row in report.get("experts", {}).get("rows", []):
        pages = "cold" if row["cold"] else "warm"
        out[f"experts {row['budget']} {pages} t/s"] = row["tps"]
    if "quality" in report:
        out["quality held-out nll"] = report["quality"]["nll"]["mean"]
    return out


def section_of(metric: str) -> str:
    """The section a ``metrics`` name comes from (its first word names it)."""
    first = metric.split(" ", 1)[0]
    return {"prefill": "decode", "spec": "speculation"}.get(first, first)


def run(
    config: BenchConfig, progress: Progress
) -> tuple[dict, list[tuple[str, str]], list[speculation.SpecResult]]:
    """Runs the configured sections: (JSON report, [(section title, Markdown)], speculation
    rows for the charts)."""
    report: dict[str, Any] = {
        "machine": machine_description(),
        "model": str(config.model),
        "runs": config.runs,
        **config.notes,
    }
    texts: list[tuple[str, str]] = []
    spec_results: list[speculation.SpecResult] = []
    for section in config.sections:
        started = time.perf_counter()
        progress(f"bench: {section}...")
        if section == "decode":
            report["decode"], text = run_decode(config, progress)
            title = (
                f"Decode: target-only, {config.n_decode} tokens after the shortest prompt; "
                f"prefill at {'/'.join(map(str, config.contexts))} tokens"
            )
        elif section == "speculation":
            report["speculation"], text, spec_results = run_speculation(config, progress)
            title = f"Speculation: greedy, up to {config.max_tokens} tokens"
        elif section == "experts":
            report["experts"], text = run_experts(config, progress)
            title = "Experts: resident vs streamed"
        elif section == "quality":
            report["quality"], text = run_quality(config, progress)
            title = "Quality"
        else:
            raise ValueError(f"unknown section {section!r}; known: {', '.join(SECTIONS)}")
        progress(f"bench: {section} took {time.perf_counter() - started:.0f} s")
        texts.append((title, text))
    report["metrics"] = metrics(report)
    return report, texts, spec_results
