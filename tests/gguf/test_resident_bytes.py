"""``quants.resident_nbytes`` (memory plans) predicts exactly what ``host_weight`` holds, for every
supported type, shape kind and weights mode."""

from __future__ import annotations

from ds4mlx.gguf.quants import SUPPORTED_TYPES, host_weight, resident_nbytes

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
SHAPES = [(512,), (3, 512), (2, 4, 512)]


def stored(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """Bytes as GGUFReader maps them: typed values for F32/F16, uint8 rows otherwise. Scales are
    kept small (random bytes would make float16 scales inf or NaN, which converts alike)."""
    if qtype in (T.F32, T.F16):
        return np.ones(shape, dtype=np.float32 if qtype == T.F32 else np.float16)
    block, size = GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1]))
    return np.zeros((rows, shape[-1] // block * size), np.uint8)


@pytest.mark.parametrize("mode", ["native", "f32"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES, key=lambda t: t.name))
def test_matches_host_weight(qtype, shape, mode):
    held = host_weight(stored(qtype, shape), qtype, shape, mode).nbytes
    assert resident_nbytes(qtype, shape, mode) == held


def test_integer_tables_are_kept_as_stored():
    assert resident_nbytes(T.I32, (1000, 6), "native") == 24000
    assert resident_nbytes(T.I32, (1000, 6), "f32") == 24000
