"""The Metal kernels of a GPU decode step's mHC, RoPE and MoE routing (metal/hc_site.metal,
hc_expand.metal, rope.metal, moe_route.metal, moe_combine.metal) against their twins: through
the CPU emulator here, the real kernels on a Mac; and the dispatch that sends a GPU step to them
(``kernels.hc_site``, ``hc_expand``, ``rotary``, ``moe_route``, ``moe_combine``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ds4mlx import kernels
from ds4mlx.diagnostics.metal_graph import metal_configuration
from ds4mlx.kernels import metal, metal_fused, twins
from ds4mlx.models.compressed_attention import Compressor
from ds4mlx.models.moe import GatingFunc, gate_probs, route
from ds4mlx.models.rope import RoPE, RopeConfig

import mlx.core as mx
import numpy as np
import pytest
from emulator import build_emulator, run

NO_METAL = "Metal is not available (needs macOS on Apple silicon with MLX's Metal backend)"
# DeepSeek-V4-Flash's mHC: 4 streams of its 4096-wide hidden state, 20 Sinkhorn rounds; its
# 256 experts, 6 a token; its 512-wide heads, the last 64 channels rotated.
HC, ITERS, EPS, D = 4, 20, 1e-6, 4096
MIX = (2 + HC) * HC
EXPERTS, TOP_K = 256, 6
HEAD_DIM, ROPE_DIMS = 512, 64
TOKENS = (1, 3, 8)  # a decode row, a ragged tile, a whole tile


def site_case(tokens: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((tokens, HC, D)).astype(np.float32),
        "mixes": (rng.standard_normal((tokens, MIX)) * 2).astype(np.float32),
        "scale": rng.uniform(0.5, 2.0, 3).astype(np.float32),
        "base": rng.standard_normal(MIX).astype(np.float32),
    }


def expand_case(tokens: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "out": rng.standard_normal((tokens, D)).astype(np.float32),
        "residual": rng.standard_normal((tokens, HC, D)).astype(np.float32),
        "post": rng.uniform(0, 2, (tokens, HC)).astype(np.float32),
        "comb": rng.uniform(0, 1, (tokens, HC, HC)).astype(np.float32),
    }


def site_twin(case: dict[str, np.ndarray]) -> list[np.ndarray]:
    args = (mx.array(case[name]) for name in ("x", "mixes", "scale", "base"))
    return [np.array(a) for a in twins.hc_site(*args, HC, ITERS, EPS)]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    """The mHC and MoE kernels at DS4-Flash's hidden width."""
    return build_emulator(
        tmp_path_factory.mktemp("metal-step"),
        DS4_HC=HC,
        DS4_ITERS=ITERS,
        DS4_D=D,
        DS4_E=EXPERTS,
        DS4_TOPK=TOP_K,
    )


@pytest.fixture(scope="module")
def rope_emulator(tmp_path_factory) -> Path:
    """RoPE, pooling and the indexer at DS4-Flash's head and indexer widths."""
    return build_emulator(
        tmp_path_factory.mktemp("metal-heads"),
        DS4_D=HEAD_DIM,
        DS4_ROPE_N=ROPE_DIMS,
        DS4_ROPE_OFFSET=HEAD_DIM - ROPE_DIMS,
        DS4_POOL_R=POOL_RATIO,
        DS4_IDX_H=INDEX_HEADS,
        DS4_IDX_D=INDEX_DIM,
        DS4_IDX_TOPK=INDEX_TOP_K,
    )


