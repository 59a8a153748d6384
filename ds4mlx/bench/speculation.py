"""Speculative decoding measured against target-only decoding on the same prompts, in one run.

For every prompt: a warm-up round, then ``runs`` rounds, each a target-only run and one run per
drafter decoded in turns, one decode step each (``turns.decode_in_turns``), so that every drafted
run and its target-only partner are timed under the same machine load, millisecond by
millisecond; one after the other, two identical runs of the tiny model differ by 10-20%. A
drafter's speed-up is the median of its per-round ratios (with their min..max). Each row also has
τ, acceptance per draft position and the scheduler's pauses over the timed runs, and greedy
parity (every drafted run's output must be the target's own tokens). A drafter keeps its
``DrafterLease`` across the rounds and prompts, as a server does, so the rows show what the
scheduler settles into. ds4's acceptance fixtures name the chat prompts (``hello``, ``redis``,
``math``, ``python_reverse``, ``c_add``); a prose continuation and the beginnings of
standard-library files the drafter trainer held out (``scripts/train_drafters.py``) complete
the set.
"""

from __future__ import annotations

import re
import statistics
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ds4mlx.bench.samples import Samples
from ds4mlx.bench.turns import TimedRun, decode_in_turns
from ds4mlx.generation import DrafterLease, SpeculationConfig, load_drafter, stepped

if TYPE_CHECKING:
    from ds4mlx.generation import Drafter, SpeculativeStats
    from ds4mlx.loader import LoadedModel


@dataclass(frozen=True)
class BenchPrompt:
    name: str
    # "chat": rendered with the model's chat template; "text": continued as is; "code": the
    # file's first CODE_PROMPT_TOKENS tokens; "copy": the file's beginning shown, then restarted
    kind: str
    text: str


CHAT_PROMPTS = (
    BenchPrompt("hello", "chat", "Hello! Who are you?"),
    BenchPrompt("redis", "chat", "Explain what Redis is and when to use it."),
    BenchPrompt("math", "chat", "What is 17 * 23? Show the steps."),
    BenchPrompt("python_reverse", "chat", "Write a Python function that reverses a string."),
    BenchPrompt("c_add", "chat", "Write a C function that adds two integers."),
)
PROSE_PROMPT = BenchPrompt(
    "prose",
    "text",
    "The harbour was quiet in the early morning. Fishing boats rocked against the pier, and "
    "the old lighthouse keeper walked slowly along the sea wall, counting the gulls as he went.",
)

#: Standard-library files that ``scripts/train_drafters.py`` holds out from drafter training
#: (every tenth stdlib document of the corpus, in name order); the trainer checks this list.
HELD_OUT_CODE_FILES = ("copy.py", "glob.py", "netrc.py", "rlcompleter.py", "token.py", "filecmp.py")
CODE_PROMPT_TOKENS = 64


