"""The fused mHC Sinkhorn and the sparse CSA attention kernels: twins against dense references,
row independence, the Metal sources through the CPU emulator, and on a Mac the real kernels.

The Sinkhorn twin is checked against ggml's own order in tests/models/test_model_pieces.py.
"""

from __future__ import annotations

from pathlib import Path

from ds4mlx.kernels import metal, twins
from ds4mlx.kernels.gradients import with_twin_gradient
from ds4mlx.models.attention import sink_attention

import mlx.core as mx
import numpy as np
import pytest
from emulator import build_emulator, run

NO_METAL = "Metal is not available (needs macOS on Apple silicon with MLX's Metal backend)"
HC, ITERS, EPS = 4, 20, 1e-6
T, H, D, W, N, SLOTS = 7, 3, 64, 20, 9, 4  # odd sizes; D is two SIMD widths


def attention_case(seed: int) -> dict[str, np.ndarray]:
    """Random inputs; each row sees a window range inside (or clipped to) the window, and a mix
    of valid, repeated-nothing and unused (-1) compressed slots; row 0 sees nothing at all."""
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, W // 2, T)
    hi = np.minimum(lo + rng.integers(1, W, T), W)
    ranges = np.stack([lo, hi], axis=1).astype(np.int32)
    index = np.stack([rng.permutation(N)[:SLOTS] for _ in range(T)]).astype(np.int32)
    index[rng.random((T, SLOTS)) < 0.3] = -1
    ranges[0] = (5, 5)
    index[0] = -1
    return {
        "q": rng.standard_normal((T, H, D)).astype(np.float32),
        "window": rng.standard_normal((W, D)).astype(np.float32),
        "window_range": ranges,
        "comp": rng.standard_normal((N, D)).astype(np.float32),
        "comp_index": index,
        "sinks": rng.standard_normal(H).astype(np.float32),
    }


def dense_reference(case: dict[str, np.ndarray], scale: float) -> np.ndarray:
    """The model's masked formulation: all window and compressed keys, a visibility mask."""
    keys = np.concatenate([case["window"], case["comp"]])
    mask = np.zeros((T, W + N), bool)
    for t, (lo, hi) in enumerate(case["window_range"]):
        mask[t, lo:hi] = True
        for row in case["comp_index"][t]:
            if row >= 0:
                mask[t, W + row] = True
    out = sink_attention(
        mx.array(case["q"]), mx.array(keys), mx.array(mask), mx.array(case["sinks"]), scale
    )
    return np.array(out)