@pytest.mark.parametrize("tokens", TOKENS)
def test_emulated_hc_site_kernel_matches_twin(emulator: Path, tmp_path, tokens):
    case = site_case(tokens, seed=tokens)
    payload = np.array([tokens], np.int32).tobytes() + np.array([EPS], np.float32).tobytes()
    payload += b"".join(case[name].tobytes() for name in ("scale", "base", "x", "mixes"))
    got = run(emulator, ["hc_site"], [payload], tmp_path)[0]
    y, post, comb = np.split(got, [tokens * D, tokens * (D + HC)])
    expected = site_twin(case)
    np.testing.assert_allclose(y.reshape(tokens, D), expected[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(post.reshape(tokens, HC), expected[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(comb.reshape(tokens, HC, HC), expected[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tokens", TOKENS)
def test_emulated_hc_expand_kernel_matches_twin(emulator: Path, tmp_path, tokens):
    case = expand_case(tokens, seed=10 + tokens)
    payload = np.array([tokens], np.int32).tobytes()
    payload += b"".join(case[name].tobytes() for name in ("out", "residual", "post", "comb"))
    got = run(emulator, ["hc_expand"], [payload], tmp_path)[0].reshape(tokens, HC, D)
    expected = twins.hc_expand(*(mx.array(case[n]) for n in ("out", "residual", "post", "comb")))
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("heads", [5, 0], ids=["heads", "keys"])  # x [T, H, D] or [T, D]
def test_emulated_rope_kernel_matches_twin(
    rope_emulator: Path, tmp_path, interleaved, inverse, heads
):
    tokens = 3
    rope = RoPE(RopeConfig(ROPE_DIMS, 10000.0, interleaved=interleaved))
    angles = rope.angles(np.arange(70_000, 70_000 + tokens))  # far positions: host angles
    shape = (tokens, heads, HEAD_DIM) if heads else (tokens, HEAD_DIM)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    payload = np.array([tokens, heads, interleaved, inverse], np.int32).tobytes()
    payload += x.tobytes() + angles.cos.tobytes() + angles.sin.tobytes()
    got = run(rope_emulator, ["rope"], [payload], tmp_path)[0].reshape(x.shape)
    expected = rope.twin(mx.array(x), angles, HEAD_DIM - ROPE_DIMS, inverse)
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[..., : HEAD_DIM - ROPE_DIMS], x[..., : HEAD_DIM - ROPE_DIMS])


def embedding_case(bits: int, seed: int) -> tuple[kernels.QuantizedWeight, np.ndarray]:
    """An embedding of 50 rows of DS4-Flash's width in MLX's affine layout, and a ragged
    tile's tokens (repeated, the first and the last row)."""
    rng = np.random.default_rng(seed)
    table = mx.array(rng.standard_normal((50, D)).astype(np.float32))
    packed, scales, biases = mx.quantize(table, group_size=EMBED_GROUP, bits=bits)
    weight = kernels.QuantizedWeight(packed, scales, biases, bits, EMBED_GROUP, "affine")
    return weight, np.array([7, 0, 49, 7, 3], np.int32)


EMBED_GROUP = 32  # MLX's layout of DS4-Flash's Q8_0 embedding: 32-value groups


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_emulated_embed_streams_kernel_matches_twin(emulator: Path, tmp_path, bits):
    """A tile's token rows decoded into each of its hc streams, flat, as take_rows decodes
    them."""
    weight, tokens = embedding_case(bits, bits)
    payload = np.array([len(tokens), 50, bits], np.int32).tobytes() + tokens.tobytes()
    payload += b"".join(
        np.array(a).tobytes() for a in (weight.packed, weight.scales, weight.biases)
    )
    got = run(emulator, ["embed_streams"], [payload], tmp_path)[0].reshape(len(tokens), HC, D)
    rows = np.array(kernels.take_rows(weight, mx.array(tokens)))
    np.testing.assert_allclose(got, np.repeat(rows[:, None], HC, axis=1), rtol=1e-6, atol=1e-6)


def test_gpu_decode_tile_embeds_in_one_launch():
    """In inference on the GPU an affine embedding's rows are one launch making the flat
    streams; other layouts and the prefill (not inference) use take_rows."""
    weight, tokens = embedding_case(8, 0)
    mxfp4 = kernels.QuantizedWeight(weight.packed, weight.scales, None, 8, 32, "mxfp4")
    with metal_configuration() as calls:
        with kernels.inference():
            streams = kernels.embed_streams(weight, mx.array(tokens), HC)
            assert kernels.embed_streams(mxfp4, mx.array(tokens), HC) is None
        assert kernels.embed_streams(weight, mx.array(tokens), HC) is None
    assert [c.name for c in calls] == ["ds4_embed_streams"]
    assert calls[0].template == (
        ("S_", mx.float32),
        ("BITS", 8),
        ("GROUP", EMBED_GROUP),
        ("D", D),
        ("HC", HC),
    )
    assert calls[0].grid == (D, len(tokens), 1)
    assert streams.shape == (len(tokens), HC * D) and streams.dtype == mx.float32


ROUTINGS = [
    (GatingFunc.SQRT_SOFTPLUS, True, False, True, 1.5),  # DS4's routed layers
    (GatingFunc.SQRT_SOFTPLUS, False, True, True, 1.5),  # DS4's hash-routed layers
    (GatingFunc.SOFTMAX, False, False, False, 1.0),
    (GatingFunc.SIGMOID, True, False, True, 2.5),
    (GatingFunc.SOFTMAX_WEIGHT, False, False, False, 0.0),
]


@pytest.mark.parametrize("func, has_bias, hashed, normalize, scale", ROUTINGS)
def test_emulated_moe_route_kernel_matches_twin(
    emulator: Path, tmp_path, func, has_bias, hashed, normalize, scale
):
    tokens = 7  # the real rows of a tile of 8: the routing's rows
    rng = np.random.default_rng(int(func) * 10 + hashed)
    logits = (rng.standard_normal((tokens + 1, EXPERTS)) * 4).astype(np.float32)
    logits[0, :10] = 30.0  # above softplus's threshold (and ties: the lower expert first)
    bias = rng.standard_normal(EXPERTS).astype(np.float32) * 0.1
    fixed = np.stack([rng.permutation(EXPERTS)[:TOP_K] for _ in range(tokens + 1)])
    fixed = fixed.astype(np.int32)
    flags = [tokens + 1, tokens, func, has_bias, hashed, normalize]
    payload = np.array(flags, np.int32).tobytes()
    payload += np.array([scale], np.float32).tobytes() + logits.tobytes() + bias.tobytes()
    payload += fixed.tobytes()
    got = run(emulator, ["moe_route"], [payload], tmp_path)[0]
    assert got.size == 2 * tokens * TOP_K  # [R, k] each: the padding row is not routed
    indices = got[: tokens * TOP_K].view(np.int32).reshape(tokens, TOP_K)
    weights = got[tokens * TOP_K :].reshape(tokens, TOP_K)
    fixed = fixed[:tokens]
    expected = route(
        gate_probs(mx.array(logits[:tokens]), func),
        TOP_K,
        func=func,
        bias=mx.array(bias) if has_bias else None,
        selected=mx.array(fixed) if hashed else None,
        normalize=normalize,
        scale=scale,
    )
    if hashed:
        np.testing.assert_array_equal(indices, fixed)
    else:  # the same experts (the twin's sort may order ties either way)
        np.testing.assert_array_equal(np.sort(indices[1:]), np.sort(np.array(expected[0])[1:]))
        np.testing.assert_array_equal(indices[0], np.arange(TOP_K) if not has_bias else indices[0])
    order = np.argsort(indices, axis=1)
    expected_order = np.argsort(np.array(expected[0]), axis=1)
    np.testing.assert_allclose(
        np.take_along_axis(weights, order, 1),
        np.take_along_axis(np.array(expected[1]), expected_order, 1),
        rtol=1e-5,
        atol=1e-6,
    )


def test_gpu_routing_covers_the_real_rows_only():
    """A tile's routing on the GPU: one launch for its real rows, whose indices [R, k] the
    expert launches and the sum read as they are."""
    logits = mx.array(np.random.default_rng(5).standard_normal((8, EXPERTS)).astype(np.float32))
    routing = {"n_used": TOP_K, "func": int(GatingFunc.SQRT_SOFTPLUS), "normalize": True}
    with metal_configuration() as calls, kernels.inference():
        indices, weights = kernels.moe_route(logits, None, None, 3, **routing, scale=1.5)
    (call,) = calls
    assert call.name == "ds4_moe_route" and call.grid == (3, 1, 1)
    assert call.inputs[4] == ((1,), mx.int32)
    assert indices.shape == weights.shape == (3, TOP_K)


@pytest.mark.parametrize("real", [1, 3, 8])
def test_emulated_moe_combine_kernel_matches_twin(emulator: Path, tmp_path, real):
    tokens = 8
    rng = np.random.default_rng(real)
    expert_out = rng.standard_normal((real, TOP_K, D)).astype(np.float32)
    weights = rng.uniform(0, 1, (tokens, TOP_K)).astype(np.float32)
    shared = rng.standard_normal((tokens, D)).astype(np.float32)
    payload = np.array([tokens, real], np.int32).tobytes()
    payload += expert_out.tobytes() + weights.tobytes() + shared.tobytes()
    got = run(emulator, ["moe_combine"], [payload], tmp_path)[0].reshape(tokens, D)
    routed = np.array(mx.sum(mx.array(expert_out) * mx.array(weights[:real])[..., None], axis=1))
    expected = np.concatenate([routed, np.zeros((tokens - real, D), np.float32)]) + shared
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


POOL_RATIO = 4  # CSA


@pytest.mark.parametrize(
    "overlap, b0, n", [(True, 0, 3), (True, 5, 2), (False, 0, 1), (False, 7, 3)]
)
def test_emulated_pool_blocks_kernel_matches_twin(rope_emulator: Path, tmp_path, overlap, b0, n):
    """Block 0 of a CSA compressor pools against a missing previous block (-inf scores)."""
    r, dim = POOL_RATIO, HEAD_DIM
    lo = r if overlap and b0 else 0  # CSA keeps the block before the first completed one
    rows = lo + n * r + 2  # and rows of a block not yet completed
    rng = np.random.default_rng(b0 + n)
    width = (2 if overlap else 1) * dim
    kv = rng.standard_normal((rows, width)).astype(np.float32)
    score = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
    payload = np.array([rows, n, lo, overlap], np.int32).tobytes() + kv.tobytes() + score.tobytes()
    got = run(rope_emulator, ["pool_blocks"], [payload], tmp_path)[0].reshape(n, dim)
    twin = SimpleNamespace(ratio=r, dim=dim, overlap=overlap)
    expected = Compressor._pooled(twin, mx.array(kv), mx.array(score), lo, n, b0)
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-5, atol=1e-5)


# (cached rows, fresh rows, take, keep): DS4-Flash's window (127 + 24 kept rows) grown by a
# decode step, by a ragged verify tile, and a compressor's pending rows that all stay.
GROW_CASES = [(151, 8, 1, 151), (151, 8, 6, 151), (3, 8, 5, 10), (140, 8, 8, 151)]


def _grow_case(n, f, seed):
    rng = np.random.default_rng(seed)
    cached = rng.standard_normal((n, HEAD_DIM)).astype(np.float32)
    return cached, rng.standard_normal((f, HEAD_DIM)).astype(np.float32)


def _grow_twin(cached, fresh, take, keep):
    with kernels.inference():  # not on the GPU here: the MLX slices and concatenation
        return kernels.grow_rows([mx.array(cached)], [mx.array(fresh)], take, keep)[0]


@pytest.mark.parametrize("n, f, take, keep", GROW_CASES)
def test_emulated_grow_rows_kernel_matches_twin(rope_emulator: Path, tmp_path, n, f, take, keep):
    cached, fresh = _grow_case(n, f, n + take)
    rows = min(n + take, keep)
    payload = np.array([n, f, take, rows], np.int32).tobytes() + cached.tobytes() + fresh.tobytes()
    got = run(rope_emulator, ["grow_rows"], [payload], tmp_path)[0].reshape(rows, HEAD_DIM)
    np.testing.assert_array_equal(got, np.array(_grow_twin(cached, fresh, take, keep)))


@pytest.mark.parametrize("added", [False, True], ids=["pairs", "scored"])
@pytest.mark.parametrize("n, f, take, keep", GROW_CASES)
def test_emulated_grow_row_pairs_kernel_matches_twin(
    rope_emulator: Path, tmp_path, n, f, take, keep, added
):
    """Both of a compressor's pending rows (kv and scores) in one launch, each as its own
    grow_rows; scored: the fresh scores are gate products plus a position embedding, summed in
    the launch (``kernels.grow_scored_rows``) as MLX sums them."""
    (cached, fresh), (cached2, fresh2) = _grow_case(n, f, n + take), _grow_case(n, f, 100 + n)
    embedding = _grow_case(0, f, 200 + n)[1] if added else np.zeros(1, np.float32)
    rows = min(n + take, keep)
    payload = np.array([n, f, take, rows, added], np.int32).tobytes()
    payload += b"".join(a.tobytes() for a in (cached, fresh, cached2, fresh2, embedding))
    got = run(rope_emulator, ["grow_row_pairs"], [payload], tmp_path)[0]
    first, second = got.reshape(2, rows, HEAD_DIM)
    np.testing.assert_array_equal(first, np.array(_grow_twin(cached, fresh, take, keep)))
    scores = np.array(mx.array(fresh2) + mx.array(embedding)) if added else fresh2
    np.testing.assert_array_equal(second, np.array(_grow_twin(cached2, scores, take, keep)))


def test_gpu_cache_growth_is_one_launch_for_a_pair_of_one_shape():
    cached, fresh = _grow_case(20, 8, 0)
    with metal_configuration() as calls, kernels.inference():
        grown = kernels.grow_rows([mx.array(cached)] * 2, [mx.array(fresh)] * 2, 3, 16)
        one = kernels.grow_rows([mx.array(cached)], [mx.array(fresh)], 3, 16)
        mixed = kernels.grow_rows(
            [mx.array(cached), mx.array(cached[1:])], [mx.array(fresh)] * 2, 3, 16
        )
        first = kernels.grow_rows([mx.array(cached[:0])], [mx.array(fresh)], 3, 16)
    # Two caches of one shape: one launch; one cache, or two of different shapes: one a
    # cache; an empty cache: the MLX ops.
    assert [c.name for c in calls] == ["ds4_grow_row_pairs"] + ["ds4_grow_rows"] * 3
    assert calls[0].template == (("T_", mx.float32), ("W", HEAD_DIM), ("ADDED", 0))
    assert calls[0].grid == (HEAD_DIM, 16, 2)
    assert calls[0].outputs == (((16, HEAD_DIM), mx.float32),) * 2
    assert calls[1].grid == (HEAD_DIM, 16, 1) and calls[1].outputs == (
        ((16, HEAD_DIM), mx.float32),
    )
    assert [a.shape for a in (*grown, *one, *mixed, *first)] == [(16, HEAD_DIM)] * 5 + [
        (3, HEAD_DIM)
    ]


def test_gpu_compressor_scores_are_summed_inside_the_growth():
    """A compressor's pending rows grown by gate products and their position embedding: one
    launch on the GPU (a non-empty cache), the sum then the growth elsewhere, same values."""
    cached, fresh = _grow_case(20, 8, 1)
    kv, gate, embedding = (mx.array(_grow_case(0, 8, seed)[1]) for seed in (2, 3, 4))
    pair = [mx.array(cached), mx.array(cached[::-1].copy())]
    with metal_configuration() as calls, kernels.inference():
        grown = kernels.grow_scored_rows(pair, kv, gate, embedding, 3, 16)
        first = kernels.grow_scored_rows([a[:0] for a in pair], kv, gate, embedding, 3, 16)
    assert [c.name for c in calls] == ["ds4_grow_row_pairs"]
    assert calls[0].template == (("T_", mx.float32), ("W", HEAD_DIM), ("ADDED", 1))
    assert calls[0].inputs[4] == ((8, HEAD_DIM), mx.float32)
    assert [a.shape for a in (*grown, *first)] == [(16, HEAD_DIM)] * 2 + [(3, HEAD_DIM)] * 2
    with kernels.inference():
        kept, scores = kernels.grow_scored_rows(pair, kv, gate, embedding, 3, 16)
    expected = kernels.grow_rows(pair, [kv, gate + embedding], 3, 16)
    assert mx.array_equal(kept, expected[0]).item() and mx.array_equal(scores, expected[1]).item()


# DeepSeek-V4-Flash's indexer: 64 heads of 128 channels, each row keeping 512 blocks (scaled
# down to 16 where the emulated scores feed MLX's selection).
INDEX_HEADS, INDEX_DIM, INDEX_TOP_K = 64, 128, 512


# The indexer's head-weight scale at DS4-Flash's widths, 1 / sqrt(dim * heads).
INDEX_WEIGHT_SCALE = float(np.float32(1.0 / np.sqrt(INDEX_DIM * INDEX_HEADS)))


def test_emulated_indexer_top_k_matches_twin(rope_emulator: Path, tmp_path):
    """Both launches of a ragged verify tile's choice, of rows seeing fewer blocks than the
    top-k, more, and none (a padding row); some blocks tie at zero (no head scores them
    positively); the head weights scaled inside the scores' launch."""
    rng = np.random.default_rng(40)
    tokens, blocks, top_k = 8, 600, INDEX_TOP_K
    visible = np.array([9, 590, 513, 600, 512, 0, 0, 0], np.int32)
    q = rng.standard_normal((tokens, INDEX_HEADS, INDEX_DIM)).astype(np.float32)
    weights = rng.uniform(0, 1, (tokens, INDEX_HEADS)).astype(np.float32)
    keys = rng.standard_normal((blocks, INDEX_DIM)).astype(np.float32)
    keys[[3, 7, 20]] = 0.0  # every score of these blocks is 0: ties, the lower block first
    payload = np.array([tokens, blocks], np.int32).tobytes()
    payload += np.array([INDEX_WEIGHT_SCALE], np.float32).tobytes()
    payload += q.tobytes() + weights.tobytes() + keys.tobytes() + visible.tobytes()
    scores = run(rope_emulator, ["indexer_scores"], [payload], tmp_path)[0].reshape(tokens, blocks)
    assert np.all(np.isneginf(scores[1, 590:])) and np.all(np.isneginf(scores[5]))
    scaled = weights * np.float32(INDEX_WEIGHT_SCALE)
    expected_scores = np.einsum("th,thn->tn", scaled, np.maximum(q @ keys.T, 0))
    seen = np.arange(blocks) < visible[:, None]
    np.testing.assert_allclose(scores[seen], expected_scores[seen], rtol=1e-4, atol=1e-5)
    got = _emulated_top_k(rope_emulator, tmp_path, scores, visible)
    args = (mx.array(q), mx.array(scaled), mx.array(keys), mx.array(visible))
    np.testing.assert_array_equal(got, np.array(twins.indexer_top_k(*args, top_k)))


def _emulated_top_k(binary: Path, work: Path, scores: np.ndarray, visible: np.ndarray):
    """The emulated selection of INDEX_TOP_K blocks a row."""
    tokens, blocks = scores.shape
    payload = np.array([tokens, blocks], np.int32).tobytes() + scores.tobytes()
    got = run(binary, ["indexer_top_k"], [payload + visible.tobytes()], work)[0]
    return got.view(np.int32).reshape(tokens, -1)


def top_k_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores of a ragged verify tile over DS4-Flash's top-k: rows that see fewer blocks than
    it, exactly it, one more, many more, all, none; ties everywhere (few distinct values, so
    the TOPK-th score ties across the threshold), -0 beside +0, the -inf of unseen blocks,
    scores that differ in their last bits."""
    rng = np.random.default_rng(seed)
    tokens, blocks = 8, 3000
    scores = rng.integers(0, 40, (tokens, blocks)).astype(np.float32) * 0.25
    scores[1] = rng.standard_normal(blocks).astype(np.float32)  # distinct scores
    scores[2, ::2] = -0.0
    scores[2, 1::2] = 0.0  # every score equal: the lowest blocks win
    scores[3, :700] = np.float32(1e30)  # more top scores than the top-k, all equal
    # Scores one bit pattern apart: their keys differ in the last 8 bits only.
    scores[4] = (0x3F800000 + rng.integers(0, 256, blocks)).astype(np.uint32).view(np.float32)
    visible = np.array([INDEX_TOP_K - 5, INDEX_TOP_K, 2900, INDEX_TOP_K + 1, blocks, 0, 1500, 9])
    scores[np.arange(blocks) >= visible[:, None]] = -np.inf
    return scores, visible.astype(np.int32)


@pytest.mark.parametrize("seed", [0, 1])
def test_emulated_indexer_top_k_kernel_matches_twin(rope_emulator: Path, tmp_path, seed):
    """Each row's choice at DS4-Flash's top-k (512) from 3,000 blocks: the twin's blocks,
    in its order."""
    scores, visible = top_k_case(seed)
    got = _emulated_top_k(rope_emulator, tmp_path, scores, visible)
    expected = metal_fused.select_top_k(mx.array(scores), mx.array(visible), INDEX_TOP_K)
    np.testing.assert_array_equal(got, np.array(expected))
    assert (got[2] == np.arange(INDEX_TOP_K)).all() and (got[5] == -1).all()


def test_gpu_indexer_choice_is_two_launches():
    """On the GPU a tile's indexer choice is the scores' launch and the selection's, of the
    shapes the kernels declare (no MLX sort)."""
    rng = np.random.default_rng(3)
    q = mx.array(rng.standard_normal((8, 4, 32)).astype(np.float32))
    weights = mx.array(rng.uniform(0, 1, (8, 4)).astype(np.float32))
    keys = mx.array(rng.standard_normal((40, 32)).astype(np.float32))
    visible = mx.array(np.array([40, 3, 0, 0, 0, 0, 0, 0], np.int32))
    with metal_configuration() as calls, kernels.inference():
        top = kernels.indexer_top_k(q, weights, keys, visible, 16)
    assert [c.name for c in calls] == ["ds4_indexer_scores", "ds4_indexer_top_k"]
    assert calls[0].inputs[4] == ((1,), mx.float32)  # the head weights' scale
    assert calls[1].template == (("TOPK", 16), ("THREADS", 256))
    assert calls[1].grid == (256, 8, 1) and calls[1].threadgroup == (256, 1, 1)
    assert calls[1].inputs == (((8, 40), mx.float32), ((8,), mx.int32))
    assert calls[1].outputs == (((8, 16), mx.int32),)
    assert top.shape == (8, 16)


def test_gpu_steps_launch_the_fused_mhc_kernels():
    """On the GPU (the Mac configuration) an mHC site after its projection and an expansion are
    one launch each, of the sizes the kernels declare."""
    site, expand = site_case(8, 1), expand_case(8, 2)
    with metal_configuration() as calls:
        y, post, comb = kernels.hc_site(
            *(mx.array(site[n]) for n in ("x", "mixes", "scale", "base")), HC, ITERS, EPS
        )
        streams = kernels.hc_expand(*(mx.array(expand[n]) for n in expand))
    assert [c.name for c in calls] == ["ds4_hc_site", "ds4_hc_expand"]
    assert calls[0].template == (("T_", mx.float32), ("HC", HC), ("D", D), ("ITERS", ITERS))
    assert calls[0].grid == (D, 8, 1)
    assert calls[0].outputs == (
        ((8, D), mx.float32),
        ((8, HC), mx.float32),
        ((8, HC, HC), mx.float32),
    )
    assert calls[1].template == (("T_", mx.float32), ("HC", HC), ("D", D))
    assert calls[1].grid == (D, HC, 8)
    assert (y.shape, post.shape, comb.shape, streams.shape) == (
        (8, D),
        (8, HC),
        (8, HC, HC),
        (8, HC, D),
    )
    # Off the GPU the same calls are the twins' values.
    np.testing.assert_allclose(
        np.array(kernels.hc_site(*(mx.array(site[n]) for n in site), HC, ITERS, EPS)[0]),
        site_twin(site)[0],
        rtol=1e-5,
        atol=1e-5,
    )


def test_mhc_kernel_wrappers_differentiate_through_the_twins(monkeypatch):
    """The wrappers themselves, with the twins standing in for the Metal kernels: the twins'
    values and gradients."""
    monkeypatch.setattr(metal_fused, "hc_site_kernel", twins.hc_site)
    monkeypatch.setattr(metal_fused, "hc_expand_kernel", twins.hc_expand)
    metal_fused._hc_site_function.cache_clear()
    metal_fused._hc_expand_function.cache_clear()
    site = [mx.array(a) for a in site_case(3, 4).values()]
    expand = [mx.array(a) for a in expand_case(3, 5).values()]

    def site_loss(function):
        return lambda *a: sum(mx.sum(o**2) for o in function(*a, HC, ITERS, EPS))

    def expand_loss(function):
        return lambda *a: mx.sum(function(*a) ** 2)

    for got, expected, inputs in (
        (site_loss(metal_fused.hc_site), site_loss(twins.hc_site), site),
        (expand_loss(metal_fused.hc_expand), expand_loss(twins.hc_expand), expand),
    ):
        argnums = list(range(len(inputs)))
        np.testing.assert_allclose(np.array(got(*inputs)), np.array(expected(*inputs)), rtol=1e-6)
        grads = mx.grad(got, argnums)(*inputs)
        reference = mx.grad(expected, argnums)(*inputs)
        for g, e in zip(grads, reference, strict=True):
            np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-5)
    metal_fused._hc_site_function.cache_clear()
    metal_fused._hc_expand_function.cache_clear()


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("tokens", TOKENS)
def test_metal_mhc_kernels_match_twins(tokens):
    site, expand = site_case(tokens, 20 + tokens), expand_case(tokens, 30 + tokens)
    got = metal_fused.hc_site(*(mx.array(site[n]) for n in site), HC, ITERS, EPS)
    for g, e in zip(got, site_twin(site), strict=True):
        np.testing.assert_allclose(np.array(g), e, rtol=1e-5, atol=1e-5)
    args = [mx.array(expand[n]) for n in expand]
    np.testing.assert_allclose(
        np.array(metal_fused.hc_expand(*args)),
        np.array(twins.hc_expand(*args)),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("inverse", [False, True])
def test_metal_rope_matches_twin(inverse):
    rope = RoPE(RopeConfig(ROPE_DIMS, 10000.0))
    angles = rope.angles(np.arange(5, 12))
    x = mx.array(np.random.default_rng(9).standard_normal((7, 3, HEAD_DIM)).astype(np.float32))
    got = metal_fused.rope(x, *angles.on_device, HEAD_DIM - ROPE_DIMS, ROPE_DIMS, True, inverse)
    expected = rope.twin(x, angles, HEAD_DIM - ROPE_DIMS, inverse)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_metal_embed_streams_matches_twin(bits):
    weight, tokens = embedding_case(bits, 10 + bits)
    got = metal_fused.embed_streams(
        mx.array(tokens), weight.packed, weight.scales, weight.biases, bits, EMBED_GROUP, HC
    )
    rows = np.array(kernels.take_rows(weight, mx.array(tokens)))
    expected = np.repeat(rows[:, None], HC, axis=1).reshape(len(tokens), HC * D)
    np.testing.assert_allclose(np.array(got), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
def test_metal_moe_route_and_combine_match_twins():
    rng = np.random.default_rng(12)
    logits = mx.array(rng.standard_normal((8, EXPERTS)).astype(np.float32) * 4)
    bias = mx.array(rng.standard_normal(EXPERTS).astype(np.float32) * 0.1)
    func = GatingFunc.SQRT_SOFTPLUS
    indices, weights = metal_fused.moe_route(
        logits, bias, None, n_used=TOP_K, func=int(func), normalize=True, scale=1.5
    )
    expected = route(
        gate_probs(logits, func), TOP_K, func=func, bias=bias, normalize=True, scale=1.5
    )
    np.testing.assert_array_equal(np.array(indices), np.array(expected[0]))
    np.testing.assert_allclose(np.array(weights), np.array(expected[1]), rtol=1e-5)
    real = metal_fused.moe_route(
        logits, bias, None, n_used=TOP_K, func=int(func), normalize=True, scale=1.5, rows=3
    )
    np.testing.assert_array_equal(np.array(real[0]), np.array(indices)[:3])
    np.testing.assert_array_equal(np.array(real[1]), np.array(weights)[:3])
    expert_out = mx.array(rng.standard_normal((3, TOP_K, 64)).astype(np.float32))
    shared = mx.array(rng.standard_normal((8, 64)).astype(np.float32))
    got = metal_fused.moe_combine(expert_out, weights, shared)
    routed = mx.sum(expert_out * weights[:3, :, None], axis=1)
    expected_sum = mx.concatenate([routed, mx.zeros((5, 64))]) + shared
    np.testing.assert_allclose(np.array(got), np.array(expected_sum), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("overlap, b0", [(True, 0), (True, 3), (False, 2)])
def test_metal_pool_blocks_matches_twin(overlap, b0):
    r, dim, n = POOL_RATIO, HEAD_DIM, 2
    lo = r if overlap and b0 else 0
    rng = np.random.default_rng(b0)
    width = (2 if overlap else 1) * dim
    kv = mx.array(rng.standard_normal((lo + n * r + 1, width)).astype(np.float32))
    score = mx.array(rng.standard_normal((lo + n * r + 1, width)).astype(np.float32))
    got = metal_fused.pool_blocks(kv, score, lo, n, r, dim, overlap)
    twin = SimpleNamespace(ratio=r, dim=dim, overlap=overlap)
    expected = Compressor._pooled(twin, kv, score, lo, n, b0)
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
def test_metal_indexer_top_k_matches_twin():
    rng = np.random.default_rng(41)
    visible = mx.array(np.array([9, 35, 36, 37, 16, 0, 0, 0], np.int32))
    args = (
        mx.array(rng.standard_normal((8, INDEX_HEADS, INDEX_DIM)).astype(np.float32)),
        mx.array(rng.uniform(0, 1, (8, INDEX_HEADS)).astype(np.float32)),
        mx.array(rng.standard_normal((37, INDEX_DIM)).astype(np.float32)),
        visible,
    )
    got = metal_fused.indexer_top_k(*args, 16, INDEX_WEIGHT_SCALE)
    scaled = (*args[:1], args[1] * INDEX_WEIGHT_SCALE, *args[2:])
    np.testing.assert_array_equal(np.array(got), np.array(twins.indexer_top_k(*scaled, 16)))


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("seed", [0, 1])
def test_metal_indexer_top_k_kernel_matches_twin(seed):
    scores, visible = (mx.array(a) for a in top_k_case(seed))
    got = metal_fused.top_k_kernel(scores, visible, INDEX_TOP_K)
    expected = metal_fused.select_top_k(scores, visible, INDEX_TOP_K)
    np.testing.assert_array_equal(np.array(got), np.array(expected))


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("n, f, take, keep", GROW_CASES)
def test_metal_grow_rows_matches_twin(n, f, take, keep):
    cached, fresh = _grow_case(n, f, n)
    got = metal_fused.grow_rows(mx.array(cached), mx.array(fresh), take, keep)
    expected = np.concatenate([cached, fresh[:take]])[-min(n + take, keep) :]
    np.testing.assert_array_equal(np.array(got), expected)
    cached2, fresh2 = _grow_case(n, f, n + 1)
    pairs = ((mx.array(cached), mx.array(cached2)), (mx.array(fresh), mx.array(fresh2)))
    first, second = metal_fused.grow_row_pairs(*pairs, take, keep)
    np.testing.assert_array_equal(np.array(first), expected)
    expected2 = np.concatenate([cached2, fresh2[:take]])[-min(n + take, keep) :]
    np.testing.assert_array_equal(np.array(second), expected2)
    embedding = _grow_case(0, f, n + 2)[1]
    _, scored = metal_fused.grow_row_pairs(*pairs, take, keep, mx.array(embedding))
    scores = np.array(mx.array(fresh2) + mx.array(embedding))
    expected3 = np.concatenate([cached2, scores[:take]])[-min(n + take, keep) :]
    np.testing.assert_array_equal(np.array(scored), expected3)
