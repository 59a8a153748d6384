"""A prefill that only samples the next token computes the LM head for its last row alone
(``forward(..., all_logits=False)``): at DeepSeek-V4-Flash's width the head is 129,280 rows, and
multiplying it for every prompt token was most of a short prefill's waste. The last row's logits
are the ones all rows give, the hidden states are every row's, and callers that read every row
(perplexity, quality checks, verify) still get them."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
import ds4mlx.models.base as model_base
from ds4mlx.generation import generate
from ds4mlx.speculation import SpeculationConfig, load_drafter
from ds4mlx.speculation.config import DrafterKind

import mlx.core as mx
import numpy as np
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PROMPT = [3, 17, 5, 9, 40, 2, 11, 8, 31, 6, 12]  # longer than a decode tile: a batched prefill


@pytest.fixture(scope="module", params=["ds4-tiny.gguf:f32", "ds4-tiny.gguf:native", "glm-tiny"])
def model(request):
    name, _, dtype = request.param.partition(":")
    path = ASSETS / (name if name.endswith(".gguf") else f"{name}.gguf")
    return ds4mlx.load_model(path, weights_dtype=dtype or "auto")


@pytest.fixture
def head_rows(monkeypatch):
    """The row counts the head's product is asked for, in order."""
    seen: list[int] = []
    real_linear = model_base.linear

    def recording(x, w, rows=None):
        seen.append(x.shape[0])
        return real_linear(x, w, rows)

    monkeypatch.setattr(model_base, "linear", recording)
    return seen


@pytest.mark.parametrize("length", [len(PROMPT), 3])  # a batched prefill and a decode tile
def test_last_row_logits_equal_that_row_of_all(model, length, head_rows):
    tokens = mx.array(PROMPT[:length], dtype=mx.int32)
    network = model.network
    every = network.forward(tokens, network.new_state(), return_hidden=True)
    state = network.new_state()
    last = network.forward(tokens, state, return_hidden=True, all_logits=False)
    assert last.logits.shape == (1, every.logits.shape[1])
    np.testing.assert_allclose(
        np.array(last.logits[0]), np.array(every.logits[-1]), rtol=1e-4, atol=1e-4
    )
    # Everything but the logits is every row's, as before, and the state advanced as far.
    assert last.final_hidden.shape == every.final_hidden.shape
    np.testing.assert_array_equal(np.array(last.final_hidden), np.array(every.final_hidden))
    assert state.pos == length
    if length >= model_base.DECODE_TILE:  # the batched head ran on every row, then on one
        assert head_rows == [length, 1]


def test_generation_prefill_multiplies_the_head_for_one_row(model, head_rows):
    session = model.new_session()
    events = list(generate(session, PROMPT, 1))
    assert head_rows == [1]
    # The same first token as from every row's logits.
    every = model.new_session().feed(PROMPT)
    assert events[0].token == int(every[-1].argmax())


def test_speculative_prefill_multiplies_the_head_for_one_row(head_rows):
    """Drafters read a prompt's hidden states, never its logits: with DSpark on, the prefill's
    head also runs for the last row alone, and the output is plain decoding's."""
    model = ds4mlx.load_model(ASSETS / "ds4-tiny.gguf")
    config = SpeculationConfig(DrafterKind.DSPARK, ASSETS / "ds4-tiny-dspark.gguf")
    drafter = load_drafter(config, model)
    events = list(generate(model.new_session(), PROMPT, 8, None, drafter, config))
    assert head_rows[0] == 1
    plain = list(generate(model.new_session(), PROMPT, 8))
    assert [e.token for e in events[:-1]] == [e.token for e in plain[:-1]]


def test_all_logits_stay_the_default_of_a_feed(model):
    logits = model.new_session().feed(PROMPT)
    assert logits.shape[0] == len(PROMPT)
    session = model.new_session()
    last = session.feed_mx(PROMPT, all_logits=False)
    assert last.shape[0] == 1 and session.n_tokens == len(PROMPT)
    np.testing.assert_allclose(np.array(last[0]), logits[-1], rtol=1e-4, atol=1e-4)
