"""GGUF validation at its exact edges, on files built byte by byte here (no fixture from other
modules, so each test fails on its own when the edge it guards moves): a last field or a last
tensor ending exactly at the end of the file, the data section's start aligned up, counts that
just fit, and tensors that touch without overlapping.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ds4mlx.gguf import GGUFError
from ds4mlx.gguf.validate import INT64_MAX, MAX_ARRAY_NESTING, MAX_NAME_BYTES, validate_gguf

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

F32 = GGMLQuantizationType.F32


def string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def kv_u32(key: str, value: int) -> bytes:
    return string(key) + struct.pack("<II", GGUFValueType.UINT32, value)


def kv_string(key: str, value: str) -> bytes:
    return string(key) + struct.pack("<I", GGUFValueType.STRING) + string(value)


def kv_u32_array(key: str, values: list[int]) -> bytes:
    return (
        string(key)
        + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.UINT32, len(values))
        + struct.pack(f"<{len(values)}I", *values)
    )


def tensor_info(name: str, dims: tuple[int, ...], offset: int, qtype: int = F32) -> bytes:
    return (
        string(name)
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", qtype, offset)
    )


def gguf(kvs: list[bytes], infos: list[bytes] = ()) -> bytes:
    """The header, metadata and tensor infos (no padding, no data)."""
    return struct.pack("<IIQQ", 0x46554747, 3, len(infos), len(kvs)) + b"".join(kvs + list(infos))


def write(tmp_path: Path, content: bytes, name: str = "edge.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def padded(content: bytes, alignment: int) -> bytes:
    return content + b"\0" * (-len(content) % alignment)


# ------------------------------------------------------------------ the end of the file


@pytest.mark.parametrize(
    "last",
    [
        kv_string("test.last", "ends at the end"),
        kv_u32_array("test.last", [1, 2, 3]),
        kv_u32("x", 1),
    ],
    ids=["string", "array", "scalar"],
)
def test_a_last_metadata_field_ending_exactly_at_the_end_of_the_file_passes(tmp_path, last):
    content = gguf([kv_u32("test.first", 7), last])
    layout = validate_gguf(write(tmp_path, content))
    assert layout.tensors == {} and layout.version == 3
    with pytest.raises(GGUFError, match="truncated"):
        validate_gguf(write(tmp_path, content[:-1], "cut.gguf"))


def test_a_last_tensor_ending_exactly_at_the_end_of_the_file_passes(tmp_path):
    head = padded(gguf([kv_u32("test.a", 1)], [tensor_info("t", (8,), 0)]), 32)
    values = np.arange(8, dtype=np.float32).tobytes()
    layout = validate_gguf(write(tmp_path, head + values))
    assert layout.tensors["t"].file_offset + layout.tensors["t"].nbytes == len(head) + 32
    with pytest.raises(GGUFError, match="runs past the end of the file"):
        validate_gguf(write(tmp_path, head + values[:-1], "cut.gguf"))


# ------------------------------------------------------------------ the data section's start


@pytest.mark.parametrize("alignment", [None, 64, 128])
def test_the_data_section_starts_at_the_next_multiple_of_the_alignment(tmp_path, alignment):
    kvs = [kv_u32("general.alignment", alignment)] if alignment else []
    step = alignment or 32  # GGUF's default
    for extra in range(0, step, 7):  # tensor infos ending at every few bytes of a block
        kvs_here = [*kvs, kv_string("test.pad", "p" * extra)]
        header = gguf(kvs_here, [tensor_info("t", (8,), 0)])
        start = -(-len(header) // step) * step
        content = header + b"\0" * (start - len(header)) + np.ones(8, np.float32).tobytes()
        layout = validate_gguf(write(tmp_path, content))
        assert layout.alignment == step and layout.data_offset == start, extra
        assert layout.tensors["t"].file_offset == start


def test_an_aligned_header_end_is_the_data_sections_start(tmp_path):
    for extra in range(32):
        header = gguf([kv_string("test.pad", "p" * extra)], [tensor_info("t", (8,), 0)])
        if len(header) % 32 == 0:
            break
    layout = validate_gguf(write(tmp_path, header + np.ones(8, np.float32).tobytes()))
    assert layout.data_offset == len(header)


def test_a_tensor_offset_off_the_alignment_is_refused(tmp_path):
    header = padded(gguf([], [tensor_info("a", (8,), 0), tensor_info("b", (8,), 48)]), 32)
    with pytest.raises(GGUFError, match="not a multiple of the alignment 32"):
        validate_gguf(write(tmp_path, header + b"\0" * 96))


# ------------------------------------------------------------------ neighbours and counts


def test_tensors_that_touch_do_not_overlap(tmp_path):
    header = padded(gguf([], [tensor_info("a", (8,), 0), tensor_info("b", (8,), 32)]), 32)
    layout = validate_gguf(write(tmp_path, header + b"\0" * 64))
    assert layout.tensors["b"].file_offset == layout.tensors["a"].file_offset + 32
    overlapping = padded(gguf([], [tensor_info("a", (16,), 0), tensor_info("b", (8,), 32)]), 32)
    with pytest.raises(GGUFError, match="overlap"):
        validate_gguf(write(tmp_path, overlapping + b"\0" * 96, "overlap.gguf"))


def test_four_dimensions_pass_and_five_do_not(tmp_path):
    four = padded(gguf([], [tensor_info("t", (2, 2, 2, 1), 0)]), 32)
    assert validate_gguf(write(tmp_path, four + b"\0" * 32)).tensors["t"].shape == (1, 2, 2, 2)
    five = padded(gguf([], [tensor_info("t", (2, 2, 2, 1, 1), 0)]), 32)
    with pytest.raises(GGUFError, match="5 dimensions"):
        validate_gguf(write(tmp_path, five + b"\0" * 32, "five.gguf"))


@pytest.mark.parametrize(
    ("dims", "refusal"),
    [
        ((INT64_MAX,), "runs past the end of the file"),
        ((7, INT64_MAX // 7), "runs past the end of the file"),
        ((INT64_MAX + 1,), "element count overflows int64"),
        ((7, INT64_MAX // 7 + 1), "element count overflows int64"),
    ],
)
def test_an_element_count_of_int64_max_fits_int64_and_one_more_overflows(tmp_path, dims, refusal):
    # ggml stores the element count as int64: INT64_MAX elements fit (such a tensor is refused
    # only because no file holds its data), one more does not.
    head = padded(gguf([], [tensor_info("t", dims, 0, GGMLQuantizationType.I8)]), 32)
    with pytest.raises(GGUFError, match=refusal):
        validate_gguf(write(tmp_path, head + b"\0" * 32))


def test_alignment_must_be_a_power_of_two(tmp_path):
    for bad in (0, 3, 48):
        with pytest.raises(GGUFError, match="not a non-zero power of two"):
            validate_gguf(write(tmp_path, gguf([kv_u32("general.alignment", bad)])))
    assert validate_gguf(write(tmp_path, gguf([kv_u32("general.alignment", 1)]))).alignment == 1


def test_a_duplicate_key_is_refused_even_last(tmp_path):
    content = gguf([kv_u32("a", 1), kv_u32("b", 2), kv_u32("a", 3)])
    with pytest.raises(GGUFError, match="duplicate metadata key 'a'"):
        validate_gguf(write(tmp_path, content))


# ------------------------------------------------------------------ the file's own alignment


@pytest.mark.parametrize(("alignment", "offset", "accepted"), [(64, 32, False), (16, 16, True)])
def test_tensor_offsets_follow_the_files_alignment_not_the_default(
    tmp_path, alignment, offset, accepted
):
    kvs = [kv_u32("general.alignment", alignment)]
    infos = [tensor_info("a", (4,), 0), tensor_info("b", (4,), offset)]
    content = padded(gguf(kvs, infos), alignment) + b"\0" * (offset + 16)
    if accepted:
        assert validate_gguf(write(tmp_path, content)).tensors["b"].nbytes == 16
    else:
        with pytest.raises(GGUFError, match=f"not a multiple of the alignment {alignment}"):
            validate_gguf(write(tmp_path, content))


# ------------------------------------------------------------------ names and nesting limits


@pytest.mark.parametrize(
    ("length", "accepted"), [(MAX_NAME_BYTES, True), (MAX_NAME_BYTES + 1, False)]
)
def test_a_key_may_be_as_long_as_the_name_limit(tmp_path, length, accepted):
    path = write(tmp_path, gguf([kv_u32("k" * length, 7)]))
    if accepted:
        assert validate_gguf(path).tensors == {}
    else:
        with pytest.raises(GGUFError, match="names are limited"):
            validate_gguf(path)


def nested_array(key: str, levels: int) -> bytes:
    """An array of arrays ``levels`` deep, the innermost holding one UINT32."""
    inner = struct.pack("<IQI", GGUFValueType.UINT32, 1, 5)
    for _ in range(levels - 1):
        inner = struct.pack("<IQ", GGUFValueType.ARRAY, 1) + inner
    return string(key) + struct.pack("<I", GGUFValueType.ARRAY) + inner


@pytest.mark.parametrize(
    ("levels", "accepted"), [(MAX_ARRAY_NESTING, True), (MAX_ARRAY_NESTING + 1, False)]
)
def test_arrays_nest_up_to_the_limit(tmp_path, levels, accepted):
    path = write(tmp_path, gguf([nested_array("test.nested", levels)]))
    if accepted:
        assert validate_gguf(path).tensors == {}
    else:
        with pytest.raises(GGUFError, match="nests arrays deeper"):
            validate_gguf(path)


@pytest.mark.parametrize("key", ["GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"])
def test_the_readers_own_field_names_are_refused_as_keys(tmp_path, key):
    with pytest.raises(GGUFError, match="reserved"):
        validate_gguf(write(tmp_path, gguf([kv_u32(key, 1)])))


def test_a_header_alone_is_a_whole_file_and_one_byte_less_is_not(tmp_path):
    # No metadata, no tensors: the 24 header bytes are all there is.
    header = gguf([])
    assert len(header) == 24
    layout = validate_gguf(write(tmp_path, header))
    assert layout.tensors == {} and layout.data_offset == 32
    with pytest.raises(GGUFError, match="truncated in the header"):
        validate_gguf(write(tmp_path, header[:-1], "short.gguf"))
