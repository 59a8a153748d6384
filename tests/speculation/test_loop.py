"""The speculative loop commits exactly what plain decoding would, and counts what it did."""

from __future__ import annotations

from ds4mlx.engine.generate import DoneEvent, run_alone, stepped_generate
from ds4mlx.engine.sampling import Sampler, SamplingOptions
from ds4mlx.generation import generate
from ds4mlx.speculation import SpeculationConfig
from ds4mlx.speculation.drafter import Draft
from ds4mlx.speculation.loop import (
    DrafterLease,
    SpeculationOptions,
    SpeculativeDecoder,
    SpeculativeStats,
    _cut_by_confidence,
    _weighs_cost,
)
from ds4mlx.speculation.scheduler import MIN_TAIL_DRAFT, CostMeter

import mlx.core as mx
import numpy as np
import pytest

from .conftest import ScriptedDrafter, TickingClock, measured_lease, record_asks

PROMPTS = [[115, 78, 104, 2, 65, 24], [9, 56, 25, 61, 80, 12, 12, 86], [1, 2, 3]]


def run(events):
    tokens, stats = [], None
    for event in events:
        if isinstance(event, DoneEvent):
            stats = event.stats
        else:
            tokens.append(event.token)
    return tokens, stats


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("error_rate", [0.0, 0.3, 1.0])
def test_greedy_speculation_equals_plain_decoding(ds4_model, prompt, error_rate):
    n = 40
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=error_rate)
    session = ds4_model.new_session()
    spec, stats = run(generate(session, prompt, n, drafter=drafter, lease=measured_lease()))
    assert spec == plain
    assert stats.generated_tokens == n
    # The session holds everything but the last generated token, as after plain decoding.
    assert session.tokens == [*prompt, *plain[:-1]]
    assert sum(drafter.observed_rows) == len(prompt) + n - 1
    # Per-position counters add up to the totals; a draft always reaches position 0.
    assert stats.position_drafted[0] == stats.drafted_passes
    assert sum(stats.position_drafted) == stats.drafted_tokens
    assert sum(stats.position_accepted) == stats.accepted_tokens
    assert stats.position_drafted == sorted(stats.position_drafted, reverse=True)
    if error_rate in (0.0, 1.0):
        assert set(stats.position_acceptance) == {1.0 - error_rate}
    if error_rate == 0.0:
        assert stats.accepted_tokens == stats.drafted_tokens > 0
        # Every draft of five accepted, plus the target's token; the budget's last draft is
        # cut to the two tokens that fit (1 + 6 * 6 + 3 = 40).
        assert stats.position_drafted == [7, 7, 6, 6, 6]
        assert stats.tau == (6 * 6 + 3) / 7
    if error_rate == 1.0:
        assert stats.accepted_tokens == 0
        # The scheduler backs off useless drafting (for cost, before ds4's window ends).
        assert stats.scheduler.pauses + stats.scheduler.cost_pauses > 0


def test_confidence_threshold_cuts_drafts(ds4_model):
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(
        prompt, plain, ds4_model.args.vocab_size, error_rate=0.0, confidences=True
    )
    spec, stats = run(
        generate(
            ds4_model.new_session(),
            prompt,
            n,
            drafter=drafter,
            config=SpeculationConfig(confidence=0.6),
        )
    )
    assert spec == plain
    # Confidences 1.0, 0.85, 0.7, 0.55, ...: at most three tokens survive per draft.
    assert stats.drafted_tokens <= 3 * stats.verify_passes


def test_stop_token_inside_an_accepted_draft(ds4_model):
    prompt, n = PROMPTS[1], 30
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    stop = plain[12]
    expected = plain[: plain.index(stop) + 1]
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    session = ds4_model.new_session()
    spec, stats = run(generate(session, prompt, n, drafter=drafter, stop_tokens=[stop]))
    assert spec == expected and stats.stop_reason == "stop"
    assert session.tokens == [*prompt, *expected[:-1]]


