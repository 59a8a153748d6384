"""The style check's verdict does not depend on when the tools were installed: ruff, whose new
releases add rules and change formatting, is pinned to one version in the test extra (issue 36:
``ruff>=0.6`` let a new release fail tests/test_style.py on a clean checkout)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_ruff_is_pinned_to_the_installed_version():
    # Read as text: tomllib is Python 3.11's, and the project runs on 3.10.
    (line,) = re.findall(r'"(ruff\b[^"]*)"', PYPROJECT.read_text())
    ruff = Requirement(line)
    (pin,) = ruff.specifier
    assert pin.operator == "==", f"ruff is not pinned: {ruff}"
    try:
        installed = importlib.metadata.version("ruff")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    assert installed == pin.version, f"ruff {installed} installed, {ruff} in pyproject.toml"
