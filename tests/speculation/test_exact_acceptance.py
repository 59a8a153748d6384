"""Exact acceptance (``--mtp-exact-sampling``) through ``accept``: what it commits must be
distributed exactly as plain sampling, row by row.

Each test runs ``accept`` many times on fixed verify logits and checks the committed tokens
with χ² tests: a fully accepted draft's bonus token comes from the last row only; after a
rejection, the token comes from the first rejected row with the draft token removed; and the
sequence as a whole follows each row's sampling distribution. Seeds are fixed, so every run gives
the same verdict.
"""

from __future__ import annotations

from ds4mlx.engine.sampling import Sampler, SamplingOptions
from ds4mlx.speculation.acceptance import AcceptanceMode, Verdict, accept

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import binomtest, chisquare

CERTAIN = 60.0  # a logit gap that puts all the float32 mass on one token


def one_hot_row(token: int, vocab: int) -> np.ndarray:
    row = np.zeros(vocab, np.float32)
    row[token] = CERTAIN
    return row


def run(
    logits: np.ndarray,
    draft: list[int],
    options: SamplingOptions,
    n: int,
    recent: tuple[int, ...] = (),
) -> list[Verdict]:
    sampler = Sampler(options)
    sampler.record(recent)
    rows = mx.array(logits)
    return [accept(rows, draft, sampler, AcceptanceMode.EXACT) for _ in range(n)]


def assert_distributed_as(tokens: list[int], probs: np.ndarray) -> None:
    tokens_arr = np.array(tokens)
    support = probs > 0
    assert np.isin(tokens_arr, np.flatnonzero(support)).all(), "a token of probability 0"
    observed = np.bincount(tokens_arr, minlength=len(probs))[support]
    expected = probs[support].astype(np.float64)
    assert chisquare(observed, expected / expected.sum() * len(tokens)).pvalue > 1e-3


def test_a_fully_accepted_draft_draws_its_bonus_from_the_last_row():
    vocab = 6
    last = np.array([0.05, 0.10, 0.15, 0.20, 0.22, 0.28])
    logits = np.stack(
        [one_hot_row(2, vocab), one_hot_row(5, vocab), np.log(last).astype(np.float32)]
    )
    verdicts = run(logits, [2, 5], SamplingOptions(temperature=1.0, seed=21), 2000)
    assert all(v.accepted == 2 for v in verdicts)
    assert_distributed_as([v.next_token for v in verdicts], last)


def test_a_rejection_draws_from_the_residual_of_the_first_rejected_row():
    """Row 0 always accepts its draft; row 1 gives its draft 0.4, so about 60% of the verifies
    stop there, and what they commit instead is row 1 without the draft, renormalised."""
    vocab = 5
    row1 = np.array([0.25, 0.40, 0.05, 0.20, 0.10])
    row2 = np.array([0.70, 0.05, 0.05, 0.10, 0.10])
    logits = np.stack([one_hot_row(3, vocab), np.log(row1), np.log(row2)]).astype(np.float32)
    verdicts = run(logits, [3, 1], SamplingOptions(temperature=1.0, seed=22), 2500)
    assert {v.accepted for v in verdicts} == {1, 2}
    rejected = [v.next_token for v in verdicts if v.accepted == 1]
    assert binomtest(len(rejected), len(verdicts), 0.6).pvalue > 1e-3
    residual = row1.copy()
    residual[1] = 0.0
    assert_distributed_as(rejected, residual / residual.sum())
    assert_distributed_as([v.next_token for v in verdicts if v.accepted == 2], row2)


def test_a_rejected_first_token_draws_from_the_first_row():
    vocab = 4
    row0 = np.array([0.1, 0.5, 0.3, 0.1])
    logits = np.stack([np.log(row0), one_hot_row(0, vocab)]).astype(np.float32)
    verdicts = run(logits, [2], SamplingOptions(temperature=1.0, seed=23), 2000)
    rejected = [v.next_token for v in verdicts if v.accepted == 0]
    assert binomtest(len(rejected), len(verdicts), 0.7).pvalue > 1e-3
    assert_distributed_as(rejected, np.array([0.1, 0.5, 0.0, 0.1]) / 0.7)
    assert all(v.next_token == 0 for v in verdicts if v.accepted == 1)  # bonus: row 1


@pytest.mark.parametrize(
    "options",
    [
        SamplingOptions(temperature=1.0, seed=24),
        SamplingOptions(temperature=0.7, top_k=4, top_p=0.95, seed=25),
    ],
    ids=["plain", "filtered"],
)
def test_the_committed_sequence_follows_each_rows_sampling_distribution(options):
    """The guarantee itself: position j's token, given the positions before it were the
    draft's, is distributed as row j's sampling distribution (the filtered, tempered one)."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((3, 7)) * 1.5).astype(np.float32)
    draft = [int(np.argsort(-logits[0])[1]), int(np.argmax(logits[1]))]
    sampler = Sampler(options)
    rows = np.array(sampler.probabilities(mx.array(logits)))
    assert rows[0, draft[0]] > 0.15 and rows[1, draft[1]] > 0.3  # the bonus row gets samples
    verdicts = run(logits, draft, options, 3000)
    committed = [[*draft[: v.accepted], v.next_token] for v in verdicts]
    for j in range(3):
        reached = [seq[j] for seq in committed if len(seq) > j]
        assert len(reached) > 150
        assert_distributed_as(reached, rows[j])


def test_the_bonus_row_is_penalised_as_if_the_draft_were_committed():
    """A presence penalty bans the draft token from the row after it (it is now recent), so
    the bonus token is never the draft token, though the raw row prefers it."""
    vocab = 4
    last = np.log(np.array([0.1, 0.7, 0.1, 0.1])).astype(np.float32)
    logits = np.stack([one_hot_row(1, vocab), last])
    options = SamplingOptions(temperature=1.0, presence_penalty=100.0, seed=26)
    verdicts = run(logits, [1], options, 600)
    assert all(v.accepted == 1 for v in verdicts)
    assert_distributed_as([v.next_token for v in verdicts], np.array([1, 0, 1, 1]) / 3)
