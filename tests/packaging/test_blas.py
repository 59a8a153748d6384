"""The optimised-BLAS preload (``ds4mlx._blas``): it is said only when a model runs, once, and an
installed BLAS wheel (the ``blas`` extra's ``mkl``) is found where pip put its library."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ds4mlx import _blas

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "assets" / "ds4-tiny.gguf"
NOTICE = "ds4mlx: DS4MLX_BLAS=/nonexistent/libblas.so not found"


def python(code_or_args: list[str]) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter (the preload happens at import) for which no BLAS can be loaded."""
    env = {**os.environ, "DS4MLX_BLAS": "/nonexistent/libblas.so", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, *code_or_args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the preload is Linux's")
def test_no_blas_notice_on_help_or_import():
    for args in (["-m", "ds4mlx.cli.main", "--help"], ["-c", "import ds4mlx"]):
        done = python(args)
        assert done.returncode == 0, done.stderr
        assert "BLAS" not in done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the preload is Linux's")
def test_the_blas_notice_comes_once_when_a_model_loads():
    done = python(
        ["-c", f"import ds4mlx; ds4mlx.load_model({str(TINY)!r}); ds4mlx.load_model({str(TINY)!r})"]
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(NOTICE) == 1, done.stderr


def test_a_blas_wheel_is_found_where_pip_installed_its_library(tmp_path, monkeypatch):
    """As the ``mkl`` wheel lays itself out: the library in the environment's lib/, listed in
    the distribution's RECORD relative to site-packages."""
    site = tmp_path / "lib" / "python3" / "site-packages"
    info = site / "mkl-2026.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mkl\nVersion: 2026.0.0\n")
    library = tmp_path / "lib" / "libmkl_rt.so.3"
    library.write_bytes(b"")
    (info / "RECORD").write_text(
        "../../libmkl_rt.so.3,,\n../../libmkl_core.so.3,,\nmkl-2026.0.0.dist-info/METADATA,,\n"
    )
    monkeypatch.syspath_prepend(str(site))
    assert list(_blas._wheel_libraries()) == [str(library.resolve())]
