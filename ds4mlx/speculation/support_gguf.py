"""What the drafters' support GGUFs share: the target identity, the architecture check, test
weights and writing. (The blocks built like the target's layers, ``stage_args`` and
``block_shapes``, are model code: ``models.deepseek4_mtp``.)

**Target identity.** A drafter is trained for one target checkpoint. Files ds4mlx writes record it
under ``ds4mlx.target_sha256``: the sha256 of a byte stream built from the target's tensors,
sorted by name, each contributing ``name``, its GGML type name, its numpy-order shape and byte
count, then its data. Tensors up to ``FULL_HASH_BYTES`` contribute all their bytes; larger ones
``HASH_WINDOWS`` windows of ``HASH_WINDOW_BYTES`` (at the start, evenly spaced, the end). So the
identity depends on the weights only (not on metadata, tensor order or alignment), is reproducible
from the file alone, and costs a few hundred MiB of reads even for an 80 GB target. A
requantized target has a different identity; pass ``check_target_id=False`` to the loaders to use
a drafter with it anyway. Files without the key (ds4's and llama.cpp's exports) are not checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from ds4mlx.gguf import GGUFError, GGUFFile, MetaValue, TensorToWrite, write_gguf

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

TARGET_ID_KEY = "ds4mlx.target_sha256"
TARGET_FILE_KEY = "ds4mlx.target_file"  # the target's file name when the drafter was trained
FULL_HASH_BYTES = 1 << 20
HASH_WINDOWS = 4
HASH_WINDOW_BYTES = 1 << 16

Shape = tuple[int, ...]


# --------------------------------------------------------------------------------------------
# Target identity
# --------------------------------------------------------------------------------------------


def _windows(nbytes: int) -> list[tuple[int, int]]:
    """(offset, length) of the byte ranges of a tensor that enter its fingerprint."""
    if nbytes <= FULL_HASH_BYTES:
        return [(0, nbytes)]
    last = nbytes - HASH_WINDOW_BYTES
    return [(last * i // (HASH_WINDOWS - 1), HASH_WINDOW_BYTES) for i in range(HASH_WINDOWS)]


def target_fingerprint(gguf: GGUFFile) -> str:
    """The target identity (see the module docstring), as a hex sha256. It reads the file's
    memory map, i.e. the weights the loaded model holds even if the path was replaced since."""
    digest = hashlib.sha256()
    for info in sorted(gguf.layout.tensors.values(), key=lambda info: info.name):
        header = f"{info.name}\0{info.qtype.name}\0{list(info.shape)}\0{info.nbytes}\0"
        digest.update(header.encode())
        for offset, length in _windows(info.nbytes):
            start = info.file_offset + offset
            digest.update(gguf.mapping[start : start + length])
    return digest.hexdigest()


def identity_metadata(target: GGUFFile) -> dict[str, MetaValue]:
    """The keys a support file written for ``target`` carries."""
    return {
        TARGET_ID_KEY: MetaValue(target_fingerprint(target), GGUFValueType.STRING),
        TARGET_FILE_KEY: MetaValue(Path(target.path).name, GGUFValueType.STRING),
    }


def tokenizer_metadata(target: GGUFFile) -> dict[str, MetaValue]:
    """The target's ``tokenizer.*`` keys, which llama.cpp expects in a drafter file too (empty
    arrays left out: GGUF writers refuse them)."""
    out = {}
    for key in target.layout.metadata:
        value = target.get(key)
        if key.startswith("tokenizer.") and value != []:
            out[key] = MetaValue(value, target.writer_type(key))
    return out


def check_target(support: GGUFFile, target: GGUFFile) -> None:
    """Raise GGUFError if ``support`` records a target identity that ``target`` does not have."""
    expected = support.get(TARGET_ID_KEY)
    if expected is None:
        return
    actual = target_fingerprint(target)
    if actual != expected:
        trained_for = support.get(TARGET_FILE_KEY, "another model")
        raise GGUFError(
            f"{support.path} was trained for a different target ({trained_for}, identity "
            f"{str(expected)[:16]}...) than {target.path} (identity {actual[:16]}...); "
            f"load the matching target, or skip the check (check_target=False) at your own risk"
        )


def require_arch(gguf: GGUFFile, allowed: Mapping[str, str]) -> str:
    """The file's architecture, which must be a key of ``allowed`` (arch -> description)."""
    arch = gguf.arch
    if arch not in allowed:
        expected = ", ".join(f"'{a}' ({what})" for a, what in allowed.items())
        raise GGUFError(
            f"{gguf.path}: architecture '{arch}' is not a supported drafter; expected {expected}"
        )
    return arch


def random_arrays(shapes: Mapping[str, Shape], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float32 tensors for ``shapes`` that make a well-behaved untrained model: unit norm
    weights, zero biases, sinks and mHC biases, small mHC scales, and matmul weights with
    variance 1 / fan-in."""

    def make(name: str, shape: Shape) -> np.ndarray:
        if name.endswith("norm.weight"):
            return np.ones(shape, np.float32)
        if name.endswith(("sinks.weight", ".bias", "_base.weight")):
            return np.zeros(shape, np.float32)
        if name.endswith("_scale.weight"):
            return np.full(shape, 0.1, np.float32)
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    return {name: make(name, shape) for name, shape in shapes.items()}


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def storage_type(
    name: str, shape: Shape, matrix_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0
) -> GGMLQuantizationType:
    """How a drafter tensor is stored by default: ``matrix_type`` (Q8_0, as ds4 stores its
    support files) for matmul weights whose rows fit its blocks, float32 for everything small
    or elementwise, int32 for an index table (``d2t``)."""
    if name == "d2t":
        return GGMLQuantizationType.I32
    is_matrix = len(shape) >= 2 and not name.endswith(
        ("_fn.weight", "conf_proj.weight", "confidence_head.proj.weight")
    )
    block = GGML_QUANT_SIZES[matrix_type][0]
    if is_matrix and shape[-1] % block == 0:
        return matrix_type
    return GGMLQuantizationType.F32


def write_support_gguf(
    path: Path,
    arch: str,
    metadata: Mapping[str, MetaValue],
    tensors: Mapping[str, np.ndarray],
    *,
    types: Mapping[str, GGMLQuantizationType] | None = None,
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
) -> None:
    """Write a drafter GGUF: ``metadata`` and float tensors in numpy order, each stored as
    ``types`` gives (by stored name) or else as ``storage_type`` says."""
    types = types or {}
    write_gguf(
        path,
        arch,
        metadata,
        [
            TensorToWrite(
                name,
                array,
                types[name] if name in types else storage_type(name, array.shape, matrix_type),
            )
            for name, array in tensors.items()
        ],
    )
