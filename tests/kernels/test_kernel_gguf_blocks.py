"""The CPU's kernels on GGUF blocks as stored (kernels/cpu_ops/quant_blocks.cpp): every format
decodes to the gguf package's values exactly, the products agree with float32 matmuls on those
values, each decode/verify row is computed on its own (a row's bits do not depend on the other
rows), and the blocks load by mapping the file."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from types import SimpleNamespace

from ds4mlx import kernels
from ds4mlx.gguf import quants, reader
from ds4mlx.kernels import PackedWeight

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.ggml_blocks import (
    INTEGER_DOT_BLOCK,
    T,
    integer_rounded,
    random_blocks,
    reference,
)

TINY = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
FORMATS = (T.Q8_0, T.Q4_0, T.Q4_K, T.Q6_K, T.Q2_K, T.IQ2_XXS, T.MXFP4, T.F16, T.BF16)


def stored(qtype: T, shape: tuple[int, int], seed: int, moderate: bool = True) -> np.ndarray:
    """A matrix's stored bytes, uint8 [rows, row_bytes]."""
    raw = np.ascontiguousarray(random_blocks(qtype, shape, seed, moderate))
    return raw.view(np.uint8).reshape(shape[0], -1)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_rows_decode_to_the_reference_values(ops, qtype):
    # Extreme scales (every finite float16, every e8m0 exponent): exact, infinities included.
    shape = (6, 512)
    raw = stored(qtype, shape, seed=int(qtype), moderate=False)
    got = np.array(ops.blocks_rows(mx.array(raw), int(qtype), mx.arange(shape[0])))
    np.testing.assert_array_equal(got, reference(raw, qtype, shape))


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 5, 19])
def test_linear_equals_a_float_matmul_on_the_decoded_values(ops, qtype, tokens):
    shape = (70, 512)  # 70 rows: whole groups of four and a tail
    raw = stored(qtype, shape, seed=tokens)
    x = np.random.default_rng(tokens).standard_normal((tokens, shape[1])).astype(np.float32)
    # Q8_0, Q2_K and IQ2_XXS take integer dot products on the input rounded to 8 bits (as
    # llama.cpp does), whatever the row count: the sums are those of the rounded input's.
    rounded = integer_rounded(x, qtype).astype(np.float64)
    want = rounded @ reference(raw, qtype, shape).T.astype(np.float64)
    got = np.array(kernels.linear(mx.array(x), PackedWeight(mx.array(raw), qtype)))
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("qtype", INTEGER_DOT_BLOCK, ids=lambda t: t.name)
def test_prefill_sums_what_decode_sums(ops, qtype):
    """Prefill's BLAS product (past 32 rows) takes the input rounded to 8 bits as the decode
    tiles' integer dot products do: the two agree to float32 summation order, not to the
    rounding's ~0.5% (prefill and decode logits of one token must not drift apart)."""
    shape, tokens = (70, 512), 40
    w = PackedWeight(mx.array(stored(qtype, shape, seed=5)), qtype)
    x = np.random.default_rng(6).standard_normal((tokens, shape[1])).astype(np.float32)
    batched = np.array(kernels.linear(mx.array(x), w))
    alone = [np.array(kernels.linear(mx.array(x[r : r + 1]), w)) for r in range(tokens)]
    rows = np.concatenate(alone)
    np.testing.assert_allclose(batched, rows, rtol=1e-5, atol=1e-5 * np.abs(rows).max())


@pytest.mark.parametrize("qtype", (T.Q8_0, T.IQ2_XXS, T.Q2_K), ids=lambda t: t.name)
def test_each_tile_row_is_its_own(ops, qtype):
    """A verify tile's row equals that token decoded alone, bit for bit, whatever the other
    rows; rows past ``rows`` are zeros."""
    shape = (36, 1024)
    w = PackedWeight(mx.array(stored(qtype, shape, seed=3)), qtype)
    x = np.random.default_rng(4).standard_normal((8, shape[1])).astype(np.float32)
    tile = np.array(kernels.linear(mx.array(x), w, rows=6))
    for r in range(6):
        alone = np.array(kernels.linear(mx.array(x[r : r + 1]), w, rows=1))
        np.testing.assert_array_equal(tile[r], alone[0])
    assert not tile[6:].any()


