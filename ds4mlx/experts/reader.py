"""Bounded positional reads of single experts out of a GGUF file's stacked expert tensors.

A stacked tensor [E, out, in] stores expert e's rows contiguously at ``file_offset + e * size``
with ``size = nbytes / E``. Reads use ``os.pread`` into private buffers, not the memory map: the
bytes then count once (in the slab), the page cache is not charged to the process, and a short
read (a file truncated under us) is detected and reported instead of faulting.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ds4mlx.gguf import GGUFError
from ds4mlx.gguf.quants import SUPPORTED_TYPES, HostWeight, host_weight
from ds4mlx.gguf.validate import TensorInfo

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
_DENSE_DTYPES = {T.F32: np.float32, T.F16: np.float16}


@dataclass(frozen=True)
class ExpertTensor:
    """One stacked expert tensor's placement, checked against the file."""

    name: str
    qtype: GGMLQuantizationType
    n_experts: int
    expert_shape: tuple[int, ...]  # [out, in]
    file_offset: int
    expert_nbytes: int

    @classmethod
    def from_info(cls, path: Path, info: TensorInfo, file_size: int) -> ExpertTensor:
        """Raises GGUFError unless the tensor is a stack whose every expert lies in the file."""
        shape = info.shape
        if len(shape) == 2:  # writers drop a trailing ne of 1: a single expert
            shape = (1, *shape)
        if len(shape) != 3 or min(shape) <= 0:
            raise GGUFError(
                f"{path}: expert tensor '{info.name}' has shape {list(info.shape)}, "
                "expected [experts, out, in]"
            )
        if info.qtype not in SUPPORTED_TYPES:
            raise GGUFError(
                f"{path}: unsupported tensor type {info.qtype.name} in tensor '{info.name}'"
            )
        n_experts, out, inner = shape
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        if inner % block:
            raise GGUFError(
                f"{path}: tensor '{info.name}' rows of {inner} values are not "
                f"whole {info.qtype.name} blocks of {block}"
            )
        expert_nbytes = out * inner // block * type_size
        if info.nbytes != n_experts * expert_nbytes:
            raise GGUFError(
                f"{path}: tensor '{info.name}' holds {info.nbytes} bytes, expected "
                f"{n_experts} experts x {expert_nbytes}"
            )
        if info.file_offset < 0 or info.file_offset + info.nbytes > file_size:
            raise GGUFError(
                f"{path}: tensor '{info.name}' spans bytes {info.file_offset}.."
                f"{info.file_offset + info.nbytes}, past the end of the file "
                f"({file_size} bytes)"
            )
        return cls(info.name, info.qtype, n_experts, (out, inner), info.file_offset, expert_nbytes)

    def raw_view(self, buffer: np.ndarray) -> np.ndarray:
        """One expert's bytes as ``GGUFReader`` would map them (typed for F32/F16)."""
        dtype = _DENSE_DTYPES.get(self.qtype)
        if dtype is not None:
            return buffer.view(dtype).reshape(self.expert_shape)
        return buffer.reshape(self.expert_shape[0], -1)


class ExpertReader:
    """Reads and converts single experts; safe to call from several threads at once."""

    def __init__(self, path: str | Path, mode: str | None):
        self.path = Path(path)
        self.mode = mode
        self._fd = os.open(self.path, os.O_RDONLY)
        self.file_size = os.fstat(self._fd).st_size
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.reads = 0
        self.read_seconds = 0.0  # summed over reads (threads overlap: per-read throughput)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def read_bytes(self, tensor: ExpertTensor, expert: int) -> np.ndarray:
        """Expert ``expert``'s stored bytes (uint8), never reading outside the tensor."""
        if not 0 <= expert < tensor.n_experts:
            raise GGUFError(
                f"{self.path}: expert {expert} out of range for tensor "
                f"'{tensor.name}' ({tensor.n_experts} experts)"
            )
        offset = tensor.file_offset + expert * tensor.expert_nbytes
        end = offset + tensor.expert_nbytes
        if offset < 0 or end > self.file_size:
            raise GGUFError(
                f"{self.path}: expert {expert} of '{tensor.name}' at bytes "
                f"{offset}..{end} lies outside the file ({self.file_size} bytes)"
            )
        buffer = np.empty(tensor.expert_nbytes, np.uint8)
        view = memoryview(buffer)
        started = time.perf_counter()
        done = 0
        while done < len(buffer):
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n <= 0:
                raise GGUFError(
                    f"{self.path}: short read of expert {expert} of "
                    f"'{tensor.name}' ({done} of {len(buffer)} bytes at offset "
                    f"{offset}): the file was truncated or changed"
                )
            done += n
        elapsed = time.perf_counter() - started
        with self._lock:
            self.bytes_read += done
            self.reads += 1
            self.read_seconds += elapsed
        return buffer

    def read_tensor(self, tensor: ExpertTensor, expert: int) -> HostWeight:
        """One expert of one tensor, converted as the resident weights are."""
        return host_weight(
            tensor.raw_view(self.read_bytes(tensor, expert)),
            tensor.qtype,
            tensor.expert_shape,
            self.mode,
        )

    def read_expert(self, tensors: tuple[ExpertTensor, ...], expert: int) -> tuple[HostWeight, ...]:
        """One expert of each tensor (gate, up, down)."""
        return tuple(self.read_tensor(t, expert) for t in tensors)

    def drop_page_cache(self) -> bool:
        """Asks the kernel to drop this file's cached pages (so later reads come from the disk).
        Returns whether the platform supports it; dirty or mapped pages may stay."""
        if not hasattr(os, "posix_fadvise"):
            return False
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
