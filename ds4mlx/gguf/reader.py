"""Memory-mapped, validated GGUF access.

``open_gguf`` first walks the file with ``validate.validate_gguf`` (bounded reads only), then
hands it to ``gguf.GGUFReader``, which memory-maps it: metadata values and tensor bytes are read
on demand and tensors are converted one at a time, so the file is never copied into RAM.
"""

from __future__ import annotations

import importlib.metadata
import mmap
import sys
import time
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from ds4mlx.gguf import quants
from ds4mlx.gguf.errors import GGUFError
from ds4mlx.gguf.validate import GGUFLayout, TensorInfo, validate_gguf
from ds4mlx.kernels import PackedWeight, Weight
from ds4mlx.kernels.native import native_ops

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader


class _Reader(GGUFReader):
    """``GGUFReader`` over a plain array view of its memory map: numpy's memmap bookkeeping on
    every slice (``__getitem__``, ``__array_finalize__``) was most of the time parsing a real
    vocabulary's 257k metadata strings (a 129k-token tokenizer and its merges)."""

    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.memmap) -> None:
        self.mapped = mapped  # the memmap itself, whose pages _release_pages gives back
        self._plain = mapped.view(np.ndarray)


class GGUFFile:
    """A GGUF file opened read-only through a memory map, after full structural validation."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.layout: GGUFLayout = validate_gguf(self.path)
        try:
            self.reader = _Reader(self.path, "r")
        except (ValueError, KeyError, IndexError, OverflowError) as exc:
            # Should be unreachable: validation covers every check the reader makes.
            raise GGUFError(f"{self.path}: gguf.GGUFReader rejected the file: {exc}") from exc
        self._data = {t.name: t.data for t in self.reader.tensors}
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

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except UnicodeDecodeError as exc:
            raise GGUFError(
                f"{self.path}: metadata key '{key}' holds a string that is not valid UTF-8 "
                f"({exc.reason} at byte {exc.start})"
            ) from None

    def require(self, key: str) -> Any:
        if key not in self.reader.fields:
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
        mapping = getattr(self.reader.mapped, "_mmap", None)  # numpy memmap's mmap object
        if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = info.file_offset - info.file_offset % mmap.PAGESIZE
        length = info.file_offset + info.nbytes - start
        if length > 0 and start + length <= len(mapping):
            mapping.madvise(mmap.MADV_DONTNEED, start, length)

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
