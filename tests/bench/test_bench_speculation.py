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
    assert len(table) == 2 + len(results) + 1 and all(line.count("|") == 12 for line in table)


def test_text_prompts_keep_their_whole_text(glm):
    prompt = BenchPrompt("t", "text", "one two three " * 40)
    assert glm.tokenizer.decode(prompt_ids(glm, prompt)) == prompt.text


def test_rounds_pair_each_drafted_run_with_its_rounds_target_run(monkeypatch):
    """Scripted runs (tokens/s by call order): the warm-up is shared, odd rounds run the
    drafters first in reverse, each ratio divides by the same round's target-only run, and a
    drafted run whose output differs in any timed round fails parity for that drafter alone."""
    from types import SimpleNamespace

    from ds4mlx.bench import speculation
    from ds4mlx.generation import SpeculativeStats

    calls: list[str] = []
    speeds = {  # (drafter, nth timed run) -> tokens/s
        ("plain", 1): 100.0,
        ("a", 1): 150.0,
        ("b", 1): 90.0,
        ("b", 2): 40.0,
        ("a", 2): 60.0,
        ("plain", 2): 50.0,
    }

    def run(model, ids, max_tokens, drafter, config, stop, lease=None):
        name = "plain" if drafter is None else drafter.name
        calls.append(name)
        nth = calls.count(name) - 1  # the warm-up is the 0th
        tokens = [1, 2, 3] if (name, nth) != ("b", 2) else [1, 2, 4]
        stats = SpeculativeStats(drafted_passes=1, drafted_tokens=2, accepted_tokens=1)
        done = SimpleNamespace(acceptance=None if drafter is None else stats)
        return tokens, speeds.get((name, nth), 0.0), done

    monkeypatch.setattr(speculation, "_run", run)
    monkeypatch.setattr(speculation, "prompt_ids", lambda model, prompt: [7])
    drafters = [
        speculation._Drafting(n, SpeculationConfig(), SimpleNamespace(name=n), None)
        for n in ("a", "b")
    ]
    rows = speculation.bench_prompt(
        None, BenchPrompt("p", "text", "x"), drafters, max_tokens=3, runs=2
    )
    assert calls == ["plain", "a", "b", "plain", "a", "b", "b", "a", "plain"]
    a, b = rows
    assert a.ratios.runs == [1.5, 1.2] and b.ratios.runs == [0.9, 0.8]
    assert a.speedup == 1.35 and a.target.runs == [100.0, 50.0]
    assert a.parity and not b.parity
    assert a.tau == 2.0 and a.acceptance == 0.5 and a.position_acceptance == []
