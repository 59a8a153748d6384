"""The native CPU operations (kernels/cpu_ops): built on this machine, equal to their twins
within float rounding, row-independent, differentiable through the twin, and a failed build
falls back to the twins with one clear line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ds4mlx import kernels
from ds4mlx.kernels import native, twins

import mlx.core as mx
import numpy as np
import pytest

HC, ITERS, EPS = 4, 20, 1e-6
WIDTH = (2 + HC) * HC


def mixes_case(seed: int, tokens: int) -> tuple[mx.array, mx.array, mx.array]:
    rng = np.random.default_rng(seed)
    return (
        mx.array(rng.standard_normal((tokens, WIDTH)).astype(np.float32) * 3),
        mx.array(rng.uniform(0.2, 2.0, 3).astype(np.float32)),
        mx.array(rng.standard_normal(WIDTH).astype(np.float32)),
    )


@pytest.mark.parametrize("tokens", [1, 8, 37])
def test_hc_mixes_equals_the_twin(ops, tokens):
    case = mixes_case(tokens, tokens)
    got = ops.hc_mixes(*case, HC, ITERS, EPS)
    want = twins.hc_mixes(*case, HC, ITERS, EPS)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == mx.float32
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=2e-6, atol=1e-7)
    comb = np.array(got[2])
    # the last normalisation is over src: those sums are 1; 20 rounds leave rows near 1
    np.testing.assert_allclose(comb.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(comb.sum(axis=2), 1.0, atol=2e-2)


def test_rows_do_not_depend_on_the_other_rows(ops):
    mixes, scale, base = mixes_case(3, 8)
    together = ops.hc_mixes(mixes, scale, base, HC, ITERS, EPS)
    for r in range(8):
        alone = ops.hc_mixes(mixes[r : r + 1], scale, base, HC, ITERS, EPS)
        for a, t in zip(alone, together, strict=True):
            assert mx.array_equal(a[0], t[r]).item()


def test_strided_and_non_float32_inputs(ops):
    mixes, scale, base = mixes_case(5, 6)
    strided = mx.swapaxes(mx.swapaxes(mixes, 0, 1) * 1.0, 0, 1)  # a transposed view
    for g, w in zip(
        ops.hc_mixes(strided[::2], scale, base, HC, ITERS, EPS),
        ops.hc_mixes(mixes[::2] + 0.0, scale, base, HC, ITERS, EPS),
        strict=True,
    ):
        assert mx.array_equal(g, w).item()
    half = ops.hc_mixes(mixes.astype(mx.float16), scale, base, HC, ITERS, EPS)
    want = twins.hc_mixes(mixes.astype(mx.float16).astype(mx.float32), scale, base, HC, ITERS, EPS)
    np.testing.assert_allclose(np.array(half[2]), np.array(want[2]), rtol=2e-6, atol=1e-7)


def test_bad_shapes_are_refused(ops):
    with pytest.raises(ValueError, match="hc_mixes"):
        ops.hc_mixes(mx.zeros((2, WIDTH + 1)), mx.ones(3), mx.zeros(WIDTH), HC, ITERS, EPS)


def test_kernels_dispatch_one_primitive_and_the_twin_gradient(ops):
    from ds4mlx.diagnostics.graph import primitive_names

    mixes, scale, base = mixes_case(11, 8)
    mx.eval(mixes, scale, base)
    assert mx.default_device() == mx.cpu
    names = primitive_names(*kernels.hc_mixes(mixes, scale, base, HC, ITERS, EPS))
    assert "DS4HcMixes" in names and len(names) <= 2

    def loss(fn):
        def f(m, s, b):
            pre, post, comb = fn(m, s, b, HC, ITERS, EPS)
            return (pre * 1.5).sum() + (post**2).sum() + (comb * mx.arange(16).reshape(4, 4)).sum()

        return f

    got = mx.grad(loss(kernels.hc_mixes), argnums=(0, 1, 2))(mixes, scale, base)
    want = mx.grad(loss(twins.hc_mixes), argnums=(0, 1, 2))(mixes, scale, base)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-4, atol=1e-6)


def test_the_build_key_changes_with_every_source_file(tmp_path, monkeypatch):
    # A header edit (common.h holds the shared arithmetic) must rebuild the module like a .cpp
    # edit does; a file the build never reads must not.
    copy = tmp_path / "cpu_ops"
    shutil.copytree(native.SOURCE_DIR, copy, ignore=shutil.ignore_patterns("build"))
    monkeypatch.setattr(native, "SOURCE_DIR", copy)
    keys = [native.build_key()]
    (copy / "notes.md").write_text("not a source\n")
    assert native.build_key() == keys[0]
    for name in ("common.h", "ops.h", "moe.cpp", "CMakeLists.txt"):
        with open(copy / name, "a") as source:
            source.write("\n")
        keys.append(native.build_key())
    assert len(set(keys)) == len(keys)


def test_a_failed_build_falls_back_to_the_twins_with_one_line(tmp_path):
    broken = tmp_path / "src"
    broken.mkdir()
    (broken / "CMakeLists.txt").write_text(
        'cmake_minimum_required(VERSION 3.25)\nmessage(FATAL_ERROR "deliberately broken")\n'
    )
    script = (
        "import ds4mlx.kernels.native as n, pathlib, sys\n"
        f"n.SOURCE_DIR = pathlib.Path({str(broken)!r})\n"
        "assert n.native_ops() is None\n"
        "from ds4mlx import kernels\n"
        "import mlx.core as mx\n"
        "pre, post, comb = kernels.hc_mixes(mx.zeros((1, 24)), mx.ones(3), mx.zeros(24), 4, 20,"
        " 1e-6)\n"
        "print(comb.sum().item())\n"
    )
    env = dict(os.environ, DS4MLX_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DS4MLX_KERNELS", None)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if "native CPU operations" in line]
    assert any("unavailable" in line and "deliberately broken" in line for line in notices), (
        done.stderr
    )
    assert abs(float(done.stdout) - 4.0) < 1e-3  # the twin computed it


def _broken_build(tmp_path) -> tuple[str, dict[str, str]]:
    """A Python preamble that points the build at sources whose configure step reports some
    progress and fails fast, and the environment of a fresh cache."""
    broken = tmp_path / "src"
    broken.mkdir()
    (broken / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.25)\n"
        'message(NOTICE "[ 40%] Building CXX object half.cpp.o")\n'
        'message(FATAL_ERROR "deliberately broken")\n'
    )
    preamble = (
        "import ds4mlx.kernels.native as n, pathlib\n"
        f"n.SOURCE_DIR = pathlib.Path({str(broken)!r})\n"
    )
    env = dict(os.environ, DS4MLX_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DS4MLX_KERNELS", None)
    env.pop("DS4MLX_REBUILD_NATIVE", None)
    return preamble, env


def test_a_failed_build_is_remembered_until_a_retry_is_asked_for(tmp_path):
    # A build costs minutes on a busy machine: the next process must not spend them again.
    preamble, env = _broken_build(tmp_path)
    script = preamble + "assert n.native_ops() is None\n"

    def run(**extra: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env={**env, **extra},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return done.stderr

    first = run()
    assert "building the native CPU operations: 40%" in first  # cmake's progress, shown
    assert "deliberately broken" in first
    again = run()
    assert "building" not in again
    assert "failed before" in again and "deliberately broken" in again
    assert "DS4MLX_REBUILD_NATIVE=1" in again
    retried = run(DS4MLX_REBUILD_NATIVE="1")
    assert "building the native CPU operations" in retried and "failed before" not in retried


def test_the_build_happens_while_loading_not_in_the_prefill(tmp_path):
    # Its minutes were reported as the first prompt's prefill speed ("prefill 0.05 t/s").
    preamble, env = _broken_build(tmp_path)
    script = preamble + (
        "from ds4mlx.cli.main import main\nraise SystemExit(main(['-p', 'x', '-n', '2']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    unavailable = next(i for i, line in enumerate(lines) if "unavailable" in line)
    loaded = next(i for i, line in enumerate(lines) if line.startswith("ds4: loaded"))
    assert unavailable < loaded, done.stderr


def test_mlx_choice_turns_them_off():
    script = "import ds4mlx.kernels.native as n; print(n.native_ops() is None)"
    env = dict(os.environ, DS4MLX_KERNELS="mlx")
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.stdout.strip() == "True" and "native" not in done.stderr


def experts_case(
    seed: int, tokens: int, experts: int = 8, k: int = 2, dim: int = 64, ff: int = 48
) -> tuple[mx.array, ...]:
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 1.0) -> mx.array:
        return mx.array(rng.standard_normal(shape).astype(np.float32) * scale)

    indices = np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]).astype(np.int32)
    return (
        normal(tokens, dim),
        normal(experts, ff, dim, scale=0.3),
        normal(experts, ff, dim, scale=0.3),
        normal(experts, dim, ff, scale=0.3),
        mx.array(indices),
    )


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "per-row"])
@pytest.mark.parametrize("limit", [0.0, 1.5])
def test_routed_experts_equal_the_twin(ops, grouped, limit):
    case = experts_case(1, 37)
    got = ops.routed_experts(*case, limit, grouped)
    want = twins.routed_experts(*case, limit)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


def test_routed_experts_per_row_results_do_not_depend_on_the_other_rows(ops):
    x, gate, up, down, indices = experts_case(2, 7, experts=3)  # experts shared
    together = ops.routed_experts(x, gate, up, down, indices, 10.0, False)
    for r in range(7):
        alone = ops.routed_experts(x[r : r + 1], gate, up, down, indices[r : r + 1], 10.0, False)
        assert mx.array_equal(alone[0], together[r]).item()


def test_routed_experts_on_a_subset_of_the_pairs_give_the_same_bits(ops):
    # What a streamed store does: the pairs of some experts, in order, with [P, 1] indices.
    x, gate, up, down, indices = experts_case(6, 40)
    whole = np.array(ops.routed_experts(x, gate, up, down, indices, 10.0, True))
    flat = np.array(indices).reshape(-1)
    subset = np.flatnonzero(np.isin(flat, [1, 4, 6]))
    subset = subset[np.argsort(flat[subset], kind="stable")]
    part = ops.routed_experts(
        x[mx.array(subset // 2)], gate, up, down, mx.array(flat[subset][:, None]), 10.0, True
    )
    np.testing.assert_array_equal(np.array(part)[:, 0], whole.reshape(-1, whole.shape[-1])[subset])


def test_routed_experts_refuse_mismatched_shapes(ops):
    x, gate, up, down, indices = experts_case(3, 4)
    with pytest.raises(ValueError, match="routed_experts"):
        ops.routed_experts(x, gate, up, mx.swapaxes(down, 1, 2), indices, 0.0, True)
    with pytest.raises(ValueError, match="routed_experts"):
        ops.routed_experts(x, gate, up, down, indices[:2], 0.0, True)


def test_kernels_routed_experts_gradient_is_the_twins(ops):
    x, gate, up, down, indices = experts_case(4, 5)

    def loss(fn):
        def f(x, gate, down):
            out = fn(x, gate, up, down, indices, 1.5)
            return (out * mx.arange(out.size).reshape(out.shape) / out.size).sum()

        return f

    def fused(x, gate, up, down, indices, limit):
        return kernels.routed_experts(x, gate, up, down, indices, limit, row_invariant=False)

    got = mx.grad(loss(fused), argnums=(0, 1, 2))(x, gate, down)
    want = mx.grad(loss(twins.routed_experts), argnums=(0, 1, 2))(x, gate, down)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-4, atol=1e-5)


def test_kernels_routed_experts_leave_other_weight_kinds_to_the_caller(ops):
    x, gate, up, down, indices = experts_case(5, 3)
    half = gate.astype(mx.float16)
    assert kernels.routed_experts(x, half, up, down, indices, 0.0, row_invariant=True) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_attention_equals_the_twin_row_by_row(ops, seed):
    from test_kernel_fused import attention_case

    case = attention_case(seed)
    names = ("q", "window", "window_range", "comp", "comp_index", "sinks")
    args = [mx.array(case[name]) for name in names]
    got = ops.sparse_attention(*args, 0.125)
    np.testing.assert_allclose(
        np.array(got), np.array(twins.sparse_attention(*args, 0.125)), rtol=1e-5, atol=1e-6
    )
    assert not np.array(got)[0].any()  # row 0 sees no key at all
    q, window, ranges, comp, index, sinks = args
    for t in range(q.shape[0]):
        lo, hi = (int(v) for v in case["window_range"][t])
        # alone, with only its own window rows: the same bits
        alone = ops.sparse_attention(
            q[t : t + 1],
            window[lo:hi],
            mx.array([[0, hi - lo]]),
            comp,
            index[t : t + 1],
            sinks,
            0.125,
        )
        assert mx.array_equal(alone[0], got[t]).item()


@pytest.mark.parametrize("interleaved", [True, False], ids=["normal", "neox"])
def test_rope_equals_the_formula_and_its_gradient(ops, interleaved):
    from ds4mlx.models.rope import RoPE, RopeConfig

    rope = RoPE(RopeConfig(n_dims=32, base=10000.0, interleaved=interleaved))
    x = mx.array(np.random.default_rng(9).standard_normal((5, 3, 64)).astype(np.float32))
    angles = rope.angles(np.arange(7, 12))
    cos, sin = mx.array(angles.cos), mx.array(angles.sin)
    weights = mx.arange(x.size).reshape(x.shape) / x.size
    for inverse in (False, True):
        got = ops.rope(x, cos, sin, 24, 32, interleaved, inverse)
        want = rope.twin(x, angles, 24, inverse)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, atol=1e-6)
    grad = mx.grad(lambda v: (ops.rope(v, cos, sin, 24, 32, interleaved, False) * weights).sum())
    inverse = ops.rope(weights, cos, sin, 24, 32, interleaved, True)  # a rotation's transpose
    np.testing.assert_allclose(np.array(grad(x)), np.array(inverse), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="rope"):
        ops.rope(x, cos, sin, 40, 32, interleaved, False)


def test_hc_pre_and_expand_equal_their_twins_and_gradients(ops):
    rng = np.random.default_rng(12)
    tokens, dim = 8, 32
    x = mx.array(rng.standard_normal((tokens, HC, dim)).astype(np.float32))
    fn = mx.array(rng.standard_normal((WIDTH, HC * dim)).astype(np.float32) * 0.1)
    _, scale, base = mixes_case(12, 1)
    fn_t = mx.contiguous(fn.T)
    got = ops.hc_pre(x, fn_t, scale, base, HC, ITERS, EPS, 1e-6)
    want = twins.hc_pre(x, fn_t, scale, base, HC, ITERS, EPS, 1e-6)
    # a strided (transposed) projection is read correctly too
    np.testing.assert_allclose(
        np.array(ops.hc_pre(x, fn.T, scale, base, HC, ITERS, EPS, 1e-6)[0]),
        np.array(got[0]),
        rtol=1e-6,
        atol=1e-6,
    )
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-5, atol=1e-5)
    out = mx.array(rng.standard_normal((tokens, dim)).astype(np.float32))
    post, comb = want[1], want[2]
    np.testing.assert_allclose(
        np.array(ops.hc_expand(out, x, post, comb)),
        np.array(twins.hc_expand(out, x, post, comb)),
        rtol=1e-5,
        atol=1e-5,
    )

    def loss(pre_fn, expand_fn, projection):
        def f(x, fn):
            h, post, comb = pre_fn(x, projection(fn), scale, base, HC, ITERS, EPS, 1e-6)
            return (expand_fn(h * 2.0, x, post, comb) * x).sum()

        return f

    # kernels.hc_pre takes the projection [out, in] as models hold it, the twin [in, out]
    got = mx.grad(loss(kernels.hc_pre, kernels.hc_expand, lambda f: f), argnums=(0, 1))(x, fn)
    want = mx.grad(loss(twins.hc_pre, twins.hc_expand, lambda f: f.T), argnums=(0, 1))(x, fn)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(g), np.array(w), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="hc_pre"):
        ops.hc_pre(x, fn_t[:-1], scale, base, HC, ITERS, EPS, 1e-6)
    with pytest.raises(ValueError, match="hc_expand"):
        ops.hc_expand(out[:, :-1], x, post, comb)


def test_hc_pre_and_expand_compute_a_tiles_real_rows_each_on_its_own(ops):
    """A decode tile's mHC site and expansion compute its real rows only (the others zeros),
    and a row's bits are the same whatever the real-row count: a verify row equals that token
    decoded alone. A chunk longer than a tile (prefill) stays close to the tile's values."""
    rng = np.random.default_rng(13)
    tokens, dim = 8, 64
    x = mx.array(rng.standard_normal((tokens, HC, dim)).astype(np.float32))
    fn_t = mx.array(rng.standard_normal((HC * dim, WIDTH)).astype(np.float32) * 0.1)
    out = mx.array(rng.standard_normal((tokens, dim)).astype(np.float32))
    _, scale, base = mixes_case(13, 1)
    every = ops.hc_pre(x, fn_t, scale, base, HC, ITERS, EPS, 1e-6)
    expanded = ops.hc_expand(out, x, every[1], every[2])
    for rows in (1, 3, 6):
        site = ops.hc_pre(x, fn_t, scale, base, HC, ITERS, EPS, 1e-6, rows)
        for part, whole in zip(site, every, strict=True):
            np.testing.assert_array_equal(np.array(part[:rows]), np.array(whole[:rows]))
            assert not np.array(part[rows:]).any()
        streams = ops.hc_expand(out, x, every[1], every[2], rows)
        np.testing.assert_array_equal(np.array(streams[:rows]), np.array(expanded[:rows]))
        assert not np.array(streams[rows:]).any()
    first = ops.hc_pre(x[:1], fn_t, scale, base, HC, ITERS, EPS, 1e-6)
    for part, whole in zip(first, every, strict=True):
        np.testing.assert_array_equal(np.array(part), np.array(whole[:1]))
    long = mx.concatenate([x] * 3)  # a prefill chunk: one GEMM
    chunk = ops.hc_pre(long, fn_t, scale, base, HC, ITERS, EPS, 1e-6)
    np.testing.assert_allclose(
        np.array(chunk[0][:tokens]), np.array(every[0]), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_indexer_top_k_equals_the_twin_row_by_row(ops, seed):
    rng = np.random.default_rng(seed)
    tokens, heads, dim, n_keys, top_k = 8, 4, 16, 40, 6
    q = mx.array(rng.standard_normal((tokens, heads, dim)).astype(np.float32))
    weights = mx.array(rng.standard_normal((tokens, heads)).astype(np.float32))
    keys = mx.array(rng.standard_normal((n_keys, dim)).astype(np.float32))
    visible = mx.array(np.array([0, 3, 6, 7, 20, 40, 33, 12], np.int32))
    got = ops.indexer_top_k(q, weights, keys, visible, top_k)
    assert got.dtype == mx.int32 and got.shape == (tokens, top_k)
    assert mx.array_equal(got, twins.indexer_top_k(q, weights, keys, visible, top_k)).item()
    chosen = np.array(got)
    assert (chosen[0] == -1).all() and chosen[1].tolist() == [0, 1, 2, -1, -1, -1]
    for t, n in enumerate(np.array(visible)):
        if n > top_k:  # the highest scores among the row's own blocks, ascending
            scores = np.maximum(np.array(q[t]) @ np.array(keys)[:n].T, 0)
            scores = (scores * np.array(weights[t])[:, None]).sum(0)
            assert chosen[t].tolist() == sorted(np.argsort(-scores, kind="stable")[:top_k])
        # alone, with only its own blocks: the same choice
        alone = ops.indexer_top_k(
            q[t : t + 1], weights[t : t + 1], keys[: max(int(n), 1)], visible[t : t + 1], top_k
        )
        assert alone.tolist()[0] == chosen[t].tolist()
    # Equal scores (all keys zero): the lower blocks are kept, by both.
    zeros = mx.zeros((n_keys, dim))
    assert np.array(ops.indexer_top_k(q, weights, zeros, visible, top_k))[5].tolist() == list(
        range(top_k)
    )
    assert mx.array_equal(
        ops.indexer_top_k(q, weights, zeros, visible, top_k),
        twins.indexer_top_k(q, weights, zeros, visible, top_k),
    ).item()
    with pytest.raises(ValueError, match="indexer_top_k"):
        ops.indexer_top_k(q, weights, keys[:, :8], visible, top_k)