def test_sampled_speculation_is_reproducible_with_a_seed(ds4_model):
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    sampling = SamplingOptions(temperature=0.8, top_k=20, seed=5)

    def once():
        drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.1)
        return run(generate(ds4_model.new_session(), prompt, n, sampling, drafter=drafter))[0]

    assert once() == once()


def test_context_limit(ds4_model):
    prompt = PROMPTS[2]
    plain, _ = run(generate(ds4_model.new_session(), prompt, 20))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    spec, stats = run(
        generate(ds4_model.new_session(), prompt, 20, drafter=drafter, max_context=12)
    )
    assert stats.stop_reason == "context"
    assert spec == plain[: len(spec)] and len(prompt) + len(spec) - 1 <= 12


def test_verify_logits_are_bit_identical_to_one_token_decode(ds4_model):
    """The decode tile makes each row's logits independent of the chunk it was computed in."""
    net = ds4_model.network
    prompt = [115, 78, 104, 2, 65, 24, 98, 109, 23, 9] * 4
    chunk = [61, 80, 7, 7, 3, 9][: net.max_invariant_rows]
    assert_verify_rows_equal_decode(net, prompt, chunk)


def assert_verify_rows_equal_decode(net, prompt: list[int], chunk: list[int]) -> None:
    """After ``prompt``, feeding ``chunk`` as one verify pass gives, row for row, bit for bit,
    the logits of feeding it one token at a time."""
    decoded = net.new_state()
    net.forward(mx.array(prompt), decoded)
    one_by_one = [np.array(net.forward(mx.array([t]), decoded))[0] for t in chunk]
    verified = net.new_state()
    net.forward(mx.array(prompt), verified)
    batch = np.array(net.forward(mx.array(chunk), verified))
    for row, expected in zip(batch, one_by_one, strict=True):
        assert np.array_equal(row, expected)


def test_full_rollback_after_one_token_decodes(ds4_model):
    """A decode tile drops its padding rows; the caches must still allow a full rollback."""
    from ds4mlx.models.deepseek4 import ROLLBACK_DEPTH

    import mlx.core as mx
    import numpy as np

    net = ds4_model.network
    prompt = [115, 78, 104, 2, 65, 24, 98, 109, 23, 9] * 6
    state = net.new_state()
    net.forward(mx.array(prompt[:-ROLLBACK_DEPTH]), state)
    for token in prompt[-ROLLBACK_DEPTH:]:
        net.forward(mx.array([token]), state)
    net.truncate(state, len(prompt) - ROLLBACK_DEPTH)
    again = np.array(net.forward(mx.array(prompt[-ROLLBACK_DEPTH:]), state))
    reference = ds4_model.logits(prompt)[-ROLLBACK_DEPTH:]
    assert np.abs(again - reference).max() < 1e-4 * np.abs(reference).max()


PENALIZED = SamplingOptions(
    repeat_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.5, repeat_last_n=16
)


@pytest.mark.parametrize("error_rate", [0.0, 0.3])
def test_penalized_greedy_speculation_equals_plain_decoding(ds4_model, error_rate):
    """Each verify row is penalised as if the draft tokens before it were committed, so the
    committed tokens are still exactly plain decoding's."""
    prompt, n = PROMPTS[1], 40
    unpenalized, _ = run(generate(ds4_model.new_session(), prompt, n))
    plain, _ = run(generate(ds4_model.new_session(), prompt, n, PENALIZED))
    assert plain != unpenalized
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=error_rate)
    spec, stats = run(generate(ds4_model.new_session(), prompt, n, PENALIZED, drafter=drafter))
    assert spec == plain
    assert stats.accepted_tokens > 0


