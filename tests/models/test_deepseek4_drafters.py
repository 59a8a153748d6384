"""The DeepSeek-V4 drafter networks as model code (``models.deepseek4_dspark``,
``models.deepseek4_mtp``): built from weights through their constructors, never patched."""

from __future__ import annotations

from ds4mlx.kernels import inference
from ds4mlx.models import deepseek4_dspark as dspark_net
from ds4mlx.models import deepseek4_mtp as mtp_net
from ds4mlx.models.deepseek4 import Attention, Block, LayerCache, tensor_shapes
from ds4mlx.models.tiles import CompiledTiles
from ds4mlx.models.weights import ArrayWeights
from ds4mlx.speculation.support_gguf import random_arrays

import mlx.core as mx
import numpy as np
from speculation.tiny_targets import TINY

CONFIG = dspark_net.DSparkConfig(
    block_size=4,
    noise_token_id=95,
    target_layers=(0, 2),
    stage_count=2,
    markov_rank=8,
    confidence=True,
)


def _arrays(shapes, seed: int) -> dict[str, mx.array]:
    return {k: mx.array(v) for k, v in random_arrays(shapes, np.random.default_rng(seed)).items()}


def _head(seed: int) -> mtp_net.TargetHead:
    rng = np.random.default_rng(seed)
    embed, output = (rng.standard_normal((TINY.vocab_size, TINY.hidden_size)) for _ in "eo")
    return mtp_net.TargetHead(mx.array(embed, mx.float32), mx.array(output, mx.float32) / 8)


def test_window_rules():
    """ds4: every row of a block sees the same ring range; llama.cpp: row q sees k if q - k < W."""
    keys = mx.zeros((8, 4))
    ds4 = np.array(dspark_net.BlockContext(keys, 0, np.array([8]), 3, 6).mask())
    llama = np.array(dspark_net.BlockContext(keys, 0, np.array([8]), 3, 6, per_row=True).mask())
    assert [list(np.flatnonzero(row[:8])) for row in ds4] == [[2, 3, 4, 5, 6, 7]] * 3
    assert [list(np.flatnonzero(row[:8])) for row in llama] == [
        [3, 4, 5, 6, 7],
        [4, 5, 6, 7],
        [5, 6, 7],
    ]
    assert ds4[:, 8:].all() and llama[:, 8:].all()  # the whole block, non-causally


def test_a_block_runs_the_attention_it_is_given():
    """``Block(..., attention=)`` puts that module where the layer's own would be and calls it
    as the block calls its own: with one built from the same weights, the same bits."""
    args = mtp_net.stage_args(TINY, 1)
    w = ArrayWeights(tensor_shapes(args), _arrays(tensor_shapes(args), 3))
    given = Attention(args, w, 0)
    block, own = Block(args, w, 0, attention=given), Block(args, w, 0)
    assert block.attn is given and own.attn is not given
    x = mx.array(np.random.default_rng(4).standard_normal((5, TINY.hc_mult, TINY.hidden_size)))
    tokens = mx.array([1, 2, 3, 4, 5], dtype=mx.int32)
    out, _ = block(x, tokens, 0, LayerCache())
    expected, _ = own(x, tokens, 0, LayerCache())
    assert np.array_equal(np.array(out), np.array(expected))


def test_dspark_stages_attend_over_whole_blocks_from_construction():
    """Each stage is a Block built with a ``BlockAttention`` around the stage's ``Attention``;
    the compiled draft (the speculative loop's) picks what the uncompiled block rows pick."""
    stages = mtp_net.stage_args(TINY, CONFIG.stage_count)
    arrays = _arrays(dspark_net.tensor_shapes(stages, CONFIG), 5)
    net = dspark_net.net_from_arrays(TINY, CONFIG, arrays, _head(6))
    for s, stage in enumerate(net.stages):
        assert isinstance(stage.attn, dspark_net.BlockAttention)
        assert isinstance(stage.attn.inner, Attention)
        assert stage.attn.inner.wkv is arrays[f"blk.{s}.attn_kv.weight"]

    taps = mx.array(np.random.default_rng(7).standard_normal((6, 2 * TINY.hidden_size)))
    contexts = [
        dspark_net.BlockContext(keys, 0, np.array([6]), CONFIG.block_size, net.window)
        for keys in net.context_keys(taps.astype(mx.float32), 0)
    ]
    block = mx.array([[7, 95, 95, 95]], dtype=mx.int32)
    with inference():
        hidden = net.hidden(block, contexts, tile=True)
        rows = net.block_rows(hidden, net.logits(hidden), 7, 4, confidences=False)
        flat = [
            part
            for stage in net.stage_contexts(contexts)
            for part in (stage.keys, stage.mask, *stage.angles.on_device)
        ]
        draft = CompiledTiles(net.draft_tile).get(4)  # as ``DSparkDrafter.block`` runs it
        logits, picks = draft(block, mx.array([7], dtype=mx.int32), *flat)
    assert picks.tolist() == rows.picks.tolist()
    np.testing.assert_allclose(np.array(logits), np.array(rows.logits), rtol=1e-5, atol=1e-5)
