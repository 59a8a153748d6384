"""Memory-mapped GGUF access (first cut: validation and quant mapping are being added)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf import quants as gguf_quants

from ds4mlx.gguf.errors import GGUFError


class GGUFFile:
    """A GGUF file opened read-only through a memory map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.reader = GGUFReader(self.path, "r")
        except Exception as exc:  # noqa: BLE001 - any reader failure is a bad file
            raise GGUFError(f"{self.path}: cannot read GGUF: {exc}") from exc
        self._tensors = {t.name: t for t in self.reader.tensors}

    @property
    def arch(self) -> str:
        return str(self.require("general.architecture"))

    def get(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            return default
        return field.contents()

    def require(self, key: str) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            raise GGUFError(f"{self.path}: missing required metadata key '{key}'")
        return field.contents()

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def has_tensor(self, name: str) -> bool:
        return name in self._tensors

    def _tensor(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: missing tensor '{name}'") from None

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape in numpy (row-major) order, i.e. ggml's ne reversed."""
        return tuple(int(d) for d in reversed(self._tensor(name).shape.tolist()))

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        return self._tensor(name).tensor_type

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes/elements as a memory-mapped numpy view (no copy)."""
        return self._tensor(name).data

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy order."""
        t = self._tensor(name)
        out = gguf_quants.dequantize(t.data, t.tensor_type)
        return np.ascontiguousarray(out, dtype=np.float32).reshape(self.tensor_shape(name))


def open_gguf(path: str | Path) -> GGUFFile:
    return GGUFFile(path)
