"""The generation API's last events carry what speculation accepted, so a face reads τ and the
counts from the event without knowing which decoder ran."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.generation import (
    ChatService,
    Done,
    Finished,
    GenerationStats,
    SpeculationConfig,
    SpeculativeStats,
    TextDelta,
    TokenEvent,
    generate,
    load_drafter,
)

import pytest

REPO = Path(__file__).resolve().parents[2]
# Code that repeats itself: prompt lookup finds copies to draft from.
COPY_TEXT = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
) * 2
LOOKUP = SpeculationConfig(lookup=7, lookup_ngram=(2, 4))


@pytest.fixture(scope="module")
def tiny():
    return ds4mlx.load_model(REPO / "assets" / "ds4-tiny.gguf")


def run(model, config: SpeculationConfig, n: int = 32) -> tuple[list[int], Done]:
    prompt = model.tokenizer.encode(COPY_TEXT)
    drafter = load_drafter(config, model)
    events = list(generate(model.new_session(), prompt, n, None, drafter, config))
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    assert isinstance(events[-1], Done)
    return [e.token for e in events[:-1]], events[-1]


def test_plain_decoding_ends_with_no_acceptance(tiny):
    _, done = run(tiny, SpeculationConfig())
    assert done.acceptance is None
    assert done.stats.generated_tokens == 32


def test_a_drafted_generation_ends_with_its_acceptance(tiny):
    plain, _ = run(tiny, SpeculationConfig())
    tokens, done = run(tiny, LOOKUP)
    assert tokens == plain  # greedy: drafting changes the speed, never the text
    acceptance = done.acceptance
    assert acceptance is not None
    assert 0 < acceptance.accepted_tokens <= acceptance.drafted_tokens
    assert acceptance.acceptance_rate == acceptance.accepted_tokens / acceptance.drafted_tokens
    assert acceptance.tau == pytest.approx(
        (acceptance.accepted_tokens + acceptance.drafted_passes) / acceptance.drafted_passes
    )
    assert acceptance.tau > 1


def test_a_strict_config_decodes_target_only_and_reports_no_acceptance(tiny):
    plain, _ = run(tiny, SpeculationConfig())
    tokens, done = run(tiny, SpeculationConfig(lookup=7, lookup_ngram=(2, 4), strict=True))
    assert tokens == plain and done.acceptance is None


def test_the_chat_service_finishes_with_the_acceptance(tiny):
    drafting = ChatService(tiny, load_drafter(LOOKUP, tiny), LOOKUP, max_context=512)
    plain = ChatService(tiny, max_context=512)
    ends = []
    for service in (plain, drafting):
        events = list(service.complete(COPY_TEXT, max_tokens=32))
        assert isinstance(events[-1], Finished)
        ends.append(("".join(e.text for e in events if isinstance(e, TextDelta)), events[-1]))
    (plain_text, plain_end), (text, end) = ends
    assert text == plain_text
    assert plain_end.acceptance is None
    assert end.acceptance is not None and end.acceptance.drafted_tokens > 0
    assert end.acceptance is end.stats  # the same generation's counters, not a copy


def test_finished_built_by_a_backend_reports_acceptance_only_from_speculative_stats():
    """The agent's HTTP backend builds Finished itself, with plain statistics."""
    assert Finished("stop", 3, 2, 0, GenerationStats()).acceptance is None
    counters = SpeculativeStats(drafted_passes=4, drafted_tokens=12, accepted_tokens=9)
    assert Finished("stop", 3, 2, 0, counters).acceptance is counters
