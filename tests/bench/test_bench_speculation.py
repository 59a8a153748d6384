"""The speculation benchmark's measurements on the shipped GLM tiny model (its NextN drafter is
inside the file): parity, counters and the table agree with a plain run of the same prompt."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.bench.speculation import (
    CHAT_PROMPTS,
    BenchPrompt,
    bench_model,
    code_prompts,
    markdown_table,
    prompt_ids,
    summary_rows,
)
from ds4mlx.generation import generate
from ds4mlx.speculation import DrafterKind, SpeculationConfig

import pytest

GLM = Path(__file__).resolve().parents[2] / "assets" / "glm-tiny.gguf"
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def glm():
    if not GLM.is_file():
        pytest.skip(f"{GLM} is not built")
    return ds4mlx.load_model(GLM)


def test_code_prompts_are_the_held_out_files_this_python_ships():
    prompts = code_prompts()
    assert prompts and all(p.kind == "code" and p.name.startswith("code:") for p in prompts)
    assert len({p.text for p in prompts}) == len(prompts)


def test_bench_rows_match_plain_generation(glm):
    prompts = [CHAT_PROMPTS[0], code_prompts()[0]]
    config = SpeculationConfig(DrafterKind.NEXTN)
    results = bench_model(glm, [("nextn", config)], prompts, max_tokens=MAX_TOKENS, runs=1)
    assert [r.prompt for r in results] == [p.name for p in prompts]
    for prompt, result in zip(prompts, results, strict=True):
        stop = glm.tokenizer.stop_ids if prompt.kind == "chat" else ()
        plain = [
            e.token
            for e in generate(
                glm.new_session(), prompt_ids(glm, prompt), MAX_TOKENS, stop_tokens=stop
            )
            if hasattr(e, "token")
        ]
        assert result.parity and result.tokens == len(plain)
        if result.tau:
            assert 1.0 <= result.tau <= 2.0  # NextN drafts one token a verify
        else:  # a cost pause carried over from the warm-up covered the whole timed run
            assert result.pauses > 0 and result.acceptance == 0.0
        assert len(result.position_acceptance) <= 1
        assert len(result.target.runs) == len(result.drafted.runs) == 1
    assert results[1].tokens == MAX_TOKENS  # code runs the full length, EOS or not
    pooled = list(summary_rows(results))
    assert [r.prompt for r in pooled] == ["code (mean)"] and pooled[0].tau == results[1].tau
    table = markdown_table([*results, *pooled]).splitlines()
    assert len(table) == 2 + len(results) + 1 and all(line.count("|") == 13 for line in table)


def test_text_prompts_keep_their_whole_text(glm):
    prompt = BenchPrompt("t", "text", "one two three " * 40)
    assert glm.tokenizer.decode(prompt_ids(glm, prompt)) == prompt.text


def test_rounds_pair_each_drafted_run_with_its_rounds_target_run(monkeypatch):
    """Scripted rounds (seconds per run): the warm-up round is not timed, each ratio divides by
    the same round's target-only run, and a drafted run whose output differs in any round fails
    parity for that drafter alone."""
    from types import SimpleNamespace

    from ds4mlx.bench import speculation
    from ds4mlx.bench.turns import TimedRun
    from ds4mlx.generation import SpeculativeStats

    rounds = [  # (tokens, seconds, CPU seconds) of the target-only run, drafter a's, b's
        [([1, 2, 3], 9.0, 9.0), ([1, 2, 3], 9.0, 9.0), ([1, 2, 3], 9.0, 9.0)],  # the warm-up
        [([1, 2, 3], 2.0, 1.0), ([1, 2, 3], 1.0, 1.0), ([1, 2, 3], 4.0, 2.0)],
        [([1, 2, 3], 2.0, 1.0), ([1, 2, 3], 4.0, 0.5), ([1, 2, 4], 1.0, 1.0)],
    ]
    stats = SpeculativeStats(drafted_passes=1, drafted_tokens=2, accepted_tokens=1)
    drafted_done = SimpleNamespace(acceptance=stats)

    def scripted_round(model, ids, max_tokens, drafters, stop):
        plain, *drafted = rounds.pop(0)
        tokens, seconds, cpu_seconds = plain
        return [
            TimedRun(tokens, seconds, None, cpu_seconds),
            *(TimedRun(tokens, seconds, drafted_done, cpu) for tokens, seconds, cpu in drafted),
        ]

    monkeypatch.setattr(speculation, "_round", scripted_round)
    monkeypatch.setattr(speculation, "prompt_ids", lambda model, prompt: [7])
    drafters = [
        speculation._Drafting(n, SpeculationConfig(), SimpleNamespace(name=n), None)
        for n in ("a", "b")
    ]
    a, b = speculation.bench_prompt(
        None, BenchPrompt("p", "text", "x"), drafters, max_tokens=3, runs=2
    )
    assert not rounds
    assert a.ratios.runs == [2.0, 0.5] and b.ratios.runs == [0.5, 2.0]
    assert a.speedup == 1.25 and a.target.runs == [1.0, 1.0]  # two tokens after the first
    assert a.drafted.runs == [2.0, 0.5]
    assert a.cpu_ratios.runs == [1.0, 2.0] and b.cpu_ratios.runs == [0.5, 1.0]
    assert a.parity and not b.parity
    assert a.tau == 2.0 and a.acceptance == 0.5 and a.position_acceptance == []
