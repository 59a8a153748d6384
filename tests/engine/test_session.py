"""Session input checks: bad token ids are refused before anything is computed, and the session
is left as it was."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.engine.session import feed_batch

import mlx.core as mx
import numpy as np
import pytest

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"


@pytest.fixture(scope="module")
def model():
    return ds4mlx.load_model(TINY)


@pytest.mark.parametrize("case", ["negative", "vocab", "huge"])
def test_token_ids_outside_the_vocabulary_are_refused(model, case):
    vocab = model.network.args.vocab_size
    bad = {"negative": [-1], "vocab": [vocab], "huge": [1, 2, 10**9]}[case]
    session = model.new_session()
    before = session.feed([5, 6, 7])
    outside = next(t for t in bad if not 0 <= t < vocab)
    with pytest.raises(
        ValueError,
        match=rf"token id {outside} is outside the model's "
        rf"vocabulary \(0\.\.{vocab - 1}\)",
    ):
        session.feed(bad)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        session.feed_hidden(bad)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        feed_batch([session, model.new_session()], [1, bad[-1]])
    # Nothing was fed: the session continues exactly as a fresh one does.
    assert session.n_tokens == 3
    fresh = model.new_session()
    np.testing.assert_array_equal(fresh.feed([5, 6, 7]), before)
    np.testing.assert_array_equal(session.feed([8]), fresh.feed([8]))


def test_empty_and_non_integer_feeds_are_refused(model):
    session = model.new_session()
    with pytest.raises(ValueError, match="at least one token"):
        session.feed([])
    with pytest.raises(ValueError, match="token ids must be integers"):
        session.feed([1.5])
    assert session.n_tokens == 0


GLM_TINY = TINY.with_name("glm-tiny.gguf")


def test_a_batched_step_equals_each_session_fed_alone(model):
    """Row i of ``feed_batch`` is session i's own next step, and each session holds its token
    afterwards (in its own order: the batch must not swap or drop them)."""
    first, second = model.new_session(), model.new_session()
    first.feed([5, 6, 7])
    second.feed([9, 10])
    alone = []
    for session, token in ((first, 11), (second, 12)):
        twin = model.new_session()
        twin.feed(session.tokens)
        alone.append(twin.feed([token])[0])
    logits = np.array(feed_batch([first, second], [11, 12]).astype(mx.float32))
    np.testing.assert_allclose(logits, np.stack(alone), rtol=1e-3, atol=1e-3)
    assert (first.tokens, second.tokens) == ([5, 6, 7, 11], [9, 10, 12])


def test_a_batched_step_refuses_what_it_cannot_batch(model):
    session = model.new_session()
    with pytest.raises(ValueError, match=r"^feed_batch\(\) needs at least one session$"):
        feed_batch([], [])
    with pytest.raises(ValueError, match="^a batched step needs sessions of one model$"):
        feed_batch([session, ds4mlx.load_model(TINY).new_session()], [1, 2])
    glm = ds4mlx.load_model(GLM_TINY)
    with pytest.raises(ValueError, match="has no batched decode$"):
        feed_batch([glm.new_session()], [1])
    with pytest.raises(ValueError, match="^1 tokens for 2 sessions$"):
        feed_batch([session, model.new_session()], [1])
    with pytest.raises(ValueError, match="^2 tokens for 1 sessions$"):
        feed_batch([session], [1, 2])
    assert session.n_tokens == 0


def test_hidden_feeds_keep_the_tokens_like_plain_feeds(model):
    session = model.new_session()
    out = session.feed_hidden([5, 6, 7], capture_layers=(0,), all_logits=False)
    assert session.tokens == [5, 6, 7]
    assert out.logits.shape[0] == 1 and sorted(out.layers) == [0]
    assert out.final_hidden.shape[0] == 3  # every token's hidden state, the last logits alone
    lazy = session.feed_hidden_lazy(mx.array([8, 9]), capture_layers=(0,))
    assert session.tokens == [5, 6, 7]  # unread: the ids come with ``confirm``
    assert lazy.logits.shape[0] == 2
    session.confirm([8, 9])
    fresh = model.new_session()
    fresh.feed([5, 6, 7, 8, 9])
    np.testing.assert_allclose(session.feed([4]), fresh.feed([4]), rtol=1e-3, atol=1e-3)


def test_a_snapshot_counts_its_tokens_and_restores_them(model):
    session = model.new_session()
    session.feed([5, 6, 7])
    snapshot = session.snapshot()
    assert snapshot.n_tokens == 3
    session.truncate(1)
    assert session.tokens == [5]
    session.restore(snapshot)
    assert session.tokens == [5, 6, 7] and session.n_tokens == 3