def test_grouped_projection_takes_each_group_through_its_matrix(ops):
    groups, n, k, tokens = 3, 32, 256, 4
    raw = stored(T.Q8_0, (groups * n, k), seed=5).reshape(groups, n, -1)
    x = np.random.default_rng(6).standard_normal((tokens, groups * k)).astype(np.float32)
    got = np.array(kernels.grouped_linear(mx.array(x), PackedWeight(mx.array(raw), T.Q8_0)))
    for g in range(groups):
        values = reference(raw[g], T.Q8_0, (n, k))
        want = x[:, g * k : (g + 1) * k] @ values.T
        # Q8_0 form of the input, as in test_linear_equals_a_float_matmul_on_the_decoded_values
        tolerance = 1e-2 * np.abs(want).max()
        np.testing.assert_allclose(got[:, g * n : (g + 1) * n], want, atol=tolerance)


def expert_stacks(experts: int, dim: int, ff: int) -> list[tuple[np.ndarray, T, tuple[int, ...]]]:
    """DS4-Flash's expert types: IQ2_XXS gate and up [E, F, D], Q2_K down [E, D, F]."""
    made = []
    for i, (qtype, shape) in enumerate(
        ((T.IQ2_XXS, (ff, dim)), (T.IQ2_XXS, (ff, dim)), (T.Q2_K, (dim, ff)))
    ):
        raw = np.stack([stored(qtype, shape, seed=10 * i + e) for e in range(experts)])
        made.append((raw, qtype, shape))
    return made


def rounded_twin(x: np.ndarray, floats: list[np.ndarray], indices: np.ndarray, limit: float):
    """The routed experts' twin on the inputs the CPU's integer products see: the token rows
    rounded for the IQ2_XXS gate and up, the SwiGLU rows for the Q2_K down (as llama.cpp)."""
    gate, up, down = floats
    rows = integer_rounded(x, T.IQ2_XXS)
    out = np.zeros((*indices.shape, x.shape[1]), np.float32)
    for (t, slot), e in np.ndenumerate(indices):
        g, u = mx.array(gate[e] @ rows[t]), mx.array(up[e] @ rows[t])
        hidden = np.array(kernels.twins.swiglu(g, u, limit))
        out[t, slot] = down[e] @ integer_rounded(hidden, T.Q2_K)
    return out


@pytest.mark.parametrize("tokens", [12, 80])  # few pairs an expert; past 32, shared GEMMs
def test_routed_experts_on_blocks_equal_the_float_twin(ops, tokens):
    experts, dim, ff, limit = 4, 256, 512, 7.0
    stacks = expert_stacks(experts, dim, ff)
    weights = [PackedWeight(mx.array(raw), qtype) for raw, qtype, _ in stacks]
    floats = [
        np.stack([reference(raw[e], qtype, shape) for e in range(experts)])
        for raw, qtype, shape in stacks
    ]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((tokens, dim)).astype(np.float32)
    indices = rng.integers(0, experts, (tokens, 2)).astype(np.int32)
    want = rounded_twin(x, floats, indices, limit)
    for row_invariant in (True, False):  # decode tiles; prefill (shared GEMMs)
        got = kernels.routed_experts(
            mx.array(x), *weights, mx.array(indices), limit, row_invariant=row_invariant
        )
        # A SwiGLU value that lies on a rounding boundary may take the neighbouring code here or
        # there (its sums differ in order): 0.2% of the largest output, where leaving the down
        # projection's input unrounded is off by 1.6%.
        np.testing.assert_allclose(np.array(got), want, rtol=2e-4, atol=2e-3 * np.abs(want).max())


def test_an_expert_row_does_not_depend_on_the_others(ops):
    """Streamed batches and verify tiles: a pair's result is the same bits alone or with other
    pairs on the same expert."""
    stacks = expert_stacks(3, 256, 256)
    weights = [PackedWeight(mx.array(raw), qtype) for raw, qtype, _ in stacks]
    x = mx.array(np.random.default_rng(8).standard_normal((5, 256)).astype(np.float32))
    indices = mx.array([[0, 1], [0, 2], [0, 1], [2, 1], [0, 0]], dtype=mx.int32)
    whole = np.array(kernels.routed_experts(x, *weights, indices, 0.0, row_invariant=True))
    for t in range(5):
        alone = kernels.routed_experts(
            x[t : t + 1], *weights, indices[t : t + 1], 0.0, row_invariant=True
        )
        np.testing.assert_array_equal(np.array(alone)[0], whole[t])


