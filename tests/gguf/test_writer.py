"""``write_gguf``: files read back by ds4mlx's own reader and loader, typed metadata, and atomic
replacement (a failed write leaves the previous file, and no temporary one)."""

from __future__ import annotations

import math
from pathlib import Path

from ds4mlx import kernels
from ds4mlx.gguf import open_gguf
from ds4mlx.gguf.quantize import QUANTIZE_TYPES, quantize
from ds4mlx.gguf.writer import MetaValue, TensorToWrite, write_gguf

import numpy as np
import pytest
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf import quants as gguf_quants

T = GGMLQuantizationType
V = GGUFValueType
TYPES = sorted(QUANTIZE_TYPES, key=lambda t: t.name)
SHAPES = ((3, 512), (2, 3, 256))

METADATA = {
    "test.count": 7,
    "test.epsilon": 1e-6,
    "test.flag": True,
    "test.name": "tiny",
    "test.ints": [1, -2, 3],
    "test.floats": [0.5, 1, 2.25],
    "test.strings": ["a", "bb", ""],
    "test.bools": [True, False],
    "test.signed": MetaValue(-5, V.INT32),
    "test.big": MetaValue(2**40, V.UINT64),
    "test.double": MetaValue(0.1, V.FLOAT64),
    "test.unsigned_array": MetaValue([1, 2, 3], V.UINT32),
    "test.bytes": MetaValue((0, 255), V.UINT8),
    "test.int8": MetaValue(-5, V.INT8),
    "test.int16": MetaValue(-300, V.INT16),
    "test.uint8": MetaValue(200, V.UINT8),
}
# key -> (types as GGUFReader reports them, value as GGUFFile.get returns it)
EXPECTED_METADATA = {
    "general.architecture": ([V.STRING], "deepseek4"),
    "general.alignment": ([V.UINT32], 32),
    "test.count": ([V.UINT32], 7),
    "test.epsilon": ([V.FLOAT32], pytest.approx(1e-6)),
    "test.flag": ([V.BOOL], True),
    "test.name": ([V.STRING], "tiny"),
    "test.ints": ([V.ARRAY, V.INT32], [1, -2, 3]),
    "test.floats": ([V.ARRAY, V.FLOAT32], [0.5, 1.0, 2.25]),
    "test.strings": ([V.ARRAY, V.STRING], ["a", "bb", ""]),
    "test.bools": ([V.ARRAY, V.BOOL], [True, False]),
    "test.signed": ([V.INT32], -5),
    "test.big": ([V.UINT64], 2**40),
    "test.double": ([V.FLOAT64], 0.1),
    "test.unsigned_array": ([V.ARRAY, V.UINT32], [1, 2, 3]),
    "test.bytes": ([V.ARRAY, V.UINT8], [0, 255]),
    "test.int8": ([V.INT8], -5),  # signed (fresh6's reader_int8_metadata_read_unsigned)
    "test.int16": ([V.INT16], -300),
    "test.uint8": ([V.UINT8], 200),
    "general.quantization_version": ([V.UINT32], GGML_QUANT_VERSION),
    "general.file_type": ([V.UINT32], LlamaFileType.MOSTLY_Q4_K_M),
}


