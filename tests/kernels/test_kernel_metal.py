"""The Metal kernels in metal/ against their MLX twins.

On Apple silicon the real kernels run through mx.fast.metal_kernel. Everywhere else the same
sources are compiled for the CPU by tests/kernels/metal_emulation.cpp (a small Metal shim), so the
decoding and indexing logic is still exercised.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ds4mlx.gguf.quants import load_weight
from ds4mlx.kernels import metal, twins

import mlx.core as mx
import numpy as np
import pytest
from emulator import build_emulator
from ggml_blocks import random_blocks
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
PACKED = sorted(twins.PACKED_TYPES, key=lambda t: t.name)
N_EXPERTS, N_OUT, K_IN, N_ROWS, N_BATCHES = 4, 6, 768, 9, 3  # rows not a multiple of ROWS
NO_METAL = "Metal is not available (needs macOS on Apple silicon with MLX's Metal backend)"


def packed_weight(qtype: GGMLQuantizationType, seed: int):
    shape = (N_EXPERTS, N_OUT, K_IN)
    return load_weight(random_blocks(qtype, shape, seed, moderate=True), qtype, shape, "native")


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_metal_sources_declare_the_ggml_block_layout(qtype: GGMLQuantizationType):
    source = (metal.METAL_SOURCE_DIR / f"{qtype.name.lower()}.metal").read_text()
    declared = {
        name: int(value)
        for name, value in re.findall(r"constexpr uint (DS4_BLOCK_\w+) = (\d+);", source)
    }
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    assert declared == {"DS4_BLOCK_VALUES": block_size, "DS4_BLOCK_BYTES": type_size}
    assert "ds4_decode_subblock" in source


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    return build_emulator(
        tmp_path_factory.mktemp("metal"), DS4_K=K_IN, DS4_N=N_OUT, DS4_ROWS=metal.ROWS_PER_SIMDGROUP
    )


@pytest.mark.parametrize("qtype", PACKED, ids=lambda t: t.name)
def test_emulated_metal_kernel_matches_twin(qtype: GGMLQuantizationType, emulator: Path, tmp_path):
    weight = packed_weight(qtype, seed=30)
    rng = np.random.default_rng(31)
    x = rng.normal(size=(N_BATCHES, N_ROWS, K_IN)).astype(np.float32)
    indices = np.array([3, 0, 3], dtype=np.uint32)
    tables = np.array(metal._tables(qtype), dtype=np.uint8)
    (tmp_path / "in.bin").write_bytes(
        np.array([N_BATCHES, N_ROWS, N_EXPERTS], dtype=np.int32).tobytes()
        + x.tobytes()
        + np.array(weight.data).tobytes()
        + np.array([tables.size], dtype=np.uint32).tobytes()
        + tables.tobytes()
        + indices.tobytes()
    )
    subprocess.run(
        [str(emulator), qtype.name.lower(), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
        check=True,
        capture_output=True,
    )
    got = np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(N_BATCHES, N_ROWS, N_OUT)
    expected = np.array(twins.gather_linear(mx.array(x), weight, mx.array(indices)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


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
    x2 = mx.array(rng.normal(size=(2, N_ROWS, K_IN)), dtype=dtype)
    pairs.append((metal.linear(x2, matrix), twins.linear(x2, matrix)))
    for got, expected in pairs:
        assert got.dtype == dtype and got.shape == expected.shape
        got, expected = np.array(got.astype(mx.float32)), np.array(expected.astype(mx.float32))
        np.testing.assert_allclose(got, expected, rtol=0, atol=tolerance * np.abs(expected).max())
