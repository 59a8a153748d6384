"""GGUFFile's API on valid files: metadata, shapes, raw views, and every supported tensor type
written through gguf.GGUFWriter and loaded back exactly."""

from __future__ import annotations

from pathlib import Path

from ds4mlx import kernels
from ds4mlx.gguf import SUPPORTED_TYPES, GGUFError, open_gguf
from ds4mlx.kernels import PackedWeight

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf import quants as gguf_quants

from tests.conftest import REPO_ROOT, oracle_dir

T = GGMLQuantizationType
QUANTIZABLE = {T.Q8_0, T.Q4_0, T.MXFP4, T.BF16}  # gguf.quants.quantize implements these
SUPPORTED_IN_ORDER = sorted(SUPPORTED_TYPES, key=lambda t: t.name)


def test_metadata_access(valid_gguf: Path):
    gguf_file = open_gguf(valid_gguf)
    assert gguf_file.arch == "deepseek4"
    assert gguf_file.require("test.key_a") == 7
    assert gguf_file.get("test.name") == "tiny"
    assert gguf_file.get("test.tokens") == ["a", "bb", "ccc"]
    assert gguf_file.get("test.scores") == [0.5, 1.5]
    assert gguf_file.get("test.absent", 42) == 42
    assert gguf_file.layout.alignment == 64
    with pytest.raises(GGUFError) as caught:
        gguf_file.require("deepseek4.block_count")
    expected = f"{valid_gguf}: missing required metadata key 'deepseek4.block_count'"
    assert str(caught.value) == expected


def shipped_and_oracle_ggufs() -> list[Path]:
    return sorted((REPO_ROOT / "assets").glob("*.gguf")) + sorted(oracle_dir().glob("*.gguf"))


