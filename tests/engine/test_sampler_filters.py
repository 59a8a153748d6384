"""The sampler's filters on hand-made logits: each alone, together in the documented order
(logit biases, penalties, then top-p, min-p and top-k on the untempered distribution, then the
temperature), at their boundaries, and the tokens actually drawn.

A filtered-out token must have probability 0 in ``probabilities()`` and must never be drawn.
Draws are checked on every path a token can take while they coexist: the host path
(``Sampler.__call__``: the recorded tokens penalise on the host), the device path
(``penalized_on_device`` + ``draw_on_device`` with the look-back window as an array, as
pipelined decoding does), and an unseeded sampler (the global generator). Seeds are fixed, so
the χ² checks give the same verdict on every run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, replace

from ds4mlx.engine.constraints import Constraint
from ds4mlx.engine.sampling import Sampler, SamplingOptions

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

# Probabilities of a 6-token vocabulary, all distinct, none tied.
PROBS = np.array([0.05, 0.30, 0.02, 0.18, 0.40, 0.05 + 1e-3])
PROBS = PROBS / PROBS.sum()
LOGITS = np.log(PROBS).astype(np.float32)


def reference(logits: np.ndarray, o: SamplingOptions, recent: tuple[int, ...] = ()) -> np.ndarray:
    """The documented sampling distribution, written out in float64 (llama.cpp's meaning of
    each filter): biases, penalties, then the filters on the untempered softmax, then the
    temperature over what is left."""
    z = logits.astype(np.float64).copy()
    for token, bias in o.logit_bias:
        z[token] += bias
    window = list(recent)[-o.repeat_last_n :]
    for token in set(window):
        z[token] = z[token] * o.repeat_penalty if z[token] <= 0 else z[token] / o.repeat_penalty
        z[token] -= window.count(token) * o.frequency_penalty + o.presence_penalty
    if o.greedy:
        return np.eye(len(z))[np.argmax(z)]
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = np.ones(len(z), bool)
    if o.top_p < 1.0:  # the smallest set of most likely tokens whose mass reaches top_p
        keep &= np.array([p[p > q].sum() < o.top_p for q in p])
    if o.min_p > 0.0:
        keep &= p >= o.min_p * p.max()
    if 0 < o.top_k < len(z):
        keep &= np.isin(np.arange(len(z)), np.argsort(-p, kind="stable")[: o.top_k])
    tempered = np.where(keep, z / o.temperature, -np.inf)
    out = np.exp(tempered - tempered.max())
    return out / out.sum()


def probabilities(
    options: SamplingOptions, logits: np.ndarray = LOGITS, recent: tuple[int, ...] = ()
) -> np.ndarray:
    sampler = Sampler(options)
    sampler.record(recent)
    row = sampler.penalized(mx.array(logits)[None])
    return np.array(sampler.probabilities(row))[0].astype(np.float64)


CASES = {
    "temperature": SamplingOptions(temperature=0.6),
    "hot": SamplingOptions(temperature=1.7),
    "top_k": SamplingOptions(temperature=1.0, top_k=3),
    "top_p": SamplingOptions(temperature=1.0, top_p=0.8),
    "min_p": SamplingOptions(temperature=1.0, min_p=0.3),
    "top_p_then_temperature": SamplingOptions(temperature=0.5, top_p=0.75),
    "min_p_then_temperature": SamplingOptions(temperature=2.0, min_p=0.12),
    "all_filters": SamplingOptions(temperature=0.8, top_k=4, top_p=0.9, min_p=0.1),
    "top_k_narrower_than_top_p": SamplingOptions(temperature=1.2, top_k=2, top_p=0.95),
    "top_p_narrower_than_top_k": SamplingOptions(temperature=1.2, top_k=5, top_p=0.6),
}


@pytest.mark.parametrize("name", CASES)
def test_probabilities_follow_the_documented_filters(name):
    options = CASES[name]
    expected = reference(LOGITS, options)
    got = probabilities(options)
    np.testing.assert_array_equal(got == 0, expected == 0)  # the same tokens removed
    np.testing.assert_allclose(got, expected, atol=2e-6)
    assert (expected == 0).any() or name in ("temperature", "hot")


def test_each_filter_removes_what_it_should():
    # PROBS sorted: 4 (0.40), 1 (0.30), 3 (0.18), 5, 0, 2
    removed = {
        name: set(np.flatnonzero(probabilities(CASES[name]) == 0).tolist())
        for name in ("top_k", "top_p", "min_p")
    }
    assert removed["top_k"] == {0, 2, 5}
    assert removed["top_p"] == {0, 2, 5}  # 0.40 + 0.30 < 0.8 <= 0.40 + 0.30 + 0.18
    assert removed["min_p"] == {0, 2, 5}  # 0.3 * 0.40 = 0.12 > 0.051
    assert set(
        np.flatnonzero(probabilities(SamplingOptions(temperature=1.0, min_p=0.5)) == 0).tolist()
    ) == {0, 2, 3, 5}  # 0.5 * 0.40 = 0.20 > 0.18


def test_top_p_applies_to_the_whole_distribution_not_after_top_k():
    """mlx-lm's order: top-p measures mass over the full softmax, so top-k=2 then top-p=0.5
    keeps both tokens (0.40 < 0.5); renormalising after top-k first would keep one."""
    got = probabilities(SamplingOptions(temperature=1.0, top_k=2, top_p=0.5))
    assert set(np.flatnonzero(got).tolist()) == {1, 4}


def test_filters_see_the_untempered_distribution():
    """At temperature 0.25, token 4 alone would hold over 70% of the tempered mass; top-p=0.65
    on the untempered distribution still keeps tokens 4 and 1 (0.40 < 0.65 <= 0.40 + 0.30)."""
    got = probabilities(SamplingOptions(temperature=0.25, top_p=0.65))
    assert set(np.flatnonzero(got).tolist()) == {1, 4}
    ratio = (PROBS[4] / PROBS[1]) ** 4  # exp((z4 - z1) / 0.25)
    assert got[4] / got[1] == pytest.approx(ratio, rel=1e-4)


def test_filters_act_on_the_penalised_logits():
    """Penalties come before the filters: a repeated token drops out of the top-k."""
    options = SamplingOptions(temperature=1.0, top_k=2, presence_penalty=5.0)
    got = probabilities(options, recent=(4,))
    assert set(np.flatnonzero(got).tolist()) == {1, 3}
    np.testing.assert_allclose(got, reference(LOGITS, options, (4,)), atol=2e-6)
    biased = SamplingOptions(temperature=1.0, top_k=1, logit_bias=((2, 10.0),))
    assert np.flatnonzero(probabilities(biased)).tolist() == [2]


# --------------------------------------------------------------------------------------------
# Boundaries
# --------------------------------------------------------------------------------------------

# Probabilities that float32 holds exactly, so that cumulative sums hit top_p exactly.
DYADIC = np.array([0.125, 0.5, 0.05, 0.25, 0.075])
DYADIC_LOGITS = np.log(DYADIC).astype(np.float32)


@pytest.mark.parametrize(
    "top_p, kept",
    [
        (0.5, {1}),  # the first token alone reaches 0.5 exactly
        (0.75, {1, 3}),  # 0.5 + 0.25 reaches it exactly: no third token
        (float(np.nextafter(np.float32(0.75), np.float32(0.0))), {1, 3}),
        (float(np.nextafter(np.float32(0.75), np.float32(1.0))), {0, 1, 3}),
        (0.875, {0, 1, 3}),
        (0.9, {0, 1, 3, 4}),
    ],
)
def test_top_p_stops_as_soon_as_the_mass_reaches_it(top_p, kept):
    got = probabilities(SamplingOptions(temperature=1.0, top_p=top_p), DYADIC_LOGITS)
    assert set(np.flatnonzero(got).tolist()) == kept
    np.testing.assert_allclose(
        got[sorted(kept)], DYADIC[sorted(kept)] / DYADIC[sorted(kept)].sum(), rtol=1e-5
    )


def test_min_p_keeps_a_token_exactly_at_min_p_times_the_maximum():
    at = np.float32(math.log(0.25))
    logits = np.array([0.0, at, at - 1e-3, -3.0, 0.0], np.float32)
    got = probabilities(SamplingOptions(temperature=1.0, min_p=0.25), logits)
    assert set(np.flatnonzero(got).tolist()) == {0, 1, 4}
    np.testing.assert_allclose(got[[0, 1, 4]], np.array([4, 1, 4]) / 9, rtol=1e-5)


@pytest.mark.parametrize("top_k", [1, 2, 3, 4])
def test_top_k_keeps_exactly_k_tokens_when_the_kth_logit_is_tied(top_k):
    # ranks: 3 (3.0), 1 (2.0), then 2, 4 and 5 tied at 1.0, then 0 and 6
    logits = np.array([0.5, 2.0, 1.0, 3.0, 1.0, 1.0, -1.0], np.float32)
    got = probabilities(SamplingOptions(temperature=1.0, top_k=top_k), logits)
    kept = set(np.flatnonzero(got).tolist())
    assert len(kept) == top_k
    assert ({3} if top_k == 1 else {3, 1}) <= kept
    assert kept - {3, 1} <= {2, 4, 5}  # the rest from the tied tokens
    survivors = np.array(sorted(kept))
    expected = np.exp(logits[survivors]) / np.exp(logits[survivors]).sum()
    np.testing.assert_allclose(got[survivors], expected, rtol=1e-5)


@pytest.mark.parametrize("top_k", [6, 7, 100])
def test_top_k_at_or_above_the_vocabulary_keeps_everything(top_k):
    """llama.cpp treats such a top-k as no filter; it must not fail mid-generation."""
    got = probabilities(SamplingOptions(temperature=1.0, top_k=top_k))
    np.testing.assert_allclose(got, PROBS, rtol=1e-5)
    sampler = Sampler(SamplingOptions(temperature=1.0, top_k=top_k, seed=1))
    assert 0 <= sampler(mx.array(LOGITS)) < len(PROBS)


def test_greedy_is_the_argmax_of_the_penalised_logits():
    options = SamplingOptions(repeat_penalty=4.0)
    got = probabilities(options, recent=(4,))
    assert got.tolist() == np.eye(6)[1].tolist()  # 4 is penalised below 1
    sampler = Sampler(options)
    sampler.record([4])
    assert sampler(mx.array(LOGITS)) == 1
    assert (
        int(
            sampler.draw_on_device(
                sampler.penalized_on_device(mx.array(LOGITS), sampler.recent_tokens())
            )[0]
        )
        == 1
    )


# --------------------------------------------------------------------------------------------
# Draws, on every path
# --------------------------------------------------------------------------------------------


def host_draws(
    options: SamplingOptions, logits: np.ndarray, recent: tuple[int, ...], n: int
) -> np.ndarray:
    sampler = Sampler(options)
    sampler.record(recent)
    row = mx.array(logits)
    return np.array([sampler(row) for _ in range(n)])


def device_draws(
    options: SamplingOptions, logits: np.ndarray, recent: tuple[int, ...], n: int
) -> np.ndarray:
    sampler = Sampler(options)
    window = mx.array(list(recent), dtype=mx.int32)
    row = mx.array(logits)
    drawn = []
    for i in range(n):
        drawn.append(sampler.draw_on_device(sampler.penalized_on_device(row, window)))
        if i % 256 == 255:  # keep the queued graph short
            mx.eval(drawn[-1])
    return np.array(mx.concatenate(drawn))


def global_draws(
    options: SamplingOptions, logits: np.ndarray, recent: tuple[int, ...], n: int
) -> np.ndarray:
    """An unseeded sampler draws from the global generator (seeded here for the test); fewer
    draws, since it shares all but the generator with the host path."""
    mx.random.seed(options.seed or 0)
    return host_draws(replace(options, seed=None), logits, recent, min(n, 3000))


PATHS: dict[str, Callable[..., np.ndarray]] = {
    "host": host_draws,
    "device": device_draws,
    "global": global_draws,
}

DRAW_CASES = {
    # every filter removes something, with penalties and a bias: the largest sample
    "everything": (
        SamplingOptions(
            temperature=0.7,
            top_k=5,
            top_p=0.95,
            min_p=0.08,
            repeat_penalty=1.3,
            presence_penalty=0.2,
            logit_bias=((0, 0.4),),
            seed=11,
        ),
        (4, 1, 1),
        5000,
    ),
    "tied_top_k_cold": (SamplingOptions(temperature=0.6, top_k=3, seed=12), (), 3000),
    "top_p_min_p_hot": (SamplingOptions(temperature=1.6, top_p=0.9, min_p=0.1, seed=13), (), 3000),
}
TIED = np.array([1.0, 2.0, 1.5, 1.5, -0.5, 0.2], np.float32)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", DRAW_CASES)
def test_draws_follow_probabilities_and_never_pick_a_removed_token(case, path):
    options, recent, n = DRAW_CASES[case]
    logits = TIED if case.startswith("tied") else LOGITS
    sampler = Sampler(options)
    sampler.record(recent)
    probs = np.array(sampler.probabilities(sampler.penalized(mx.array(logits)[None])))[0]
    removed = np.flatnonzero(probs == 0)
    assert removed.size > 0
    draws = PATHS[path](options, logits, recent, n)
    n = len(draws)
    assert not np.isin(draws, removed).any(), f"drew a removed token {set(draws) & set(removed)}"
    if not case.startswith("tied"):
        np.testing.assert_allclose(probs, reference(logits, options, recent), atol=2e-6)
    support = probs > 0
    observed = np.bincount(draws, minlength=len(probs))[support]
    expected = probs[support].astype(np.float64)
    assert chisquare(observed, expected / expected.sum() * n).pvalue > 1e-3


def test_a_seeded_sampler_repeats_itself_and_ignores_other_draws():
    options = SamplingOptions(temperature=1.0, seed=5)
    first = host_draws(options, LOGITS, (), 200)
    sampler = Sampler(options)
    again = []
    for _ in range(200):
        mx.random.categorical(mx.zeros((1, 4)))  # another generation drawing in between
        again.append(sampler(mx.array(LOGITS)))
    np.testing.assert_array_equal(first, again)
    assert len(set(first.tolist())) > 3
    np.testing.assert_array_equal(first, device_draws(options, LOGITS, (), 200))


def test_log_probabilities_list_the_asked_alternatives_and_never_impossible_ones():
    sampler = Sampler(SamplingOptions(logprobs=3))
    sampler.note_logprobs(mx.array([[0.0, 3.0, 1.0, 2.0, -1.0]]), [1])
    assert [token for token, _ in sampler.take_logprob().top] == [1, 3, 2]
    masked = mx.array([[0.0, -np.inf, -np.inf, 1.0, -np.inf]])
    sampler.note_logprobs(masked, [3])
    noted = sampler.take_logprob()
    assert [token for token, _ in noted.top] == [3, 0]
    assert noted.logprob == pytest.approx(-np.log1p(np.exp(-1.0)))


def test_log_probabilities_are_taken_in_the_order_their_tokens_were_committed():
    # A verify pass notes several accepted tokens at once; each is then streamed in turn.
    sampler = Sampler(SamplingOptions(logprobs=0))
    rows = mx.array([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [5.0, 0.0, 0.0]])
    sampler.note_logprobs(rows, [1, 2, 0])
    taken = [sampler.take_logprob() for _ in range(4)]
    assert [noted.token for noted in taken[:3]] == [1, 2, 0] and taken[3] is None


class _AllowsAll(Constraint):
    """A constraint over a 4-token vocabulary that forbids nothing in it."""

    vocab_size = 4

    def mask(self) -> mx.array:
        return mx.ones((4,), dtype=mx.bool_)

    def advance(self, token: int) -> None:
        pass

    def rollback(self, count: int) -> None:
        pass


def test_a_constraint_forbids_the_rows_padding_past_the_vocabulary():
    # Embedding tables are padded past the tokenizer's vocabulary: those columns name no token.
    sampler = Sampler(SamplingOptions(), _AllowsAll())
    logits = mx.array([[0.0, 1.0, 2.0, 3.0, 9.0, 9.0]])
    for row in (sampler.penalized(logits)[0], sampler.masked_on_device(logits[0])):
        assert row.tolist() == [0.0, 1.0, 2.0, 3.0, -math.inf, -math.inf]
    assert sampler(logits[0]) == 3


def test_a_single_padding_column_is_forbidden_too():
    sampler = Sampler(SamplingOptions(), _AllowsAll())
    logits = mx.array([[0.0, 1.0, 2.0, 3.0, 9.0]])
    for row in (sampler.penalized(logits)[0], sampler.masked_on_device(logits[0])):
        assert row.tolist() == [0.0, 1.0, 2.0, 3.0, -math.inf]


def test_seed_zero_is_a_seed():
    """0 is a seed like any other: two generations seeded with it draw the same tokens."""
    logits = mx.zeros((1000,))
    options = SamplingOptions(temperature=1.0, seed=0)
    draws = []
    for _ in range(2):
        sampler = Sampler(options)
        draws.append([sampler.draw(logits) for _ in range(4)])
    assert draws[0] == draws[1]
    assert len(set(draws[0])) > 1  # a sequence, not one token repeated


def test_the_default_options_are_greedy_unfiltered_and_unpenalized():
    defaults = SamplingOptions()
    assert asdict(defaults) == {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "seed": None,
        "repeat_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repeat_last_n": 64,  # llama.cpp's look-back
        "logit_bias": (),
        "logprobs": None,
    }
    assert defaults.greedy and not defaults.penalizes
    # OpenAI's top_logprobs: at most 20 alternatives.
    assert SamplingOptions(logprobs=20).logprobs == 20
    with pytest.raises(ValueError, match=r"^logprobs must be in \[0, 20\], got 21$"):
        SamplingOptions(logprobs=21)


def test_a_repeat_penalty_below_one_alone_favours_the_seen_tokens():
    options = SamplingOptions(repeat_penalty=0.5)
    assert options.penalizes
    sampler = Sampler(options)
    sampler.record([1, 2])
    row = sampler.penalized(mx.array([[1.0, 2.0, -2.0, 3.0]]))[0]
    # Seen tokens: a positive logit divided by 0.5, a negative one multiplied by it.
    assert row.tolist() == [1.0, 4.0, -1.0, 3.0]


class _Following(_AllowsAll):
    """Records the tokens it is moved past."""

    def __init__(self) -> None:
        self.advanced: list[int] = []

    def advance(self, token: int) -> None:
        self.advanced.append(token)


def test_a_committed_token_moves_the_constraint_and_the_penalty_window():
    constraint = _Following()
    sampler = Sampler(SamplingOptions(presence_penalty=1.0), constraint)
    sampler.commit(3)
    sampler.commit(1)
    assert constraint.advanced == [3, 1]
    assert sampler.recent_tokens().tolist() == [3, 1]
