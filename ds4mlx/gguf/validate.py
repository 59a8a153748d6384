"""Bounded pre-parse of a GGUF file's header, metadata and tensor infos.

``gguf.GGUFReader`` trusts every length and count it reads: on a damaged or hostile file it can
loop for 2**64 iterations, build a huge array, or fail with a bare numpy/struct traceback. This
module walks the same structure first with explicit bounds checks (nothing is read or allocated
before the file is known to hold it), so the reader is only ever handed a file it can parse, and
every defect becomes one ``GGUFError`` naming the file, the key or tensor, and what is wrong.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from ds4mlx.gguf.errors import GGUFError

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
)
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

ALIGNMENT_KEY = "general.alignment"
MAX_TENSOR_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 65536  # keys and tensor names are short; a huge one is corruption, not data
MAX_ARRAY_NESTING = 8  # real files nest at most once; deeper nesting only serves to blow the stack
INT64_MAX = 2**63 - 1  # ggml stores dims and element counts as int64

# GGUFReader files these pseudo-fields under the same names as metadata keys; a file that uses one
# as a key would make the reader fail on a "duplicate" it created itself.
RESERVED_KEYS = frozenset({"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"})

HEADER_BYTES = 4 + 4 + 8 + 8  # magic, version, tensor count, metadata count
SCALAR_SIZES = {
    value_type: np.dtype(numpy_type).itemsize
    for value_type, numpy_type in GGUFReader.gguf_scalar_to_np.items()
}
# The fewest bytes one entry can take: used to reject counts the rest of the file cannot hold
# before looping over them.
MIN_STRING_BYTES = 8  # the length prefix
MIN_ARRAY_BYTES = 4 + 8  # item type, item count
MIN_KV_BYTES = MIN_STRING_BYTES + 4 + min(SCALAR_SIZES.values())  # key, value type, 1-byte value
MIN_TENSOR_INFO_BYTES = MIN_STRING_BYTES + 4 + 8 + 4 + 8  # name, n_dims, one dim, type, offset


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in the file, as checked against the file's size."""

    name: str
    qtype: GGMLQuantizationType
    ggml_dims: tuple[int, ...]  # ggml's ne order: innermost (row length) first
    file_offset: int  # absolute byte offset of the tensor's data
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape in numpy (row-major) order, i.e. ggml's ne reversed."""
        return tuple(reversed(self.ggml_dims))


@dataclass(frozen=True)
class GGUFLayout:
    """The validated structure of a GGUF file."""

    version: int
    alignment: int
    data_offset: int  # start of the tensor data section
    tensors: dict[str, TensorInfo]  # in file order
    #: each metadata key's value type and the absolute offset of its value (read on demand)
    metadata: dict[str, tuple[GGUFValueType, int]]


#: a length-prefixed string's length (also how reader.py walks a string array)
U64 = struct.Struct("<Q")


