"""Memory-mapped, validated GGUF access.

``open_gguf`` first walks the file with ``validate.validate_gguf`` (bounded reads only), then
maps it: metadata values are decoded when asked for, from the offsets the walk recorded, and
tensor bytes are numpy views of the map converted one at a time, so the file is never copied
into RAM. ``gguf.GGUFReader`` (which parses every field up front: 2-4 s for a real
vocabulary's 260k strings) is built only for the callers that copy whole fields.
"""

from __future__ import annotations

import importlib.metadata
import mmap
import struct
import sys
import time
from collections.abc import Callable, Sequence
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from ds4mlx.gguf import quants
from ds4mlx.gguf.errors import GGUFError
from ds4mlx.gguf.validate import U64, GGUFLayout, TensorInfo, validate_gguf
from ds4mlx.kernels import PackedWeight, Weight
from ds4mlx.kernels.native import native_ops

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape


class _Reader(GGUFReader):
    """``GGUFReader`` over a plain array view of its memory map: numpy's memmap bookkeeping on
    every slice (``__getitem__``, ``__array_finalize__``) was most of the time parsing a real
    vocabulary's 257k metadata strings (a 129k-token tokenizer and its merges)."""

    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.memmap) -> None:
        self._plain = mapped.view(np.ndarray)


# Tensor types GGUFReader maps as typed elements; every other type is a byte array of blocks.
_ELEMENT_TYPES = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}


def _tensor_view(file_bytes: np.ndarray, info: TensorInfo) -> np.ndarray:
    """Tensor ``info``'s data as ``GGUFReader`` presents it (typed elements in numpy order, or
    the blocks' bytes row by row), a view of the mapped file."""
    data = file_bytes[info.file_offset : info.file_offset + info.nbytes]
    element = _ELEMENT_TYPES.get(info.qtype)
    if element is not None:
        return data.view(element).reshape(info.shape)
    return data.reshape(quant_shape_to_byte_shape(info.shape, info.qtype))


def _metadata_value(buffer: mmap.mmap, value_type: GGUFValueType, offset: int) -> tuple[Any, int]:
    """The value of ``value_type`` at ``offset`` (validated) and the offset after it."""
    if value_type in _SCALAR_FORMATS:
        scalar = struct.Struct(_SCALAR_FORMATS[value_type])
        return scalar.unpack_from(buffer, offset)[0], offset + scalar.size
    if value_type == GGUFValueType.STRING:
        (length,) = struct.unpack_from("<Q", buffer, offset)
        start = offset + 8
        return str(buffer[start : start + length], "utf-8"), start + length
    item_type, count = struct.unpack_from("<IQ", buffer, offset)
    item_type, offset = GGUFValueType(item_type), offset + 12
    if item_type in _SCALAR_FORMATS:
        items = np.frombuffer(buffer, _SCALAR_FORMATS[item_type], count, offset)
        return items.tolist(), offset + items.nbytes
    if item_type == GGUFValueType.STRING:  # a vocabulary: 129k strings in one tight loop
        strings = []
        for _ in range(count):
            start = offset + 8
            offset = start + U64.unpack_from(buffer, offset)[0]
            strings.append(str(buffer[start:offset], "utf-8"))
        return strings, offset
    values = []
    for _ in range(count):
        value, offset = _metadata_value(buffer, item_type, offset)
        values.append(value)
    return values, offset