def run_twin(case: dict[str, np.ndarray], scale: float, rows: slice = slice(None)) -> np.ndarray:
    return np.array(
        twins.sparse_attention(
            mx.array(case["q"][rows]),
            mx.array(case["window"]),
            mx.array(case["window_range"][rows]),
            mx.array(case["comp"]),
            mx.array(case["comp_index"][rows]),
            mx.array(case["sinks"]),
            scale,
        )
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_attention_twin_equals_the_masked_dense_attention(seed):
    case, scale = attention_case(seed), D**-0.5
    np.testing.assert_allclose(
        run_twin(case, scale), dense_reference(case, scale), rtol=1e-5, atol=1e-5
    )
    assert not run_twin(case, scale)[0].any()  # nothing visible: the sink takes everything


def test_sparse_attention_twin_rows_do_not_depend_on_each_other():
    """Decode (one row) and verify (several rows) give bit-identical rows."""
    case, scale = attention_case(3), D**-0.5
    together = run_twin(case, scale)
    for t in range(T):
        assert np.array_equal(run_twin(case, scale, slice(t, t + 1))[0], together[t])


def test_sparse_attention_without_compressed_rows():
    case, scale = attention_case(4), D**-0.5
    case["comp"] = np.zeros((0, D), np.float32)
    case["comp_index"] = np.full((T, SLOTS), -1, np.int32)
    expected = dense_reference(case | {"comp": np.zeros((N, D), np.float32)}, scale)
    np.testing.assert_allclose(run_twin(case, scale), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens", [1, 8, 37])
def test_compiled_sinkhorn_twin_is_bit_identical_to_its_rounds(tokens):
    """The twin runs its rounds through mx.compile (fused elementwise steps); values and
    gradients must equal the plain rounds bit for bit, at any token count."""
    comb = mx.array(np.random.default_rng(tokens).standard_normal((tokens, HC, HC)) * 3, mx.float32)
    weights = mx.arange(HC * HC, dtype=mx.float32).reshape(HC, HC)

    def plain(c):
        return twins._sinkhorn_rounds(c, ITERS, EPS)

    def compiled(c):
        return twins.sinkhorn(c, ITERS, EPS)

    assert np.array_equal(np.array(compiled(comb)), np.array(plain(comb)))
    grads = [mx.grad(lambda c, f=f: mx.sum(f(c) * weights))(comb) for f in (plain, compiled)]
    assert np.array_equal(np.array(grads[0]), np.array(grads[1]))


def test_metal_kernels_differentiate_through_their_twins():
    """Metal kernels have no derivative of their own; the wrapper's VJP uses the twin. Checked
    here with the twin standing in for the kernel."""
    comb = mx.array(np.random.default_rng(5).standard_normal((3, HC, HC)).astype(np.float32))
    wrapped = with_twin_gradient(
        lambda c: twins.sinkhorn(c, ITERS, EPS), lambda c: twins.sinkhorn(c, ITERS, EPS)
    )

    def loss(function):
        return lambda c: mx.sum(function(c) * mx.arange(HC * HC).reshape(HC, HC))

    expected = mx.grad(loss(lambda c: twins.sinkhorn(c, ITERS, EPS)))(comb)
    np.testing.assert_allclose(
        np.array(mx.grad(loss(wrapped))(comb)), np.array(expected), rtol=1e-6, atol=1e-7
    )


# --------------------------------------------------------------------------------------------
# The Metal sources, run on the CPU by the emulator
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    return build_emulator(tmp_path_factory.mktemp("metal-fused"), **attention_defines(D, H))


def attention_defines(dim: int, heads: int) -> dict[str, int]:
    """The emulator's sizes: Sinkhorn's, and the attention's as metal.py launches it."""
    return {
        "DS4_HC": HC,
        "DS4_ITERS": ITERS,
        "DS4_D": dim,
        "DS4_HEADS": metal.attention_heads_per_group(heads),
        "DS4_SPLITS": metal.ATTENTION_SPLITS,
        "DS4_SLOTS": SLOTS,  # the replaced kernel's compiled-in slot count
    }


def test_emulated_sinkhorn_kernel_matches_twin(emulator: Path, tmp_path):
    comb = (np.random.default_rng(6).standard_normal((5, HC, HC)) * 3).astype(np.float32)
    got, _ = run(
        emulator,
        ["sinkhorn"],
        [np.array([5], np.int32), np.array([EPS], np.float32), comb],
        tmp_path,
    )
    expected = np.array(twins.sinkhorn(mx.array(comb), ITERS, EPS))
    np.testing.assert_allclose(got.reshape(comb.shape), expected, rtol=1e-5, atol=1e-6)


def emulate_attention(
    emulator: Path, case: dict[str, np.ndarray], scale: float, tmp_path: Path, mode: str = ""
):
    tokens, heads, dim = case["q"].shape
    sizes = [tokens, heads, len(case["window"]), len(case["comp"]), case["comp_index"].shape[1]]
    payload = [np.array(sizes, np.int32), np.array([scale], np.float32)] + [
        np.ascontiguousarray(case[name])
        for name in ("q", "window", "window_range", "comp", "comp_index", "sinks")
    ]
    out, counters = run(emulator, [mode or "sparse_attention"], payload, tmp_path)
    return out.reshape(tokens, heads, dim), counters


@pytest.mark.parametrize("seed", [0, 1])
def test_emulated_sparse_attention_kernel_matches_twin(emulator: Path, tmp_path, seed):
    case, scale = attention_case(seed), D**-0.5
    case["comp_index"][1, 0] = N + 3  # out of range: skipped, never read
    for mode in ("sparse_attention", "baseline_sparse_attention"):  # the benchmark's baseline
        got, _ = emulate_attention(emulator, case, scale, tmp_path, mode)
        np.testing.assert_allclose(got, run_twin(case, scale), rtol=1e-5, atol=1e-5)


def test_emulated_sparse_attention_at_flash_shape_reads_each_key_once_per_8_heads(
    tmp_path_factory, tmp_path
):
    """DeepSeek-V4-Flash's CSA decode: head dim 512, 64 heads, a 128-row window and 512
    selected compressed rows (some slots unused), two rows with different lengths."""
    tokens, heads, dim, window, n_comp, slots = 2, 64, 512, 128, 1024, 512
    rng = np.random.default_rng(12)
    index = np.stack([rng.permutation(n_comp)[:slots] for _ in range(tokens)]).astype(np.int32)
    index[1, 500:] = -1
    case = {
        "q": rng.standard_normal((tokens, heads, dim)).astype(np.float32),
        "window": rng.standard_normal((window, dim)).astype(np.float32),
        "window_range": np.array([[0, window], [40, window]], np.int32),
        "comp": rng.standard_normal((n_comp, dim)).astype(np.float32),
        "comp_index": index,
        "sinks": rng.standard_normal(heads).astype(np.float32),
    }
    binary = build_emulator(tmp_path_factory.mktemp("flash"), **attention_defines(dim, heads))
    got, counters = emulate_attention(binary, case, dim**-0.5, tmp_path)
    np.testing.assert_allclose(got, run_twin(case, dim**-0.5), rtol=1e-5, atol=1e-5)

    group = metal.attention_heads_per_group(heads)
    assert group >= 8 and counters["threadgroups"] == tokens * heads // group
    visible_keys = (window + slots) + (window - 40 + 500)
    key_bytes = visible_keys * dim * 4 * (heads // group)  # each row once per head group
    q_bytes = metal.ATTENTION_SPLITS * case["q"].nbytes  # every split reads its head's query
    index_bytes = index.nbytes * (heads // group)
    per_thread = 16 * counters["threadgroups"] * counters["threads_per_threadgroup"]  # ranges..
    assert key_bytes < counters["device_bytes"] <= key_bytes + q_bytes + index_bytes + per_thread


# --------------------------------------------------------------------------------------------
# The real kernels (Apple silicon)
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
def test_metal_sinkhorn_matches_twin():
    comb = mx.array((np.random.default_rng(7).standard_normal((33, HC, HC)) * 3).astype(np.float32))
    np.testing.assert_allclose(
        np.array(metal.sinkhorn(comb, ITERS, EPS)),
        np.array(twins.sinkhorn(comb, ITERS, EPS)),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("dtype", (mx.float32, mx.float16), ids=str)
def test_metal_sparse_attention_matches_twin(dtype):
    case, scale = attention_case(8), D**-0.5
    args = [
        mx.array(case[name])
        for name in ("q", "window", "window_range", "comp", "comp_index", "sinks")
    ]
    args[0], args[1], args[3] = (a.astype(dtype) for a in (args[0], args[1], args[3]))
    got = metal.sparse_attention(*args, scale)
    expected = twins.sparse_attention(*args, scale)
    tolerance = 1e-5 if dtype == mx.float32 else 2e-2
    np.testing.assert_allclose(
        np.array(got.astype(mx.float32)),
        np.array(expected.astype(mx.float32)),
        rtol=0,
        atol=tolerance * float(mx.abs(expected).max()),
    )


def test_metal_kernel_gradients_with_several_inputs():
    case, scale = attention_case(9), D**-0.5
    fixed = {name: mx.array(case[name]) for name in ("window_range", "comp_index")}

    def twin(q, window, comp, sinks):
        return twins.sparse_attention(
            q, window, fixed["window_range"], comp, fixed["comp_index"], sinks, scale
        )

    wrapped = with_twin_gradient(twin, twin)
    inputs = [mx.array(case[name]) for name in ("q", "window", "comp", "sinks")]
    argnums = list(range(len(inputs)))
    got = mx.grad(lambda *a: mx.sum(wrapped(*a) ** 2), argnums)(*inputs)
    expected = mx.grad(lambda *a: mx.sum(twin(*a) ** 2), argnums)(*inputs)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-6)


def test_metal_sparse_attention_wrapper_is_built_once_and_differentiates(monkeypatch):
    """The wrapper itself, with the twin standing in for the Metal kernel: one custom function
    per scale whatever the ranges and indices, the twin's values, its gradients for the float
    inputs and zeros for the integer ones."""
    monkeypatch.setattr(metal, "_sparse_attention_kernel", twins.sparse_attention)
    metal._sparse_attention_function.cache_clear()
    scale = D**-0.5
    names = ("q", "window", "window_range", "comp", "comp_index", "sinks")
    for seed in (3, 4):
        case = attention_case(seed)
        inputs = [mx.array(case[name]) for name in names]
        got = metal.sparse_attention(*inputs, scale)
        expected = twins.sparse_attention(*inputs, scale)
        np.testing.assert_array_equal(np.array(got), np.array(expected))

        def loss(function, *args):
            return mx.sum(function(*args, scale) ** 2)

        argnums = [0, 1, 3, 5]
        grads = mx.grad(lambda *a: loss(metal.sparse_attention, *a), argnums)(*inputs)
        reference = mx.grad(lambda *a: loss(twins.sparse_attention, *a), argnums)(*inputs)
        for g, e in zip(grads, reference, strict=True):
            np.testing.assert_allclose(np.array(g), np.array(e), rtol=1e-5, atol=1e-6)
    assert metal._sparse_attention_function.cache_info().misses == 1
    metal._sparse_attention_function.cache_clear()
