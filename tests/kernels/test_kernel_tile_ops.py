"""The native operations decode tiles are made of (kernels/cpu_ops): each equals what the model
computes without it (its twin: MLX's own operations), gives a row the same bits whatever the
other rows are, and refuses shapes it cannot take."""

from __future__ import annotations

from ds4mlx import kernels
from ds4mlx.diagnostics.graph import primitive_names
from ds4mlx.kernels import twins
from ds4mlx.models.moe import GatingFunc, gate_probs, route

import mlx.core as mx
import numpy as np
import pytest


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> mx.array:
    return mx.array(rng.standard_normal(shape).astype(np.float32) * scale)


@pytest.mark.parametrize("n", [8, 40, 70])  # whole 32-column blocks, and a tail
def test_rows_linear_is_the_product_of_the_first_rows_each_on_its_own(ops, n):
    rng = np.random.default_rng(n)
    x, w, w2 = normal(rng, 8, 48), normal(rng, 48, n), normal(rng, 48, 16)
    full, second = ops.rows_linear(x, [w, w2], 8)
    np.testing.assert_allclose(np.array(full), np.array(x @ w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(second), np.array(x @ w2), rtol=1e-5, atol=1e-5)
    for rows in range(1, 8):
        part = np.array(ops.rows_linear(x, [w], rows)[0])
        np.testing.assert_array_equal(part[:rows], np.array(full)[:rows])  # the same bits
        assert not part[rows:].any()
    for r in range(8):  # a row alone, in another position, gives its bits in the tile
        alone = ops.rows_linear(x[r : r + 1], [w], 1)[0]
        np.testing.assert_array_equal(np.array(alone)[0], np.array(full)[r])
    with pytest.raises(ValueError, match="rows_linear"):
        ops.rows_linear(x, [normal(rng, 47, n)], 8)


def test_linear_takes_the_native_product_for_frozen_matrices_of_few_rows(ops):
    rng = np.random.default_rng(1)
    w = normal(rng, 24, 40)  # [out, in] as stored in GGUF
    frozen = kernels.freeze(w)
    x = normal(rng, 8, 40)
    assert primitive_names(kernels.linear(x, frozen, 3)) == ["DS4RowsLinear"]
    np.testing.assert_allclose(
        np.array(kernels.linear(x, frozen)), np.array(x @ w.T), rtol=1e-5, atol=1e-5
    )
    # Larger inputs and plain (trainable) arrays keep MLX's matmul.
    assert "DS4RowsLinear" not in primitive_names(kernels.linear(normal(rng, 9, 40), frozen))
    assert "DS4RowsLinear" not in primitive_names(kernels.linear(x, w))
    products = kernels.linear_many(x, [frozen, kernels.freeze(normal(rng, 8, 40))], 2)
    assert primitive_names(*products) == ["DS4RowsLinear"]


def test_grouped_linear_equals_the_batched_matmul(ops):
    rng = np.random.default_rng(2)
    groups, k, n = 4, 16, 12
    w = normal(rng, groups, n, k)  # [G, out, in]
    x = normal(rng, 8, groups * k)
    want = mx.swapaxes(mx.swapaxes(x.reshape(8, groups, k), 0, 1) @ mx.swapaxes(w, -1, -2), 0, 1)
    got = kernels.grouped_linear(x, kernels.freeze(w), 5)
    np.testing.assert_allclose(
        np.array(got)[:5], np.array(want.reshape(8, -1))[:5], rtol=1e-5, atol=1e-5
    )
    assert not np.array(got)[5:].any()
    # Not frozen (or too many rows): the batched matmul itself.
    np.testing.assert_array_equal(
        np.array(kernels.grouped_linear(x, w)), np.array(want.reshape(8, -1))
    )


@pytest.mark.parametrize(("old_rows", "take", "keep"), [(0, 3, 10), (6, 2, 5), (6, 8, 30)])
def test_grow_rows_appends_and_keeps_the_last_rows(ops, old_rows, take, keep):
    rng = np.random.default_rng(old_rows + take)
    cached = [normal(rng, old_rows, 4), normal(rng, old_rows, 2)]
    new = [normal(rng, 8, 4), normal(rng, 8, 2)]
    with kernels.inference():
        got = kernels.grow_rows(cached, new, take, keep)
        assert primitive_names(*got) == ["DS4AppendRows"]
    want = kernels.grow_rows(cached, new, take, keep)  # outside inference: the MLX twin
    for g, w, c, f in zip(got, want, cached, new, strict=True):
        full = np.concatenate([np.array(c), np.array(f)[:take]])
        np.testing.assert_array_equal(np.array(g), full[max(0, len(full) - keep) :])
        np.testing.assert_array_equal(np.array(g), np.array(w))


def test_rms_norm_equals_mlx_fast_and_its_gradient(ops):
    rng = np.random.default_rng(3)
    x, w = normal(rng, 5, 3, 64), normal(rng, 64)
    np.testing.assert_allclose(
        np.array(ops.rms_norm(x, w, 1e-6)),
        np.array(mx.fast.rms_norm(x, w, 1e-6)),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        np.array(ops.rms_norm(x, None, 1e-6)),
        np.array(mx.fast.rms_norm(x, None, 1e-6)),
        rtol=1e-5,
        atol=1e-6,
    )
    grads = mx.grad(lambda a, b: (ops.rms_norm(a, b, 1e-6) ** 2).sum(), argnums=(0, 1))(x, w)
    want = mx.grad(lambda a, b: (mx.fast.rms_norm(a, b, 1e-6) ** 2).sum(), argnums=(0, 1))(x, w)
    for g, v in zip(grads, want, strict=True):
        np.testing.assert_allclose(np.array(g), np.array(v), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="rms_norm"):
        ops.rms_norm(x, normal(rng, 63), 1e-6)


def moe_twin(
    logits,
    x,
    gate,
    up,
    down,
    shared_gate,
    shared_up,
    shared_down,
    bias,
    hashed,
    rows,
    n_used,
    func,
    normalize,
    scale,
    limit,
    shared_limit,
):
    """What models.moe computes for a tile without the fused primitive."""
    indices, weights = route(
        gate_probs(logits, func),
        n_used,
        func=func,
        bias=bias,
        selected=hashed,
        normalize=normalize,
        scale=scale,
    )
    out = twins.routed_experts(x[:rows], gate, up, down, indices[:rows], limit)
    routed = mx.sum(out * weights[:rows, :, None], axis=1)
    shared = twins.swiglu(shared_gate, shared_up, shared_limit) @ shared_down.T
    return (mx.concatenate([routed, mx.zeros((x.shape[0] - rows, x.shape[1]))]) + shared)[:rows]


@pytest.mark.parametrize("func", list(GatingFunc))
@pytest.mark.parametrize("routing", ["bias", "hashed", "plain"])
def test_moe_tile_equals_routing_experts_and_sum(ops, func, routing):
    rng = np.random.default_rng(int(func) * 7 + len(routing))
    tokens, dim, experts, ff, k = 8, 32, 6, 16, 2
    logits, x = normal(rng, tokens, experts), normal(rng, tokens, dim)
    gate, up = normal(rng, experts, ff, dim, scale=0.3), normal(rng, experts, ff, dim, scale=0.3)
    down = normal(rng, experts, dim, ff, scale=0.3)
    shared_gate, shared_up = normal(rng, tokens, 24), normal(rng, tokens, 24)
    shared_down = normal(rng, dim, 24, scale=0.3)  # [out, in] as stored in GGUF
    bias = normal(rng, experts, scale=0.1) if routing == "bias" else None
    hashed = (
        mx.array(np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int32))
        if routing == "hashed"
        else None
    )
    args = (logits, x, gate, up, down, shared_gate, shared_up)
    frozen = kernels.freeze(shared_down)
    for rows, normalize, scale, limit in ((8, True, 1.5, 0.0), (5, False, 1.0, 1.0)):
        with kernels.inference():
            got = kernels.moe_tile(
                *args,
                frozen,
                bias,
                hashed,
                rows,
                n_used=k,
                func=int(func),
                normalize=normalize,
                scale=scale,
                limit=limit,
                shared_limit=limit,
            )
            assert primitive_names(got) == ["DS4MoeTile"]
        want = moe_twin(
            *args, shared_down, bias, hashed, rows, k, func, normalize, scale, limit, limit
        )
        np.testing.assert_allclose(np.array(got)[:rows], np.array(want), rtol=1e-4, atol=1e-5)
        assert not np.array(got)[rows:].any()
    with kernels.inference():  # a row's bits do not depend on how many rows are real
        one, all_rows = (
            kernels.moe_tile(
                *args,
                frozen,
                bias,
                hashed,
                rows,
                n_used=k,
                func=int(func),
                normalize=True,
                scale=1.0,
                limit=0.0,
                shared_limit=0.0,
            )
            for rows in (1, 8)
        )
    np.testing.assert_array_equal(np.array(one)[0], np.array(all_rows)[0])