def tensor_name(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> str:
    return f"{qtype.name}.{len(shape)}d"


@pytest.fixture(scope="module")
def every_type(tmp_path_factory) -> tuple[Path, dict[str, TensorToWrite]]:
    rng = np.random.default_rng(0)
    tensors = {
        tensor_name(qtype, shape): TensorToWrite(
            tensor_name(qtype, shape), rng.standard_normal(shape).astype(np.float32), qtype
        )
        for qtype in TYPES
        for shape in SHAPES
    }
    # most of the weights in Q4_K, so general.file_type is MOSTLY_Q4_K_M
    big = TensorToWrite("big.weight", rng.standard_normal((16, 1024)).astype(np.float32), T.Q4_K)
    tensors[big.name] = big
    path = tmp_path_factory.mktemp("writer") / "every-type.gguf"
    write_gguf(path, "deepseek4", METADATA, tensors.values())
    return path, tensors


def test_metadata_round_trips_with_its_types(every_type):
    path, _ = every_type
    gguf_file = open_gguf(path)
    fields = gguf_file.reader.fields
    written = {key: field for key, field in fields.items() if not key.startswith("GGUF.")}
    assert list(written) == list(EXPECTED_METADATA)
    for key, (types, value) in EXPECTED_METADATA.items():
        assert fields[key].types == types, key
        assert gguf_file.get(key) == value, key


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_tensors_round_trip_through_ds4mlx_loader(every_type, qtype: GGMLQuantizationType):
    path, tensors = every_type
    gguf_file = open_gguf(path)
    for shape in SHAPES:
        name = tensor_name(qtype, shape)
        assert gguf_file.tensor_type(name) == qtype
        assert gguf_file.tensor_shape(name) == shape
        assert gguf_file.layout.tensors[name].ggml_dims == tuple(reversed(shape))  # ggml's ne
        encoded = quantize(tensors[name].array, qtype)
        np.testing.assert_array_equal(np.asarray(gguf_file.raw(name)).view(np.uint8), encoded)
        expected = gguf_quants.dequantize(encoded, qtype).reshape(shape)
        np.testing.assert_array_equal(gguf_file.dequantize(name), expected)
        native = gguf_file.load_weight(name, "native")
        np.testing.assert_array_equal(np.array(kernels.dequantize(native)), expected)


def test_file_type_and_alignment_can_be_chosen(tmp_path: Path):
    path = tmp_path / "model.gguf"
    tensors = [
        TensorToWrite("norm", np.ones(64, np.float32)),
        TensorToWrite("a", np.ones((2, 64), np.float32), T.Q8_0),
    ]
    write_gguf(path, "deepseek4", {}, tensors, alignment=64)
    gguf_file = open_gguf(path)
    assert gguf_file.get("general.file_type") == LlamaFileType.MOSTLY_Q8_0
    assert gguf_file.layout.alignment == 64
    assert all(info.file_offset % 64 == 0 for info in gguf_file.layout.tensors.values())
    metadata = {"general.file_type": int(LlamaFileType.MOSTLY_Q2_K)}
    write_gguf(path, "deepseek4", metadata, tensors)
    assert open_gguf(path).get("general.file_type") == LlamaFileType.MOSTLY_Q2_K
    with pytest.raises(ValueError, match="alignment 48 is not a non-zero power of two"):
        write_gguf(path, "deepseek4", {}, tensors, alignment=48)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"k": -1}, r"'k': -1 does not fit GGUF type UINT32"),
        ({"k": 2**32}, r"'k': 4294967296 does not fit GGUF type UINT32"),
        ({"k": MetaValue(128, V.INT8)}, r"'k': 128 does not fit GGUF type INT8"),
        ({"k": MetaValue(1.5, V.INT32)}, r"'k': 1.5 does not fit GGUF type INT32"),
        ({"k": MetaValue("7", V.UINT32)}, r"'k': '7' does not fit GGUF type UINT32"),
        ({"k": 1e39}, r"'k': 1e\+39 does not fit GGUF type FLOAT32"),
        ({"k": MetaValue([1, -1], V.UINT32)}, r"item 1 of metadata key 'k': -1 does not fit"),
        ({"k": [1, "a"]}, r"'k': an array's items must share one type, found STRING, UINT32"),
        ({"k": []}, r"'k': empty arrays cannot be written"),
        ({"k": MetaValue([], V.UINT32)}, r"'k': empty arrays cannot be written"),
        ({"k": {"a": 1}}, r"'k': cannot store a dict"),
        ({"k": MetaValue([1], V.ARRAY)}, r"'k': give a list's item type, not ARRAY"),
        ({"general.architecture": "x"}, r"'general.architecture' is set by write_gguf's own"),
        ({"general.alignment": 64}, r"'general.alignment' is set by write_gguf's own"),
        ({"GGUF.version": 3}, r"'GGUF.version' is reserved"),
        ({"": 1}, r"metadata key '' is not a non-empty string"),
    ],
)
def test_bad_metadata_is_refused_before_writing(tmp_path: Path, metadata, message):
    with pytest.raises(ValueError, match=message):
        write_gguf(tmp_path / "model.gguf", "deepseek4", metadata, [])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (TensorToWrite("w", np.zeros((4, 300), np.float32), T.Q4_K), r"'w': .*block size 256"),
        (TensorToWrite("w", np.zeros((4, 48), np.float32), T.Q8_0), r"'w': .*block size 32"),
        (TensorToWrite("w", np.zeros((1,) * 5, np.float32)), r"'w' has shape \[1, 1, 1, 1, 1\]"),
        (TensorToWrite("w", np.float32(1)), r"'w' has shape \[\]: GGUF tensors have 1 to 4"),
        (TensorToWrite("x" * 64, np.zeros(4, np.float32)), r"limits tensor names to 63 bytes"),
        # 32 characters, 64 bytes in UTF-8: ggml counts bytes.
        (TensorToWrite("é" * 32, np.zeros(4, np.float32)), r"limits tensor names to 63 bytes"),
        (TensorToWrite("", np.zeros(4, np.float32)), r"tensor name '' is not a non-empty"),
    ],
)
def test_bad_tensor_leaves_the_previous_file(tmp_path: Path, tensor: TensorToWrite, message):
    path = tmp_path / "model.gguf"
    good = [TensorToWrite("good", np.ones((2, 256), np.float32), T.Q6_K)]
    write_gguf(path, "deepseek4", {"version": 1}, good)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=message):
        write_gguf(path, "deepseek4", {"version": 2}, [*good, tensor])
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]