def test_presence_penalty_stops_repeats_within_the_window(ds4_model):
    prompt, n, window = PROMPTS[2], 24, 12
    options = SamplingOptions(presence_penalty=1e4, repeat_last_n=window)
    tokens, _ = run(generate(ds4_model.new_session(), prompt, n, options))
    history = [*prompt, *tokens]
    for i in range(len(prompt), len(history)):
        assert history[i] not in history[max(0, i - window) : i]


def test_logit_bias_bans_and_forces_tokens(ds4_model):
    prompt, n = PROMPTS[0], 12
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    banned = plain[0]
    tokens, _ = run(
        generate(ds4_model.new_session(), prompt, n, SamplingOptions(logit_bias=((banned, -1e4),)))
    )
    assert banned not in tokens and tokens != plain
    forced, _ = run(
        generate(ds4_model.new_session(), prompt, n, SamplingOptions(logit_bias=((5, 1e4),)))
    )
    assert forced == [5] * n
    vocab = ds4_model.args.vocab_size
    session = ds4_model.new_session()
    with pytest.raises(ValueError, match="logit_bias: token id .* outside"):
        run(generate(session, prompt, n, SamplingOptions(logit_bias=((vocab, 1.0),))))
    assert session.tokens == []  # refused before the prefill


def test_the_budget_tail_decodes_plainly_for_a_drafter_that_starts_over(ds4_model):
    """Once no cycle drafts any more (room for fewer than MIN_TAIL_DRAFT draft tokens), a
    drafter that never reads rows fed after its last draft (DSpark, MTP) is not fed them: the
    rest is plain pipelined decoding, with the same tokens."""
    prompt = PROMPTS[0]
    # Every draft is accepted, so each cycle commits max_draft + 1 tokens after the prefill's
    # one; the budget ends MIN_TAIL_DRAFT tokens after the sixth cycle, too few to draft.
    drafted = 1 + 6 * (5 + 1)
    n = drafted + MIN_TAIL_DRAFT
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    drafter.reads_rows_after_last_draft = False
    session = ds4_model.new_session()
    spec, stats = run(generate(session, prompt, n, drafter=drafter, lease=measured_lease()))
    assert spec == plain
    assert session.tokens == [*prompt, *plain[:-1]]
    # It saw every row fed until drafting ended, and none of the tail's.
    seen = sum(drafter.observed_rows) - len(prompt) + 1  # generated tokens it saw fed
    assert seen == drafted
    assert stats.scheduler.tail_cycles == 1
    assert stats.verify_passes == stats.drafted_passes  # no verify pass of a lone token


def test_cost_pauses_decode_plainly_with_the_drafter_following_every_row(ds4_model):
    """A drafter whose cycles commit fewer tokens than a plain advance (on a clock where each
    cycle lasts a tick) is paused by the cost rule: plain pipelined advances, each handing the
    drafter the rows it fed, which are the target's own; the output is plain decoding's."""
    prompt, n = PROMPTS[1], 48
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=1.0)
    seen: list[mx.array] = []
    observe = drafter.observe

    def keep_rows(tokens, next_token, rows):
        observe(tokens, next_token, rows)
        seen.append(rows.layers[0])

    drafter.observe = keep_rows
    session = ds4_model.new_session()
    spec, stats = run(generate(session, prompt, n, drafter=drafter, lease=measured_lease()))
    assert spec == plain
    assert stats.scheduler.cost_pauses > 0 and stats.scheduler.plain_advances > 0
    assert sum(drafter.observed_rows) == len(prompt) + n - 1
    # Plain advances decode several tokens a verify-free pass: fewer verify passes than tokens.
    assert stats.verify_passes < n - 1 - stats.scheduler.plain_advances
    # The rows handed over are the target's: those of one pass over the same tokens.
    reference = ds4_model.new_session().feed_hidden(session.tokens, drafter.capture_layers)
    np.testing.assert_allclose(
        np.array(mx.concatenate(seen)), np.array(reference.layers[0]), atol=1e-4, rtol=1e-4
    )