def test_moe_tile_only_in_inference_and_refuses_bad_shapes(ops):
    rng = np.random.default_rng(5)
    x, logits = normal(rng, 8, 32), normal(rng, 8, 6)
    gate, down = normal(rng, 6, 16, 32), normal(rng, 6, 32, 16)
    shared, shared_down = normal(rng, 8, 16), kernels.freeze(normal(rng, 32, 16))
    call = {
        "n_used": 2,
        "func": 4,
        "normalize": True,
        "scale": 1.0,
        "limit": 0.0,
        "shared_limit": 0.0,
    }
    assert (
        kernels.moe_tile(
            logits, x, gate, gate, down, shared, shared, shared_down, None, None, 8, **call
        )
        is None
    )
    with pytest.raises(ValueError, match="moe_tile"):
        ops.moe_tile(
            logits[:, :5],
            x,
            gate,
            gate,
            down,
            shared,
            shared,
            normal(rng, 16, 32),
            None,
            None,
            8,
            2,
            4,
            True,
            1.0,
            0.0,
            0.0,
        )


def test_inference_calls_the_native_operations_without_the_gradient_wrapper(ops):
    rng = np.random.default_rng(6)
    out, residual = normal(rng, 8, 16), normal(rng, 8, 4, 16)
    post, comb = normal(rng, 8, 4), normal(rng, 8, 4, 4)
    assert "CustomTransforms" in primitive_names(kernels.hc_expand(out, residual, post, comb))
    with kernels.inference():
        assert primitive_names(kernels.hc_expand(out, residual, post, comb)) == ["DS4HcExpand"]