class GGUFFile:
    """A GGUF file opened read-only through a memory map, after full structural validation."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.layout: GGUFLayout = validate_gguf(self.path)
        try:
            with open(self.path, "rb") as file:
                self.mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise GGUFError(f"{self.path}: cannot read file: {exc.strerror or exc}") from exc
        file_bytes = np.frombuffer(self.mapping, np.uint8)
        self._data = {
            name: _tensor_view(file_bytes, info) for name, info in self.layout.tensors.items()
        }
        # Called with (tensor name, bytes) after each tensor is converted: loading progress.
        self.on_tensor_loaded: Callable[[str, int], None] | None = None
        # Tensors mapped as stored (CPU block kernels) and tensors converted, with the seconds
        # conversion took: what ``ds4 -v`` reports of a load.
        self.mapped_tensors = 0
        self.converted_tensors = 0
        self.conversion_seconds = 0.0

    @property
    def arch(self) -> str:
        return str(self.require("general.architecture"))

    @cached_property
    def reader(self) -> GGUFReader:
        """The file's fields as ``gguf.GGUFReader`` parses them, for copying whole fields
        (writing a support GGUF); values are read with ``get``."""
        try:
            return _Reader(self.path, "r")
        except (ValueError, KeyError, IndexError, OverflowError) as exc:
            # Should be unreachable: validation covers every check the reader makes.
            raise GGUFError(f"{self.path}: gguf.GGUFReader rejected the file: {exc}") from exc

    def get(self, key: str, default: Any = None) -> Any:
        entry = self.layout.metadata.get(key)
        if entry is None:
            return default
        try:
            return _metadata_value(self.mapping, *entry)[0]
        except UnicodeDecodeError as exc:
            raise GGUFError(
                f"{self.path}: metadata key '{key}' holds a string that is not valid UTF-8 "
                f"({exc.reason} at byte {exc.start})"
            ) from None

    def writer_type(self, key: str) -> GGUFValueType:
        """The value type a GGUF writer is given for ``key``'s value: its scalar type, or the
        item type of an array."""
        value_type, offset = self.layout.metadata[key]
        if value_type != GGUFValueType.ARRAY:
            return value_type
        return GGUFValueType(struct.unpack_from("<I", self.mapping, offset)[0])

    def require(self, key: str) -> Any:
        if key not in self.layout.metadata:
            raise GGUFError(f"{self.path}: missing required metadata key '{key}'")
        return self.get(key)

    def tensor_names(self) -> list[str]:
        return list(self.layout.tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self.layout.tensors

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.layout.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: missing tensor '{name}'") from None

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape in numpy (row-major) order, i.e. ggml's ne reversed."""
        return self._info(name).shape

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        return self._info(name).qtype

    def expect_shape(self, name: str, shape: Sequence[int]) -> None:
        """Raises GGUFError unless tensor ``name`` exists with exactly this (numpy-order) shape."""
        actual = self.tensor_shape(name)
        if actual != tuple(shape):
            raise GGUFError(
                f"{self.path}: tensor '{name}' has shape {list(actual)}, expected {list(shape)}"
            )

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes/elements as a memory-mapped numpy view (no copy)."""
        self._info(name)
        return self._data[name]

    def _supported_info(self, name: str) -> TensorInfo:
        info = self._info(name)
        if info.qtype not in quants.SUPPORTED_TYPES:
            supported = ", ".join(sorted(t.name for t in quants.SUPPORTED_TYPES))
            raise GGUFError(
                f"{self.path}: unsupported tensor type {info.qtype.name} in tensor '{name}' "
                f"(supported: {supported})"
            )
        return info

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy order (via the ``gguf`` package's reference code)."""
        info = self._supported_info(name)
        array = quants.dequantize(self._data[name], info.qtype, info.shape)
        self.mark_loaded(name)
        return array

    def mark_loaded(self, name: str, nbytes: int | None = None) -> None:
        """Tensor ``name`` (``nbytes`` of it: a shard) is converted: unmap its file pages and
        report it to ``on_tensor_loaded``."""
        info = self._info(name)
        self._release_pages(info)
        if self.on_tensor_loaded is not None:
            self.on_tensor_loaded(name, info.nbytes if nbytes is None else nbytes)

    def _release_pages(self, info: TensorInfo) -> None:
        """Unmaps a converted tensor's file pages from this process. Pages touched through the
        memory map count in its RSS until unmapped, so a loaded model would otherwise show
        twice its weights (the converted copy and the file). They stay in the OS page cache;
        every weight is a copy, so nothing reads them again."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = info.file_offset - info.file_offset % mmap.PAGESIZE
        length = info.file_offset + info.nbytes - start
        if length > 0 and start + length <= len(self.mapping):
            self.mapping.madvise(mmap.MADV_DONTNEED, start, length)

    def load_weight(self, name: str, mode: str | None = None) -> Weight:
        """The tensor as a weight for ``kernels.linear``/``gather_linear``/``take_rows``.

        ``mode`` is "f32" (float32 array) or "native" (the file's precision, MLX-quantized where
        that is exact, else packed blocks); None picks ``quants.default_weight_mode()``
        ("native" with Metal or the CPU's block kernels, "f32" without). See
        ``ds4mlx.gguf.quants``.
        """
        info = self._supported_info(name)
        mode = mode or quants.default_weight_mode()
        if quants.keeps_blocks(info.qtype, info.shape, mode) and maps_blocks():
            # Loaded by mapping: the blocks are read where they lie, when a kernel first does.
            shape = list(quants.block_bytes_shape(info.qtype, info.shape))
            data = native_ops().mapped_bytes(str(self.path), info.file_offset, shape)
            self.mapped_tensors += 1
            self.mark_loaded(name)
            return PackedWeight(data, info.qtype)
        start = time.perf_counter()
        weight = quants.load_weight(self._data[name], info.qtype, info.shape, mode)
        self.conversion_seconds += time.perf_counter() - start
        self.converted_tensors += 1
        self.mark_loaded(name)
        return weight


@cache
def maps_blocks() -> bool:
    """Whether the CPU's blocks load by mapping the file. The native operations wrap a mapping
    as an MLX buffer the way MLX's CPU allocator lays one out, which is MLX's internal business:
    checked once; where it differs the blocks are copied from the file instead, with a word."""
    if native_ops().mapping_supported():
        return True
    print(
        f"ds4mlx: MLX {importlib.metadata.version('mlx')} lays out its CPU buffers differently "
        "from what the mapping loader expects; GGUF blocks are copied from the file instead "
        "(a slower load, the same results)",
        file=sys.stderr,
    )
    return False


def open_gguf(path: str | Path) -> GGUFFile:
    return GGUFFile(path)