def code_prompts(names: Sequence[str] = HELD_OUT_CODE_FILES) -> list[BenchPrompt]:
    """Held-out code prompts: the files as the running interpreter ships them (cut to
    ``CODE_PROMPT_TOKENS`` tokens when encoded); files this Python lacks are skipped."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [
        BenchPrompt(f"code:{name}", "code", (stdlib / name).read_text(encoding="utf-8"))
        for name in names
        if (stdlib / name).is_file()
    ]


#: Copy-heavy prompts, made from the held-out files: "rename" shows a function and starts it
#: again under another name (the model repeats the body with one change); "restart" shows the
#: file's beginning and starts it over (an edit of a file shown in the prompt).
COPY_SHOWN_TOKENS = 160
_FUNCTION = re.compile(r"^def (\w+)\(.*?(?=^\S)", re.S | re.M)


def copy_prompts(names: Sequence[str] = HELD_OUT_CODE_FILES) -> list[BenchPrompt]:
    """For each held-out file this Python ships: a "restart" prompt, and a "rename" prompt when
    the file has a top-level function of 150 to 1,200 characters."""
    prompts = []
    for prompt in code_prompts(names):
        name, text = prompt.name.removeprefix("code:"), prompt.text
        prompts.append(BenchPrompt(f"copy:restart:{name}", "copy", text))
        function = next(
            (m for m in _FUNCTION.finditer(text) if 150 <= len(m.group(0)) <= 1200), None
        )
        if function is not None:
            first_line = function.group(0).splitlines()[0]
            renamed = first_line.replace(function.group(1), f"{function.group(1)}_v2", 1)
            prompts.append(
                BenchPrompt(
                    f"copy:rename:{name}", "text", f"{function.group(0).rstrip()}\n\n\n{renamed}\n"
                )
            )
    return prompts


def prompt_ids(model: LoadedModel, prompt: BenchPrompt) -> list[int]:
    if prompt.kind == "chat":
        return model.tokenizer.encode(model.render_user_prompt(prompt.text))
    ids = model.tokenizer.encode(prompt.text)
    if prompt.kind == "copy":
        shown = ids[:COPY_SHOWN_TOKENS]
        return [*shown, *model.tokenizer.encode("\n\n"), *shown[:8]]
    return ids[:CODE_PROMPT_TOKENS] if prompt.kind == "code" else ids


@dataclass
class SpecResult:
    prompt: str
    drafter: str
    target: Samples
    drafted: Samples
    tokens: int
    tau: float
    acceptance: float
    #: Accepted share per draft position: position k counts drafts that reached it.
    position_acceptance: list[float]
    #: The scheduler's pauses over the timed runs: for poor acceptance or missing drafts, and
    #: for cost.
    pauses: int
    parity: bool
    #: Drafted over target-only tokens/s of each round's pair of runs (empty: the medians').
    ratios: Samples = field(default_factory=Samples)
    #: The same ratios by the runs' CPU seconds (``turns``: steadier on a shared machine).
    cpu_ratios: Samples = field(default_factory=Samples)

    @property
    def speedup(self) -> float:
        if self.ratios.runs:
            return self.ratios.median
        return self.drafted.median / self.target.median if self.target.median else 0.0

    def as_json(self) -> dict:
        data = asdict(self)
        for name in ("target", "drafted", "ratios", "cpu_ratios"):
            samples = getattr(self, name)
            data[name] = {"median": samples.median, "runs": samples.runs}
        data["speedup"] = self.speedup
        return data


def _round(
    model: LoadedModel,
    ids: list[int],
    max_tokens: int,
    drafters: Sequence[_Drafting],
    stop: Sequence[int],
) -> list[TimedRun]:
    """The target-only run and one run per drafter, on fresh sessions, decoded in turns
    (``turns.decode_in_turns``): the target-only run first, then the drafters' in order."""
    plain = SpeculationConfig()
    generations = [stepped(model.new_session(), ids, max_tokens, config=plain, stop_tokens=stop)]
    for d in drafters:
        d.drafter.reset()
        generations.append(
            stepped(
                model.new_session(),
                ids,
                max_tokens,
                drafter=d.drafter,
                config=d.config,
                stop_tokens=stop,
                lease=d.lease,
            )
        )
    return decode_in_turns(generations)


@dataclass
class _DrafterRuns:
    """One drafter's timed runs of one prompt."""

    name: str
    parity: bool
    drafted: Samples = field(default_factory=Samples)
    ratios: Samples = field(default_factory=Samples)
    cpu_ratios: Samples = field(default_factory=Samples)
    stats: list[SpeculativeStats] = field(default_factory=list)

    def add(self, run: TimedRun, plain: TimedRun, plain_tokens: list[int]) -> None:
        """A timed run and the target-only run it was decoded in turns with."""
        self.drafted.runs.append(run.decode_tps)
        # The same tokens when parity holds: the ratio of tokens/s is that of the seconds.
        self.ratios.runs.append(run.decode_tps / plain.decode_tps if plain.decode_tps else 0.0)
        self.cpu_ratios.runs.append(run.cpu_tps / plain.cpu_tps if plain.cpu_tps else 0.0)
        if run.done is not None and run.done.acceptance is not None:
            self.stats.append(run.done.acceptance)
        self.parity = self.parity and run.tokens == plain_tokens

    def result(self, prompt: str, target: Samples, tokens: int) -> SpecResult:
        """The row: τ, acceptance and pauses pooled over the runs (a run can start in a pause
        an earlier one left, so runs differ)."""
        stats = self.stats
        assert stats, f"{self.name} decoded without speculation"
        passes = sum(s.drafted_passes for s in stats)
        accepted = sum(s.accepted_tokens for s in stats)
        drafted = sum(s.drafted_tokens for s in stats)
        reached = [0] * max(len(s.position_drafted) for s in stats)
        kept = list(reached)
        for s in stats:
            for k, (n_reached, n_kept) in enumerate(
                zip(s.position_drafted, s.position_accepted, strict=True)
            ):
                reached[k] += n_reached
                kept[k] += n_kept
        return SpecResult(
            prompt,
            self.name,
            target,
            self.drafted,
            tokens,
            (accepted + passes) / passes if passes else 0.0,
            accepted / drafted if drafted else 0.0,
            [k / r for k, r in zip(kept, reached, strict=True)],
            sum(s.scheduler.pauses + s.scheduler.cost_pauses for s in stats),
            self.parity,
            self.ratios,
            self.cpu_ratios,
        )


@dataclass
class _Drafting:
    name: str
    config: SpeculationConfig
    drafter: Drafter
    #: The drafter's across runs and prompts, as a server keeps one for its drafter (the
    #: scheduler carries what drafting costs from one request to the next).
    lease: DrafterLease


