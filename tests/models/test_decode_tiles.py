"""Decode tiles (``models.base.DECODE_TILE``) as both tiny models run them.

A tile has DECODE_TILE rows of which a one-token step fills one: every native product of the
step must compute that real row alone (``kernels.linear``'s ``rows``), not the padding. GLM's
layers once passed no row count anywhere and multiplied all eight rows (1.2x its decode time on
the tiny model). And a compiled tile (``models.tiles``) computes exactly what its Python does."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import ds4mlx
from ds4mlx.generation import generate
from ds4mlx.kernels import dispatch, matmul, mhc_ops, moe_ops, sequence_ops
from ds4mlx.kernels.native import native_ops
from ds4mlx.models.glm5_next import Model as GLMModel
from ds4mlx.models.kda import KDA
from ds4mlx.models.tiles import uncompiled

import mlx.core as mx
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
# The native operations that take a real-row count, and its position among their arguments.
ROW_COUNTED = {"rows_linear": 2, "blocks_linear": 3}


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
            self.products[(name, args[0].shape[0], int(args[ROW_COUNTED[name]]))] += 1
            return operation(*args)

        return counted


@pytest.mark.parametrize("asset", ["ds4-tiny.gguf", "glm-tiny.gguf"])
def test_one_token_steps_compute_one_row_of_each_product(asset, monkeypatch):
    if native_ops() is None:
        pytest.skip("the native CPU operations are not built here")
    model = ds4mlx.load_model(ASSETS / asset, weights_dtype="f32")
    counting = _CountingOps(native_ops())
    for module in (dispatch, matmul, mhc_ops, moe_ops, sequence_ops):
        monkeypatch.setattr(module, "native_ops", lambda: counting)
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


def test_glm_tiles_compiled_give_the_bits_of_their_python():
    """Past the first steps (a KDA layer compiles its whole tile once its cache keeps the
    shapes of every later step; MLA layers around their attention), decode and a 3-row verify
    give bit-identical logits compiled and uncompiled."""
    network = ds4mlx.load_model(ASSETS / "glm-tiny.gguf", weights_dtype="f32").network
    assert isinstance(network, GLMModel)
    prompt = mx.array([5, 9, 2, 7, 11, 3], dtype=mx.int32)
    steps = [[4], [8], [1], [6], [10], [12], [2], [3, 5, 7], [9]]

    def run() -> list[mx.array]:
        state = network.new_state()
        network.forward(prompt, state)
        return [network.forward(mx.array(step, dtype=mx.int32), state) for step in steps]

    compiled = run()
    kda_blocks = [b for b in network.blocks if isinstance(b.mixer, KDA)]
    mla_blocks = [b for b in network.blocks if not isinstance(b.mixer, KDA)]
    assert kda_blocks and all(b._recurrent_tiles.compiled for b in kda_blocks)
    assert mla_blocks and all(b._before_attention.compiled for b in mla_blocks)
    with uncompiled():
        plain = run()
    for step, (a, b) in enumerate(zip(compiled, plain, strict=True)):
        assert mx.array_equal(a, b).item(), f"step {step} differs"