def test_names_of_63_bytes_and_unsigned_integer_tables_are_written(tmp_path: Path):
    path = tmp_path / "model.gguf"
    names = ["x" * 63, "é" * 31 + "x"]  # 63 bytes each
    table = np.array([0, 7, 65535], np.uint16)  # index tables often come unsigned
    tensors = [TensorToWrite(name, np.ones(4, np.float32)) for name in names]
    write_gguf(path, "deepseek4", {}, [*tensors, TensorToWrite("ids", table, T.I32)])
    written = open_gguf(path)
    assert written.tensor_names() == [*names, "ids"]
    assert written.tensor_type("ids") == T.I32
    np.testing.assert_array_equal(np.asarray(written.raw("ids")), table)


def test_duplicate_tensor_names_are_refused(tmp_path: Path):
    tensor = TensorToWrite("w", np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="duplicate tensor 'w'"):
        write_gguf(tmp_path / "model.gguf", "deepseek4", {}, [tensor, tensor])
    assert list(tmp_path.iterdir()) == []


def test_a_crash_while_writing_leaves_the_previous_file(tmp_path: Path, monkeypatch):
    path = tmp_path / "model.gguf"
    tensors = [TensorToWrite("w", np.ones((2, 256), np.float32), T.Q2_K)]
    write_gguf(path, "deepseek4", {"version": 1}, tensors)
    before = path.read_bytes()

    def crash(self, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(GGUFWriter, "write_tensors_to_file", crash)
    with pytest.raises(OSError, match="disk full"):
        write_gguf(path, "deepseek4", {"version": 2}, tensors)
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]


def file_type_of(tmp_path: Path, tensors: list[TensorToWrite]) -> int:
    path = tmp_path / "model.gguf"
    write_gguf(path, "deepseek4", {}, tensors)
    return open_gguf(path).get("general.file_type")


def test_the_file_type_is_the_type_of_most_float_weights(tmp_path: Path):
    ids = TensorToWrite("ids", np.arange(10_000, dtype=np.int32), T.I32)  # not weights
    small = TensorToWrite("a", np.ones((2, 32), np.float32), T.Q8_0)
    assert file_type_of(tmp_path, [ids, small]) == LlamaFileType.MOSTLY_Q8_0
    assert file_type_of(tmp_path, [ids]) == LlamaFileType.ALL_F32
    assert file_type_of(tmp_path, []) == LlamaFileType.ALL_F32
    # Weights add up per type: two Q8_0 tensors of 64 outweigh one Q4_0 of 96.
    q8 = [TensorToWrite(f"q8.{i}", np.ones(64, np.float32), T.Q8_0) for i in range(2)]
    q4 = TensorToWrite("q4", np.ones(96, np.float32), T.Q4_0)
    assert file_type_of(tmp_path, [q4, *q8]) == LlamaFileType.MOSTLY_Q8_0


def test_a_tie_goes_to_the_type_seen_first(tmp_path: Path):
    q8 = TensorToWrite("q8", np.ones(64, np.float32), T.Q8_0)
    q4 = TensorToWrite("q4", np.ones(64, np.float32), T.Q4_0)
    assert file_type_of(tmp_path, [q8, q4]) == LlamaFileType.MOSTLY_Q8_0
    assert file_type_of(tmp_path, [q4, q8]) == LlamaFileType.MOSTLY_Q4_0


def test_a_given_quantization_version_is_kept(tmp_path: Path):
    path = tmp_path / "model.gguf"
    write_gguf(path, "deepseek4", {"general.quantization_version": 1}, [])
    assert open_gguf(path).get("general.quantization_version") == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (MetaValue(7, V.STRING), "7 does not fit GGUF type STRING"),
        (MetaValue(1, V.BOOL), "1 does not fit GGUF type BOOL"),
        (MetaValue(True, V.UINT32), "True does not fit GGUF type UINT32"),
        (MetaValue(False, V.FLOAT32), "False does not fit GGUF type FLOAT32"),
        (MetaValue(2**63, V.INT64), "9223372036854775808 does not fit GGUF type INT64"),
    ],
)
def test_a_value_of_another_type_is_refused(tmp_path: Path, value, message):
    with pytest.raises(ValueError, match=f"metadata key 'k': {message}"):
        write_gguf(tmp_path / "model.gguf", "deepseek4", {"k": value}, [])


