"""Logit biases and repetition penalties as llama.cpp applies them."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.engine.generate import TokenEvent, run_alone, stepped_generate
from ds4mlx.engine.sampling import Sampler, SamplingOptions
from ds4mlx.engine.session import Session

import mlx.core as mx
import numpy as np
import pytest

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"


def reference(logits: np.ndarray, recent: list[int], o: SamplingOptions) -> np.ndarray:
    """llama.cpp's ``llama_sampler_penalties_apply``, token by token."""
    out = logits.astype(np.float32).copy()
    window = recent[-o.repeat_last_n :]
    for token in set(window):
        count = window.count(token)
        if out[token] <= 0:
            out[token] *= o.repeat_penalty
        else:
            out[token] /= o.repeat_penalty
        out[token] -= count * o.frequency_penalty + o.presence_penalty
    return out


OPTIONS = [
    SamplingOptions(repeat_penalty=1.3),
    SamplingOptions(frequency_penalty=0.7),
    SamplingOptions(presence_penalty=1.5, repeat_last_n=4),
    SamplingOptions(
        repeat_penalty=0.8, frequency_penalty=-0.5, presence_penalty=0.25, repeat_last_n=6
    ),
]


@pytest.mark.parametrize("options", OPTIONS)
def test_penalties_match_llamacpp(options):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 20)).astype(np.float32) * 4
    recent = [3, 5, 5, 7, 3, 3, 11, 0]
    draft = [5, 19]
    sampler = Sampler(options)
    sampler.record(recent)
    got = np.array(sampler.penalized(mx.array(logits), draft))
    for i in range(3):  # row i follows the draft's first i tokens
        expected = reference(logits[i], recent + draft[:i], options)
        np.testing.assert_allclose(got[i], expected, rtol=1e-6)
    assert not np.array_equal(got, logits)


def test_no_penalty_leaves_logits_alone():
    sampler = Sampler(SamplingOptions())
    sampler.record([1, 2, 2])
    logits = mx.array(np.arange(10, dtype=np.float32)[None])
    assert sampler.penalized(logits, [4]) is logits
    assert sampler(logits[0]) == 9


def test_recent_tokens_are_a_window():
    sampler = Sampler(SamplingOptions(presence_penalty=100.0, repeat_last_n=2))
    logits = mx.array(np.array([5.0, 4.0, 3.0, 0.0], np.float32))
    sampler.record([0, 1])
    assert sampler(logits) == 2  # 0 and 1 are penalised
    sampler.record([2, 3])
    assert sampler(logits) == 0  # only 2 and 3 are recent now


def test_logit_bias_comes_before_the_penalties():
    options = SamplingOptions(repeat_penalty=2.0, logit_bias=((1, 3.0), (2, -1.0)))
    sampler = Sampler(options)
    sampler.record([1, 2])
    logits = np.array([[0.5, 1.0, 1.0, 0.25]], np.float32)
    got = np.array(sampler.penalized(mx.array(logits)))
    # token 1: (1 + 3) / 2; token 2: (1 - 1) * 2 (not positive: multiplied)
    np.testing.assert_allclose(got[0], [0.5, 2.0, 0.0, 0.25])


@pytest.mark.parametrize(
    "field, value",
    [
        ("repeat_penalty", 0.0),
        ("repeat_last_n", 0),
        ("logit_bias", ((3, 1.0), (3, 2.0))),
        ("logit_bias", ((-1, 1.0),)),
    ],
)
def test_bad_penalty_options(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingOptions(**{field: value})


def test_a_continued_session_penalises_the_tokens_it_already_holds():
    # A prompt-cache hit restores part of the prompt and feeds only the rest: the penalties
    # must still see the restored tokens, or the warm answer differs from the cold one.
    if not TINY_MODEL.is_file():
        pytest.skip(f"{TINY_MODEL} is not built")
    model = ds4mlx.load_model(TINY_MODEL)
    prompt = model.tokenizer.encode("def function_1(x):\n    return x\n\ndef", add_special=True)
    options = SamplingOptions(frequency_penalty=1.0, presence_penalty=0.5)

    def answer(session: Session, tokens: list[int], sampling: SamplingOptions) -> list[int]:
        events = run_alone(stepped_generate(session, tokens, 24, sampling))
        return [event.token for event in events if isinstance(event, TokenEvent)]

    cold = answer(model.new_session(), prompt, options)
    warm_session = model.new_session()
    warm_session.feed(prompt[:-3])
    assert answer(warm_session, prompt[-3:], options) == cold
    assert answer(model.new_session(), prompt, SamplingOptions()) != cold  # it matters here


def test_verify_rows_look_back_on_the_last_tokens_of_the_window():
    # Row i sees the recorded tokens then draft[:i], cut to the last repeat_last_n of them.
    sampler = Sampler(SamplingOptions(repeat_penalty=2.0, repeat_last_n=2))
    sampler.record([0, 1])
    rows = np.array(sampler.penalized(mx.array(np.full((2, 4), 4.0, np.float32)), draft=[2]))
    np.testing.assert_array_equal(rows, [[2.0, 2.0, 4.0, 4.0], [4.0, 2.0, 2.0, 4.0]])


def test_a_logit_bias_names_each_token_once():
    with pytest.raises(ValueError, match="distinct token ids"):
        SamplingOptions(logit_bias=((1, 1.0), (1, 2.0)))
