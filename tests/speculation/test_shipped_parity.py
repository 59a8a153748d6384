"""Greedy speculative output equals plain greedy output, token for token, on the shipped tiny
family: ds4-tiny with its DSpark and legacy MTP drafters, glm-tiny with its NextN layer; ten
prompts (chat and held-out code), 128 tokens each."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import ds4mlx
from ds4mlx.bench.speculation import CHAT_PROMPTS, PROSE_PROMPT, code_prompts, prompt_ids
from ds4mlx.engine.generate import TokenEvent
from ds4mlx.generation import generate
from ds4mlx.speculation import DrafterKind, SpeculationConfig, load_drafter, scheduler
from ds4mlx.speculation.scheduler import COST_PAUSE, QUICK_SAMPLES

import pytest

from .conftest import losing_lease

ASSETS = Path(__file__).resolve().parents[2] / "assets"
N_TOKENS = 128
PROMPTS = [*CHAT_PROMPTS, PROSE_PROMPT, *code_prompts()[:4]]
CASES = {
    "dspark": (
        "ds4-tiny.gguf",
        SpeculationConfig(DrafterKind.DSPARK, ASSETS / "ds4-tiny-dspark.gguf"),
    ),
    "mtp": (
        "ds4-tiny.gguf",
        SpeculationConfig(
            DrafterKind.MTP, ASSETS / "ds4-tiny-mtp.gguf", mtp_draft=3, mtp_margin=0.0
        ),
    ),
    "nextn": ("glm-tiny.gguf", SpeculationConfig(DrafterKind.NEXTN)),
}


@cache
def _model(target_file: str):
    return ds4mlx.load_model(ASSETS / target_file)


@cache
def _plain(target_file: str, prompt_index: int) -> list[int]:
    """Plain greedy decoding's tokens for ``PROMPTS[prompt_index]``, decoded once per target
    (the drafters of one target and both tests compare against the same output)."""
    model = _model(target_file)
    ids = prompt_ids(model, PROMPTS[prompt_index])
    events = generate(model.new_session(), ids, N_TOKENS)
    return [e.token for e in events if isinstance(e, TokenEvent)]


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_greedy_equals_plain_greedy(case):
    target_file, config = CASES[case]
    files = [ASSETS / target_file] + ([config.support_path] if config.support_path else [])
    if not all(f.is_file() for f in files):
        pytest.skip(f"{', '.join(f.name for f in files)} not all built")
    assert len(PROMPTS) >= 10
    model = _model(target_file)
    drafter = load_drafter(config, model)

    def run(ids, drafter):
        events = list(generate(model.new_session(), ids, N_TOKENS, drafter=drafter, config=config))
        return [e.token for e in events if isinstance(e, TokenEvent)], events[-1].stats

    accepted = 0
    for index, prompt in enumerate(PROMPTS):
        ids = prompt_ids(model, prompt)
        plain = _plain(target_file, index)
        drafted, stats = run(ids, drafter)
        assert drafted == plain, prompt.name
        assert len(plain) == N_TOKENS  # no stop tokens: the whole length is compared
        accepted += stats.accepted_tokens
    assert accepted > 0  # the drafts were really used


@pytest.mark.parametrize("case", list(CASES))
def test_cost_pauses_keep_greedy_output_and_the_drafter_in_step(case, monkeypatch):
    """With plain decoding measured as cheaper than any drafted cycle, the cost rule pauses
    each drafter for runs of plain pipelined advances and probes it again after each: the
    drafter must follow those advances' rows, so that its drafts after a pause are still
    accepted, and the output stays plain greedy's. (Pauses are held to the shortest, so that
    one request holds several: against free plain decoding every probe loses by far.)"""
    monkeypatch.setattr(scheduler, "MAX_COST_PAUSE", COST_PAUSE)
    monkeypatch.setattr(scheduler, "MAX_SILENT_PAUSE", COST_PAUSE)
    monkeypatch.setattr(scheduler, "MAX_LOSS_PAUSE", COST_PAUSE)
    target_file, config = CASES[case]
    files = [ASSETS / target_file] + ([config.support_path] if config.support_path else [])
    if not all(f.is_file() for f in files):
        pytest.skip(f"{', '.join(f.name for f in files)} not all built")
    model = _model(target_file)
    drafter = load_drafter(config, model)
    accepted_after_a_pause = 0
    for prompt in [*PROMPTS[:2], PROSE_PROMPT, *code_prompts()[:2]]:
        ids = prompt_ids(model, prompt)
        plain = _plain(target_file, PROMPTS.index(prompt))
        lease = losing_lease()
        events = list(
            generate(
                model.new_session(), ids, N_TOKENS, drafter=drafter, config=config, lease=lease
            )
        )
        stats = events[-1].stats
        assert [e.token for e in events if isinstance(e, TokenEvent)] == plain, prompt.name
        assert stats.scheduler.cost_pauses >= 2 and stats.scheduler.plain_advances > 0
        # More drafts accepted than the first probe can hold (against free plain decoding no
        # drafter can pay, judged after QUICK_SAMPLES cycles): drafting resumed in step.
        accepted_after_a_pause += stats.accepted_tokens > QUICK_SAMPLES * drafter.max_draft
    assert accepted_after_a_pause > 0
