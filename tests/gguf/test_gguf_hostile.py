"""Malformed GGUF files: each must raise GGUFError naming the file and what is wrong, without a
crash, a hang or a large allocation."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ds4mlx.gguf import GGUFError, open_gguf

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf_anatomy import Anatomy

MAX_OPEN_ALLOCATION = 4 * 2**20  # bytes of Python/numpy memory opening a bad file may peak at


def with_u32(content: bytes, offset: int, value: int) -> bytes:
    return content[:offset] + struct.pack("<I", value) + content[offset + 4 :]


def with_u64(content: bytes, offset: int, value: int) -> bytes:
    return content[:offset] + struct.pack("<Q", value) + content[offset + 8 :]


def with_bytes(content: bytes, offset: int, value: bytes) -> bytes:
    return content[:offset] + value + content[offset + len(value) :]


@dataclass(frozen=True)
class Case:
    corrupt: Callable[[Anatomy], bytes]
    expected: tuple[str, ...]  # fragments the message must contain besides the file name


def key(a: Anatomy, name: str):
    return a.keys[name]


def info(a: Anatomy, name: str):
    return a.tensor_infos[name]


CASES = {
    # header
    "empty-file": Case(lambda a: b"", ("truncated in the header",)),
    "truncated-header": Case(lambda a: a.content[:20], ("truncated in the header",)),
    "bad-magic": Case(lambda a: with_bytes(a.content, 0, b"GGML"), ("bad magic b'GGML'",)),
    "version-1": Case(lambda a: with_u32(a.content, 4, 1), ("unsupported GGUF version 1",)),
    "version-from-the-future": Case(lambda a: with_u32(a.content, 4, 99), ("version 99",)),
    "big-endian": Case(lambda a: with_u32(a.content, 4, 3 << 24), ("big-endian",)),
    "absurd-tensor-count": Case(
        lambda a: with_u64(a.content, 8, 2**40),
        ("tensor count 1099511627776 is impossible: at least 32 bytes each",),
    ),
    "absurd-metadata-count": Case(
        lambda a: with_u64(a.content, 16, 2**62), ("metadata count", "impossible")
    ),
    # metadata
    "truncated-in-key": Case(
        lambda a: a.content[: key(a, "test.key_b").start + 3], ("truncated in metadata key #",)
    ),
    "truncated-in-string-value": Case(
        lambda a: a.content[: key(a, "test.name").value + 10],
        ("value of metadata key 'test.name'", "past the end"),
    ),
    "truncated-in-array": Case(
        lambda a: a.content[: key(a, "test.tokens").value + 20],
        ("metadata key 'test.tokens'",),
    ),
    "key-length-past-eof": Case(
        lambda a: with_u64(a.content, key(a, "test.key_a").start, 2**60),
        ("string length 1152921504606846976", "runs past the end of the file"),
    ),
    "key-too-long": Case(
        lambda a: with_u64(a.content, key(a, "test.key_a").start, 100_000) + bytes(100_000),
        ("names are limited to",),
    ),
    "string-value-length-past-eof": Case(
        lambda a: with_u64(a.content, key(a, "test.name").value, 2**50),
        ("value of metadata key 'test.name'", "runs past the end"),
    ),
    "array-count-absurd": Case(
        lambda a: with_u64(a.content, key(a, "test.scores").value + 4, 2**61),
        ("metadata key 'test.scores'", "array item count 2305843009213693952 is impossible"),
    ),
    "string-array-count-absurd": Case(
        lambda a: with_u64(a.content, key(a, "test.tokens").value + 4, 2**58),
        ("metadata key 'test.tokens'", "impossible"),
    ),
    "unknown-value-type": Case(
        lambda a: with_u32(a.content, key(a, "test.key_a").value_type, 99),
        ("unknown value type 99 in metadata key 'test.key_a'",),
    ),
    "unknown-array-item-type": Case(
        lambda a: with_u32(a.content, key(a, "test.scores").value, 77),
        ("unknown value type 77", "test.scores"),
    ),
    "duplicate-key": Case(
        lambda a: with_bytes(a.content, key(a, "test.key_b").start + 8, b"test.key_a"),
        ("duplicate metadata key 'test.key_a'",),
    ),
    "reserved-key": Case(
        lambda a: with_bytes(a.content, key(a, "test.counter").start + 8, b"GGUF.version"),
        ("metadata key 'GGUF.version' is reserved",),
    ),
    "key-not-utf8": Case(
        lambda a: with_bytes(a.content, key(a, "test.key_a").start + 8, b"\xff"),
        ("metadata key #", "not valid UTF-8"),
    ),
    "alignment-not-power-of-two": Case(
        lambda a: with_u32(a.content, key(a, "general.alignment").value, 48),
        ("'general.alignment' is 48, not a non-zero power of two",),
    ),
    "alignment-zero": Case(
        lambda a: with_u32(a.content, key(a, "general.alignment").value, 0),
        ("'general.alignment' is 0",),
    ),
    "alignment-wrong-type": Case(
        lambda a: with_u32(a.content, key(a, "general.alignment").value_type, GGUFValueType.INT32),
        ("'general.alignment' has type INT32, not UINT32",),
    ),
    # tensor infos
    "truncated-in-tensor-infos": Case(
        lambda a: a.content[: info(a, "b.weight").dims + 4],
        ("tensor 'b.weight'", "truncated"),
    ),
    "tensor-name-not-utf8": Case(
        lambda a: with_bytes(a.content, info(a, "a.weight").start + 8, b"\xc3("),
        ("name of tensor info #0", "not valid UTF-8"),
    ),
    "too-many-dims": Case(
        lambda a: with_u32(a.content, info(a, "a.weight").n_dims, 5),
        ("tensor 'a.weight' has 5 dimensions; 1 to 4 allowed",),
    ),
    "no-dims": Case(
        lambda a: with_u32(a.content, info(a, "a.weight").n_dims, 0),
        ("tensor 'a.weight' has 0 dimensions",),
    ),
    "element-count-overflow": Case(
        lambda a: with_u64(a.content, info(a, "a.weight").dims + 8, 2**62),
        ("tensor 'a.weight'", "element count overflows int64"),
    ),
    "huge-dims-past-eof": Case(
        lambda a: with_u64(a.content, info(a, "a.weight").dims + 8, 2**30),
        ("tensor 'a.weight' data", "runs past the end of the file"),
    ),
    "unknown-tensor-type": Case(
        lambda a: with_u32(a.content, info(a, "a.weight").type, 1234),
        ("unknown tensor type id 1234 in tensor 'a.weight'",),
    ),
    "removed-tensor-type": Case(  # id 4 was Q4_2, dropped from ggml
        lambda a: with_u32(a.content, info(a, "a.weight").type, 4),
        ("unknown tensor type id 4 in tensor 'a.weight'",),
    ),
    "row-not-a-whole-block": Case(
        lambda a: with_u32(a.content, info(a, "b.weight").type, GGMLQuantizationType.Q4_K),
        ("tensor 'b.weight' has rows of 32 values, not a multiple of the Q4_K block size 256",),
    ),
    "duplicate-tensor-name": Case(
        lambda a: with_bytes(a.content, info(a, "b.weight").start + 8, b"a"),
        ("duplicate tensor name 'a.weight'",),
    ),
    # tensor data
    "offset-past-eof": Case(
        lambda a: with_u64(a.content, info(a, "c.weight").offset, 2**40),
        ("tensor 'c.weight' data", "runs past the end of the file"),
    ),
    "misaligned-offset": Case(
        lambda a: with_u64(
            a.content, info(a, "b.weight").offset, a.tensor_data["b.weight"][0] - a.data_offset + 8
        ),
        ("tensor 'b.weight' has data offset", "not a multiple of the alignment 64"),
    ),
    "overlapping-tensors": Case(
        lambda a: with_u64(a.content, info(a, "c.weight").offset, 0),
        ("tensors 'a.weight'", "and 'c.weight'", "overlap"),
    ),
    "truncated-data": Case(
        lambda a: a.content[: a.tensor_data["c.weight"][0] + 5],
        ("tensor 'c.weight' data", "runs past the end of the file"),
    ),
    "truncated-before-data": Case(
        lambda a: a.content[: a.data_offset],
        ("tensor 'a.weight' data", "runs past the end of the file"),
    ),
}


def assert_refused(path: Path, expected: tuple[str, ...]) -> GGUFError:
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError) as caught:
            open_gguf(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(caught.value)
    assert str(path) in message
    for fragment in expected:
        assert fragment in message
    assert peak < MAX_OPEN_ALLOCATION, f"opening allocated {peak} bytes"
    return caught.value


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_malformed_file_is_refused(case: Case, anatomy: Anatomy, tmp_path: Path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(case.corrupt(anatomy))
    assert_refused(path, case.expected)


def test_cases_corrupt_a_file_that_is_valid(valid_gguf: Path):
    assert open_gguf(valid_gguf).tensor_names() == ["a.weight", "b.weight", "c.weight"]


def test_deeply_nested_array_is_refused(tmp_path: Path):
    path = tmp_path / "nested.gguf"
    writer = GGUFWriter(path, "deepseek4")
    nested: list = [1]
    for _ in range(12):
        nested = [nested]
    writer.add_array("test.nested", nested)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_refused(path, ("metadata key 'test.nested'", "nests arrays deeper than 8 levels"))


def test_missing_path_and_directory_are_refused(tmp_path: Path):
    assert_refused(tmp_path / "absent.gguf", ("cannot read file",))
    assert_refused(tmp_path, ("cannot read file",))


def test_unsupported_type_opens_but_cannot_be_loaded(tmp_path: Path):
    path = tmp_path / "q5k.gguf"
    writer = GGUFWriter(path, "deepseek4")
    blocks = np.zeros((2, 176), dtype=np.uint8)  # two Q5_K blocks
    writer.add_tensor("blk.0.ffn_up.weight", blocks, raw_dtype=GGMLQuantizationType.Q5_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_file = open_gguf(path)
    for load in (gguf_file.load_weight, gguf_file.dequantize):
        with pytest.raises(GGUFError) as caught:
            load("blk.0.ffn_up.weight")
        message = str(caught.value)
        assert str(path) in message
        assert "unsupported tensor type Q5_K in tensor 'blk.0.ffn_up.weight'" in message


def test_string_value_that_is_not_utf8_fails_when_read(anatomy: Anatomy, tmp_path: Path):
    path = tmp_path / "latin1.gguf"
    path.write_bytes(with_bytes(anatomy.content, anatomy.keys["test.name"].value + 8, b"\xe9"))
    gguf_file = open_gguf(path)  # values are decoded on demand, so opening succeeds
    with pytest.raises(GGUFError, match="metadata key 'test.name' holds a string that is not"):
        gguf_file.get("test.name")
    assert gguf_file.get("test.key_a") == 7


def test_tensor_with_a_zero_dimension(tmp_path):
    """Found by the fuzz test: an empty tensor passed validation, then crashed in reshape."""
    from ds4mlx.gguf import GGUFError, open_gguf

    import gguf
    import numpy as np

    path = tmp_path / "empty.gguf"
    writer = gguf.GGUFWriter(path, "deepseek4")
    writer.add_tensor("empty.weight", np.zeros((4, 0), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFError, match="empty.gguf.*'empty.weight'.*dimension is zero"):
        open_gguf(path)
