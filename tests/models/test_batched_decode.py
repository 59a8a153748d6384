"""Batched decode: one forward step over independent sessions equals each session's own decode,
bit for bit, whatever the sessions' positions and however many share the step."""

from __future__ import annotations

import ds4mlx
from ds4mlx.engine.session import Session, feed_batch, supports_batched_decode

import mlx.core as mx
import numpy as np
import pytest

# Prompt lengths around the compressed layers' block edges (ratio 4 and 128) and the sliding
# window (32), so that sessions in one step complete blocks at different times.
PROMPT_LENGTHS = [1, 3, 7, 30, 45, 64, 127, 129, 5]


@pytest.fixture(scope="module")
def network(chat_model_path):
    # Built on the "b" oracle fixture, whose indexer top-k of 8 makes its CSA layers really
    # select blocks.
    return ds4mlx.load_model(chat_model_path).network


def prefilled(network, prompts: list[list[int]]):
    states = [network.new_state() for _ in prompts]
    for prompt, state in zip(prompts, states, strict=True):
        network.forward(mx.array(prompt), state)
    return states


@pytest.mark.parametrize("n_sessions", [1, 4, len(PROMPT_LENGTHS)])
def test_each_row_equals_its_own_one_token_decode(network, n_sessions):
    rng = np.random.default_rng(n_sessions)
    vocab = network.args.vocab_size
    prompts = [[int(t) for t in rng.integers(0, vocab, n)] for n in PROMPT_LENGTHS[:n_sessions]]
    alone, batched = prefilled(network, prompts), prefilled(network, prompts)
    tokens = [int(t) for t in rng.integers(0, vocab, n_sessions)]
    for _ in range(5):
        expected = [
            np.array(network.forward(mx.array([t]), s))[0]
            for t, s in zip(tokens, alone, strict=True)
        ]
        got = np.array(network.forward_batch(tokens, batched))
        assert got.shape == (n_sessions, vocab)
        for row, reference in zip(got, expected, strict=True):
            assert np.array_equal(row, reference)  # bitwise, not merely close
        tokens = [int(np.argmax(row)) for row in expected]
    assert [s.pos for s in batched] == [s.pos for s in alone]
    # The caches a batched step leaves serve ordinary decoding (and its rollback) afterwards.
    for token, a, b in zip(tokens, alone, batched, strict=True):
        network.truncate(a, a.pos - 2)
        network.truncate(b, b.pos - 2)
        assert np.array_equal(
            np.array(network.forward(mx.array([token, 5]), a)),
            np.array(network.forward(mx.array([token, 5]), b)),
        )


def test_sessions_feed_batch_advances_each_session(network):
    sessions = [Session(network) for _ in range(3)]
    for session, prompt in zip(sessions, [[1, 2, 3], [4], [5, 6, 7, 8, 9]], strict=True):
        session.feed(prompt)
    assert supports_batched_decode(network)
    logits = feed_batch(sessions, [10, 11, 12])
    assert logits.shape[0] == 3
    assert [s.tokens[-1] for s in sessions] == [10, 11, 12]
    assert [s.n_tokens for s in sessions] == [4, 2, 6]


def test_bad_batches_are_refused(network):
    state = network.new_state()
    network.forward(mx.array([1, 2]), state)
    with pytest.raises(ValueError, match="appears twice"):
        network.forward_batch([1, 2], [state, state])
    with pytest.raises(ValueError, match="tokens for"):
        network.forward_batch([1], [state, network.new_state()])
    with pytest.raises(ValueError, match="at least one"):
        network.forward_batch([], [])