def test_a_long_cost_pause_leaves_out_rows_the_drafter_would_never_read(ds4_model):
    """A drafter that reads back only its ``window`` of rows is handed the tokens alone
    (``observe_tokens``) for plain advances that at least a window of tokens follows before
    the next draft, and the rows of the rest; the output stays plain decoding's."""
    prompt, n = PROMPTS[1], 48
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    drafter.window = 8
    calls: list[tuple[str, int]] = []
    observe = drafter.observe

    def observe_rows(tokens, next_token, rows):
        calls.append(("rows", len(tokens)))
        observe(tokens, next_token, rows)

    def observe_tokens(tokens, next_token):
        calls.append(("tokens", len(tokens)))
        drafter.committed += len(tokens)

    drafter.observe, drafter.observe_tokens = observe_rows, observe_tokens
    lease = measured_lease()
    lease.costs.pause_left = 5  # plain advances of four tokens before drafting resumes
    spec, stats = run(generate(ds4_model.new_session(), prompt, n, drafter=drafter, lease=lease))
    assert spec == plain
    # After the prompt's rows: three advances with 16, 12 and 8 tokens after them in the pause
    # go without rows; the last two, within the window, with; then every drafted cycle's rows.
    assert calls[:6] == [("rows", len(prompt)), *[("tokens", 4)] * 3, ("rows", 4), ("rows", 4)]
    assert all(kind == "rows" for kind, _ in calls[6:]) and stats.drafted_passes > 0


def test_sampled_generation_is_never_paused_for_cost(ds4_model):
    """Sampled tokens depend on the draws before them, which depend on the scheduling: the cost
    rule (which reads a clock) leaves sampled generation to ds4's rules, so a seed still gives
    the same output on every run."""
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    sampling = SamplingOptions(temperature=0.8, top_k=20, seed=5)
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=1.0)
    _, stats = run(
        generate(
            ds4_model.new_session(), prompt, n, sampling, drafter=drafter, lease=measured_lease()
        )
    )
    assert stats.scheduler.cost_pauses == 0 and stats.scheduler.plain_advances == 0
    # The same drafter greedy: paused for cost.
    _, stats = run(
        generate(ds4_model.new_session(), prompt, n, drafter=drafter, lease=measured_lease())
    )
    assert stats.scheduler.cost_pauses > 0


def test_cycles_without_a_draft_decode_pipelined_with_the_drafter_following(ds4_model):
    """A drafter with target rows that proposes nothing (MTP stopped by its margin) costs no
    verify pass of a lone token: each such cycle is a plain pipelined advance, whose rows the
    drafter still sees, and ds4's rule counts it as a cycle without a draft."""
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size)
    drafter.propose = lambda max_tokens: Draft()
    spec, stats = run(
        generate(ds4_model.new_session(), prompt, n, drafter=drafter, lease=measured_lease())
    )
    assert spec == plain
    assert stats.verify_passes == 0
    assert stats.scheduler.no_draft_cycles > 0
    assert sum(drafter.observed_rows) == len(prompt) + n - 1


def test_ds4s_pause_decodes_pipelined(ds4_model):
    """Sampled decoding (ds4's rules only): a window of rejected drafts pauses drafting, and
    the paused cycles are plain pipelined steps, not verify passes of one token; a seed gives
    the same output on every run."""
    prompt, n = PROMPTS[0], 32
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    sampling = SamplingOptions(temperature=0.8, top_k=20, seed=5)
    outputs = []
    for _ in range(2):
        drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=1.0)
        tokens, stats = run(
            generate(
                ds4_model.new_session(),
                prompt,
                n,
                sampling,
                drafter=drafter,
                lease=measured_lease(),
            )
        )
        outputs.append(tokens)
        assert stats.scheduler.paused_cycles > 0
        assert stats.verify_passes == stats.drafted_passes
        # Each paused cycle decodes one token, as in ds4 (only the budget's tail, at most
        # MIN_TAIL_DRAFT tokens, is neither drafted nor paused); each drafted one commits one.
        undrafted = n - 1 - stats.drafted_passes - stats.scheduler.paused_cycles
        assert 0 <= undrafted <= MIN_TAIL_DRAFT
    assert outputs[0] == outputs[1]


