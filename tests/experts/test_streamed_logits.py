"""Streamed experts give bit-identical logits to resident ones, at any budget."""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.models.tiles import uncompiled

import numpy as np
import pytest
from expert_helpers import ORACLE_DIR, TINY, budget_gib, feed_patterns, streamed

SHARES = [1.0, 0.5, 0.25, "min"]


def assert_identical(path: Path, tokens: list[int], shares, weights_dtype: str = "auto"):
    resident = ds4mlx.load_model(path, weights_dtype=weights_dtype)
    expected = feed_patterns(resident, tokens)
    for share in shares:
        model = streamed(path, budget_gib(path, share, weights_dtype), weights_dtype)
        try:
            got = feed_patterns(model, tokens)
            for i, (a, b) in enumerate(zip(expected, got, strict=True)):
                assert np.array_equal(a, b), f"budget {share}: chunk {i} differs"
            stats = model.expert_stats()
            assert stats.capacity_bytes <= stats.budget_bytes
        finally:
            model.close()


@pytest.mark.parametrize("share", SHARES)
def test_tiny_target(share):
    assert_identical(TINY, list(range(3, 80, 2)), [share])


def test_tiny_target_native_weights():
    # Packed (Q2_K) and MLX-quantized (Q4_K) experts in the slab.
    assert_identical(TINY, list(range(3, 60, 3)), [0.5, "min"], weights_dtype="native")


@pytest.mark.parametrize(
    "name",
    [
        "deepseek4-a-f16",
        "deepseek4-a-kquant",
        "deepseek4-a-mxfp4",
        "deepseek4-b-f16",
        "glm5-next-a-f32",
    ],
)
def test_oracle_fixtures(oracle, name):
    path = ORACLE_DIR / f"{name}.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    fixture = next(f for f in oracle["fixtures"] if f["name"] == name)
    assert_identical(path, list(fixture["tokens"])[:40], SHARES)


@pytest.mark.parametrize("share", [1.0, "min"])
@pytest.mark.parametrize("weights_dtype", ["auto", "native"])
def test_compiled_streamed_tiles_match_uncompiled_ones(share, weights_dtype):
    # At the minimum budget a verify tile's routing outgrows the slab: batches, uncompiled.
    model = streamed(TINY, budget_gib(TINY, share, weights_dtype), weights_dtype)
    try:
        assert all(block._compiles_streamed_tiles for block in model.network.blocks)
        tokens = list(range(5, 60, 3))
        compiled = feed_patterns(model, tokens)
        assert all(block._after_routing.compiled for block in model.network.blocks)
        with uncompiled():
            plain = feed_patterns(model, tokens)
        for i, (a, b) in enumerate(zip(compiled, plain, strict=True)):
            assert np.array_equal(a, b), f"chunk {i} differs"
    finally:
        model.close()
