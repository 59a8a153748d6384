"""A decode tile has DECODE_TILE rows of which a one-token step fills one: every native product
of the step must compute that real row alone (``kernels.linear``'s ``rows``), not the padding.
GLM's layers once passed no row count anywhere and multiplied all eight rows (1.2x its decode
time on the tiny model)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import ds4mlx
from ds4mlx import kernels
from ds4mlx.generation import generate
from ds4mlx.kernels.native import native_ops

import mlx.core as mx
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
# The native operations that take a real-row count as their last argument.
ROW_COUNTED = ("rows_linear", "blocks_linear")


class _CountingOps:
    """The native operations, recording (operation, rows given, real rows) of each product."""

    def __init__(self, ops):
        self.ops = ops
        self.products: Counter[tuple[str, int, int]] = Counter()

    def __getattr__(self, name: str):
        operation = getattr(self.ops, name)
        if name not in ROW_COUNTED:
            return operation

        def counted(*args):
            self.products[(name, args[0].shape[0], int(args[-1]))] += 1
            return operation(*args)

        return counted


@pytest.mark.parametrize("asset", ["ds4-tiny.gguf", "glm-tiny.gguf"])
def test_one_token_steps_compute_one_row_of_each_product(asset, monkeypatch):
    if native_ops() is None:
        pytest.skip("the native CPU operations are not built here")
    model = ds4mlx.load_model(ASSETS / asset, weights_dtype="f32")
    counting = _CountingOps(native_ops())
    monkeypatch.setattr(kernels, "native_ops", lambda: counting)
    # Compiled tiles would replay the graphs traced before the spy: trace nothing.
    mx.disable_compile()
    try:
        # A one-token prompt runs as a tile too, then each decoded token.
        list(generate(model.new_session(), [5], 4))
    finally:
        mx.enable_compile()
    assert counting.products, "no native product ran: the spy sees nothing"
    padded = {key: n for key, n in counting.products.items() if key[2] != 1}
    assert not padded, f"products computing more than the real row: {padded}"