def test_a_sampled_request_after_a_greedy_one_that_paused_drafts_as_ds4_would(ds4_model):
    """The pause a greedy request leaves on the lease is for greedy requests: a seeded request
    after it drafts from its first cycle, and gives what it gives on a fresh lease."""
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    sampling = SamplingOptions(temperature=0.8, top_k=20, seed=5)

    def sampled(lease):
        drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=1.0)
        return run(
            generate(ds4_model.new_session(), prompt, n, sampling, drafter=drafter, lease=lease)
        )

    lease = measured_lease()
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=1.0)
    run(generate(ds4_model.new_session(), prompt, n, drafter=drafter, lease=lease))
    assert lease.costs.pause_left > 0
    tokens, stats = sampled(lease)
    assert stats.scheduler.plain_advances == 0 and stats.scheduler.cost_pauses == 0
    assert tokens == sampled(measured_lease())[0]


def test_the_first_drafted_cycle_of_each_draft_length_is_not_timed(ds4_model):
    """It compiled the verify pass for that many rows: the cost rule never sees its time, on
    the first request or any later one on the same lease (``CostMeter.warm_up``)."""
    prompt, n = PROMPTS[0], 32
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    lease = measured_lease()
    timed = 0
    for _ in range(2):
        drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
        warmed = len(lease.costs.warmed_lengths)
        spec, stats = run(
            generate(ds4_model.new_session(), prompt, n, drafter=drafter, lease=lease)
        )
        assert spec == plain and stats.scheduler.cost_pauses == 0
        timed += stats.drafted_passes - (len(lease.costs.warmed_lengths) - warmed)
        assert lease.costs.drafted.samples == timed
    assert 5 in lease.costs.warmed_lengths and timed > 0


def test_a_combined_drafts_acceptance_is_credited_to_the_piece_that_made_each_token():
    """DSpark's block of three, then the lookup's extension of two: the accepted prefix is
    split where the pieces meet, the extension credited only with what it reached past the
    block."""
    stats = SpeculativeStats()
    stats.record_draft(5, 4, [("dspark", 3), ("lookup", 2)])
    assert stats.by_drafter == {"dspark": [1, 3, 3], "lookup": [1, 2, 1]}
    # Rejected inside the block: none of the extension was kept.
    stats.record_draft(5, 2, [("dspark", 3), ("lookup", 2)])
    assert stats.by_drafter == {"dspark": [2, 6, 5], "lookup": [2, 4, 1]}
    # The pieces name what the drafter proposed; a confidence cut or a constraint may shorten
    # the draft after that. A piece is credited with its tokens inside the verified draft
    # alone, and a piece cut away entirely is no draft of its drafter.
    stats.record_draft(4, 4, [("dspark", 3), ("lookup", 3)])
    assert stats.by_drafter == {"dspark": [3, 9, 8], "lookup": [3, 5, 2]}
    stats.record_draft(3, 3, [("dspark", 3), ("lookup", 2)])
    assert stats.by_drafter == {"dspark": [4, 12, 11], "lookup": [3, 5, 2]}


def test_three_pieces_are_each_credited_from_where_the_one_before_ended():
    stats = SpeculativeStats()
    stats.record_draft(6, 5, [("a", 2), ("b", 2), ("c", 2)])
    assert stats.by_drafter == {"a": [1, 2, 2], "b": [1, 2, 2], "c": [1, 2, 1]}
    assert stats.position_drafted == [1] * 6
    assert stats.position_accepted == [1, 1, 1, 1, 1, 0]


