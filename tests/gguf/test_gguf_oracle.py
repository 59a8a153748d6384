"""The llama.cpp oracle fixtures open, validate, and map exactly onto the native weights."""

from __future__ import annotations

import os
from pathlib import Path

from ds4mlx import kernels
from ds4mlx.gguf import SUPPORTED_TYPES, open_gguf

import numpy as np
import pytest
from gguf import GGUFReader
from gguf import quants as gguf_quants

ORACLE_DIR = Path(
    os.environ.get("DS4MLX_ORACLE_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "oracle"
)
FIXTURES = sorted(ORACLE_DIR.glob("*.gguf"))
pytestmark = pytest.mark.skipif(not FIXTURES, reason=f"no oracle fixtures in {ORACLE_DIR}")


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_opens_cleanly_and_matches_the_gguf_reader(path: Path):
    gguf_file = open_gguf(path)
    reference = GGUFReader(path)
    assert gguf_file.arch == reference.fields["general.architecture"].contents()
    assert gguf_file.tensor_names() == [t.name for t in reference.tensors]
    assert gguf_file.layout.data_offset == reference.data_offset
    for tensor in reference.tensors:
        assert gguf_file.tensor_type(tensor.name) == tensor.tensor_type
        assert gguf_file.tensor_shape(tensor.name) == tuple(reversed(tensor.shape.tolist()))
        assert gguf_file.tensor_type(tensor.name) in SUPPORTED_TYPES


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_native_weights_are_exact(path: Path):
    # One tensor per (type, rank) keeps this fast; the full sweep is the same code path.
    gguf_file = open_gguf(path)
    seen = set()
    for name in gguf_file.tensor_names():
        kind = (gguf_file.tensor_type(name), len(gguf_file.tensor_shape(name)))
        if kind in seen:
            continue
        seen.add(kind)
        raw = gguf_file.raw(name)
        expected = np.asarray(gguf_quants.dequantize(raw, kind[0]), dtype=np.float32)
        expected = expected.reshape(gguf_file.tensor_shape(name))
        np.testing.assert_array_equal(gguf_file.dequantize(name), expected)
        native = np.array(kernels.dequantize(gguf_file.load_weight(name, "native")))
        np.testing.assert_array_equal(native, expected, err_msg=name)
