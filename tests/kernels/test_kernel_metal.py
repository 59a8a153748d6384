"""The packed mat-vec kernel in metal/ against its MLX twin, and what it reads.

On Apple silicon the real kernels run through mx.fast.metal_kernel. Everywhere else the same
sources run on the CPU through tests/kernels/metal_emulation.cpp, which also counts every device
load: the counters hold the kernel to its design (each weight byte read once, x once per
threadgroup) and compare it with the kernel it replaced (tests/kernels/baseline_metal).
"""

from __future__ import annotations

import re
from pathlib import Path

from ds4mlx import kernels
from ds4mlx.diagnostics.metal_graph import metal_configuration
from ds4mlx.gguf.quants import load_weight
from ds4mlx.kernels import metal, twins
from ds4mlx.kernels.weights import PackedWeight

import mlx.core as mx
import numpy as np
import pytest
from emulator import build_emulator, linear_defines, run_linear
from ggml_blocks import random_blocks
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
PACKED = sorted(twins.PACKED_TYPES, key=lambda t: t.name)
N_EXPERTS, N_OUT, K_IN, N_ROWS, N_BATCHES = 4, 6, 768, 9, 3  # rows not a multiple of a tile
NO_METAL = "Metal is not available (needs macOS on Apple silicon with MLX's Metal backend)"
# DeepSeek-V4-Flash: routed experts' gate/up (2048 x 4096) and down (4096 x 2048), the head.
FLASH_SHAPES = {"expert_up": (2048, 4096), "expert_down": (4096, 2048), "head": (129280, 4096)}


def packed_weight(qtype: GGMLQuantizationType, seed: int):
    shape = (N_EXPERTS, N_OUT, K_IN)
    return load_weight(random_blocks(qtype, shape, seed, moderate=True), qtype, shape, "native")


