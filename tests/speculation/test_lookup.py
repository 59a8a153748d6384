"""Prompt lookup: the n-gram index, the drafter's contract, lookup in front of a learned drafter,
and generation with it equal to plain decoding (greedy) on the shipped models."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.engine.generate import DoneEvent
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.generation import generate
from ds4mlx.speculation import SpeculationConfig, load_drafter
from ds4mlx.speculation.config import DrafterKind
from ds4mlx.speculation.drafter import Draft, TargetRows
from ds4mlx.speculation.lookup import LookupDrafter, LookupExtension, NgramIndex

import mlx.core as mx
import pytest

REPO = Path(__file__).resolve().parents[2]
NO_ROWS = TargetRows(0, {}, mx.zeros((0, 1, 1)), mx.zeros((0, 1)))
COPY_TEXT = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
)


def index_of(tokens, sizes=(2, 4)):
    index = NgramIndex(*sizes)
    index.extend(tokens)
    return index


def test_the_longest_most_recent_match_is_continued():
    #             0  1  2  3  4  5  6  7  8  9 10 11
    index = index_of([1, 2, 3, 9, 9, 2, 3, 7, 8, 1, 2, 3])
    # "2 3" + pending 4 never occurred; "3 4" neither: nothing.
    assert index.continuation(4, 5) == ([], 0)
    # pending 7: "2 3 7" occurred at 5..7, followed by 8 1 2 3 (and the pending 7 again).
    assert index.continuation(7, 5) == ([8, 1, 2, 3, 7], 3)
    # pending 9: "1 2 3 9" at 0..3.
    assert index.continuation(9, 3) == ([9, 2, 3], 4)
    # pending 3: "7 9 2 3" never occurred, "9 2 3" did (4..6), followed by 7 9.
    assert index_of([1, 2, 3, 9, 9, 2, 3, 7, 9, 2]).continuation(3, 2) == ([7, 9], 3)
    # The longest n wins over a more recent shorter match: "1 2 3 9" (n=4) at 0..3.
    assert index_of([1, 2, 3, 9, 5, 3, 9, 6, 1, 2, 3]).continuation(9, 2) == ([5, 3], 4)
    # The most recent occurrence of an n-gram wins.
    assert index_of([5, 6, 1, 5, 6, 2, 5]).continuation(6, 1) == ([2], 2)


def test_a_copy_that_runs_into_the_present_repeats_the_pattern():
    # "0 1" last occurred at 1..2: its continuation (index 3) reaches the pending token at
    # once, and goes on as the pattern went: 0 1 0 1 0, one period of two tokens after another.
    assert index_of([7, 0, 1, 0]).continuation(1, 5) == ([0, 1, 0, 1, 0], 2)
    # A period of three: "a b c" repeated, the copy running past the pending token.
    assert index_of([4, 5, 6, 4, 5]).continuation(6, 6) == ([4, 5, 6, 4, 5, 6], 3)


def test_the_index_grows_by_one_entry_per_size_and_token():
    index = NgramIndex(2, 4)
    tokens = list(range(50)) * 4
    index.extend(tokens)
    assert len(index._next) <= 3 * len(tokens)
    assert index.continuation(0, 4) == ([1, 2, 3, 4], 4)
    with pytest.raises(ValueError, match="1 <= min <= max"):
        NgramIndex(3, 2)


def test_the_drafter_follows_observed_tokens_and_recalled_history():
    drafter = LookupDrafter(max_draft=4, ngram=(2, 3))
    assert drafter.propose(4) == Draft()  # nothing observed
    drafter.recall([10, 11, 12, 13, 14])
    drafter.observe([20, 10], 11, NO_ROWS)  # "10 11" occurred in the history
    assert drafter.propose(9).tokens == [12, 13, 14, 20]
    assert drafter.propose(2).tokens == [12, 13]
    assert drafter.last_match == 2
    drafter.observe([11, 12], 99, NO_ROWS)
    assert drafter.propose(4) == Draft() and drafter.last_match == 0
    drafter.reset()
    assert drafter.propose(4) == Draft()
    with pytest.raises(ValueError, match="--lookup must be >= 1"):
        LookupDrafter(0)


class FixedDrafter:
    name = "fixed"
    max_draft = 5
    capture_layers = (1,)

    def __init__(self):
        self.observed = 0

    def reset(self):
        self.observed = 0

    def observe(self, tokens, next_token, rows):
        self.observed += len(tokens)

    def propose(self, max_tokens):
        return Draft([7] * min(max_tokens, self.max_draft), [0.5] * min(max_tokens, 5))

    def propose_on_device(self, max_tokens):
        return mx.array(self.propose(max_tokens).tokens, dtype=mx.int32)


def test_lookup_extends_the_learned_block_with_the_copy_past_it():
    learned = FixedDrafter()
    combined = LookupExtension(learned, LookupDrafter(7, (2, 4)))
    assert combined.capture_layers == (1,) and combined.max_draft == 7
    combined.observe([1, 2, 7, 7, 7, 7, 7, 8, 9, 1], 2, NO_ROWS)
    assert learned.observed == 10  # both drafters follow every committed row
    # The copy after "1 2" starts with the block: the block is extended by the copy's 8 9.
    draft = combined.propose(7)
    assert draft.tokens == [7, 7, 7, 7, 7, 8, 9] and len(draft.confidences) == 7
    assert combined.last_sources == [("fixed", 5), ("lookup", 2)]
    assert combined.propose_on_device(7).tolist() == [7, 7, 7, 7, 7, 8, 9]
    assert combined.propose(6).tokens == [7] * 5 + [8]
    combined.observe([2, 5], 1, NO_ROWS)  # "5 1" never occurred: no copy, the block alone
    assert combined.propose(7).tokens == [7] * 5
    assert combined.last_sources == [("fixed", 5), ("lookup", 0)]
    assert combined.propose_on_device(7).tolist() == [7] * 5
    # "9 1" occurred (8..9), followed by 2 5 1 9 3 3 3: a copy the block contradicts.
    combined.observe([1, 9, 3, 3, 3, 3, 9], 1, NO_ROWS)
    assert combined.propose(7).tokens == [7] * 5  # the host compares and drops the extension
    # The device path cannot compare without reading the block: the verify pass judges.
    assert combined.propose_on_device(7).tolist() == [7] * 5 + [3, 3]


def test_an_empty_learned_block_is_not_extended_by_a_weak_copy():
    """A learned drafter that proposes nothing (MTP's margin) gives no block to lengthen: a
    short match's copy, a weak guess, is not drafted in its place (fresh6's
    lookup_extension_of_an_empty_block)."""
    learned = FixedDrafter()
    learned.propose = lambda max_tokens: Draft([], [])
    combined = LookupExtension(learned, LookupDrafter(7, (2, 4)), min_match=3)
    combined.observe([1, 2, 8, 9, 1], 2, NO_ROWS)  # "1 2" matched: a copy of 8 9 1 2
    assert combined.lookup.propose(7).tokens and combined.lookup.last_match == 2
    assert combined.propose(7).tokens == []
    assert combined.last_sources == [("fixed", 0), ("lookup", 0)]


def test_a_long_match_drafts_the_copy_in_place_of_the_learned_block():
    learned = FixedDrafter()
    combined = LookupExtension(learned, LookupDrafter(7, (2, 4)), min_match=3)
    combined.observe([4, 5, 6, 1, 2, 3, 9, 4, 5], 6, NO_ROWS)  # "4 5 6" matched (n=3)
    assert combined.propose(7).tokens == [1, 2, 3, 9, 4, 5, 6]
    assert combined.last_sources == [("lookup", 7)]
    assert combined.propose_on_device(4).tolist() == [1, 2, 3, 9]
    combined.observe([6, 8, 1], 2, NO_ROWS)  # only "1 2" (n=2) matched: block + extension
    assert combined.propose(7).tokens == [7] * 5
    assert combined.last_sources == [("fixed", 5), ("lookup", 0)]


def test_the_copy_past_the_block_carries_the_block_s_last_confidence():
    learned = FixedDrafter()
    learned.propose = lambda max_tokens: Draft([7, 7], [0.9, 0.6])
    combined = LookupExtension(learned, LookupDrafter(7, (2, 4)))
    combined.observe([1, 2, 7, 7, 8, 9, 1], 2, NO_ROWS)  # "1 2": a copy of 7 7 8 9 1
    draft = combined.propose(5)
    assert draft.tokens == [7, 7, 8, 9, 1]
    assert draft.confidences == [0.9, 0.6, 0.6, 0.6, 0.6]


def test_a_proposal_of_nothing_reports_no_match():
    drafter = LookupDrafter(4)
    drafter.observe_tokens([1, 2, 3, 1, 2], 3)  # "1 2 3" occurred
    assert drafter.propose(4).tokens == [1, 2, 3, 1] and drafter.last_match == 3
    assert drafter.propose(0).tokens == [] and drafter.last_match == 0


def test_by_default_four_token_matches_are_tried_first():
    """``--lookup`` alone matches 2..4 tokens, the longest first: the copy after "1 2 3 4",
    not after the more recent "2 3 4"."""
    drafter = LookupDrafter(4)
    drafter.observe_tokens([1, 2, 3, 4, 9, 7, 2, 3, 4, 8, 1, 2, 3], 4)
    assert drafter.propose(4).tokens == [9, 7, 2, 3] and drafter.last_match == 4
    assert SpeculationConfig().lookup_ngram == (2, 4)


@pytest.fixture(scope="module")
def tiny():
    return ds4mlx.load_model(REPO / "assets" / "ds4-tiny.gguf")


def generated(model, prompt, n, config, sampling=None, session=None):
    drafter = load_drafter(config, model)
    tokens, stats = [], None
    for event in generate(session or model.new_session(), prompt, n, sampling, drafter, config):
        if isinstance(event, DoneEvent):
            stats = event.stats
        else:
            tokens.append(event.token)
    return tokens, stats


@pytest.mark.parametrize("learned", ["none", "dspark"])
def test_greedy_generation_with_lookup_equals_plain_decoding(tiny, learned):
    prompt = tiny.tokenizer.encode(COPY_TEXT * 2)
    plain, _ = generated(tiny, prompt, 48, SpeculationConfig())
    kind = DrafterKind.DSPARK if learned == "dspark" else DrafterKind.NONE
    path = REPO / "assets" / "ds4-tiny-dspark.gguf" if learned == "dspark" else None
    config = SpeculationConfig(kind, path, lookup=7, lookup_ngram=(2, 4))
    spec, stats = generated(tiny, prompt, 48, config)
    assert spec == plain
    assert stats.by_drafter.get("lookup", [0])[0] > 0  # the copy was drafted
    assert sum(c[1] for c in stats.by_drafter.values()) == stats.drafted_tokens
    assert sum(c[2] for c in stats.by_drafter.values()) == stats.accepted_tokens


def test_greedy_glm_generation_with_nextn_and_lookup_equals_plain_decoding():
    glm = ds4mlx.load_model(REPO / "assets" / "glm-tiny.gguf")
    prompt = glm.tokenizer.encode(COPY_TEXT * 2)
    plain, _ = generated(glm, prompt, 40, SpeculationConfig())
    spec, stats = generated(glm, prompt, 40, SpeculationConfig(DrafterKind.NEXTN, lookup=5))
    assert spec == plain
    assert stats.drafted_tokens > 0


def test_earlier_turns_of_a_session_are_looked_up(tiny):
    """A second generation on the same session copies from the first one's prompt."""
    first = tiny.tokenizer.encode(COPY_TEXT)
    follow_up = tiny.tokenizer.encode("\n\ndef area(width, height):")
    outputs = []
    for config in (SpeculationConfig(), SpeculationConfig(lookup=7)):
        session = tiny.new_session()
        generated(tiny, first, 2, config, session=session)
        outputs.append(generated(tiny, follow_up, 24, config, session=session))
    (plain, _), (spec, stats) = outputs
    assert spec == plain and stats.accepted_tokens > 0


