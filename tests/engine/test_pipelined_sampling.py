"""Pipelined decoding samples on the device (``penalized_on_device`` + ``draw_on_device``, the
look-back window kept as an array) and queues several steps before reading their tokens. It must
commit exactly the tokens that one step at a time (the host path: ``Sampler.__call__``) commits,
greedy or seeded, with penalties, and a stop token inside a queued run must leave the session as
one-step decoding leaves it."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import ds4mlx
from ds4mlx.engine.generate import Decoder, DoneEvent, TokenEvent, run_alone, stepped_generate
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.session import Session

import numpy as np
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
MODELS = {"deepseek4": ASSETS / "ds4-tiny.gguf", "glm5": ASSETS / "glm-tiny.gguf"}
PROMPT = [17, 301, 5, 88, 1024, 7, 7, 640, 12, 99, 250, 3]
CYCLE = (40, 41, 42, 43)
OPTIONS = {
    # Biases make the four CYCLE tokens the only candidates and the presence penalty bans the
    # last three drawn, so greedy decoding cycles through them, and only if each step's window
    # holds exactly the tokens drawn before it, the ones of the same queued run included.
    "greedy_window": SamplingOptions(
        presence_penalty=50.0,
        repeat_last_n=3,
        logit_bias=tuple((token, 30.0 - 3 * i) for i, token in enumerate(CYCLE)),
    ),
    "seeded_filtered": SamplingOptions(
        temperature=0.9,
        top_k=40,
        top_p=0.9,
        min_p=0.02,
        frequency_penalty=0.4,
        repeat_last_n=10,
        seed=3,
    ),
}


@cache
def model(arch: str):
    # float32: the rolled-back caches are checked against a fresh prefill to 1e-4, float
    # arithmetic's agreement; native Q8_0 products round their inputs to 8 bits, where the last
    # bits of a prefill can step a rounding (test_bench_quality bounds that path).
    return ds4mlx.load_model(MODELS[arch], weights_dtype="f32")


def run(
    arch: str,
    options: SamplingOptions,
    pipeline: int,
    max_tokens: int = 21,
    stop_tokens: tuple[int, ...] = (),
    max_context: int | None = None,
) -> tuple[list[int], Session, str]:
    decoder = Decoder()
    decoder.pipeline = pipeline
    session = model(arch).new_session()
    tokens, reason = [], ""
    for event in run_alone(
        stepped_generate(
            session, PROMPT, max_tokens, options, stop_tokens, max_context, decoder=decoder
        )
    ):
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
        elif isinstance(event, DoneEvent):
            reason = event.stats.stop_reason
    return tokens, session, reason


@pytest.mark.parametrize("sampling", OPTIONS)
@pytest.mark.parametrize("arch", MODELS)
def test_pipelined_decoding_commits_the_one_step_tokens(arch, sampling):
    options = OPTIONS[sampling]
    expected, one_step, _ = run(arch, options, pipeline=1)
    got, pipelined, reason = run(arch, options, pipeline=4)
    assert got == expected
    assert reason == "length" and len(got) == 21
    assert pipelined.tokens == one_step.tokens == PROMPT + expected[:-1]
    if sampling == "greedy_window":
        assert set(expected) == set(CYCLE)
        assert expected[4:] == expected[:-4]  # a cycle of 4


@pytest.mark.parametrize("arch", MODELS)
def test_a_stop_token_inside_a_queued_run_rolls_the_session_back(arch):
    options = OPTIONS["seeded_filtered"]
    expected, _, _ = run(arch, options, pipeline=1)
    # a stop token that first appears in the middle of a queued run of 4
    at = next(i for i, t in enumerate(expected) if i % 4 in (1, 2) and t not in expected[:i])
    stop = expected[at]
    got, session, reason = run(arch, options, pipeline=4, stop_tokens=(stop,))
    assert (got, reason) == (expected[: at + 1], "stop")
    assert session.tokens == PROMPT + expected[:at]  # the stop token is never fed
    # The caches agree with the tokens: the session continues as a fresh one fed the same.
    fresh = model(arch).new_session()
    fresh.feed(session.tokens)
    got_logits, fresh_logits = session.feed([stop]), fresh.feed([stop])
    assert np.abs(got_logits - fresh_logits).max() <= 1e-4 * np.abs(fresh_logits).max()


@pytest.mark.parametrize("arch", MODELS)
def test_the_context_limit_ends_a_queued_run_where_one_step_decoding_ends(arch):
    """The last queued run fills the context exactly; its tokens are still yielded, one by
    one, until the context holds ``max_context`` tokens (the queued ones were fed ahead)."""
    options = OPTIONS["greedy_window"]
    max_context = len(PROMPT) + 10  # runs of 4, 4 and 2 after the first token
    expected, one_step, reason = run(arch, options, pipeline=1, max_context=max_context)
    assert reason == "context" and len(expected) == 11
    got, pipelined, reason = run(arch, options, pipeline=4, max_context=max_context)
    assert (got, reason) == (expected, "context")
    assert pipelined.tokens == one_step.tokens == PROMPT + expected[:-1]
