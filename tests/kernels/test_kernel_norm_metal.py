"""The Metal kernels that carry an RMS norm (metal/hc_site_norm.metal, norm_rope.metal) against
their twins: through the CPU emulator here, the real kernels on a Mac; and the dispatch that
sends a GPU decode step to them (``HyperConnection`` with a norm, ``RoPE.apply_normed``)."""

from __future__ import annotations

from pathlib import Path

from ds4mlx import kernels
from ds4mlx.diagnostics.graph import primitive_names
from ds4mlx.diagnostics.metal_graph import metal_configuration
from ds4mlx.kernels import metal, metal_fused, twins
from ds4mlx.models.mhc import HyperConnection, HyperHead
from ds4mlx.models.norms import RMSNorm
from ds4mlx.models.rope import RoPE, RopeConfig

import mlx.core as mx
import numpy as np
import pytest
from emulator import build_emulator, run

NO_METAL = "Metal is not available (needs macOS on Apple silicon with MLX's Metal backend)"
# DeepSeek-V4-Flash: 4 mHC streams of its 4096-wide hidden state, 20 Sinkhorn rounds; 512-wide
# heads whose last 64 channels are rotated. RAGGED: a width that is no multiple of a threadgroup
# (96 threads for 72 channels: some threads stride over nothing).
HC, ITERS, EPS, NORM_EPS, OUT_EPS = 4, 20, 1e-6, 1e-5, 3e-6
FLASH = {"D": 4096, "HEAD": 512, "ROPE_N": 64}
RAGGED = {"D": 72, "HEAD": 72, "ROPE_N": 16}
MIX = (2 + HC) * HC
TOKENS = (1, 3, 8)  # a decode row, a ragged tile, a whole tile


def _emulator(tmp_path_factory, shape: dict[str, int], width: str) -> Path:
    return build_emulator(
        tmp_path_factory.mktemp(f"metal-norm-{width}-{shape[width]}"),
        DS4_HC=HC,
        DS4_ITERS=ITERS,
        DS4_D=shape[width],
        DS4_ROPE_N=shape["ROPE_N"],
        DS4_ROPE_OFFSET=shape["HEAD"] - shape["ROPE_N"],
    )


@pytest.fixture(scope="module", params=[FLASH, RAGGED], ids=["flash", "ragged"])
def site_emulator(request, tmp_path_factory) -> tuple[Path, int]:
    return _emulator(tmp_path_factory, request.param, "D"), request.param["D"]


@pytest.fixture(scope="module", params=[FLASH, RAGGED], ids=["flash", "ragged"])
def rope_emulator(request, tmp_path_factory) -> tuple[Path, dict[str, int]]:
    return _emulator(tmp_path_factory, request.param, "HEAD"), request.param


def site_case(tokens: int, dim: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": (rng.standard_normal((tokens, HC, dim)) * rng.uniform(0.1, 10)).astype(np.float32),
        # The projection of the raw streams: of the size of sqrt(HC * D) normalised ones.
        "mixes": (rng.standard_normal((tokens, MIX)) * 2 * np.sqrt(HC * dim)).astype(np.float32),
        "scale": rng.uniform(0.5, 2.0, 3).astype(np.float32),
        "base": rng.standard_normal(MIX).astype(np.float32),
        "weight": rng.uniform(0.5, 1.5, dim).astype(np.float32),
    }


def site_twin(case: dict[str, np.ndarray]) -> list[np.ndarray]:
    args = (mx.array(case[n]) for n in ("x", "mixes", "scale", "base", "weight"))
    return [np.array(a) for a in twins.hc_site_norm(*args, HC, ITERS, EPS, NORM_EPS, OUT_EPS)]