@pytest.mark.parametrize("path", shipped_and_oracle_ggufs(), ids=lambda path: path.name)
def test_values_read_on_demand_are_gguf_readers(path: Path):
    """Metadata decoded from the validated offsets, and tensor views cut from the map, are
    exactly what gguf.GGUFReader parses (same values, same Python and numpy types), and the
    value types a support file's writer is given are the file's."""
    gguf_file = open_gguf(path)
    fields = {k: f for k, f in gguf_file.reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(gguf_file.layout.metadata)
    for key, field in fields.items():
        ours, theirs = gguf_file.get(key), field.contents()
        assert (ours, type(ours)) == (theirs, type(theirs)), key
        if ours != []:  # GGUFReader records no item type for an empty array
            assert gguf_file.writer_type(key) == field.types[-1], key
        if isinstance(ours, list) and ours:
            assert type(ours[0]) is type(theirs[0]), key
    for tensor in gguf_file.reader.tensors:
        raw = gguf_file.raw(tensor.name)
        assert (raw.dtype, raw.shape) == (tensor.data.dtype, tensor.data.shape), tensor.name
        assert np.array_equal(raw.view(np.uint8), tensor.data.view(np.uint8)), tensor.name


def test_tensor_access(valid_gguf: Path):
    gguf_file = open_gguf(valid_gguf)
    assert gguf_file.has_tensor("c.weight") and not gguf_file.has_tensor("d.weight")
    assert gguf_file.tensor_shape("c.weight") == (4, 64)
    assert gguf_file.tensor_type("c.weight") == T.Q8_0
    raw = gguf_file.raw("c.weight")
    assert np.shares_memory(raw, np.frombuffer(gguf_file.mapping, np.uint8))  # a view, no copy
    assert raw.shape == (4, 2 * 34)
    assert gguf_file.dequantize("a.weight").dtype == np.float32
    for accessor in (gguf_file.tensor_shape, gguf_file.raw, gguf_file.load_weight):
        with pytest.raises(GGUFError, match=r"valid\.gguf: missing tensor 'd\.weight'"):
            accessor("d.weight")


def test_expect_shape(valid_gguf: Path):
    gguf_file = open_gguf(valid_gguf)
    gguf_file.expect_shape("b.weight", (4, 32))
    with pytest.raises(GGUFError) as caught:
        gguf_file.expect_shape("b.weight", [32, 4])
    expected = f"{valid_gguf}: tensor 'b.weight' has shape [4, 32], expected [32, 4]"
    assert str(caught.value) == expected


def stored_tensor(qtype: GGMLQuantizationType, shape: tuple[int, ...], rng) -> np.ndarray:
    if qtype == T.F32:
        return rng.normal(size=shape).astype(np.float32)
    if qtype == T.F16:
        return rng.normal(size=shape).astype(np.float16)
    if qtype in QUANTIZABLE:
        return gguf_quants.quantize(rng.normal(size=shape).astype(np.float32), qtype)
    # Other formats' bytes are all free bit fields: random bytes are valid blocks.
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    row_bytes = shape[-1] // block_size * type_size
    return rng.integers(0, 256, size=(*shape[:-1], row_bytes), dtype=np.uint8)


@pytest.fixture(scope="module")
def every_type_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("types") / "every-type.gguf"
    writer = GGUFWriter(path, "deepseek4")
    rng = np.random.default_rng(5)
    for qtype in SUPPORTED_IN_ORDER:
        for shape in ((3, 512), (2, 3, 256)):
            data = stored_tensor(qtype, shape, rng)
            raw_dtype = qtype if data.dtype == np.uint8 else None
            writer.add_tensor(f"{qtype.name}.{len(shape)}d", data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("qtype", SUPPORTED_IN_ORDER, ids=lambda t: t.name)
def test_every_supported_type_loads_exactly_from_a_file(every_type_gguf: Path, qtype):
    gguf_file = open_gguf(every_type_gguf)
    for name in (f"{qtype.name}.2d", f"{qtype.name}.3d"):
        assert gguf_file.tensor_type(name) == qtype
        raw = gguf_file.raw(name)
        with np.errstate(all="ignore"):
            expected = np.asarray(gguf_quants.dequantize(raw, qtype), dtype=np.float32)
        expected = expected.reshape(gguf_file.tensor_shape(name))
        np.testing.assert_array_equal(gguf_file.dequantize(name), expected)
        f32 = gguf_file.load_weight(name, "f32")
        assert isinstance(f32, mx.array) and f32.dtype == mx.float32
        native = gguf_file.load_weight(name, "native")
        assert tuple(native.shape) == gguf_file.tensor_shape(name)
        np.testing.assert_array_equal(np.array(kernels.dequantize(native)), expected)


def _mapped_rss_bytes(path: Path) -> int:
    """This process's resident bytes in the mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = fields[-1] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


def _array_of(w: kernels.Weight) -> mx.array:
    """The array holding a weight's values (codes for quantized kinds)."""
    if isinstance(w, PackedWeight):
        return w.data
    return w if isinstance(w, mx.array) else w.packed


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")
@pytest.mark.parametrize("mode", ["f32", "native"])
def test_loaded_tensors_leave_no_file_pages_in_rss(tmp_path: Path, mode: str):
    # Converted weights are copies: the file's pages must not stay charged to the process too,
    # or a loaded model shows twice its size in RSS. Weights mapped as stored (the CPU's block
    # kernels) are the file's pages, charged once, when a kernel reads them.
    path = tmp_path / "big.gguf"
    writer = GGUFWriter(path, "deepseek4")
    rng = np.random.default_rng(0)
    for i in range(4):
        writer.add_tensor(
            f"w{i}.weight", stored_tensor(T.Q8_0, (1024, 2048), rng), raw_dtype=T.Q8_0
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_file = open_gguf(path.resolve())
    weights = [gguf_file.load_weight(f"w{i}.weight", mode) for i in range(4)]
    mx.eval([_array_of(w) for w in weights])
    tensor_bytes = 4 * 1024 * 2048 // 32 * 34
    assert _mapped_rss_bytes(path.resolve()) < tensor_bytes // 16