def test_moe_route_and_combine_give_the_fused_tiles_bits(ops):
    """Streamed experts route and sum in two steps around the store's reads: the same bits."""
    rng = np.random.default_rng(7)
    tokens, dim, experts, ff, k, rows = 8, 32, 6, 16, 2, 3
    logits, x = normal(rng, tokens, experts), normal(rng, tokens, dim)
    gate, up = normal(rng, experts, ff, dim, scale=0.3), normal(rng, experts, ff, dim, scale=0.3)
    down = normal(rng, experts, dim, ff, scale=0.3)
    shared_gate, shared_up = normal(rng, tokens, 24), normal(rng, tokens, 24)
    shared_down = kernels.freeze(normal(rng, dim, 24, scale=0.3))
    bias = normal(rng, experts, scale=0.1)
    routing = {"n_used": k, "func": 4, "normalize": True, "scale": 1.5}
    with kernels.inference():
        fused = kernels.moe_tile(
            logits,
            x,
            gate,
            up,
            down,
            shared_gate,
            shared_up,
            shared_down,
            bias,
            None,
            rows,
            **routing,
            limit=1.0,
            shared_limit=0.5,
        )
        indices, weights = kernels.moe_route(logits, bias, None, rows, **routing)
        outputs = ops.routed_experts(x[:rows], gate, up, down, indices[:rows], 1.0, False)
        parts = kernels.moe_combine(outputs, weights, shared_gate, shared_up, shared_down, 0.5)
    np.testing.assert_array_equal(np.array(parts), np.array(fused))
    want_indices, want_weights = route(
        gate_probs(logits, GatingFunc.SQRT_SOFTPLUS),
        k,
        func=GatingFunc.SQRT_SOFTPLUS,
        bias=bias,
        normalize=True,
        scale=1.5,
    )
    np.testing.assert_array_equal(
        np.sort(np.array(indices)[:rows], axis=1), np.sort(np.array(want_indices)[:rows], axis=1)
    )
    np.testing.assert_allclose(
        np.sort(np.array(weights)[:rows], axis=1),
        np.sort(np.array(want_weights)[:rows], axis=1),
        rtol=1e-6,
    )