@pytest.mark.parametrize("tokens", TOKENS)
def test_emulated_hc_site_norm_kernel_matches_twin(site_emulator, tmp_path, tokens):
    binary, dim = site_emulator
    case = site_case(tokens, dim, seed=tokens + dim)
    payload = np.array([tokens], np.int32).tobytes()
    payload += np.array([EPS, NORM_EPS, OUT_EPS], np.float32).tobytes()
    payload += b"".join(case[n].tobytes() for n in ("scale", "base", "weight", "x", "mixes"))
    got, counters = run(binary, ["hc_site_norm"], [payload], tmp_path)
    y, post, comb = np.split(got, [tokens * dim, tokens * (dim + HC)])
    expected = site_twin(case)
    np.testing.assert_allclose(y.reshape(tokens, dim), expected[0], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(post.reshape(tokens, HC), expected[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(comb.reshape(tokens, HC, HC), expected[2], rtol=1e-4, atol=1e-6)
    # One threadgroup per token: the streams are read twice (their norm, then the collapse's
    # two passes read only the D channels of each stream once more each).
    assert counters["threadgroups"] == tokens
    assert counters["threads_per_threadgroup"] == metal_fused._reduction_threads(dim)


def rope_case(
    shape: dict[str, int], tokens: int, heads: int, weighted: bool, interleaved: bool
) -> tuple[np.ndarray, np.ndarray | None, RoPE, object]:
    rng = np.random.default_rng(tokens * 7 + heads + weighted)
    dim = shape["HEAD"]
    x = rng.standard_normal((tokens, abs(heads), dim) if heads else (tokens, dim)) * 3
    weight = rng.uniform(0.5, 1.5, dim).astype(np.float32) if weighted else None
    rope = RoPE(RopeConfig(shape["ROPE_N"], 10000.0, interleaved=interleaved))
    angles = rope.angles(np.arange(70_000, 70_000 + tokens))  # far positions: host angles
    return x.astype(np.float32), weight, rope, angles


def rope_twin(x, weight, rope, angles, offset) -> np.ndarray:
    normed = twins.rms_normalised(mx.array(x), NORM_EPS)
    if weight is not None:
        normed = normed * mx.array(weight)
    return np.array(rope.twin(normed, angles, offset, False))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
# x [T, H, D], [T, D], or the product [T, H * D] as it comes (its heads read in place)
@pytest.mark.parametrize("heads", [5, 0, -5], ids=["heads", "keys", "product"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_emulated_norm_rope_kernel_matches_twin(
    rope_emulator, tmp_path, interleaved, weighted, heads, tokens
):
    binary, shape = rope_emulator
    x, weight, rope, angles = rope_case(shape, tokens, heads, weighted, interleaved)
    payload = np.array([tokens, heads, interleaved, weighted], np.int32).tobytes()
    payload += np.array([NORM_EPS], np.float32).tobytes()
    payload += (weight if weighted else np.ones(1, np.float32)).tobytes()
    payload += x.tobytes() + angles.cos.tobytes() + angles.sin.tobytes()
    got = run(binary, ["norm_rope"], [payload], tmp_path)[0].reshape(x.shape)
    offset = shape["HEAD"] - shape["ROPE_N"]
    expected = rope_twin(x, weight, rope, angles, offset)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _site(dim: int, seed: int) -> tuple[HyperConnection, RMSNorm, dict[str, np.ndarray]]:
    case = site_case(8, dim, seed)
    fn = np.random.default_rng(seed).standard_normal((MIX, HC * dim)).astype(np.float32)
    site = HyperConnection(
        mx.array(fn),
        mx.array(case["base"]),
        mx.array(case["scale"]),
        hc=HC,
        sinkhorn_iters=ITERS,
        hc_eps=EPS,
        norm_eps=NORM_EPS,
    )
    return site, RMSNorm(mx.array(case["weight"]), OUT_EPS), case


def test_gpu_steps_launch_the_norm_carrying_kernels():
    """In inference on the GPU (the Mac configuration) a site with its block's input norm is
    its projection and one launch, and a norm before RoPE rides in the RoPE launch; outside
    inference both run their composed forms (differentiable: the site's kernel through its
    twin's gradient, the norm and RoPE as MLX operations)."""
    dim = FLASH["HEAD"]
    with metal_configuration() as calls:
        site, norm, case = _site(dim, 1)
        x = mx.array(case["x"])
        rope = RoPE(RopeConfig(64, 10000.0))
        angles = rope.angles(np.arange(8))
        q = mx.array(np.ones((8, 3, dim), np.float32))
        with kernels.inference():
            h, post, comb = site(x, norm)
            rotated = rope.apply_normed(q, None, NORM_EPS, angles, offset=dim - 64)
            product = q.reshape(8, -1)
            mx.eval(product)
            from_product = rope.apply_normed(
                product, None, NORM_EPS, angles, offset=dim - 64, heads=3
            )
            grouped = rope.apply(q, angles, offset=dim - 64, inverse=True, shape=(8, 2, 1, 768))
        assert [c.name for c in calls] == [
            "ds4_hc_site_norm",
            "ds4_norm_rope",
            "ds4_norm_rope",
            "ds4_rope",
        ]
        # A product's heads and a grouped projection's layout are the launches' own shapes:
        # no view before or after them.
        assert calls[2].inputs[0] == ((8, 3 * dim), mx.float32)
        assert calls[2].outputs == (((8, 3, dim), mx.float32),) and calls[2].grid == (256, 3, 8)
        assert calls[3].outputs == (((8, 2, 1, 768), mx.float32),)
        assert primitive_names(from_product) == ["Depends"]
        assert primitive_names(grouped) == ["Depends"]
        assert (from_product.shape, grouped.shape) == ((8, 3, dim), (8, 2, 1, 768))
        assert calls[0].template == (
            ("T_", mx.float32),
            ("HC", HC),
            ("D", dim),
            ("ITERS", ITERS),
            ("THREADS", 256),
            ("SITE", 1),
        )
        assert calls[0].grid == (256, 8, 1) and calls[0].threadgroup == (256, 1, 1)
        assert calls[1].template[-2:] == (("WEIGHTED", 0), ("THREADS", 256))
        assert calls[1].grid == (256, 3, 8)
        assert (h.shape, post.shape, comb.shape, rotated.shape) == (
            (8, dim),
            (8, HC),
            (8, HC, HC),
            (8, 3, dim),
        )
        calls.clear()
        site(x, norm)
        rope.apply_normed(q, None, NORM_EPS, angles, offset=dim - 64)
        assert [c.name for c in calls] == ["ds4_hc_site"]  # RoPE: the twin's MLX operations
    # Off the GPU the same calls: the composition, in the same shapes.
    twin = rope.apply_normed(product, None, NORM_EPS, angles, offset=dim - 64, heads=3)
    np.testing.assert_array_equal(
        np.array(twin), np.array(rope.apply_normed(q, None, NORM_EPS, angles, offset=dim - 64))
    )
    assert rope.apply(q, angles, offset=dim - 64, inverse=True, shape=(8, 2, 1, 768)).shape == (
        8,
        2,
        1,
        768,
    )


def test_site_with_its_norm_is_the_site_then_the_norm():
    """Off the GPU a site given a norm is exactly the site followed by the norm, and the twin
    of the fused kernel (the norm folded after the projection) agrees with it."""
    site, norm, case = _site(RAGGED["D"], 2)
    x = mx.array(case["x"])
    h, post, comb = site(x, norm)
    plain, plain_post, plain_comb = site(x)
    np.testing.assert_array_equal(np.array(h), np.array(norm(plain)))
    np.testing.assert_array_equal(np.array(post), np.array(plain_post))
    raw = kernels.linear(x.reshape(8, -1), site.fn)
    folded = twins.hc_site_norm(
        x, raw, site.scale, site.base, norm.weight, HC, ITERS, EPS, NORM_EPS, OUT_EPS
    )
    for got, expected in zip(folded, (h, post, comb), strict=True):
        np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("shape", [FLASH, RAGGED], ids=["flash", "ragged"])
def test_metal_hc_site_norm_matches_twin(tokens, shape):
    case = site_case(tokens, shape["D"], 40 + tokens)
    args = [mx.array(case[n]) for n in ("x", "mixes", "scale", "base", "weight")]
    got = metal_fused.hc_site_norm(*args, HC, ITERS, EPS, NORM_EPS, OUT_EPS)
    for g, e in zip(got, site_twin(case), strict=True):
        np.testing.assert_allclose(np.array(g), e, rtol=1e-4, atol=2e-5)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("shape", [FLASH, RAGGED], ids=["flash", "ragged"])
def test_metal_norm_rope_matches_twin(weighted, shape):
    x, weight, rope, angles = rope_case(shape, 7, 3, weighted, True)
    offset = shape["HEAD"] - shape["ROPE_N"]
    got = metal_fused.norm_rope(
        mx.array(x),
        None if weight is None else mx.array(weight),
        NORM_EPS,
        *angles.on_device,
        offset,
        shape["ROPE_N"],
        True,
    )
    expected = rope_twin(x, weight, rope, angles, offset)
    np.testing.assert_allclose(np.array(got), expected, rtol=1e-5, atol=1e-5)


def test_gpu_streams_reach_the_next_site_without_a_view():
    """An expansion asked for flat streams writes [T, hc * D] on the GPU, and the next site
    with its norm projects them as they are; elsewhere the streams stay [T, hc, D]."""
    dim = RAGGED["D"]
    site, norm, case = _site(dim, 3)
    rng = np.random.default_rng(3)
    out = mx.array(rng.standard_normal((8, dim)).astype(np.float32))
    post = mx.array(rng.uniform(0, 2, (8, HC)).astype(np.float32))
    comb = mx.array(rng.uniform(0, 1, (8, HC, HC)).astype(np.float32))
    residual = mx.array(case["x"])
    with metal_configuration() as calls, kernels.inference():
        streams = kernels.hc_expand(out, residual, post, comb, flat=True)
        mx.eval(streams)
        h, _, _ = site(streams, norm)
        assert [c.name for c in calls] == ["ds4_hc_expand", "ds4_hc_site_norm"]
        assert streams.shape == (8, HC * dim) and calls[1].inputs[0] == ((8, HC * dim), mx.float32)
        assert calls[1].template[2] == ("D", dim)
        # The projection of the streams and the site's launch: no reshape between.
        names = primitive_names(h)
        assert names.count("Depends") == 1 and "Matmul" in names and "Reshape" not in names
    flat = kernels.hc_expand(out, residual, post, comb, flat=True)
    assert flat.shape == (8, HC, dim)
    np.testing.assert_array_equal(
        np.array(flat), np.array(kernels.hc_expand(out, residual, post, comb))
    )


def head_case(tokens: int, dim: int, seed: int) -> dict[str, np.ndarray]:
    """The head's inputs: HC mixes a token and one scale (llama.cpp's build_hc_head)."""
    case = site_case(tokens, dim, seed)
    case["mixes"], case["base"] = case["mixes"][:, :HC], case["base"][:HC]
    case["scale"] = case["scale"][:1]
    return case


def head_twin(case: dict[str, np.ndarray]) -> np.ndarray:
    args = (mx.array(case[n]) for n in ("x", "mixes", "scale", "base", "weight"))
    return np.array(twins.hc_head_norm(*args, EPS, NORM_EPS, OUT_EPS))


@pytest.mark.parametrize("tokens", TOKENS)
def test_emulated_hc_head_norm_kernel_matches_twin(site_emulator, tmp_path, tokens):
    """The site kernel as the head (SITE 0): HC mixes a token, the collapse normalised; post
    and comb are not written."""
    binary, dim = site_emulator
    case = head_case(tokens, dim, seed=60 + tokens)
    payload = np.array([tokens], np.int32).tobytes()
    payload += np.array([EPS, NORM_EPS, OUT_EPS], np.float32).tobytes()
    payload += b"".join(case[n].tobytes() for n in ("scale", "base", "weight", "x", "mixes"))
    got = run(binary, ["hc_head_norm"], [payload], tmp_path)[0]
    y, untouched = got[: tokens * dim], got[tokens * dim :]
    np.testing.assert_allclose(y.reshape(tokens, dim), head_twin(case), rtol=2e-5, atol=2e-5)
    assert np.isnan(untouched).all()


def test_gpu_head_is_its_projection_and_one_launch():
    """In inference on the GPU the head's collapse and both its norms are one launch after the
    projection of the raw streams; off the GPU the same call is the collapse then the norm."""
    dim = RAGGED["D"]
    case = head_case(8, dim, 5)
    fn = np.random.default_rng(5).standard_normal((HC, HC * dim)).astype(np.float32)
    head = HyperHead(
        mx.array(fn),
        mx.array(case["base"]),
        mx.array(case["scale"]),
        hc_eps=EPS,
        norm_eps=NORM_EPS,
    )
    norm = RMSNorm(mx.array(case["weight"]), OUT_EPS)
    x = mx.array(case["x"])
    with metal_configuration() as calls, kernels.inference():
        final = head(x, 1, norm)
    assert [c.name for c in calls] == ["ds4_hc_site_norm"]
    assert calls[0].template[-1] == ("SITE", 0) and calls[0].inputs[1] == ((8, HC), mx.float32)
    assert final.shape == (8, dim)
    np.testing.assert_array_equal(np.array(head(x, None, norm)), np.array(norm(head(x))))
    raw = x.reshape(8, -1) @ mx.array(fn).T
    folded = twins.hc_head_norm(x, raw, head.scale, head.base, norm.weight, EPS, NORM_EPS, OUT_EPS)
    np.testing.assert_allclose(np.array(folded), np.array(norm(head(x))), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("shape", [FLASH, RAGGED], ids=["flash", "ragged"])
def test_metal_hc_head_norm_matches_twin(tokens, shape):
    case = head_case(tokens, shape["D"], 70 + tokens)
    args = [mx.array(case[n]) for n in ("x", "mixes", "scale", "base", "weight")]
    got = metal_fused.hc_site_norm(*args, HC, 1, EPS, NORM_EPS, OUT_EPS, site=False)[0]
    np.testing.assert_allclose(np.array(got), head_twin(case), rtol=1e-4, atol=2e-5)