class _BoundedCursor:
    """Reads little-endian fields from a buffer, refusing any read past its end."""

    def __init__(self, buffer: mmap.mmap, path: Path):
        self.buffer = buffer
        self.path = path
        self.size = len(buffer)
        self.position = 0

    @property
    def remaining(self) -> int:
        return self.size - self.position

    def fail(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}")

    def skip(self, nbytes: int, what: str) -> int:
        """Advances over ``nbytes`` bytes; returns where they start."""
        if nbytes > self.remaining:
            raise self.fail(
                f"file is truncated in {what}: {nbytes} bytes needed at offset {self.position}, "
                f"but the file ends at {self.size}"
            )
        start = self.position
        self.position += nbytes
        return start

    def u32(self, what: str) -> int:
        return struct.unpack_from("<I", self.buffer, self.skip(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack_from("<Q", self.buffer, self.skip(8, what))[0]

    def skip_string(self, what: str) -> tuple[int, int]:
        """Advances over a length-prefixed string without reading it; returns (start, length)."""
        length = self.u64(what)
        if length > self.remaining:
            raise self.fail(
                f"string length {length} in {what} runs past the end of the file "
                f"({self.remaining} bytes left at offset {self.position}): the file is "
                "truncated or the length is corrupt"
            )
        return self.skip(length, what), length

    def skip_strings(self, count: int, what: str) -> None:
        """Advances over ``count`` length-prefixed strings. A tokenizer's vocabulary and merges
        are ~260k strings in DeepSeek-V4-Flash, so the common case is one tight loop; a
        truncated or corrupt entry is walked again one string at a time for the exact message."""
        buffer, position, size = self.buffer, self.position, self.size
        unpack_length = U64.unpack_from
        for _ in range(count):
            if position + 8 > size:
                break
            position += 8 + unpack_length(buffer, position)[0]
            if position > size:
                break
        else:
            self.position = position
            return
        for _ in range(count):
            self.skip_string(what)

    def name(self, what: str) -> str:
        """A key or tensor name: bounded in length before it is copied out, and UTF-8."""
        start, length = self.skip_string(what)
        if length > MAX_NAME_BYTES:
            raise self.fail(f"{what} is {length} bytes long; names are limited to {MAX_NAME_BYTES}")
        try:
            return self.buffer[start : start + length].decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"{exc.reason} at byte {exc.start}"
            raise self.fail(f"{what} is not valid UTF-8 ({reason})") from None

    def require_room(self, count: int, min_entry_bytes: int, what: str) -> None:
        """Rejects a count that the rest of the file cannot hold, before looping over it."""
        if count * min_entry_bytes > self.remaining:
            raise self.fail(
                f"{what} count {count} is impossible: at least {min_entry_bytes} bytes each, "
                f"but only {self.remaining} bytes are left at offset {self.position} (the file "
                "is truncated or the count is corrupt)"
            )


def validate_gguf(path: str | Path) -> GGUFLayout:
    """Checks the whole structure of a GGUF file with bounded reads; raises ``GGUFError``."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            size = path.stat().st_size
            if size < HEADER_BYTES:
                raise GGUFError(
                    f"{path}: file is truncated in the header: {size} bytes, "
                    f"a GGUF header needs {HEADER_BYTES}"
                )
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                return _parse(_BoundedCursor(buffer, path))
    except OSError as exc:
        raise GGUFError(f"{path}: cannot read file: {exc.strerror or exc}") from exc


def _parse(cursor: _BoundedCursor) -> GGUFLayout:
    magic = cursor.u32("the magic number")
    if magic != GGUF_MAGIC:
        found = struct.pack("<I", magic)
        raise cursor.fail(f"not a GGUF file: bad magic {found!r} (expected b'GGUF')")
    version = cursor.u32("the version")
    if version not in READER_SUPPORTED_VERSIONS:
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        big_endian = swapped in READER_SUPPORTED_VERSIONS
        hint = " (a big-endian file, which is not supported)" if big_endian else ""
        supported = ", ".join(map(str, READER_SUPPORTED_VERSIONS))
        raise cursor.fail(f"unsupported GGUF version {version}{hint}; supported: {supported}")
    tensor_count = cursor.u64("the tensor count")
    kv_count = cursor.u64("the metadata count")
    cursor.require_room(kv_count, MIN_KV_BYTES, "metadata")
    cursor.require_room(tensor_count, MIN_TENSOR_INFO_BYTES, "tensor")

    metadata = _read_metadata(cursor, kv_count)
    alignment = _alignment(cursor, metadata)
    infos = _read_tensor_infos(cursor, tensor_count)
    data_offset = -(-cursor.position // alignment) * alignment
    tensors = _place_tensors(cursor, infos, data_offset, alignment)
    return GGUFLayout(version, alignment, data_offset, tensors, metadata)


def _value_type(cursor: _BoundedCursor, raw: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cursor.fail(f"unknown value type {raw} in {what}") from None


def _skip_value(cursor: _BoundedCursor, value_type: GGUFValueType, what: str, depth: int) -> None:
    if value_type in SCALAR_SIZES:
        cursor.skip(SCALAR_SIZES[value_type], what)
    elif value_type == GGUFValueType.STRING:
        cursor.skip_string(what)
    else:  # ARRAY
        if depth >= MAX_ARRAY_NESTING:
            raise cursor.fail(f"{what} nests arrays deeper than {MAX_ARRAY_NESTING} levels")
        item_type = _value_type(cursor, cursor.u32(what), f"the item type of {what}")
        count = cursor.u64(what)
        if item_type in SCALAR_SIZES:
            cursor.require_room(count, SCALAR_SIZES[item_type], f"{what}: array item")
            cursor.skip(count * SCALAR_SIZES[item_type], what)
        elif item_type == GGUFValueType.STRING:
            cursor.require_room(count, MIN_STRING_BYTES, f"{what}: array item")
            cursor.skip_strings(count, what)
        else:
            cursor.require_room(count, MIN_ARRAY_BYTES, f"{what}: array item")
            for _ in range(count):
                _skip_value(cursor, item_type, what, depth + 1)


def _read_metadata(cursor: _BoundedCursor, kv_count: int) -> dict[str, tuple[GGUFValueType, int]]:
    """Walks the metadata; returns each key's value type and where its value starts."""
    metadata: dict[str, tuple[GGUFValueType, int]] = {}
    for index in range(kv_count):
        key = cursor.name(f"metadata key #{index}")
        where = f"metadata key '{key}'"
        if key in metadata:
            raise cursor.fail(f"duplicate {where}")
        if key in RESERVED_KEYS:
            raise cursor.fail(f"{where} is reserved for the reader's own fields")
        value_type = _value_type(cursor, cursor.u32(where), where)
        metadata[key] = value_type, cursor.position
        _skip_value(cursor, value_type, f"the value of {where}", depth=0)
    return metadata


def _alignment(cursor: _BoundedCursor, metadata: dict[str, tuple[GGUFValueType, int]]) -> int:
    if ALIGNMENT_KEY not in metadata:
        return GGUF_DEFAULT_ALIGNMENT
    value_type, value_start = metadata[ALIGNMENT_KEY]
    if value_type != GGUFValueType.UINT32:
        raise cursor.fail(f"metadata key '{ALIGNMENT_KEY}' has type {value_type.name}, not UINT32")
    alignment = struct.unpack_from("<I", cursor.buffer, value_start)[0]
    if alignment == 0 or alignment & (alignment - 1):
        raise cursor.fail(
            f"metadata key '{ALIGNMENT_KEY}' is {alignment}, not a non-zero power of two"
        )
    return alignment


@dataclass(frozen=True)
class _RawTensorInfo:
    name: str
    ggml_dims: tuple[int, ...]
    raw_type: int
    relative_offset: int


def _read_tensor_infos(cursor: _BoundedCursor, tensor_count: int) -> list[_RawTensorInfo]:
    infos: list[_RawTensorInfo] = []
    for index in range(tensor_count):
        # A cut inside a name leaves it unreadable: the tensor before it locates the damage.
        after = f" (after tensor '{infos[-1].name}')" if infos else ""
        name = cursor.name(f"the name of tensor info #{index}{after}")
        where = f"tensor '{name}'"
        n_dims = cursor.u32(f"the dimension count of {where}")
        if not 1 <= n_dims <= MAX_TENSOR_DIMS:
            raise cursor.fail(f"{where} has {n_dims} dimensions; 1 to {MAX_TENSOR_DIMS} allowed")
        dims = tuple(cursor.u64(f"the dimensions of {where}") for _ in range(n_dims))
        raw_type = cursor.u32(f"the type of {where}")
        relative_offset = cursor.u64(f"the data offset of {where}")
        infos.append(_RawTensorInfo(name, dims, raw_type, relative_offset))
    return infos


def _tensor_type(cursor: _BoundedCursor, raw_type: int, where: str) -> GGMLQuantizationType:
    try:
        qtype = GGMLQuantizationType(raw_type)
    except ValueError:
        qtype = None
    if qtype is None or qtype not in GGML_QUANT_SIZES:
        raise cursor.fail(f"unknown tensor type id {raw_type} in {where}")
    return qtype


def _tensor_nbytes(
    cursor: _BoundedCursor, info: _RawTensorInfo, qtype: GGMLQuantizationType
) -> int:
    where = f"tensor '{info.name}'"
    if 0 in info.ggml_dims:
        # No model has an empty weight, and readers downstream cannot shape one.
        raise cursor.fail(f"{where} has dimensions {list(info.ggml_dims)}: a dimension is zero")
    n_elements = 1
    for dim in info.ggml_dims:
        n_elements *= dim  # Python ints: the product itself cannot overflow here
        if n_elements > INT64_MAX:
            raise cursor.fail(
                f"{where} has dimensions {list(info.ggml_dims)} whose element count overflows int64"
            )
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if info.ggml_dims[0] % block_size:
        raise cursor.fail(
            f"{where} has rows of {info.ggml_dims[0]} values, not a multiple of the "
            f"{qtype.name} block size {block_size}"
        )
    return n_elements // block_size * type_size


def _place_tensors(
    cursor: _BoundedCursor, infos: list[_RawTensorInfo], data_offset: int, alignment: int
) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for info in infos:
        where = f"tensor '{info.name}'"
        if info.name in tensors:
            raise cursor.fail(f"duplicate tensor name '{info.name}'")
        qtype = _tensor_type(cursor, info.raw_type, where)
        nbytes = _tensor_nbytes(cursor, info, qtype)
        if info.relative_offset % alignment:
            raise cursor.fail(
                f"{where} has data offset {info.relative_offset}, not a multiple of the "
                f"alignment {alignment}"
            )
        start = data_offset + info.relative_offset
        if start + nbytes > cursor.size:
            raise cursor.fail(
                f"{where} data (bytes {start}..{start + nbytes}) runs past the end of the file "
                f"({cursor.size} bytes): the file is truncated or the offset is corrupt"
            )
        tensors[info.name] = TensorInfo(info.name, qtype, info.ggml_dims, start, nbytes)
    _reject_overlaps(cursor, tensors.values())
    return tensors


def _reject_overlaps(cursor: _BoundedCursor, tensors: Iterable[TensorInfo]) -> None:
    by_start = sorted((t for t in tensors if t.nbytes), key=lambda t: t.file_offset)
    for before, after in pairwise(by_start):
        if before.file_offset + before.nbytes > after.file_offset:
            raise cursor.fail(
                f"tensors '{before.name}' (bytes {before.file_offset}.."
                f"{before.file_offset + before.nbytes}) and '{after.name}' (from byte "
                f"{after.file_offset}) overlap"
            )
