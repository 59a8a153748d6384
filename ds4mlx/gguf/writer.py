"""Writing GGUF files: float32 tensors quantized with ``quantize``, typed metadata, atomic writes.

``write_gguf`` is a thin layer over ``gguf.GGUFWriter`` that adds what that class leaves to its
caller: quantizing each tensor to its type, giving every metadata value the GGUF type llama.cpp
expects, the standard ``general.*`` keys, and an atomic replace of the target file.
"""

from __future__ import annotations

import math
import os
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds4mlx.gguf.quantize import quantize
from ds4mlx.gguf.validate import ALIGNMENT_KEY, MAX_TENSOR_DIMS, RESERVED_KEYS

import numpy as np
from gguf import (
    GGML_QUANT_VERSION,
    GGUF_DEFAULT_ALIGNMENT,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    Keys,
    LlamaFileType,
)

T = GGMLQuantizationType
V = GGUFValueType
ARCHITECTURE_KEY = Keys.General.ARCHITECTURE
FILE_TYPE_KEY = Keys.General.FILE_TYPE
QUANTIZATION_VERSION_KEY = Keys.General.QUANTIZATION_VERSION

# general.file_type for the type holding most of a file's weights: the names llama-quantize gives
# its mixes (Q4_K is "Q4_K_M", MXFP4 is "MXFP4_MOE").
FILE_TYPES = {
    T.F32: LlamaFileType.ALL_F32,
    T.F16: LlamaFileType.MOSTLY_F16,
    T.BF16: LlamaFileType.MOSTLY_BF16,
    T.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    T.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    T.MXFP4: LlamaFileType.MOSTLY_MXFP4_MOE,
    T.Q2_K: LlamaFileType.MOSTLY_Q2_K,
    T.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
    T.Q6_K: LlamaFileType.MOSTLY_Q6_K,
    T.IQ2_XXS: LlamaFileType.MOSTLY_IQ2_XXS,
}
# Integer tensors are written as their values (no blocks), in the numpy type of their GGML type.
INTEGER_TYPES = {T.I8: np.int8, T.I16: np.int16, T.I32: np.int32, T.I64: np.int64}
MAX_TENSOR_NAME_BYTES = 63  # ggml's GGML_MAX_NAME (64) counts the terminating NUL


@dataclass(frozen=True)
class TensorToWrite:
    """A tensor to store: float values in numpy (row-major) order, encoded as ``qtype`` (an
    integer type stores integer values as they are)."""

    name: str
    array: np.ndarray
    qtype: GGMLQuantizationType = T.F32


@dataclass(frozen=True)
class MetaValue:
    """A metadata value with an explicit GGUF type; for a list, the type of its items.

    llama.cpp checks types: scalar keys must have exactly the type it reads (e.g. UINT32 for
    counts, FLOAT32 for epsilons), token types must be an INT32 array, and so on.
    """

    value: Any
    value_type: GGUFValueType


@dataclass(frozen=True)
class _TypedValue:
    value: Any
    value_type: GGUFValueType
    item_type: GGUFValueType | None = None  # set for arrays