def test_sampled_generation_with_lookup_is_verified_exactly_and_reproducible(tiny):
    """At temperature > 0 lookup drafts go through rejection sampling (the distribution is
    ``acceptance.exact_acceptance``'s business, tested there): drafts are made and accepted,
    and a seeded run repeats itself."""
    prompt = tiny.tokenizer.encode(COPY_TEXT * 2)
    sampling = SamplingOptions(temperature=0.3, seed=3)
    config = SpeculationConfig(lookup=6, exact_sampling=True)
    first, stats = generated(tiny, prompt, 40, config, sampling)
    again, _ = generated(tiny, prompt, 40, config, sampling)
    assert first == again
    assert stats.accepted_tokens > 0


def test_cycles_without_a_copy_decode_as_plain_decoding_does(tiny):
    """Where the context holds no copy, lookup's cycles are plain pipelined decoding (no verify
    pass of a lone token), and the drafter still follows every token."""
    prompt = tiny.tokenizer.encode("Hello! Who are you?")
    plain, _ = generated(tiny, prompt, 24, SpeculationConfig())
    config = SpeculationConfig(lookup=7)
    drafter = load_drafter(config, tiny)
    session = tiny.new_session()
    tokens, stats = [], None
    for event in generate(session, prompt, 24, None, drafter, config):
        if isinstance(event, DoneEvent):
            stats = event.stats
        else:
            tokens.append(event.token)
    assert tokens == plain
    assert stats.verify_passes == stats.drafted_passes  # every verify pass checked a draft
    assert drafter._index.tokens == session.tokens  # it saw every token fed