def test_a_verify_pass_without_a_draft_is_no_drafted_pass():
    stats = SpeculativeStats()
    stats.record_draft(0, 0)
    assert (stats.drafted_passes, stats.drafted_tokens, stats.accepted_tokens) == (0, 0, 0)
    assert stats.position_drafted == [] and stats.by_drafter == {}
    stats.record_draft(2, 1)
    stats.record_draft(1, 1)
    assert (stats.drafted_passes, stats.drafted_tokens, stats.accepted_tokens) == (2, 3, 2)
    assert stats.position_acceptance == [1.0, 0.0]


@pytest.mark.parametrize(
    ("threshold", "confidences", "kept"),
    [
        (0.0, [0.9, 0.1, 0.0], [1, 2, 3]),  # no threshold: every token
        (0.5, None, [1, 2, 3]),  # a drafter without confidences is never cut
        (0.5, [0.9, 0.5, 0.49], [1, 2]),  # at the threshold kept, below it cut
        (0.5, [0.4, 0.9, 0.9], []),  # the cut is at the first low one, whatever follows
    ],
)
def test_the_confidence_cut(threshold, confidences, kept):
    assert _cut_by_confidence(Draft([1, 2, 3], confidences), threshold) == kept


def drafting_lease() -> DrafterLease:
    """A lease on which plain decoding costs a tick per token (as the ticking clock measures
    it): any drafted cycle that commits two tokens or more wins, so the cost rule never
    pauses the drafts a test counts."""
    costs = CostMeter(clock=TickingClock())
    costs.plain.add(1.0, 1)
    return DrafterLease(costs)


def test_a_confidence_equal_to_the_threshold_keeps_its_token(ds4_model):
    """The cut falls at the first token whose confidence is below the threshold: tokens
    exactly at it are drafted."""
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    scripted = drafter.propose

    def at_the_threshold(max_tokens):
        tokens = scripted(max_tokens).tokens
        return Draft(tokens, [1.0, 0.5, 0.5, 0.25, 0.25][: len(tokens)])

    drafter.propose = at_the_threshold
    config, session = SpeculationConfig(confidence=0.5), ds4_model.new_session()
    events = generate(session, prompt, n, drafter=drafter, config=config, lease=drafting_lease())
    spec, stats = run(events)
    assert spec == plain
    # Drafts of three (1.0, 0.5, 0.5 kept), each accepted with the target's token: five of
    # them, then one cut to the two tokens the budget leaves room for (1 + 5 * 4 + 3 = 24).
    assert stats.position_drafted == [6, 6, 5]
    assert stats.accepted_tokens == stats.drafted_tokens


def test_a_draft_is_never_longer_than_the_options_allow(ds4_model):
    """``SpeculationOptions.max_draft`` caps the draft below the drafter's own cap."""
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    asked = record_asks(drafter)
    decoder = SpeculativeDecoder(drafter, SpeculationOptions(max_draft=2), drafting_lease())
    session = ds4_model.new_session()
    spec, stats = run(run_alone(stepped_generate(session, prompt, n, decoder=decoder)))
    assert spec == plain
    # Seven drafts of two, each accepted with the target's token (1 + 7 * 3 = 22): the
    # budget's last two tokens are too few to draft (MIN_TAIL_DRAFT).
    assert asked == [2] * 7
    assert stats.position_drafted == [7, 7]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_drafts_leave_out_positions_accepted_too_rarely_when_greedy(ds4_model, temperature):
    """The lease's drafts had their fifth token rejected every time: a greedy request asks the
    drafter for four tokens (``DraftScheduler.draft_length``), a sampled one for all five."""
    prompt, n = PROMPTS[0], 24
    sampling = SamplingOptions(temperature=temperature, seed=3)
    plain, _ = run(generate(ds4_model.new_session(), prompt, n, sampling=sampling))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    asked = record_asks(drafter)
    lease = drafting_lease()
    for _ in range(30):
        lease.costs.positions.add(5, 4)
    decoder = SpeculativeDecoder(drafter, SpeculationOptions(), lease)
    session = ds4_model.new_session()
    events = stepped_generate(session, prompt, n, decoder=decoder, sampling=sampling)
    spec, _ = run(run_alone(events))
    if temperature == 0:
        assert spec == plain
        assert asked[:4] == [4] * 4
    else:  # the sampled speculative text departs from the plain one: only the asks count here
        assert asked[:2] == [5] * 2