def write_gguf(
    path: str | Path,
    arch: str,
    metadata: Mapping[str, Any],
    tensors: Iterable[TensorToWrite],
    alignment: int = GGUF_DEFAULT_ALIGNMENT,
) -> None:
    """Writes a GGUF file, replacing ``path`` atomically (a crash leaves the old file or none).

    Metadata values are typed by ``MetaValue`` or else by their Python type: bool -> BOOL,
    int -> UINT32, float -> FLOAT32, str -> STRING; a non-empty list or tuple -> an ARRAY of
    STRING, BOOL, INT32 (ints; llama.cpp reads INT32 and UINT32 arrays alike, and requires INT32
    for token types) or FLOAT32 (floats, ints allowed among them). ``general.architecture`` (from
    ``arch``) and ``general.alignment`` (from ``alignment``, always written) are set here;
    ``general.quantization_version`` defaults to ggml's current one, and ``general.file_type`` to
    the type holding most of the weights, unless ``metadata`` gives them.

    Everything is checked, and every tensor quantized, before the file is created: a bad value,
    name or shape raises ``ValueError`` and leaves ``path`` as it was.
    """
    path = Path(path)
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment {alignment} is not a non-zero power of two")
    typed = {key: _typed(key, value) for key, value in metadata.items()}
    for key in (ARCHITECTURE_KEY, ALIGNMENT_KEY):
        if key in typed:
            raise ValueError(f"metadata key '{key}' is set by write_gguf's own argument")
    for key in RESERVED_KEYS.intersection(typed):
        raise ValueError(f"metadata key '{key}' is reserved for gguf.GGUFReader's own fields")
    encoded = _encode_tensors(tensors)
    typed.setdefault(QUANTIZATION_VERSION_KEY, _TypedValue(GGML_QUANT_VERSION, V.UINT32))
    typed.setdefault(FILE_TYPE_KEY, _TypedValue(int(_file_type(encoded)), V.UINT32))

    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    writer = GGUFWriter(temporary, arch)
    try:
        writer.add_custom_alignment(alignment)
        for key, typed_value in typed.items():
            writer.add_key_value(
                key, typed_value.value, typed_value.value_type, typed_value.item_type
            )
        for name, (data, qtype, _) in encoded.items():
            writer.add_tensor(name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(temporary, "rb") as written:
            os.fsync(written.fileno())  # the data must be on disk before the rename can be
        os.replace(temporary, path)
    except BaseException:
        writer.close()
        temporary.unlink(missing_ok=True)
        raise


def _encode_tensors(
    tensors: Iterable[TensorToWrite],
) -> dict[str, tuple[np.ndarray, GGMLQuantizationType, int]]:
    """name -> (the tensor's GGML bytes [..., row bytes], its type, its element count)."""
    encoded: dict[str, tuple[np.ndarray, GGMLQuantizationType, int]] = {}
    for tensor in tensors:
        where = f"tensor '{tensor.name}'"
        if not isinstance(tensor.name, str) or not tensor.name:
            raise ValueError(f"tensor name {tensor.name!r} is not a non-empty string")
        if len(tensor.name.encode("utf-8")) > MAX_TENSOR_NAME_BYTES:
            raise ValueError(f"{where}: ggml limits tensor names to {MAX_TENSOR_NAME_BYTES} bytes")
        if tensor.name in encoded:
            raise ValueError(f"duplicate {where}")
        shape = np.shape(tensor.array)
        if not 1 <= len(shape) <= MAX_TENSOR_DIMS:
            raise ValueError(
                f"{where} has shape {list(shape)}: GGUF tensors have 1 to {MAX_TENSOR_DIMS} dims"
            )
        if tensor.qtype in INTEGER_TYPES:
            data = _integers(where, tensor.array, tensor.qtype)
        else:
            try:
                data = quantize(tensor.array, tensor.qtype)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        encoded[tensor.name] = (data, tensor.qtype, math.prod(shape))
    return encoded


def _integers(where: str, array: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """An integer tensor (index tables such as a drafter's ``d2t``) stored as it is."""
    values = np.asarray(array)
    dtype = INTEGER_TYPES[qtype]
    if values.dtype.kind not in "iu" or not np.array_equal(values.astype(dtype), values):
        raise ValueError(f"{where}: {qtype.name} needs integers that fit {dtype.__name__}")
    return np.ascontiguousarray(values.astype(dtype))


def _file_type(encoded: Mapping[str, tuple[np.ndarray, GGMLQuantizationType, int]]) -> int:
    """The ``general.file_type`` of the type holding the most weights (by element count; ties go
    to the type seen first)."""
    weights: Counter[GGMLQuantizationType] = Counter()
    for _, qtype, n_elements in encoded.values():
        if qtype not in INTEGER_TYPES:
            weights[qtype] += n_elements
    most = weights.most_common(1)[0][0] if weights else T.F32
    return FILE_TYPES[most]


def _typed(key: str, value: Any) -> _TypedValue:
    """``value`` with its GGUF type, checked to be representable in it."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"metadata key {key!r} is not a non-empty string")
    where = f"metadata key '{key}'"
    if isinstance(value, MetaValue):
        value_type, value = value.value_type, value.value
        if value_type == V.ARRAY:
            raise ValueError(f"{where}: give a list's item type, not ARRAY")
        if isinstance(value, (list, tuple)):
            return _typed_array(where, value, value_type)
        _check(where, value, value_type)
        return _TypedValue(value, value_type)
    if isinstance(value, (list, tuple)):
        return _typed_array(where, value, _item_type(where, value))
    value_type = _default_type(where, value)
    _check(where, value, value_type)
    return _TypedValue(value, value_type)


def _typed_array(where: str, items: Sequence[Any], item_type: GGUFValueType) -> _TypedValue:
    if not items:
        raise ValueError(f"{where}: empty arrays cannot be written (gguf.GGUFWriter refuses them)")
    for index, item in enumerate(items):
        _check(f"item {index} of {where}", item, item_type)
    return _TypedValue(list(items), V.ARRAY, item_type)


def _default_type(where: str, value: Any) -> GGUFValueType:
    # bool first: it is an int subclass
    defaults = ((bool, V.BOOL), (int, V.UINT32), (float, V.FLOAT32), (str, V.STRING))
    for python_type, value_type in defaults:
        if isinstance(value, python_type):
            return value_type
    raise ValueError(
        f"{where}: cannot store a {type(value).__name__}; use bool, int, float, str, a list of "
        "them, or MetaValue"
    )


def _item_type(where: str, items: Sequence[Any]) -> GGUFValueType:
    if not items:
        raise ValueError(f"{where}: empty arrays cannot be written (gguf.GGUFWriter refuses them)")
    kinds = {_default_type(f"item {i} of {where}", item) for i, item in enumerate(items)}
    if kinds == {V.UINT32}:
        return V.INT32
    if kinds == {V.FLOAT32} or kinds == {V.FLOAT32, V.UINT32}:
        return V.FLOAT32
    if len(kinds) == 1:
        return kinds.pop()
    names = ", ".join(sorted(k.name for k in kinds))
    raise ValueError(f"{where}: an array's items must share one type, found {names}")


def _check(where: str, value: Any, value_type: GGUFValueType) -> None:
    """Raises ValueError unless ``value`` fits ``value_type`` (instead of a bare struct.error
    from deep inside the writer, after the file was created)."""
    if value_type == V.STRING:
        fits = isinstance(value, str)
    elif value_type == V.BOOL:
        fits = isinstance(value, bool)
    else:
        number_type = GGUFReader.gguf_scalar_to_np[value_type]
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
        if fits and np.issubdtype(number_type, np.integer):
            limits = np.iinfo(number_type)
            fits = isinstance(value, int) and int(limits.min) <= value <= int(limits.max)
        elif fits and number_type == np.float32:
            fits = not math.isfinite(value) or abs(value) <= float(np.finfo(np.float32).max)
    if not fits:
        raise ValueError(f"{where}: {value!r} does not fit GGUF type {value_type.name}")
