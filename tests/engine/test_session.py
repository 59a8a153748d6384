"""Session input checks: bad token ids are refused before anything is computed, and the session
is left as it was."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.engine.session import feed_batch

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
