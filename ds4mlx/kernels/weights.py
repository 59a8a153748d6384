"""The weight kinds ``kernels.linear`` accepts besides a plain ``mx.array``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import mlx.core as mx
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight in one of MLX's own quantized layouts, for ``mx.quantized_matmul``/``gather_qmm``.

    ``packed`` is uint32 [..., out, in * bits / 32]; ``scales`` (and ``biases`` in "affine" mode,
    None in "mxfp4" mode) are [..., out, in / group_size]. Each value is
    ``scale * q + bias`` ("affine") or ``e2m1(q) * 2**(scale - 127)`` ("mxfp4").
    """

    packed: mx.array
    scales: mx.array
    biases: mx.array | None
    bits: int
    group_size: int
    mode: str

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape [..., out, in] of the matrix (or stack of matrices)."""
        *outer, packed_columns = self.packed.shape
        return (*outer, packed_columns * 32 // self.bits)


@dataclass(frozen=True)
class PackedWeight:
    """A GGML block-quantized weight MLX cannot represent, kept as the file's bytes.

    ``data`` is uint8 [..., out, row_bytes]: each row is the row's GGML blocks exactly as stored.
    The kernels decode it on the fly (Metal) or with MLX ops (the twin in ``kernels.twins``).
    """

    data: mx.array
    qtype: GGMLQuantizationType

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape [..., out, in] of the matrix (or stack of matrices)."""
        block_size, type_size = GGML_QUANT_SIZES[self.qtype]
        *outer, row_bytes = self.data.shape
        return (*outer, row_bytes // type_size * block_size)


@dataclass(frozen=True)
class RowCodes:
    """A float32 matrix's values as int8 codes: ``scale * code + bias`` (rounded after the
    multiply and after the add) with a scale and a bias per group of input channels, exactly the
    matrix's values (``gguf.quants.row_codes`` checks that); or, for a GGUF F16 tensor, its
    float16 values. The CPU's row kernels read these, a quarter (a half) of float32's bytes,
    where a decode or verify tile is bound by weight reads.

    As GGUF stores a matrix (``panels`` false): codes [..., out, in], scale and bias
    [..., out, in / group]. For a frozen [in, out] matrix (``panels`` true): codes
    [P, in, PANEL], scale and bias [P, in / group, PANEL] with P = ceil(out / PANEL) (the last
    panel padded with zero columns), each panel of columns read front to back."""

    codes: mx.array
    scale: mx.array | None = None
    bias: mx.array | None = None
    panels: bool = False

    @property
    def operand(self) -> list[mx.array]:
        """The native operations' argument for the matrix: [codes, scale, bias], or [values]
        for float16 values (``codes`` float16, no scale nor bias: a GGUF F16 tensor, exact)."""
        return [self.codes] if self.scale is None else [self.codes, self.scale, self.bias]


Weight = mx.array | QuantizedWeight | PackedWeight


def weight_tree(w: Weight) -> dict[str, Any]:
    """``w`` as a tree of arrays and constants, which an ``mx.compile``d function takes as an
    argument (its dataclasses it does not); ``weight_of_tree`` inverts."""
    if isinstance(w, mx.array):
        return {"array": w}
    tree: dict[str, Any] = {f.name: getattr(w, f.name) for f in fields(w)}
    if isinstance(w, PackedWeight):
        tree["qtype"] = int(w.qtype)
    return {"kind": type(w).__name__, **tree}


def weight_of_tree(tree: dict[str, Any]) -> Weight:
    """The weight ``weight_tree`` made ``tree`` of."""
    if "array" in tree:
        return tree["array"]
    values = {k: v for k, v in tree.items() if k != "kind"}
    if tree["kind"] == PackedWeight.__name__:
        return PackedWeight(values["data"], GGMLQuantizationType(values["qtype"]))
    return QuantizedWeight(**values)
