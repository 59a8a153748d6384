"""Speculative decoding measured against target-only decoding on the same prompts, in one run.

For every (prompt, drafter) pair: greedy generation with the target alone and with the drafter,
each a warm-up then ``runs`` timed runs (median, min and max kept); the drafted run's τ, acceptance
per draft position and scheduler pauses; and greedy parity (the drafted output must be the
target's own tokens). ds4's acceptance fixtures name the chat prompts (``hello``, ``redis``,
``math``, ``python_reverse``, ``c_add``); a prose continuation and the beginnings of standard-
library files the drafter trainer held out (``scripts/train_drafters.py``) complete the set.
"""

from __future__ import annotations

import re
import statistics
import sysconfig
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ds4mlx.bench.samples import Samples
from ds4mlx.generation import (
    Done,
    DrafterLease,
    SpeculationConfig,
    TokenEvent,
    generate,
    load_drafter,
)

if TYPE_CHECKING:
    from ds4mlx.generation import Drafter
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
    #: The scheduler's pauses: for poor acceptance or missing drafts, and for cost.
    pauses: int
    parity: bool

    @property
    def speedup(self) -> float:
        return self.drafted.median / self.target.median if self.target.median else 0.0

    def as_json(self) -> dict:
        data = asdict(self)
        data["target"] = {"median": self.target.median, "runs": self.target.runs}
        data["drafted"] = {"median": self.drafted.median, "runs": self.drafted.runs}
        data["speedup"] = self.speedup
        return data


def _run(
    model: LoadedModel,
    ids: list[int],
    max_tokens: int,
    drafter: Drafter | None,
    config: SpeculationConfig,
    stop_tokens: Sequence[int],
    lease: DrafterLease | None = None,
) -> tuple[list[int], float, Done]:
    """One greedy generation on a fresh session: tokens, decode tokens/s and its Done."""
    session = model.new_session()
    if drafter is not None:
        drafter.reset()
    tokens: list[int] = []
    done: Done | None = None
    for event in generate(
        session,
        ids,
        max_tokens,
        drafter=drafter,
        config=config,
        stop_tokens=stop_tokens,
        lease=lease,
    ):
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
        else:
            done = event
    assert done is not None
    return tokens, done.stats.decode_tps, done


def bench_prompt(
    model: LoadedModel,
    prompt: BenchPrompt,
    drafter_name: str,
    drafter: Drafter,
    config: SpeculationConfig,
    *,
    max_tokens: int,
    runs: int,
    lease: DrafterLease | None = None,
) -> SpecResult:
    """``lease``: the drafter's across runs and prompts, as a server keeps one for its drafter
    (the scheduler's cost rule measures plain decoding once per lease)."""
    ids = prompt_ids(model, prompt)
    # A chat answer ends at its end-of-turn; text and code run the full length, so that each
    # row measures the same amount of decoding (a tiny model may end prose at once).
    stop = model.tokenizer.stop_ids if prompt.kind == "chat" else ()
    target, drafted = Samples(), Samples()
    plain_tokens, _, _ = _run(model, ids, max_tokens, None, config, stop)  # warm-up
    spec_tokens, _, done = _run(model, ids, max_tokens, drafter, config, stop, lease)
    for _ in range(runs):
        target.runs.append(_run(model, ids, max_tokens, None, config, stop)[1])
        drafted.runs.append(_run(model, ids, max_tokens, drafter, config, stop, lease)[1])
    # Greedy runs repeat the same cycles: the warm-up's counters are every run's.
    stats = done.acceptance
    assert stats is not None, f"{drafter_name} decoded without speculation"
    return SpecResult(
        prompt.name,
        drafter_name,
        target,
        drafted,
        len(spec_tokens),
        stats.tau,
        stats.acceptance_rate,
        stats.position_acceptance,
        stats.scheduler.pauses + stats.scheduler.cost_pauses,
        spec_tokens == plain_tokens,
    )


def bench_model(
    model: LoadedModel,
    drafters: Sequence[tuple[str, SpeculationConfig]],
    prompts: Sequence[BenchPrompt],
    *,
    max_tokens: int,
    runs: int,
    progress: Callable[[str], None] = lambda _line: None,
) -> list[SpecResult]:
    results = []
    for name, config in drafters:
        drafter = load_drafter(config, model)
        assert drafter is not None, f"{name}: no drafter configured"
        lease = DrafterLease()
        for prompt in prompts:
            started = time.perf_counter()
            results.append(
                bench_prompt(
                    model,
                    prompt,
                    name,
                    drafter,
                    config,
                    max_tokens=max_tokens,
                    runs=runs,
                    lease=lease,
                )
            )
            progress(f"{name} {prompt.name}: {time.perf_counter() - started:.1f} s")
    return results


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
        )


def markdown_table(results: Sequence[SpecResult]) -> str:
    lines = [
        "| prompt | drafter | tokens | target t/s | drafted t/s | speed-up | τ | "
        "acceptance | per position | pauses | parity |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in results:
        positions = " ".join(f"{rate:.2f}" for rate in r.position_acceptance) or "-"
        lines.append(
            f"| {r.prompt} | {r.drafter} | {r.tokens} | {r.target.median:.1f} "
            f"({r.target.span()}) | {r.drafted.median:.1f} ({r.drafted.span()}) | "
            f"{r.speedup:.2f}x | {r.tau:.2f} | {r.acceptance:.2f} | {positions} | {r.pauses} | "
            f"{'yes' if r.parity else 'NO'} |"
        )
    return "\n".join(lines)