def test_drafts_fit_a_verify_pass_that_one_token_decode_matches_bit_for_bit(ds4_model):
    """A verify pass of the last token and its draft stays within ``max_invariant_rows`` rows,
    whatever the drafter and the options would allow."""
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, max_draft=8, error_rate=0.0)
    asked = record_asks(drafter)
    decoder = SpeculativeDecoder(drafter, SpeculationOptions(), drafting_lease())
    spec, _ = run(run_alone(stepped_generate(ds4_model.new_session(), prompt, n, decoder=decoder)))
    assert spec == plain
    assert ds4_model.network.max_invariant_rows == 7
    assert asked[:3] == [6, 6, 6] and max(asked) == 6


def test_a_confidence_cut_drafts_on_the_host_even_where_device_drafts_are_possible(ds4_model):
    """Device drafts carry no confidences: with a threshold the draft is made on the host and
    cut there, though the drafter could leave it on the device."""
    prompt, n = PROMPTS[0], 24
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(
        prompt, plain, ds4_model.args.vocab_size, error_rate=0.0, confidences=True
    )
    drafter.propose_on_device = lambda max_tokens: mx.array(
        drafter.propose(max_tokens).tokens, dtype=mx.int32
    )
    config = SpeculationConfig(confidence=0.6)  # of 1.0, 0.85, 0.7, 0.55, 0.4: three kept
    events = generate(
        ds4_model.new_session(), prompt, n, drafter=drafter, config=config, lease=drafting_lease()
    )
    spec, stats = run(events)
    assert spec == plain
    assert len(stats.position_drafted) == 3 and stats.drafted_passes > 0


@pytest.mark.parametrize(("temperature", "weighed"), [(0.0, True), (0.01, False), (0.5, False)])
def test_only_greedy_decoding_weighs_the_cost_of_drafts(temperature, weighed):
    assert _weighs_cost(Sampler(SamplingOptions(temperature=temperature))) is weighed


class HistoryDrafter:
    """Records what the loop tells it at a prefill."""

    name = "history"
    capture_layers = (0,)
    max_draft = 4

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def reset(self) -> None:
        self.calls.append(("reset",))

    def recall(self, tokens) -> None:
        self.calls.append(("recall", list(tokens)))

    def observe(self, tokens, next_token, rows) -> None:
        self.calls.append(("observe", list(tokens), rows.pos0, rows.n_rows))

    def propose(self, max_tokens) -> Draft:
        return Draft()


def test_a_prefill_after_an_earlier_turn_recalls_that_turn_alone(ds4_model):
    """A drafter of the token history (prompt lookup) is handed the session's earlier tokens,
    then the new prompt's rows once: never the prompt twice, and no history on a fresh session."""
    history, prompt = [9, 56, 25, 61], PROMPTS[2]
    drafter = HistoryDrafter()
    decoder = SpeculativeDecoder(drafter)
    session = ds4_model.new_session()
    session.feed(history)
    decoder.prefill(session, prompt, Sampler(SamplingOptions()), decoder.new_stats(len(prompt)))
    assert drafter.calls == [("reset",), ("recall", history), ("observe", prompt, 4, 3)]
    drafter.calls.clear()
    decoder.prefill(
        ds4_model.new_session(), prompt, Sampler(SamplingOptions()), decoder.new_stats(3)
    )
    assert drafter.calls == [("reset",), ("observe", prompt, 0, 3)]
