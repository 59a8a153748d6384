"""Fixtures: a small valid GGUF file and the byte map of its fields (see gguf_anatomy)."""

from __future__ import annotations

from pathlib import Path

import ds4mlx  # noqa: F401  (preloads BLAS before any test module imports mlx.core)

import pytest
from gguf_anatomy import Anatomy, anatomy_of, write_valid_gguf


@pytest.fixture(scope="session")
def valid_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("valid") / "valid.gguf"
    write_valid_gguf(path)
    return path


@pytest.fixture(scope="session")
def anatomy(valid_gguf: Path) -> Anatomy:
    return anatomy_of(valid_gguf)
