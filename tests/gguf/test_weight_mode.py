"""``--weights-dtype auto`` on the CPU: small models are expanded to float32 (the fused decode
steps read float32 matrices only), larger ones keep their GGUF blocks as stored."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.gguf import quants
from ds4mlx.loader import resolve_weights_dtype

import mlx.core as mx
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"

pytestmark = pytest.mark.skipif(
    mx.default_device() != mx.cpu or not quants.cpu_keeps_blocks(),
    reason="the CPU's block kernels are not built here",
)


def test_the_limit_divides_small_from_large_models():
    limit = quants.CPU_FLOAT32_MODEL_BYTES
    assert quants.default_weight_mode(limit) == "f32"
    assert quants.default_weight_mode(limit + 1) == "native"
    assert quants.default_weight_mode(None) == "native"  # size unknown: one copy, as stored


@pytest.mark.parametrize("name", ["ds4-tiny.gguf", "glm-tiny.gguf"])
def test_the_tiny_models_run_in_float32_unless_asked(name):
    path = ASSETS / name
    assert quants.float32_bytes([[4, 8], [3]]) == 4 * 35
    assert resolve_weights_dtype("auto", path) == "f32"
    assert resolve_weights_dtype("native", path) == "native"
    assert resolve_weights_dtype("auto") == "native"
