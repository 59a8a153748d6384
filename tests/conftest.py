"""Shared test fixtures: where llama.cpp's oracle GGUFs live."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ds4mlx  # noqa: F401  (preloads the BLAS before any test imports mlx.core)

import pytest
from hypothesis import HealthCheck, settings

REPO_ROOT = Path(__file__).resolve().parents[1]

# Property tests run on a shared, often loaded 2-core machine: no per-example deadline and no
# "data generation too slow" health check, both of which measure wall-clock time (a test's own
# @settings inherits these).
settings.register_profile("ds4mlx", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ds4mlx")


def oracle_dir() -> Path:
    return Path(os.environ.get("DS4MLX_ORACLE_DIR", REPO_ROOT.parent / "shared" / "oracle"))


def oracle_manifest() -> dict | None:
    path = oracle_dir() / "manifest.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def oracle() -> dict:
    manifest = oracle_manifest()
    if manifest is None:
        pytest.skip(
            f"llama.cpp oracle fixtures not found at {oracle_dir()} (set DS4MLX_ORACLE_DIR)"
        )
    return manifest


@pytest.fixture(scope="session")
def ds4_fixture_path(oracle) -> Path:
    """The smallest deepseek4 oracle model, for tests that only need some real model."""
    path = oracle_dir() / "deepseek4-a-f16.gguf"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


@pytest.fixture(scope="session")
def chat_model_path(oracle, tmp_path_factory) -> Path:
    """A small deepseek4 GGUF with a real BPE tokenizer (random weights); see chat_model.py."""
    from chat_model import build_chat_model

    source = oracle_dir() / "deepseek4-b-f16.gguf"
    if not source.is_file():
        pytest.skip(f"{source} is missing")
    return build_chat_model(source, tmp_path_factory.mktemp("chat") / "chat-model.gguf")