def _pool_twin(kv: mx.array, score: mx.array, lo: int, n: int, r: int, dim: int, overlap: bool):
    """Compressor.pool's MLX pooling (``Compressor._pooled``), written out for the test."""
    rows = []
    for i in range(n):
        base = lo + i * r
        if overlap:
            prev = [base - r + j for j in range(r)]
            values = [kv[p, :dim] if p >= 0 else mx.zeros((dim,)) for p in prev]
            scores = [score[p, :dim] if p >= 0 else mx.full((dim,), -mx.inf) for p in prev]
            values += [kv[base + j, dim:] for j in range(r)]
            scores += [score[base + j, dim:] for j in range(r)]
        else:
            values = [kv[base + j] for j in range(r)]
            scores = [score[base + j] for j in range(r)]
        weights = mx.softmax(mx.stack(scores), axis=0, precise=True)
        rows.append(mx.sum(mx.stack(values) * weights, axis=0))
    return mx.stack(rows)


@pytest.mark.parametrize(
    ("lo", "n", "overlap"), [(0, 2, True), (4, 1, True), (5, 2, True), (0, 3, False), (2, 1, False)]
)
def test_pool_blocks_is_the_compressors_softmax_pooling(ops, lo, n, overlap):
    rng = np.random.default_rng(lo * 10 + n)
    r, dim = 4, 8
    width = 2 * dim if overlap else dim
    kv, score = normal(rng, 16, width), normal(rng, 16, width, scale=3.0)
    pooled = ops.pool_blocks(kv, score, lo, n, r, dim, overlap)
    np.testing.assert_allclose(
        np.array(pooled), np.array(_pool_twin(kv, score, lo, n, r, dim, overlap)), atol=1e-6
    )
    assert kernels.pool_blocks(kv, score, lo, n, r, dim, overlap) is None  # not in inference
    with kernels.inference():
        assert primitive_names(kernels.pool_blocks(kv, score, lo, n, r, dim, overlap)) == [
            "DS4PoolBlocks"
        ]
    with pytest.raises(ValueError, match="pool_blocks"):
        ops.pool_blocks(kv, score, 14, 1, r, dim, overlap)  # rows past the end


def _chain_twin(logits, w1, w2, anchor, scale, index, first, n):
    """DSparkNet.block_rows' Markov chain without confidences, in numpy on the host."""
    logits, w1, w2 = np.array(logits), np.array(w1), np.array(w2)
    prev, rows, picks = anchor, [], []
    for i in range(n):
        row = logits[i].copy()
        if i < first:  # the bonus slot: unbiased, and the chain still starts at the anchor
            rows.append(row)
            picks.append(int(np.argmax(row)))
            continue
        bias = np.array(kernels.linear(mx.array(w1[prev][None]), kernels.freeze(mx.array(w2))))
        bias = bias[0] * (1.0 if scale is None else np.float32(scale))
        if index is not None:
            bias = np.append(bias, np.float32(0))[index]
        row = row + bias
        prev = int(np.argmax(row))
        rows.append(row)
        picks.append(prev)
    return np.stack(rows), np.array(picks)


@pytest.mark.parametrize(("first", "reduced", "scaled"), [(0, False, False), (1, True, True)])
def test_markov_chain_equals_the_chained_rows(ops, first, reduced, scaled):
    rng = np.random.default_rng(first)
    vocab, rank, n = 50, 6, 5
    draft_vocab = 30 if reduced else vocab
    logits = normal(rng, 6, vocab)
    w1, w2 = normal(rng, vocab, rank), normal(rng, draft_vocab, rank)  # [out, in] as stored
    index = None
    if reduced:  # target token -> its draft row, or draft_vocab (no row)
        index = np.full(vocab, draft_vocab, np.int32)
        index[rng.permutation(vocab)[:draft_vocab]] = np.arange(draft_vocab)
    scale = mx.array([0.7]) if scaled else None
    w1_frozen, w2_frozen = kernels.freeze(w1), kernels.freeze(w2)
    with kernels.inference():
        rows, picks = kernels.markov_chain(
            logits,
            w1_frozen,
            w2_frozen,
            mx.array([3], dtype=mx.int32),
            scale,
            None if index is None else mx.array(index),
            first,
            n,
        )
    want_rows, want_picks = _chain_twin(
        logits, w1, w2, 3, None if scale is None else 0.7, index, first, n
    )
    np.testing.assert_array_equal(np.array(picks), want_picks)
    np.testing.assert_allclose(np.array(rows), want_rows, rtol=1e-6, atol=1e-6)
    assert (
        kernels.markov_chain(logits, w1_frozen, w2_frozen, mx.array([3]), None, None, 0, n) is None
    )
    with pytest.raises(ValueError, match="markov_chain"):
        ops.markov_chain(logits, w1.T, w2.T, mx.array([3]), None, None, 0, 7)  # n > rows