def test_embedding_rows_and_dequantize(ops):
    raw = stored(T.Q8_0, (10, 256), seed=9)
    w = PackedWeight(mx.array(raw), T.Q8_0)
    values = reference(raw, T.Q8_0, (10, 256))
    np.testing.assert_array_equal(
        np.array(kernels.take_rows(w, mx.array([3, 0, 3]))), values[[3, 0, 3]]
    )
    np.testing.assert_array_equal(np.array(kernels.dequantize(w)), values)


def test_bad_blocks_are_refused_with_a_message(ops):
    with pytest.raises(ValueError, match="not whole blocks"):
        ops.blocks_linear(mx.zeros((1, 32)), mx.zeros((4, 33), dtype=mx.uint8), int(T.Q8_0), 1)
    with pytest.raises(ValueError, match="no CPU kernel for GGML type"):
        ops.blocks_linear(mx.zeros((1, 32)), mx.zeros((4, 34), dtype=mx.uint8), 3, 1)
    with pytest.raises(ValueError, match="columns"):
        ops.blocks_linear(mx.zeros((1, 64)), mx.zeros((4, 34), dtype=mx.uint8), int(T.Q8_0), 1)


def test_blocks_load_by_mapping_the_file(ops, tmp_path):
    raw = stored(T.Q2_K, (4, 512), seed=11)
    path = tmp_path / "blocks.bin"
    path.write_bytes(b"\x00" * 100 + raw.tobytes())
    mapped = ops.mapped_bytes(str(path), 100, list(raw.shape))
    np.testing.assert_array_equal(np.array(mapped), raw)
    with pytest.raises(RuntimeError, match="missing.bin"):
        ops.mapped_bytes(str(tmp_path / "missing.bin"), 100, [4])


def test_mapping_reads_no_page_before_a_kernel_does(ops, tmp_path):
    """Loading by mapping copies nothing: a 256 MiB tensor costs no resident memory until its
    pages are read."""
    status = Path("/proc/self/status")
    if not status.exists():
        pytest.skip("resident memory is read from Linux's /proc")

    def resident_mib() -> float:
        line = next(x for x in status.read_text().splitlines() if x.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    path = tmp_path / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(2**28 + 4096)  # a hole: reading it is free, copying it is not
    before = resident_mib()
    mapped = ops.mapped_bytes(str(path), 4096, [2**14, 2**14])
    mx.eval(mapped)
    assert resident_mib() - before < 64
    assert np.array(mapped[-1]).sum() == 0


def test_native_weights_stay_blocks_on_the_cpu(ops):
    if not quants.cpu_keeps_blocks():
        pytest.skip("Metal keeps MLX's quantized layouts")
    assert quants.default_weight_mode() == "native"
    raw = stored(T.Q8_0, (8, 64), seed=12)
    host = quants.host_weight(raw, T.Q8_0, (8, 64), "native")
    assert host.kind == "packed" and host.nbytes == raw.nbytes
    assert quants.resident_nbytes(T.Q8_0, (8, 64), "native") == raw.nbytes


def test_this_mlx_lays_out_cpu_buffers_as_the_mapping_expects(ops):
    """mapping.cpp wraps a mapping as a buffer of MLX's CPU allocator (its size header in front
    of the data): MLX's internals. Another layout fails here, by name, and the loader copies
    the blocks instead (next test) until mapping.cpp learns it."""
    version = importlib.metadata.version("mlx")
    assert ops.mapping_supported(), f"MLX {version} lays out CPU buffers as mapping.cpp does not"


def test_blocks_are_copied_where_mapping_is_not_supported(ops, monkeypatch, capsys):
    if not quants.cpu_keeps_blocks():
        pytest.skip("Metal keeps MLX's quantized layouts")
    import ds4mlx

    tokens = list(range(3, 20))
    mapped = ds4mlx.load_model(TINY, weights_dtype="native")
    assert mapped.gguf.mapped_tensors > 0
    expected = mapped.logits(tokens)
    real_ops = reader.native_ops()
    other_layout = SimpleNamespace(**{**vars(real_ops), "mapping_supported": lambda: False})
    monkeypatch.setattr(reader, "native_ops", lambda: other_layout)
    reader.maps_blocks.cache_clear()
    try:
        copied = ds4mlx.load_model(TINY, weights_dtype="native")
    finally:
        reader.maps_blocks.cache_clear()
    assert "copied from the file instead" in capsys.readouterr().err
    assert copied.gguf.mapped_tensors == 0
    assert copied.gguf.converted_tensors > mapped.gguf.converted_tensors
    assert isinstance(copied.network.blocks[0].attn.wq_a, PackedWeight)
    np.testing.assert_array_equal(copied.logits(tokens), expected)
