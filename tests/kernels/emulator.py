"""Builds tests/kernels/metal_emulation.cpp: the Metal sources in metal/ compiled for the CPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ds4mlx.kernels import metal

import numpy as np
import pytest

SOURCE = Path(__file__).with_name("metal_emulation.cpp")


def build_emulator(directory: Path, **defines: int) -> Path:
    """The emulator binary in ``directory``, compiled with ``-D{name}={value}`` for each define
    (the kernels' compile-time sizes); skips the test when no C++20 compiler is installed."""
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++20 compiler (g++ or clang++) to build the Metal emulator")
    binary = directory / "metal_emulation"
    subprocess.run(
        [
            compiler,
            "-std=c++20",
            "-O1",
            "-pthread",
            f"-I{metal.METAL_SOURCE_DIR}",
            *(f"-D{name}={value}" for name, value in defines.items()),
            str(SOURCE),
            "-o",
            str(binary),
        ],
        check=True,
        capture_output=True,
    )
    return binary


def emulate(binary: Path, mode: str, payload: bytes, directory: Path) -> np.ndarray:
    """Run the emulator's ``mode`` on the input bytes ``payload`` (files in ``directory``): its
    float32 output."""
    (directory / "in.bin").write_bytes(payload)
    subprocess.run(
        [str(binary), mode, str(directory / "in.bin"), str(directory / "out.bin")],
        check=True,
        capture_output=True,
    )
    return np.fromfile(directory / "out.bin", dtype=np.float32)