def _coded(values: np.ndarray, qtype) -> tuple[mx.array, kernels.RowCodes]:
    """``values`` [..., out, in] quantized to ``qtype``: its float32 dequantization and codes."""
    from ds4mlx.gguf import quants
    from ds4mlx.gguf.quantize import quantize

    raw = quantize(values, qtype)
    dense = quants.dequantize(raw, qtype, values.shape)
    found = quants.row_codes(raw.reshape(-1), qtype, dense)
    assert found is not None, f"{qtype.name} has no exact codes"
    return mx.array(dense), kernels.RowCodes(*(mx.array(part) for part in found))


CODED_TYPES = ["Q8_0", "Q4_0", "Q4_K", "Q2_K", "Q6_K"]


@pytest.mark.parametrize("qtype_name", CODED_TYPES)
def test_coded_matrices_give_the_float32_products_bit_for_bit(ops, qtype_name):
    from gguf import GGMLQuantizationType

    qtype = GGMLQuantizationType[qtype_name]
    rng = np.random.default_rng(7)
    dense, codes = _coded(rng.standard_normal((192, 256)).astype(np.float32), qtype)
    frozen = kernels.freeze(dense)
    kernels.attach_codes(dense, codes)  # attached after freezing: the view has none
    assert kernels.matmul.codes_of(frozen) is None
    frozen = kernels.freeze(dense)  # now the codes follow, in panels
    panels = kernels.matmul.codes_of(frozen)
    assert panels is not None and panels.panels and panels.codes.dtype == mx.int8
    x = normal(rng, 8, 256)
    stored = kernels.matmul.frozen(frozen)
    for rows in (1, 2, 3, 5, 6, 8):
        want = ops.rows_linear(x, [stored], rows)[0]
        got = ops.rows_linear(x, [panels.operand], rows)[0]
        np.testing.assert_array_equal(np.array(got), np.array(want))
    assert primitive_names(kernels.linear(x, frozen, 2)) == ["DS4RowsLinear"]
    np.testing.assert_array_equal(
        np.array(kernels.linear(x, frozen, 2)), np.array(ops.rows_linear(x, [stored], 2)[0])
    )
    with pytest.raises(ValueError, match="rows_linear"):
        ops.rows_linear(x, [[panels.codes, panels.scale[:, :-1], panels.bias[:, :-1]]], 2)


