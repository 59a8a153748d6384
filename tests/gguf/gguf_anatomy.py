"""A small valid GGUF file, and a map of where each of its fields lives, for corrupting it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf import quants as gguf_quants


@dataclass(frozen=True)
class KeyLayout:
    start: int  # the key's length prefix
    value_type: int
    value: int


@dataclass(frozen=True)
class TensorInfoLayout:
    start: int  # the name's length prefix
    n_dims: int
    dims: int
    type: int
    offset: int


@dataclass(frozen=True)
class Anatomy:
    """Byte offsets of every field of the valid file."""

    content: bytes
    keys: dict[str, KeyLayout]
    tensor_infos: dict[str, TensorInfoLayout]
    tensor_data: dict[str, tuple[int, int]]  # name -> (absolute offset, nbytes)
    data_offset: int


ALIGNMENT = 64


def write_valid_gguf(path: Path) -> None:
    writer = GGUFWriter(path, "deepseek4")
    writer.add_custom_alignment(ALIGNMENT)
    writer.add_uint32("test.key_a", 7)
    writer.add_uint32("test.key_b", 8)
    writer.add_uint32("test.counter", 1)
    writer.add_string("test.name", "tiny")
    writer.add_array("test.tokens", ["a", "bb", "ccc"])
    writer.add_array("test.scores", [0.5, 1.5])
    rng = np.random.default_rng(0)
    writer.add_tensor("a.weight", rng.normal(size=(2, 32)).astype(np.float32))
    writer.add_tensor("b.weight", rng.normal(size=(4, 32)).astype(np.float16))
    q8_0 = GGMLQuantizationType.Q8_0
    q8 = gguf_quants.quantize(rng.normal(size=(4, 64)).astype(np.float32), q8_0)
    writer.add_tensor("c.weight", q8, raw_dtype=q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def anatomy_of(path: Path) -> Anatomy:
    reader = GGUFReader(path)
    keys = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue  # the reader's own header pseudo-fields
        value_type = field.offset + 8 + len(name.encode())
        keys[name] = KeyLayout(field.offset, value_type, value_type + 4)
    infos = {}
    for tensor in reader.tensors:
        n_dims = tensor.field.offset + 8 + len(tensor.name.encode())
        type_offset = n_dims + 4 + 8 * len(tensor.shape)
        infos[tensor.name] = TensorInfoLayout(
            tensor.field.offset, n_dims, n_dims + 4, type_offset, type_offset + 4
        )
    data = {t.name: (t.data_offset, t.n_bytes) for t in reader.tensors}
    return Anatomy(path.read_bytes(), keys, infos, data, reader.data_offset)
