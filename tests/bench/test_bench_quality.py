"""The quality gate on the shipped tiny target: held-out NLL against the stored baseline, and
logprob agreement between batched prefill, token-by-token decoding, speculative verify chunks and
streamed experts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import ds4mlx
from ds4mlx.bench import quality
from ds4mlx.experts import ExpertOptions

import pytest

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
# Same machine, same file: the forward pass is deterministic up to BLAS summation order, so a
# change beyond these is a change in the model's arithmetic, not noise.
SNIPPET_TOLERANCE = 2e-3
MEAN_TOLERANCE = 5e-4
# float32 logits through different chunkings of the same computation.
AGREEMENT_TOLERANCE = 1e-4
# Native weights on the CPU's block kernels: Q8_0 matrices multiply inputs rounded to 8 bits per
# 32-value block (as llama.cpp does), a step of 1/127 of the block's largest value. Chunkings
# differ in the last bits of their inputs, which can land a value on the other side of a rounding
# step: measured up to 0.028 nats between paths and 0.007 nats of a snippet's NLL. A broken cache
# or mask moves logprobs by whole nats. Streamed experts still equal resident ones exactly.
NATIVE_AGREEMENT_TOLERANCE = 0.1
NATIVE_SNIPPET_TOLERANCE = 2e-2
NATIVE_SNIPPETS = 25


def load_tiny(weights_dtype: str):
    if not TINY.is_file():
        pytest.skip(f"{TINY} is not built (scripts/train_tiny.py)")
    return ds4mlx.load_model(TINY, weights_dtype=weights_dtype)


@pytest.fixture(scope="module")
def tiny():
    # The stored baseline and the agreement above are float32 arithmetic (the reference path).
    model = load_tiny("f32")
    yield model
    model.close()


@pytest.fixture(scope="module")
def tiny_native():
    model = load_tiny("native")
    yield model
    model.close()


def test_the_snippets_are_100_fixed_held_out_texts():
    data = json.loads(quality.SNIPPETS.read_text())
    snippets = quality.load_snippets()
    assert len(snippets) == 100 == len(set(snippets))
    assert all(len(text) >= 240 for text in snippets)
    assert all(s["source"].startswith("stdlib/") for s in data["snippets"])


def test_heldout_nll_matches_the_stored_baseline(tiny):
    baseline = json.loads(quality.BASELINE.read_text())
    if quality.file_sha256(TINY) != baseline["sha256"]:
        pytest.skip(
            f"{TINY.name} was rebuilt since the baseline; rerun "
            f"`python -m ds4mlx.bench.quality {TINY}` and review the change"
        )
    assert baseline["max_tokens"] == quality.MAX_TOKENS
    report = quality.heldout_nll(tiny, quality.load_snippets())
    assert len(report.per_snippet) == len(baseline["per_snippet"]) == 100
    worst = max(
        abs(a - b) for a, b in zip(report.per_snippet, baseline["per_snippet"], strict=True)
    )
    assert worst <= SNIPPET_TOLERANCE
    assert abs(report.mean - baseline["mean"]) <= MEAN_TOLERANCE
    # And the model is a model: far better than guessing uniformly over the vocabulary.
    assert report.mean < math.log(tiny.args.vocab_size) - 1.0


def test_native_weights_keep_the_baseline_quality(tiny_native):
    baseline = json.loads(quality.BASELINE.read_text())
    if quality.file_sha256(TINY) != baseline["sha256"]:
        pytest.skip(f"{TINY.name} was rebuilt since the baseline")
    report = quality.heldout_nll(tiny_native, quality.load_snippets()[:NATIVE_SNIPPETS])
    expected = baseline["per_snippet"][:NATIVE_SNIPPETS]
    worst = max(abs(a - b) for a, b in zip(report.per_snippet, expected, strict=True))
    assert worst <= NATIVE_SNIPPET_TOLERANCE
    assert abs(report.mean - sum(expected) / len(expected)) <= MEAN_TOLERANCE


def test_native_logprob_agreement_across_paths(tiny_native):
    cache_gib = quality.half_expert_cache_gib(tiny_native)
    streamed = ds4mlx.load_model(
        TINY, weights_dtype="native", experts=ExpertOptions(stream=True, cache_gib=cache_gib)
    )
    try:
        for text in quality.load_snippets()[:2]:
            ids = quality.snippet_ids(tiny_native, text)
            diffs = quality.logprob_agreement(tiny_native, ids, streamed=streamed)
            assert diffs.pop("streamed experts") == 0.0
            assert max(diffs.values()) <= NATIVE_AGREEMENT_TOLERANCE, diffs
        assert streamed.expert_stats().evictions > 0
    finally:
        streamed.close()


def test_snippet_nll_is_the_mean_negative_logprob(tiny):
    text = quality.load_snippets()[0]
    ids = quality.snippet_ids(tiny, text)
    logprobs = quality.log_softmax(tiny.logits(ids[:-1]))
    expected = -sum(logprobs[i, ids[i + 1]] for i in range(len(ids) - 1)) / (len(ids) - 1)
    assert quality.snippet_nll(tiny, text) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match="at least 2"):
        quality.snippet_nll(tiny, text, max_tokens=1)


def test_logprob_agreement_across_paths(tiny):
    streamed = ds4mlx.load_model(
        TINY,
        weights_dtype="f32",
        experts=ExpertOptions(stream=True, cache_gib=quality.half_expert_cache_gib(tiny)),
    )
    try:
        for text in quality.load_snippets()[:2]:
            diffs = quality.logprob_agreement(
                tiny, quality.snippet_ids(tiny, text), streamed=streamed
            )
            assert set(diffs) == {
                "token by token",
                "verify chunks (prefix 16, draft 4 + 1)",
                "streamed experts",
            }
            assert max(diffs.values()) <= AGREEMENT_TOLERANCE, diffs
        # The streamed model really streamed: a half-size cache evicted and read the file.
        stats = streamed.expert_stats()
        assert stats.kind == "streamed" and stats.misses > 0 and stats.evictions > 0
    finally:
        streamed.close()


def test_agreement_needs_tokens_past_the_prefix(tiny):
    with pytest.raises(ValueError, match="more than 16"):
        quality.logprob_agreement(tiny, list(range(1, 10)))