@pytest.mark.parametrize("out", [64 * 3 + 15, 64 + 1, 63])
def test_a_width_short_of_whole_panels_is_padded_and_gives_the_float32_bits(ops, out):
    """A vocabulary's head (glm-tiny's 6159 rows) is not a whole number of 64-column panels:
    its codes are padded with zero columns, the products' columns stop at its width, and each
    is the float32 matrix's to the bit, also beside a whole-panel matrix in one call."""
    from gguf import GGMLQuantizationType

    rng = np.random.default_rng(3)
    values = rng.standard_normal((out, 256)).astype(np.float32)
    dense, codes = _coded(values, GGMLQuantizationType.Q6_K)
    kernels.attach_codes(dense, codes)
    frozen = kernels.freeze(dense)
    panels = kernels.matmul.codes_of(frozen)
    assert panels.codes.shape == (-(-out // 64), 256, 64)
    assert not np.array(panels.codes)[-1, :, out % 64 or 64 :].any()  # the padding is zeros
    stored = kernels.matmul.frozen(frozen)
    whole = kernels.freeze(normal(rng, 128, 256))
    x = normal(rng, 8, 256)
    for rows in (1, 3, 6, 8):
        got, beside = kernels.linear_many(x, [frozen, whole], rows)
        assert got.shape == (8, out)
        np.testing.assert_array_equal(
            np.array(got), np.array(ops.rows_linear(x, [stored], rows)[0])
        )
        np.testing.assert_array_equal(
            np.array(beside), np.array(ops.rows_linear(x, [kernels.matmul.frozen(whole)], rows)[0])
        )
    assert primitive_names(kernels.linear(x, frozen, 1)) == ["DS4RowsLinear"]
    # Without the width a call reads the padded panels whole; a width beyond them is refused.
    assert ops.rows_linear(x, [panels.operand], 1)[0].shape == (8, panels.codes.shape[0] * 64)
    with pytest.raises(ValueError, match="width"):
        ops.rows_linear(x, [panels.operand], 1, [panels.codes.shape[0] * 64 + 1])
    with pytest.raises(ValueError, match="width"):
        ops.rows_linear(x, [stored], 1, [out - 1])  # float32 values hold their width exactly


@pytest.mark.parametrize("qtype_name", ["Q8_0", "Q2_K", "Q4_K"])
def test_moe_tile_on_coded_experts_gives_the_float32_bits(ops, qtype_name):
    from gguf import GGMLQuantizationType

    qtype = GGMLQuantizationType[qtype_name]
    rng = np.random.default_rng(11)
    experts, ff, dim, shared_ff, tokens = 4, 256, 256, 256, 6
    gate, gate_codes = _coded(rng.standard_normal((experts, ff, dim)).astype(np.float32), qtype)
    up, up_codes = _coded(rng.standard_normal((experts, ff, dim)).astype(np.float32), qtype)
    down, down_codes = _coded(rng.standard_normal((experts, dim, ff)).astype(np.float32), qtype)
    shared, shared_codes = _coded(rng.standard_normal((dim, shared_ff)).astype(np.float32), qtype)
    kernels.attach_codes(shared, shared_codes)
    shared_frozen = kernels.freeze(shared)
    x, logits = normal(rng, tokens, dim), normal(rng, tokens, experts)
    sg, su = normal(rng, tokens, shared_ff), normal(rng, tokens, shared_ff)
    args = dict(rows=5, n_used=2, func=4, normalize=True, scale=1.5, limit=10.0, shared_limit=10.0)
    plain = ops.moe_tile(
        logits, x, gate, up, down, sg, su, kernels.matmul.frozen(shared_frozen), None, None, **args
    )
    coded = ops.moe_tile(
        logits,
        x,
        gate_codes.operand,
        up_codes.operand,
        down_codes.operand,
        sg,
        su,
        kernels.matmul.codes_of(shared_frozen).operand,
        None,
        None,
        **args,
    )
    np.testing.assert_array_equal(np.array(coded), np.array(plain))


def test_float16_values_give_the_float32_products_bit_for_bit(ops):
    """A GGUF F16 matrix keeps its float16 values for the row kernels (half float32's bytes);
    exact, so the products are the float32 matrix's to the bit, dense and as experts."""
    rng = np.random.default_rng(5)
    halves = rng.standard_normal((128, 96)).astype(np.float16)
    halves[0, :4] = [np.float16(6e-8), np.float16(-3e-5), np.float16(0.0), np.float16(-0.0)]
    dense = mx.array(halves.astype(np.float32))
    kernels.attach_codes(dense, kernels.RowCodes(mx.array(halves)))
    frozen = kernels.freeze(dense)
    panels = kernels.matmul.codes_of(frozen)
    assert panels is not None and panels.panels and panels.codes.dtype == mx.float16
    x = normal(rng, 8, 96)
    stored = kernels.matmul.frozen(frozen)
    for rows in (1, 4, 6, 8):
        np.testing.assert_array_equal(
            np.array(ops.rows_linear(x, [panels.operand], rows)[0]),
            np.array(ops.rows_linear(x, [stored], rows)[0]),
        )
    experts = rng.standard_normal((3, 64, 96)).astype(np.float16)
    down = rng.standard_normal((3, 96, 64)).astype(np.float16)
    logits, sg, su = normal(rng, 5, 3), normal(rng, 5, 96), normal(rng, 5, 96)
    shared = kernels.freeze(normal(rng, 96, 96))
    args = dict(rows=4, n_used=2, func=1, normalize=False, scale=1.0, limit=0.0, shared_limit=0.0)
    x5 = normal(rng, 5, 96)
    as_f32 = [mx.array(e.astype(np.float32)) for e in (experts, experts, down)]
    plain = ops.moe_tile(
        logits, x5, *as_f32, sg, su, kernels.matmul.frozen(shared), None, None, **args
    )
    halved = [[mx.array(e)] for e in (experts, experts, down)]
    coded = ops.moe_tile(
        logits, x5, *halved, sg, su, kernels.matmul.frozen(shared), None, None, **args
    )
    np.testing.assert_array_equal(np.array(coded), np.array(plain))
