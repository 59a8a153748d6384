"""Named model tensors checked against an architecture's shape table.

Each architecture lists every tensor it reads with its shape in numpy order ([out, in] for
matmul weights, [expert, out, in] for stacks: ggml's ``ne`` reversed). Modules then ask for
tensors by name only. Matmul weights are whatever ``ds4mlx.kernels`` takes; the small tensors
used elementwise (norms, biases, mixes) are float32 arrays; routing tables are int32.

GGUF writers drop trailing ``ne`` entries of 1 (ggml's ``n_dims``), so a [1, out, in] stack may
be stored as [out, in] and a [1, n] row as [n]: such a file is accepted and the tensor reshaped
to the table's shape.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ds4mlx.experts import ExpertStore, LayerExperts, ResidentStore
from ds4mlx.gguf import GGUFError, GGUFFile
from ds4mlx.kernels import QuantizedWeight, Weight, freeze

import mlx.core as mx
import numpy as np

Shape = tuple[int, ...]


def _strip_leading_ones(shape: Shape) -> Shape:
    start = 0
    while start < len(shape) - 1 and shape[start] == 1:
        start += 1
    return shape[start:]


def view_weight(w: Weight, shape: Shape) -> Weight:
    """``w`` with its leading dims (everything but the input dim) regrouped to ``shape``, for
    any weight kind; e.g. [groups * rows, cols] -> [groups, rows, cols]."""

    def view(a: mx.array) -> mx.array:
        # Evaluated here: a pending reshape would be replayed by every step that reads it.
        viewed = a.reshape(*shape[:-1], a.shape[-1])
        mx.eval(viewed)
        return viewed

    if isinstance(w, mx.array):
        return view(w.reshape(*shape[:-1], -1))
    if isinstance(w, QuantizedWeight):
        biases = None if w.biases is None else view(w.biases)
        return replace(w, packed=view(w.packed), scales=view(w.scales), biases=biases)
    return replace(w, data=view(w.data))


class Weights(ABC):
    """Tensors by name, each checked against ``shapes`` (name -> numpy-order shape)."""

    error: type[Exception] = ValueError  # what a missing or misshapen tensor raises
    #: Inference weights, never updated nor differentiated: matrices are ``freeze``d (stacked
    #: routed experts are not: their fused kernels read them as stored).
    frozen: bool = False

    def __init__(
        self, shapes: Mapping[str, Shape], source: str, expert_store: ExpertStore | None = None
    ):
        self.shapes = shapes
        self.source = source  # where the tensors come from, for error messages
        self.expert_store = expert_store or ResidentStore()

    @abstractmethod
    def _shape(self, name: str) -> Shape | None:
        """The stored shape, None when the tensor is absent."""

    @abstractmethod
    def _matrix(self, name: str) -> Weight: ...

    @abstractmethod
    def _floats(self, name: str) -> mx.array: ...

    @abstractmethod
    def _ints(self, name: str) -> mx.array: ...

    def has(self, name: str) -> bool:
        """Whether an optional tensor is present (it is still checked when read)."""
        return self._shape(name) is not None

    def _check(self, name: str, alternatives: Sequence[Shape] = ()) -> tuple[Shape, Shape]:
        """(the allowed shape the stored one matches, the stored shape)."""
        allowed = (self.shapes[name], *alternatives)
        actual = self._shape(name)
        if actual is None:
            raise self.error(f"{self.source}: missing tensor '{name}'")
        for shape in allowed:
            if _strip_leading_ones(actual) == _strip_leading_ones(shape):
                return shape, actual
        want = " or ".join(str(list(s)) for s in allowed)
        raise self.error(
            f"{self.source}: tensor '{name}' has shape {list(actual)}, expected {want}"
        )

    def matrix(self, name: str) -> Weight:
        w = self._shaped_matrix(name)
        return self._prepared(w) if len(w.shape) == 2 else self._in_compute_dtype(w)

    def matrix_stack(self, name: str) -> Weight:
        """A stack of matrices [..., out, in] that every product reads whole (MLA's per-head
        ``attn_k_b`` / ``attn_v_b``; not routed experts, whose kernels read them as stored),
        prepared as a 2-D ``matrix`` is: frozen for inference, so that a product of it takes
        no transpose."""
        return self._prepared(self._shaped_matrix(name))

    def _shaped_matrix(self, name: str) -> Weight:
        """The stored matrix ``name`` viewed in its expected shape."""
        shape, actual = self._check(name)
        w = self._matrix(name)
        return w if actual == shape else view_weight(w, shape)

    def _prepared(self, w: Weight) -> Weight:
        return freeze(self._in_compute_dtype(w)) if self.frozen else w

    def _in_compute_dtype(self, w: Weight) -> Weight:
        """An inference matrix (or stack) stored as F16/BF16 in the compute dtype, float32 (the
        same values): a product with float32 rows would convert the whole matrix on every call
        (the GPU path's F16/BF16 matrices; GLM's per-head stacks)."""
        if self.frozen and isinstance(w, mx.array) and w.dtype in (mx.float16, mx.bfloat16):
            w = w.astype(mx.float32)
            mx.eval(w)
        return w

    def param(self, name: str) -> mx.array:
        shape, _ = self._check(name)
        return self._floats(name).reshape(shape)

    def ints(self, name: str) -> mx.array:
        shape, _ = self._check(name)
        return self._ints(name).reshape(shape)

    def routed_experts(self, names: Sequence[str], n_used: int) -> LayerExperts:
        """A layer's stacked routed experts (gate, up, down tensor names), held by this
        weights' expert store (resident unless a streamed store was given)."""
        for name in names:
            self._check(name)
        gate, up, down = names
        return self.expert_store.layer((gate, up, down), self.matrix, n_used)

    def grouped(self, name: str, groups: int) -> Weight:
        """A block-diagonal weight listed as [groups * rows, cols], as a stack [groups, rows,
        cols] (files may store either)."""
        rows, cols = self.shapes[name]
        stacked = (groups, rows // groups, cols)
        self._check(name, (stacked,))
        return self._prepared(view_weight(self._matrix(name), stacked))


class GGUFWeights(Weights):
    """Tensors read from a GGUF file; matmul weights through ``GGUFFile.load_weight``."""

    error = GGUFError
    frozen = True

    def __init__(
        self,
        shapes: Mapping[str, Shape],
        gguf: GGUFFile,
        mode: str | None,
        expert_store: ExpertStore | None = None,
    ):
        super().__init__(shapes, str(gguf.path), expert_store)
        self.gguf = gguf
        self.mode = mode  # GGUFFile.load_weight's mode: "f32", "native" or None (its default)

    def _shape(self, name: str) -> Shape | None:
        return self.gguf.tensor_shape(name) if self.gguf.has_tensor(name) else None

    def _matrix(self, name: str) -> Weight:
        return self.gguf.load_weight(name, self.mode)

    def _floats(self, name: str) -> mx.array:
        return mx.array(self.gguf.dequantize(name))

    def _ints(self, name: str) -> mx.array:
        return mx.array(np.asarray(self.gguf.raw(name)).astype(np.int32))


class ArrayWeights(Weights):
    """Tensors given as float32 MLX arrays keyed by their GGUF names (training, export checks).

    The arrays are used as given, so gradients taken with respect to them flow into the model.
    """

    def __init__(self, shapes: Mapping[str, Shape], arrays: Mapping[str, mx.array]):
        super().__init__(shapes, "model arrays")
        self.arrays = arrays

    def _shape(self, name: str) -> Shape | None:
        return tuple(self.arrays[name].shape) if name in self.arrays else None

    def _matrix(self, name: str) -> Weight:
        return self.arrays[name]

    def _floats(self, name: str) -> mx.array:
        return self.arrays[name]

    def _ints(self, name: str) -> mx.array:
        return self.arrays[name].astype(mx.int32)


class RenamedWeights:
    """What the model modules read (``blk.{i}.*`` and friends) served from tensors stored under
    other names: ``file_name`` maps a module's name to the stored one. Shape checks and their
    errors happen in ``inner``, whose shape table uses the stored names."""

    def __init__(self, inner: Weights, file_name: Callable[[str], str]):
        self.inner = inner
        self.file_name = file_name

    def has(self, name: str) -> bool:
        return self.inner.has(self.file_name(name))

    def matrix(self, name: str) -> Weight:
        return self.inner.matrix(self.file_name(name))

    def param(self, name: str) -> mx.array:
        return self.inner.param(self.file_name(name))

    def ints(self, name: str) -> mx.array:
        return self.inner.ints(self.file_name(name))

    def grouped(self, name: str, groups: int) -> Weight:
        return self.inner.grouped(self.file_name(name), groups)

    def routed_experts(self, names: Sequence[str], n_used: int) -> LayerExperts:
        return self.inner.routed_experts([self.file_name(name) for name in names], n_used)
