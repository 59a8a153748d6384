"""Edges of the sampling options and of the penalties that a one-character slip would move."""

from __future__ import annotations

from ds4mlx.engine.sampling import MAX_TOP_LOGPROBS, Sampler, SamplingOptions

import mlx.core as mx
import numpy as np
import pytest


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", 0.0),
        ("top_p", 1.0),
        ("top_p", 1e-6),
        ("top_k", 0),
        ("min_p", 0.0),
        ("min_p", 0.999),
        ("repeat_penalty", 1e-3),
        ("repeat_last_n", 1),
        ("logprobs", 0),
        ("logprobs", MAX_TOP_LOGPROBS),
        ("logit_bias", ((0, 1.0), (1, -1.0))),
    ],
)
def test_the_edge_of_each_allowed_range_is_allowed(field, value):
    assert getattr(SamplingOptions(**{field: value}), field) == value


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -1e-6),
        ("top_p", 0.0),
        ("top_p", 1.000001),
        ("top_k", -1),
        ("min_p", 1.0),
        ("min_p", -1e-6),
        ("repeat_penalty", -0.5),
        ("repeat_last_n", -1),
        ("logprobs", -1),
        ("logprobs", MAX_TOP_LOGPROBS + 1),
    ],
)
def test_just_past_each_range_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingOptions(**{field: value})


@pytest.mark.parametrize(
    "options, expected",
    [
        (SamplingOptions(frequency_penalty=0.5), [1.0, 2.0 - 2 * 0.5, 3.0]),
        (SamplingOptions(presence_penalty=0.5), [1.0, 2.0 - 0.5, 3.0]),
        (SamplingOptions(repeat_penalty=2.0), [1.0, 1.0, 3.0]),
    ],
)
def test_each_penalty_alone_is_applied(options, expected):
    sampler = Sampler(options)
    sampler.record([1, 1])
    got = np.array(sampler.penalized(mx.array([[1.0, 2.0, 3.0]])))[0]
    np.testing.assert_allclose(got, expected)


def test_the_window_keeps_exactly_the_last_repeat_last_n_tokens():
    sampler = Sampler(SamplingOptions(presence_penalty=1.0, repeat_last_n=2))
    sampler.record([0, 1, 2])
    got = np.array(sampler.penalized(mx.array([[5.0, 5.0, 5.0, 5.0]])))[0]
    np.testing.assert_allclose(got, [5.0, 4.0, 4.0, 5.0])
    assert sampler.recent_tokens().tolist() == [1, 2]


def test_a_verify_row_sees_the_draft_tokens_before_it_only():
    sampler = Sampler(SamplingOptions(presence_penalty=1.0))
    rows = mx.full((3, 4), 5.0)
    got = np.array(sampler.penalized(rows, draft=[1, 2]))
    np.testing.assert_allclose(got[0], [5, 5, 5, 5])
    np.testing.assert_allclose(got[1], [5, 4, 5, 5])
    np.testing.assert_allclose(got[2], [5, 4, 4, 5])


def test_zero_alternatives_reports_the_token_alone():
    sampler = Sampler(SamplingOptions(logprobs=0))
    token = sampler(mx.array([0.0, 2.0, 1.0]))
    noted = sampler.take_logprob()
    assert token == 1 and noted.token == 1 and noted.top == ()
    assert sampler.take_logprob() is None


def test_alternatives_are_best_first_and_as_many_as_asked():
    sampler = Sampler(SamplingOptions(logprobs=2))
    sampler(mx.array([0.0, 3.0, 1.0, 2.0]))
    noted = sampler.take_logprob()
    assert [token for token, _ in noted.top] == [1, 3]
    assert noted.top[0][1] > noted.top[1][1]


def test_min_p_drops_a_token_just_below_the_ratio():
    sampler = Sampler(SamplingOptions(temperature=1.0, min_p=0.5))
    # probabilities proportional to 1, 0.49, 0.51
    logits = mx.log(mx.array([1.0, 0.49, 0.51]))
    kept = np.isfinite(np.array(sampler.filtered_logprobs(logits[None]))[0])
    assert kept.tolist() == [True, False, True]


def test_top_k_of_one_is_greedy_at_any_temperature():
    sampler = Sampler(SamplingOptions(temperature=5.0, top_k=1, seed=3))
    logits = mx.array([0.0, 0.1, 0.05])
    assert {sampler.draw(logits) for _ in range(20)} == {1}


def test_a_verify_row_window_drops_the_oldest_recorded_token_for_each_draft_token():
    sampler = Sampler(SamplingOptions(presence_penalty=1.0, repeat_last_n=2))
    sampler.record([0, 1])
    got = np.array(sampler.penalized(mx.full((2, 4), 5.0), draft=[2]))
    np.testing.assert_allclose(got[1], [5, 4, 4, 5])


def test_noted_log_probabilities_come_back_oldest_first():
    sampler = Sampler(SamplingOptions(logprobs=0))
    sampler.note_logprobs(mx.log(mx.array([[0.5, 0.5], [0.25, 0.75]])), [0, 1])
    assert [sampler.take_logprob().token, sampler.take_logprob().token] == [0, 1]
