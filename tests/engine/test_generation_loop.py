"""The generation loop's own rules: the rates it reports, when a prompt fits, why generation
ends (at each limit exactly), where a pipelined run stops feeding, and the two ways a stepped
generation's steps are decoded (by the driver's batched logits or on its own)."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.engine.generate import (
    Decoder,
    DecodeStep,
    DoneEvent,
    GenerationStats,
    Limits,
    TokenEvent,
    check_prompt_fits,
    run_alone,
    stepped_generate,
    stop_reason,
)
from ds4mlx.engine.sampling import Sampler, SamplingOptions
from ds4mlx.engine.session import Session

import pytest

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
PROMPT = [17, 301, 5, 88, 1024, 7]


@pytest.fixture(scope="module")
def model():
    return ds4mlx.load_model(TINY)


def _generate(session: Session, pipeline: int = 4, **limits) -> tuple[list[int], GenerationStats]:
    decoder = Decoder()
    decoder.pipeline = pipeline
    tokens, stats = [], None
    for event in run_alone(stepped_generate(session, PROMPT, decoder=decoder, **limits)):
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
        elif isinstance(event, DoneEvent):
            stats = event.stats
    assert stats is not None
    return tokens, stats


def test_rates_count_the_prefill_and_the_decoded_tokens_apart():
    stats = GenerationStats(prompt_tokens=10, prefill_seconds=2.0, generated_tokens=5)
    stats.decode_seconds = 2.0
    assert stats.prefill_tps == 5.0
    # The first token came out of the prefill: 4 tokens in the decode time.
    assert stats.decode_tps == 2.0
    assert GenerationStats(prompt_tokens=10, prefill_seconds=0.0).prefill_tps == 0.0
    assert GenerationStats(generated_tokens=1, decode_seconds=1.0).decode_tps == 0.0
    assert GenerationStats(generated_tokens=3, decode_seconds=0.0).decode_tps == 0.0


def test_a_prompt_fits_up_to_exactly_the_context(model):
    session = model.new_session()
    session.feed([1, 2, 3])
    check_prompt_fits(session, [4] * 5, max_context=8)
    check_prompt_fits(session, [4] * 5, max_context=None)
    with pytest.raises(
        ValueError, match=r"^prompt of 5 tokens does not fit the context of 7 \(3 already used\)$"
    ):
        check_prompt_fits(session, [4] * 5, max_context=7)
    with pytest.raises(ValueError, match="^the prompt is empty$"):
        check_prompt_fits(session, [], max_context=None)


@pytest.mark.parametrize(
    ("token", "generated", "session_tokens", "max_context", "expected"),
    [
        (9, 3, 10, 20, "stop"),  # a stop token at the last allowed token is still a stop
        (9, 1, 20, 20, "stop"),  # ... and at the context's end
        (1, 3, 10, 20, "length"),
        (1, 2, 10, 20, ""),
        (1, 2, 20, 20, "context"),
        (1, 2, 19, 20, ""),
        (1, 2, 10**6, None, ""),
    ],
)
def test_generation_ends_at_each_limit_exactly(
    token, generated, session_tokens, max_context, expected
):
    reason = stop_reason(token, generated, {9}, 3, session_tokens, max_context)
    assert reason == expected


@pytest.mark.parametrize("pipeline", [1, 4])
def test_a_pipelined_run_never_feeds_past_the_limits(model, pipeline):
    """The last generated token is never fed: at the end the session holds the prompt and all
    but the last token, at most ``max_context`` of them, whatever the run length."""
    session = model.new_session()
    tokens, stats = _generate(session, pipeline, max_tokens=6)
    assert (len(tokens), stats.stop_reason) == (6, "length")
    assert session.tokens == PROMPT + tokens[:-1]
    session = model.new_session()
    context = len(PROMPT) + 5
    limited, stats = _generate(session, pipeline, max_tokens=50, max_context=context)
    assert stats.stop_reason == "context"
    assert limited == tokens  # greedy: the same tokens, cut by the context
    assert session.n_tokens == context and session.tokens == PROMPT + tokens[:-1]


def test_a_logit_bias_outside_the_vocabulary_is_refused_by_name(model):
    vocab = model.network.args.vocab_size
    options = SamplingOptions(logit_bias=((vocab, 5.0),))
    events = stepped_generate(model.new_session(), PROMPT, 3, options)
    with pytest.raises(ValueError, match=rf"^logit_bias: token id {vocab} is outside"):
        next(events)


def test_steps_answered_with_batched_logits_give_the_tokens_decoded_alone(model):
    expected, _ = _generate(model.new_session(), max_tokens=5)
    session = model.new_session()
    events = stepped_generate(session, PROMPT, 5)
    tokens, steps, answer = [], 0, None
    while True:
        event = events.send(answer)
        answer = None
        if isinstance(event, DecodeStep):
            steps += 1
            assert event.session is session and event.token == tokens[-1]
            answer = session.feed_mx([event.token])[-1]
        elif isinstance(event, TokenEvent):
            tokens.append(event.token)
        else:
            assert event.stats.stop_reason == "length"
            break
    assert tokens == expected and steps == 4


class _HostOnlySession(Session):
    """A session whose tokens must all be known on the host (``distributed.driven``)."""

    lazy_feeds = False

    def feed_lazy(self, token):
        raise AssertionError("a host-only session was fed a token the host has not read")


def test_a_session_without_lazy_feeds_decodes_one_step_at_a_time(model):
    expected, _ = _generate(model.new_session(), max_tokens=6)
    session = _HostOnlySession(model.network)
    tokens, _ = _generate(session, max_tokens=6)
    assert tokens == expected


def test_a_generation_alone_yields_tokens_and_its_stats_only(model):
    events = list(run_alone(stepped_generate(model.new_session(), PROMPT, 5)))
    assert [type(event) for event in events] == [TokenEvent] * 5 + [DoneEvent]
    stats = events[-1].stats
    assert (stats.prompt_tokens, stats.generated_tokens, stats.stop_reason) == (6, 5, "length")
    # Both phases are timed (the rates divide by them).
    assert stats.prefill_seconds > 0 and stats.decode_seconds > 0


def test_a_queued_run_cut_by_a_stop_notes_the_logprobs_of_the_tokens_it_keeps(model):
    def first_run(stop_tokens: frozenset[int]) -> tuple[list[int], Sampler]:
        session, sampler = model.new_session(), Sampler(SamplingOptions(logprobs=2))
        decoder, stats = Decoder(), GenerationStats()
        first = decoder.prefill(session, PROMPT, sampler, stats)
        assert sampler.take_logprob().token == first
        return decoder.advance(session, first, sampler, stats, Limits(9, stop_tokens)), sampler

    queued, sampler = first_run(frozenset())
    assert len(queued) == Decoder.pipeline
    assert [noted.token for noted in sampler.logprobs] == queued
    cut, sampler = first_run(frozenset({queued[1]}))
    assert cut == queued[: queued.index(queued[1]) + 1]
    # Only the kept tokens' log-probabilities wait to be taken, in their order.
    assert [noted.token for noted in sampler.logprobs] == cut


class _CountingDecoder(Decoder):
    def __init__(self) -> None:
        self.batched_steps = 0

    def batched(self) -> None:
        self.batched_steps += 1


def test_the_decoder_is_told_of_each_step_a_batch_took_for_it(model):
    session, decoder = model.new_session(), _CountingDecoder()
    events = stepped_generate(session, PROMPT, 4, decoder=decoder)
    event, steps = next(events), 0
    while not isinstance(event, DoneEvent):
        answer = None
        if isinstance(event, DecodeStep):
            steps += 1
            answer = session.feed_mx([event.token])[-1]
        event = events.send(answer)
    assert steps == 3 and decoder.batched_steps == 3
