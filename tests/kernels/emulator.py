"""Builds and runs tests/kernels/metal_emulation.cpp: the Metal sources in metal/ on the CPU.

The sources are rewritten for C++ first (``emulation_source``): a device pointer becomes the
counting ``DevicePtr<T>``, a threadgroup array a static array shared by the fibers of the
running threadgroup, other address-space qualifiers vanish. Each packed format's header is the
one ``ds4mlx.kernels.metal`` compiles (with its lookup tables); ``baseline_<format>.metal`` and
``baseline_linear.metal`` are the mat-vec kernel it replaced, ``baseline_sparse_attention.metal``
the attention kernel (tests/kernels/baseline_metal), kept so the benchmark can set the new
kernels' counters beside the old ones'.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ds4mlx.kernels import metal
from ds4mlx.kernels.native import cache_root

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

SOURCE = Path(__file__).with_name("metal_emulation.cpp")
SHIM = Path(__file__).with_name("metal_shim.h")  # included by SOURCE
STEP_KERNELS = Path(__file__).with_name("metal_step_kernels.h")  # included by SOURCE
NORM_KERNELS = Path(__file__).with_name("metal_norm_kernels.h")  # included by SOURCE
BASELINE_DIR = Path(__file__).with_name("baseline_metal")
PACKED_FORMATS = (
    GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.IQ2_XXS,
)

_DEVICE_POINTER = re.compile(r"\b(const\s+)?device\s+([A-Za-z_]\w*)\s*\*")
_THREADGROUP_ARRAY = re.compile(r"\bthreadgroup\s+([A-Za-z_][\w:]*)\s+(\w+)\s*\[")
_THREADGROUP_QUALIFIER = re.compile(r"\bthreadgroup\s+")


class EmulatorUnavailable(RuntimeError):
    """No C++20 compiler to build the emulator with."""


def emulation_source(text: str) -> str:
    """Metal source rewritten for metal_emulation.cpp (code only; comments stay as written)."""
    lines = []
    for line in text.splitlines():
        code, marker, comment = line.partition("//")
        code = _DEVICE_POINTER.sub(lambda m: f"DevicePtr<{m[1] or ''}{m[2]}> ", code)
        code = _THREADGROUP_ARRAY.sub(r"static \1 \2[", code)
        code = _THREADGROUP_QUALIFIER.sub("", code)
        lines.append(code + marker + comment)
    return "\n".join(lines) + "\n"


def write_sources(directory: Path) -> None:
    """The rewritten kernels metal_emulation.cpp includes, as ``directory/<name>.metal``."""
    for path in metal.METAL_SOURCE_DIR.glob("*.metal"):
        (directory / path.name).write_text(emulation_source(path.read_text()))
    baseline_common = (BASELINE_DIR / "common.metal").read_text()
    for qtype in PACKED_FORMATS:
        name = qtype.name.lower()
        (directory / f"{name}.metal").write_text(emulation_source(metal.format_header(qtype)))
        baseline = baseline_common + (BASELINE_DIR / f"{name}.metal").read_text()
        (directory / f"baseline_{name}.metal").write_text(emulation_source(baseline))
    for body in ("linear", "sparse_attention"):
        baseline_body = (BASELINE_DIR / f"{body}.metal").read_text()
        (directory / f"baseline_{body}.metal").write_text(emulation_source(baseline_body))


def build_emulator(directory: Path, **defines: int) -> Path:
    """The emulator binary for these sources and ``-D{name}={value}`` defines (the kernels'
    compile-time sizes), compiled in ``directory`` and kept in the ds4mlx cache under a hash of
    everything that went into it, so a later run reuses it. Without a C++20 compiler it skips
    the running test, or outside pytest raises EmulatorUnavailable."""
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        reason = "no C++20 compiler (g++ or clang++) to build the Metal emulator"
        if "pytest" in sys.modules:
            sys.modules["pytest"].skip(reason)
        raise EmulatorUnavailable(reason)
    directory.mkdir(parents=True, exist_ok=True)
    write_sources(directory)
    flags = ["-std=c++20", "-O1", f"-I{directory}", *(f"-D{k}={v}" for k, v in defines.items())]
    digest = hashlib.sha256(" ".join([compiler, *flags[:2], *flags[3:]]).encode())
    for path in sorted([SOURCE, SHIM, STEP_KERNELS, NORM_KERNELS, *directory.glob("*.metal")]):
        digest.update(path.name.encode() + path.read_bytes())
    cached = cache_root() / "metal-emulator" / f"metal_emulation-{digest.hexdigest()[:20]}"
    if cached.exists():
        return cached
    binary = directory / "metal_emulation"
    result = subprocess.run(
        [compiler, *flags, str(SOURCE), "-o", str(binary)], capture_output=True, text=True
    )
    if result.returncode:
        raise RuntimeError(f"the Metal emulator did not compile:\n{result.stderr[-4000:]}")
    cached.parent.mkdir(parents=True, exist_ok=True)
    # Copied in under a temporary name, then renamed: a concurrent run never sees half a file.
    with tempfile.NamedTemporaryFile(dir=cached.parent, delete=False) as part:
        shutil.copy2(binary, part.name)
    os.replace(part.name, cached)
    return cached


def linear_defines(n_out: int, k: int, n_rows: int) -> dict[str, int]:
    """The -D sizes of an emulator for the packed mat-vec of this shape, launched as
    ``ds4mlx.kernels.metal`` launches it (the x-row tile is chosen at run time)."""
    launch = metal.matvec_launch(n_out, n_rows)
    return {
        "DS4_K": k,
        "DS4_N": n_out,
        "DS4_SIMDGROUPS": launch.simdgroups,
        "DS4_ROWS": launch.rows,
    }


@dataclass
class Emulated:
    """One emulated launch: its outputs and counters."""

    out: np.ndarray
    device_load_instructions: int
    device_bytes: int
    threadgroups: int
    threads_per_threadgroup: int


def run(
    binary: Path, arguments: list[str], payload: list[bytes | np.ndarray], work: Path
) -> tuple[np.ndarray, dict]:
    """Runs the emulator on the input written piece by piece: (float32 output, counters)."""
    with open(work / "in.bin", "wb") as file:
        for piece in payload:
            file.write(piece if isinstance(piece, bytes) else memoryview(piece))
    result = subprocess.run(
        [str(binary), *arguments, str(work / "in.bin"), str(work / "out.bin")],
        capture_output=True,
        text=True,
    )
    (work / "in.bin").unlink()
    if result.returncode:
        raise RuntimeError(f"metal emulation {arguments} failed: {result.stderr.strip()}")
    return np.fromfile(work / "out.bin", dtype=np.float32), json.loads(result.stdout)


def run_linear(
    binary: Path,
    qtype: GGMLQuantizationType,
    x: np.ndarray,
    w: np.ndarray,
    expert_indices: np.ndarray,
    work: Path,
    baseline: bool = False,
    group_stride: int = 1,
    two_d: bool = False,
    real_rows: int | None = None,
) -> Emulated:
    """y [P, M, N] = x [P / XSHARE, M, K] @ w[expert_indices].T for raw GGML blocks
    w [E, N, row_bytes] through the emulated mat-vec (``baseline``: the kernel it replaced;
    XSHARE is the binary's -DDS4_XSHARE, P the number of ``expert_indices``). ``two_d``: x is
    [P / XSHARE, K], one row a batch, as a routed tile passes it. ``group_stride`` s runs only
    every s-th threadgroup of output rows; the others' outputs are NaN. ``real_rows``: the
    x rows computed (each batch's first; the others' outputs are NaN), all by default."""
    if two_d:
        x = x[:, None, :]
    n_batches, n_rows, k = len(expert_indices), x.shape[1], x.shape[2]
    n_experts, n_out, _ = w.shape
    block_values, _ = GGML_QUANT_SIZES[qtype]
    assert k % block_values == 0
    tables = baseline_tables(qtype) if baseline else np.zeros(1, np.uint8)
    launch = metal.matvec_launch(n_out, n_rows)
    computed = n_rows if real_rows is None else real_rows
    sizes = [n_batches, 0 if two_d else n_rows, n_experts, launch.x_rows, group_stride, computed]
    payload = [
        np.array(sizes, dtype=np.int32),
        np.ascontiguousarray(x, dtype=np.float32),
        np.ascontiguousarray(w, dtype=np.uint8),
        np.array([tables.size], dtype=np.uint32),
        tables,
        np.ascontiguousarray(expert_indices, dtype=np.uint32),
    ]
    mode = "baseline_linear" if baseline else "linear"
    out, counters = run(binary, [mode, qtype.name.lower()], payload, work)
    return Emulated(out.reshape(n_batches, n_rows, n_out), **counters)


def baseline_tables(qtype: GGMLQuantizationType) -> np.ndarray:
    """The baseline kernel's ``tables`` input: the IQ2_XXS grid bytes then ksigns."""
    if qtype != GGMLQuantizationType.IQ2_XXS:
        return np.zeros(1, np.uint8)
    return metal.table_words(qtype).view(np.uint8)