def twin_linear(qtype: GGMLQuantizationType, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The twin's x [M, K] @ W.T for raw blocks [N, row_bytes]."""
    weight = PackedWeight(mx.array(raw), qtype)
    return np.array(twins.linear(mx.array(x), weight))


def assert_close(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_metal_sources_declare_the_ggml_block_layout(qtype: GGMLQuantizationType):
    source = (metal.METAL_SOURCE_DIR / f"{qtype.name.lower()}.metal").read_text()
    declared = {
        name: int(value)
        for name, value in re.findall(r"constexpr uint (DS4_BLOCK_\w+) = (\d+);", source)
    }
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    assert declared == {"DS4_BLOCK_VALUES": block_size, "DS4_BLOCK_BYTES": type_size}
    assert "ds4_load_codes" in source and "ds4_codes_dot" in source


def test_launch_tiles_decode_and_verify_rows_and_fills_simdgroups():
    assert [metal.matvec_launch(4096, m).x_rows for m in (1, 2, 3, 4, 5, 8, 9, 512)] == [
        1,
        2,
        4,
        4,
        8,
        8,
        8,
        8,
    ]
    assert metal.matvec_launch(4096, 1).simdgroups == metal.MAX_SIMDGROUPS
    assert metal.matvec_launch(6, 1).simdgroups == 2  # 8 rows hold 6
    launch = metal.matvec_launch(129280, 3)
    rows_per_group = launch.simdgroups * launch.rows
    assert launch.grid(129280, 3, 2) == (32 * launch.simdgroups * 129280 // rows_per_group, 1, 2)


@pytest.fixture(scope="module")
def emulators(tmp_path_factory):
    """An emulator per (N, K), built on first use."""
    built: dict[tuple[int, int], Path] = {}

    def emulator(n_out: int, k: int) -> Path:
        if (n_out, k) not in built:
            directory = tmp_path_factory.mktemp(f"metal-{n_out}x{k}")
            built[n_out, k] = build_emulator(directory, **linear_defines(n_out, k, 1))
        return built[n_out, k]

    return emulator


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_emulated_gather_matches_twin(qtype: GGMLQuantizationType, emulators, tmp_path):
    """Several experts in one launch, x rows past one 8-row tile, a ragged last threadgroup."""
    weight = packed_weight(qtype, seed=30)
    rng = np.random.default_rng(31)
    x = rng.normal(size=(N_BATCHES, N_ROWS, K_IN)).astype(np.float32)
    indices = np.array([3, 0, 3], dtype=np.uint32)
    got = run_linear(emulators(N_OUT, K_IN), qtype, x, np.array(weight.data), indices, tmp_path)
    expected = np.array(twins.gather_linear(mx.array(x), weight, mx.array(indices)))
    assert_close(got.out, expected)


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_emulated_kernel_matches_twin_for_every_decode_and_verify_row_count(
    qtype: GGMLQuantizationType, emulators, tmp_path
):
    raw = random_blocks(qtype, (N_OUT, K_IN), seed=32, moderate=True)
    rng = np.random.default_rng(33)
    for n_rows in range(1, 9):
        x = rng.normal(size=(1, n_rows, K_IN)).astype(np.float32)
        got = run_linear(emulators(N_OUT, K_IN), qtype, x, raw[None], np.zeros(1), tmp_path)
        assert_close(got.out[0], twin_linear(qtype, raw, x[0]))


def sampled_matrix(qtype: GGMLQuantizationType, n_out: int, k: int, stride: int):
    """A [1, N, row_bytes] matrix whose rows in every ``stride``-th threadgroup are random
    blocks (the others zeros, never read), and the indices of those rows."""
    launch = metal.matvec_launch(n_out, 1)
    rows_per_group = launch.simdgroups * launch.rows
    starts = np.arange(0, n_out, rows_per_group * stride)
    rows = (starts[:, None] + np.arange(rows_per_group)).reshape(-1)
    rows = rows[rows < n_out]
    raw = random_blocks(qtype, (len(rows), k), seed=34, moderate=True)
    matrix = np.zeros((1, n_out, raw.shape[-1]), np.uint8)
    matrix[0, rows] = raw
    return matrix, rows


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", FLASH_SHAPES, ids=str)
def test_emulated_kernel_matches_twin_at_flash_shapes(
    qtype: GGMLQuantizationType, shape: str, emulators, tmp_path
):
    """The real N and K (so the real strides and stage counts); a sample of the threadgroups
    runs, about 8 of them."""
    n_out, k = FLASH_SHAPES[shape]
    launch = metal.matvec_launch(n_out, 1)
    stride = max(1, n_out // (launch.simdgroups * launch.rows * 8))
    matrix, rows = sampled_matrix(qtype, n_out, k, stride)
    x = np.random.default_rng(35).normal(size=(1, 3, k)).astype(np.float32)
    got = run_linear(
        emulators(n_out, k), qtype, x, matrix, np.zeros(1), tmp_path, group_stride=stride
    )
    assert_close(got.out[0][:, rows], twin_linear(qtype, matrix[0, rows], x[0]))
    computed = ~np.isnan(got.out[0, 0])
    assert np.array_equal(np.flatnonzero(computed), rows)


@pytest.mark.parametrize("qtype", (T.Q2_K, T.IQ2_XXS, T.Q6_K), ids=lambda t: t.name)
def test_decode_reads_each_weight_byte_once_in_a_quarter_of_the_loads(
    qtype: GGMLQuantizationType, emulators, tmp_path
):
    """M = 1 of a 2048 x 4096 expert: every weight byte is loaded exactly once and x once per
    threadgroup (so the bytes stay within 1.5x of weights + x), in at most a quarter of the
    load instructions of the kernel it replaced."""
    n_out, k = FLASH_SHAPES["expert_up"]
    raw = random_blocks(qtype, (1, n_out, k), seed=36, moderate=True)
    x = np.random.default_rng(37).normal(size=(1, 1, k)).astype(np.float32)
    binary = emulators(n_out, k)
    new = run_linear(binary, qtype, x, raw, np.zeros(1), tmp_path)
    assert_close(new.out[0], twin_linear(qtype, raw[0], x[0]))

    launch = metal.matvec_launch(n_out, 1)
    assert new.threadgroups == n_out // (launch.simdgroups * launch.rows)
    assert new.threads_per_threadgroup == 32 * launch.simdgroups
    # The expert index and the real row count: one lane per simdgroup each.
    index_loads = 2 * 4 * new.threadgroups * launch.simdgroups
    assert new.device_bytes == raw.nbytes + new.threadgroups * x.nbytes + index_loads
    assert new.device_bytes <= 1.5 * (raw.nbytes + x.nbytes)

    old = run_linear(binary, qtype, x, raw, np.zeros(1), tmp_path, baseline=True)
    assert_close(old.out[0], new.out[0])
    assert new.device_load_instructions * 4 <= old.device_load_instructions


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("dtype", (mx.float32, mx.float16, mx.bfloat16), ids=str)
@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_metal_kernel_matches_twin(qtype: GGMLQuantizationType, dtype):
    weight = packed_weight(qtype, seed=32)
    rng = np.random.default_rng(33)
    tolerance = 1e-5 if dtype == mx.float32 else 2e-2
    x = mx.array(rng.normal(size=(N_ROWS, 1, 1, K_IN)), dtype=dtype)
    indices = mx.array(rng.integers(0, N_EXPERTS, size=(N_ROWS, 2)))
    pairs = [
        (metal.gather_linear(x, weight, indices), twins.gather_linear(x, weight, indices)),
    ]
    matrix = load_weight(
        random_blocks(qtype, (N_OUT, K_IN), 34, moderate=True), qtype, (N_OUT, K_IN), "native"
    )
    for n_rows in (1, 3, 8, N_ROWS):
        x2 = mx.array(rng.normal(size=(2, n_rows, K_IN)), dtype=dtype)
        pairs.append((metal.linear(x2, matrix), twins.linear(x2, matrix)))
    for got, expected in pairs:
        assert got.dtype == dtype and got.shape == expected.shape
        got, expected = np.array(got.astype(mx.float32)), np.array(expected.astype(mx.float32))
        np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance * np.abs(expected).max())


@pytest.mark.parametrize("qtype", (T.Q6_K, T.Q2_K), ids=lambda t: t.name)
@pytest.mark.parametrize("real", (1, 3, 6))
def test_emulated_tile_computes_its_real_rows_only_with_each_rows_bits(
    qtype: GGMLQuantizationType, real: int, emulators, tmp_path
):
    """A decode or verify tile (8 x rows, the first ``real`` real; the head's Q6_K, a Q2_K
    projection) launched as metal.py launches it: the real rows' results are the whole tile's
    to the bit (a verify row equals its one-token decode), the other rows are not computed, and
    x is read for the real rows only."""
    raw = random_blocks(qtype, (1, N_OUT, K_IN), seed=60 + real, moderate=True)
    x = np.random.default_rng(real).normal(size=(1, 8, K_IN)).astype(np.float32)
    binary = emulators(N_OUT, K_IN)
    whole = run_linear(binary, qtype, x, raw, np.zeros(1), tmp_path)
    part = run_linear(binary, qtype, x, raw, np.zeros(1), tmp_path, real_rows=real)
    np.testing.assert_array_equal(part.out[0, :real], whole.out[0, :real])
    assert np.isnan(part.out[0, real:]).all()
    assert_close(part.out[0, :real], twin_linear(qtype, raw[0], x[0, :real]))
    assert part.device_bytes - whole.device_bytes == -(8 - real) * K_IN * 4 * whole.threadgroups


def test_gpu_tile_products_launch_for_their_real_rows():
    """``kernels.linear``'s rows hint on the GPU: a packed matrix's launch keeps the 8-row
    tile's x-row shape (so each row's bits) and covers the real rows only; zeros past them."""
    weight = PackedWeight(mx.array(random_blocks(T.Q6_K, (N_OUT, K_IN), 61)), T.Q6_K)
    x = mx.ones((8, K_IN))
    with metal_configuration() as calls:
        y = kernels.linear(x, weight, 3)
        kernels.linear(x, weight)
    (real, whole), launch = calls, metal.matvec_launch(N_OUT, 8)
    assert real.template == whole.template and dict(real.template)["XROWS"] == 8
    assert real.inputs[3] == whole.inputs[3] == ((1,), mx.int32)
    assert real.grid == launch.grid(N_OUT, 3, 1) and whole.grid == launch.grid(N_OUT, 8, 1)
    assert y.shape == (8, N_OUT)


# A routed decode tile: DeepSeek-V4-Flash's 6 experts a row, read by one launch for all pairs
# of the first R rows of an 8-row tile (ragged R), each x row where it lies (XSHARE = 6).
TOP_K, TILE = 6, 8


def pair_case(qtype: GGMLQuantizationType, n_out: int, k: int, experts: int, seed: int):
    rng = np.random.default_rng(seed)
    raw = random_blocks(qtype, (experts, n_out, k), seed, moderate=True)
    tile = rng.normal(size=(TILE, k)).astype(np.float32)
    indices = rng.integers(0, experts, size=(TILE, TOP_K)).astype(np.uint32)
    return raw, tile, indices


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", (1, 3, TILE))
def test_emulated_pair_launch_reads_each_row_for_its_experts(
    qtype: GGMLQuantizationType, rows: int, tmp_path_factory, tmp_path
):
    """x [R, K] read in place by its k experts' batches (XSHARE) matches the twin's gather of
    x broadcast over the pairs, and reads each x row once per pair, not a copy of it."""
    binary = build_emulator(
        tmp_path_factory.mktemp("metal-pairs"), **linear_defines(N_OUT, K_IN, 1), DS4_XSHARE=TOP_K
    )
    raw, tile, indices = pair_case(qtype, N_OUT, K_IN, N_EXPERTS, seed=40 + rows)
    x = tile[:rows]  # what the kernel reads of the tile
    got = run_linear(binary, qtype, x[:, None, :], raw, indices[:rows].reshape(-1), tmp_path)
    two_d = run_linear(binary, qtype, x, raw, indices[:rows].reshape(-1), tmp_path, two_d=True)
    weight = PackedWeight(mx.array(raw), qtype)
    expected = twins.gather_linear(
        mx.array(tile[:rows, None, None, :]), weight, mx.array(indices[:rows])
    )
    expected = np.array(expected).reshape(rows * TOP_K, 1, N_OUT)
    assert_close(got.out, expected)
    np.testing.assert_array_equal(two_d.out, got.out)


@pytest.mark.parametrize("qtype", (T.Q2_K, T.IQ2_XXS), ids=lambda t: t.name)
def test_emulated_pair_launch_at_the_flash_expert_shape(
    qtype: GGMLQuantizationType, tmp_path_factory, tmp_path
):
    """DeepSeek-V4-Flash's gate/up shape (2048 x 4096), one decode row's 6 experts; a sample
    of the threadgroups runs."""
    n_out, k = FLASH_SHAPES["expert_up"]
    binary = build_emulator(
        tmp_path_factory.mktemp("metal-pairs-flash"),
        **linear_defines(n_out, k, 1),
        DS4_XSHARE=TOP_K,
    )
    launch = metal.matvec_launch(n_out, 1)
    stride = max(1, n_out // (launch.simdgroups * launch.rows * 2))
    matrix, rows = sampled_matrix(qtype, n_out, k, stride)
    experts = np.concatenate([matrix, matrix[:, ::-1]])  # two experts, rows in both orders
    x = np.random.default_rng(38).normal(size=(1, k)).astype(np.float32)
    indices = np.array([1, 0, 1, 1, 0, 1], np.uint32)
    got = run_linear(binary, qtype, x, experts, indices, tmp_path, group_stride=stride, two_d=True)
    expected = twin_linear(qtype, matrix[0, rows], x)[0]
    for pair, expert in enumerate(indices):
        if expert == 0:
            assert_close(got.out[pair, 0, rows], expected)


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("real", (1, 3, 6))
def test_metal_tile_real_rows_keep_each_rows_bits(real: int):
    weight = PackedWeight(mx.array(random_blocks(T.Q6_K, (N_OUT, K_IN), 62)), T.Q6_K)
    x = mx.array(np.random.default_rng(real).normal(size=(8, K_IN)).astype(np.float32))
    part, whole = np.array(metal.linear(x, weight, real)), np.array(metal.linear(x, weight))
    np.testing.assert_array_equal(part[:real], whole[:real])
    assert (part[real:] == 0).all()


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", (1, 3, TILE))
def test_metal_pair_linear_matches_twin(qtype: GGMLQuantizationType, rows: int):
    raw, tile, indices = pair_case(qtype, N_OUT, K_IN, N_EXPERTS, seed=50 + rows)
    weight = PackedWeight(mx.array(raw), qtype)
    tile, indices = mx.array(tile), mx.array(indices)
    expected = np.array(twins.gather_linear(tile[:rows, None, None, :], weight, indices[:rows]))
    assert_close(np.array(metal.pair_linear(tile, weight, indices, rows)), expected)
    hidden = mx.array(np.random.default_rng(rows).normal(size=(rows, TOP_K, 1, K_IN)))
    hidden = hidden.astype(mx.float32)
    expected = np.array(twins.gather_linear(hidden, weight, indices[:rows]))
    assert_close(np.array(metal.pair_linear(hidden, weight, indices, rows)), expected)