def test_a_lookup_that_never_matches_runs_plain_decodings_steps(tiny, monkeypatch):
    """Where lookup finds nothing, each decode step is plain decoding's, call for call: the
    same feeds of the target, the same evaluations, the same host reads (only the prefill
    differs: it keeps the target's hidden states)."""
    from ds4mlx.engine.session import Session

    calls: list[str] = []

    def counted(owner, name):
        real = getattr(owner, name)

        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, call)

    for name in ("feed_mx", "feed_lazy", "feed_hidden", "feed_hidden_lazy", "confirm"):
        counted(Session, name)
    for name in ("eval", "async_eval"):
        counted(mx, name)
    prompt = tiny.tokenizer.encode("Hello! Who are you?")
    runs = []
    for config in (SpeculationConfig(), SpeculationConfig(lookup=7, lookup_ngram=(4, 4))):
        calls.clear()
        tokens, stats = generated(tiny, prompt, 24, config)
        runs.append((tokens, list(calls)))
    (plain, plain_calls), (spec, spec_calls) = runs
    assert spec == plain and stats.drafted_passes == 0  # no 4-gram of it repeats
    assert plain_calls[0] == "feed_mx" and spec_calls[0] == "feed_hidden"  # the prefill
    assert spec_calls[1:] == plain_calls[1:]


def test_lookup_is_scheduled_as_a_drafter_whose_proposals_cost_nothing():
    from ds4mlx.speculation.loop import SpeculativeDecoder

    assert SpeculativeDecoder(LookupDrafter(4)).scheduler.free_proposals