def bench_prompt(
    model: LoadedModel,
    prompt: BenchPrompt,
    drafters: Sequence[_Drafting],
    *,
    max_tokens: int,
    runs: int,
) -> list[SpecResult]:
    """One row per drafter: a warm-up round, then ``runs`` timed rounds, each the target-only
    run and one run per drafter decoded in turns; a drafter's ratio in a round is its run's
    speed over that round's target-only run's. Parity: every drafted run, the warm-up's
    included, decodes the target-only run's tokens."""
    ids = prompt_ids(model, prompt)
    # A chat answer ends at its end-of-turn; text and code run the full length, so that each
    # row measures the same amount of decoding (a tiny model may end prose at once).
    stop = model.tokenizer.stop_ids if prompt.kind == "chat" else ()
    plain, *drafted = _round(model, ids, max_tokens, drafters, stop)
    rows = [
        _DrafterRuns(d.name, run.tokens == plain.tokens)
        for d, run in zip(drafters, drafted, strict=True)
    ]
    target = Samples()
    for _ in range(runs):
        timed_plain, *timed = _round(model, ids, max_tokens, drafters, stop)
        target.runs.append(timed_plain.decode_tps)
        for row, run in zip(rows, timed, strict=True):
            row.add(run, timed_plain, plain.tokens)
    return [row.result(prompt.name, target, len(plain.tokens)) for row in rows]


def bench_model(
    model: LoadedModel,
    drafters: Sequence[tuple[str, SpeculationConfig]],
    prompts: Sequence[BenchPrompt],
    *,
    max_tokens: int,
    runs: int,
    progress: Callable[[str], None] = lambda _line: None,
) -> list[SpecResult]:
    """Rows grouped by drafter, in ``drafters``' order, each in ``prompts``' order."""
    drafting = []
    for name, config in drafters:
        drafter = load_drafter(config, model)
        assert drafter is not None, f"{name}: no drafter configured"
        drafting.append(_Drafting(name, config, drafter, DrafterLease()))
    by_prompt = []
    for prompt in prompts:
        started = time.perf_counter()
        by_prompt.append(bench_prompt(model, prompt, drafting, max_tokens=max_tokens, runs=runs))
        progress(f"{prompt.name}: {time.perf_counter() - started:.1f} s")
    return [rows[i] for i in range(len(drafting)) for rows in by_prompt]


def summary_rows(results: Sequence[SpecResult]) -> Iterator[SpecResult]:
    """Per drafter, a pooled row over its held-out code prompts (``code:*``, the τ the
    tiny-family issue asks for) and one over its copy-heavy prompts (``copy:*``)."""
    groups: dict[tuple[str, str], list[SpecResult]] = {}
    for result in results:
        family = result.prompt.split(":")[0]
        if family in ("code", "copy"):
            groups.setdefault((family, result.drafter), []).append(result)
    for (family, drafter), rows in groups.items():
        yield SpecResult(
            f"{family} (mean)",
            drafter,
            Samples([statistics.mean(r.target.median for r in rows)]),
            Samples([statistics.mean(r.drafted.median for r in rows)]),
            sum(r.tokens for r in rows),
            statistics.mean(r.tau for r in rows),
            statistics.mean(r.acceptance for r in rows),
            [],
            sum(r.pauses for r in rows),
            all(r.parity for r in rows),
            Samples([statistics.mean(r.speedup for r in rows)]),
            Samples([statistics.mean(r.cpu_ratios.median for r in rows)])
            if all(r.cpu_ratios.runs for r in rows)
            else Samples(),
        )


def _spread(ratios: Samples) -> str:
    """`` (min..max)`` of several paired ratios; nothing for one."""
    if len(ratios.runs) < 2:
        return ""
    return f" ({min(ratios.runs):.2f}..{max(ratios.runs):.2f})"


def _cpu_speedup(ratios: Samples) -> str:
    return f"{ratios.median:.2f}x{_spread(ratios)}" if ratios.runs else "-"


def markdown_table(results: Sequence[SpecResult]) -> str:
    lines = [
        "| prompt | drafter | tokens | target t/s | drafted t/s | speed-up | by CPU time | τ | "
        "acceptance | per position | pauses | parity |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in results:
        positions = " ".join(f"{rate:.2f}" for rate in r.position_acceptance) or "-"
        lines.append(
            f"| {r.prompt} | {r.drafter} | {r.tokens} | {r.target.median:.1f} "
            f"({r.target.span()}) | {r.drafted.median:.1f} ({r.drafted.span()}) | "
            f"{r.speedup:.2f}x{_spread(r.ratios)} | {_cpu_speedup(r.cpu_ratios)} | "
            f"{r.tau:.2f} | {r.acceptance:.2f} | "
            f"{positions} | {r.pauses} | {'yes' if r.parity else 'NO'} |"
        )
    return "\n".join(lines)