def test_float64_values_beyond_float32_are_written(tmp_path: Path):
    path = tmp_path / "model.gguf"
    write_gguf(path, "deepseek4", {"k": MetaValue(1e300, V.FLOAT64)}, [])
    assert open_gguf(path).get("k") == 1e300


@pytest.mark.parametrize(
    ("values", "qtype"),
    [(np.array([300]), T.I8), (np.array([-1, 70_000]), T.I16), (np.array([2**31]), T.I32)],
)
def test_an_integer_table_must_fit_its_type(tmp_path: Path, values, qtype):
    tensor = TensorToWrite("ids", values, qtype)
    with pytest.raises(ValueError, match=f"'ids': {qtype.name} needs integers that fit"):
        write_gguf(tmp_path / "model.gguf", "deepseek4", {}, [tensor])


@pytest.mark.parametrize(
    "value",
    [math.inf, -math.inf, float(np.finfo(np.float32).max), -float(np.finfo(np.float32).max)],
)
def test_float32_limits_and_infinities_are_written(tmp_path: Path, value: float):
    """Infinities are FLOAT32 values (a mask's -inf), and so is float32's largest value exactly;
    only finite values beyond it are refused (see 1e39 above)."""
    path = tmp_path / "model.gguf"
    write_gguf(path, "deepseek4", {"k": value}, [])
    gguf_file = open_gguf(path)
    assert gguf_file.writer_type("k") == V.FLOAT32
    assert gguf_file.get("k") == value


def test_a_nan_is_written_as_float32(tmp_path: Path):
    path = tmp_path / "model.gguf"
    write_gguf(path, "deepseek4", {"k": math.nan}, [])
    assert math.isnan(open_gguf(path).get("k"))


def test_a_tensor_of_four_dimensions_is_written(tmp_path: Path):
    path = tmp_path / "model.gguf"
    values = np.arange(2 * 3 * 2 * 32, dtype=np.float32).reshape(2, 3, 2, 32)
    write_gguf(path, "deepseek4", {}, [TensorToWrite("w", values)])
    assert open_gguf(path).layout.tensors["w"].ggml_dims == (32, 2, 3, 2)


@pytest.mark.parametrize("alignment", [0, -64])
def test_an_alignment_of_zero_or_below_is_refused(tmp_path: Path, alignment: int):
    with pytest.raises(ValueError, match=f"alignment {alignment} is not a non-zero power of two"):
        write_gguf(tmp_path / "model.gguf", "deepseek4", {}, [], alignment=alignment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("qtype", "dtype"), [(T.I8, np.int8), (T.I16, np.int16), (T.I32, np.int32), (T.I64, np.int64)]
)
def test_integer_tables_hold_their_types_extremes_and_nothing_past(tmp_path, qtype, dtype):
    path = tmp_path / "model.gguf"
    limits = np.iinfo(dtype)
    table = np.array([limits.min, -1, 0, limits.max], np.int64)
    write_gguf(path, "deepseek4", {}, [TensorToWrite("ids", table, qtype)])
    written = open_gguf(path)
    assert written.tensor_type("ids") == qtype
    stored = np.asarray(written.raw("ids"))
    assert stored.dtype == dtype
    np.testing.assert_array_equal(stored, table)
    if dtype is not np.int64:
        past = np.array([0, int(limits.max) + 1], np.int64)
        with pytest.raises(ValueError, match=f"{qtype.name} needs integers that fit"):
            write_gguf(path, "deepseek4", {}, [TensorToWrite("ids", past, qtype)])


# llama-quantize names its mixes MOSTLY_<type of most weights>, but for these.
NAMED_MIXES = {
    T.F32: LlamaFileType.ALL_F32,
    T.MXFP4: LlamaFileType.MOSTLY_MXFP4_MOE,
    T.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_each_type_names_its_file_type(tmp_path: Path, qtype: GGMLQuantizationType):
    weights = TensorToWrite("w", np.ones((2, 256), np.float32), qtype)
    # not ``.get(qtype) or``: ALL_F32 is 0
    expected = NAMED_MIXES[qtype] if qtype in NAMED_MIXES else LlamaFileType[f"MOSTLY_{qtype.name}"]
    assert file_type_of(tmp_path, [weights]) == expected
