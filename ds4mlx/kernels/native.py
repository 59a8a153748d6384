"""Native CPU operations (``kernels/cpu_ops/*.cpp``), built on first use as an MLX extension.

On the CPU every MLX primitive costs microseconds of scheduling, so a step made of thousands of
tiny ops is bound by their number (``scripts/bench_graph.py``). A custom MLX primitive does such
work, e.g. the mHC mixes with their 20-round Sinkhorn, in one. Building one needs a C++ compiler,
CMake and nanobind (the latter two are dependencies of ds4mlx); it happens once per MLX version
and source change (about 15-30 s), into ``$DS4MLX_CACHE_DIR`` (default ``~/.cache/ds4mlx``),
under a file lock so that concurrent processes build it once.

Anything that fails (no compiler, an MLX built with another nanobind ABI, a result that differs
from the twin) leaves the pure-MLX twins in use and says so once on stderr. ``DS4MLX_KERNELS=mlx``
turns the native operations off, like the Metal kernels.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType

import mlx.core as mx

SOURCE_DIR = Path(__file__).resolve().parent / "cpu_ops"
MODULE_NAME = "_cpu_ops"


def cache_root() -> Path:
    configured = os.environ.get("DS4MLX_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ds4mlx"


def build_key() -> str:
    """What the built module depends on: its sources, MLX, nanobind and the Python ABI."""
    digest = hashlib.sha256()
    for path in sorted(SOURCE_DIR.iterdir()):
        if path.suffix in (".cpp", ".h", ".txt"):
            digest.update(path.name.encode() + path.read_bytes())
    for package in ("mlx", "nanobind"):
        try:
            digest.update(f"{package}={importlib.metadata.version(package)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{package}=?".encode())
    digest.update(f"{sys.implementation.cache_tag}-{sys.platform}".encode())
    digest.update(cpu_signature().encode())
    return digest.hexdigest()[:16]


def cpu_signature() -> str:
    """What the module is compiled for (``-march=native``): the machine type and, on Linux,
    the CPU model and feature flags, so that a cache shared between machines (a network home)
    never hands one CPU a module built for another's instruction set."""
    parts = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(("model name", "flags", "Features")):
                    parts.append(line.strip())
                if len(parts) >= 4:
                    break
    except OSError:
        pass
    return "|".join(parts)


def _cmake() -> str:
    beside_python = Path(sys.executable).parent / "cmake"
    found = str(beside_python) if beside_python.exists() else shutil.which("cmake")
    if found is None:
        raise RuntimeError("CMake not found (pip install cmake)")
    return found


def _built_module(directory: Path) -> Path | None:
    found = sorted(directory.glob(f"{MODULE_NAME}*.so")) + sorted(
        directory.glob(f"{MODULE_NAME}*.pyd")
    )
    return found[0] if found else None


def build(target: Path) -> Path:
    """Configure and build the extension into ``target``; returns the module's path. Raises
    RuntimeError with the tail of the build log when the build fails."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        build_dir = Path(tmp) / "build"
        log_path = target.parent / f"{target.name}.log"
        commands = [
            [
                _cmake(),
                "-S",
                str(SOURCE_DIR),
                "-B",
                str(build_dir),
                f"-DPython_EXECUTABLE={sys.executable}",
                "-DCMAKE_BUILD_TYPE=Release",
            ],
            [_cmake(), "--build", str(build_dir), "-j", str(os.cpu_count() or 1)],
        ]
        with open(log_path, "w") as log:
            for command in commands:
                done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
                if done.returncode != 0:
                    lines = log_path.read_text().splitlines()
                    tail = [line.strip() for line in lines if line.strip()][-3:]
                    raise RuntimeError(f"build failed (log: {log_path}): " + " | ".join(tail))
        module = _built_module(build_dir)
        if module is None:
            raise RuntimeError(f"the build made no {MODULE_NAME} module (log: {log_path})")
        staged = Path(tmp) / "staged"
        staged.mkdir()
        shutil.copy2(module, staged / module.name)
        os.replace(staged, target)  # readers see a whole directory or none
    return target / module.name


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(module: ModuleType) -> None:
    """The module's results agree with the twins on a fixed input (and mlx arrays pass
    between the modules at all: that fails with a mismatched nanobind ABI)."""
    from ds4mlx.kernels import twins

    mixes = mx.sin(mx.arange(2 * 24, dtype=mx.float32).reshape(2, 24)) * 3.0
    scale, base = mx.array([0.5, 1.5, 2.0]), mx.cos(mx.arange(24, dtype=mx.float32))
    got = module.hc_mixes(mixes, scale, base, 4, 20, 1e-6)
    want = twins.hc_mixes(mixes, scale, base, 4, 20, 1e-6)
    for g, w in zip(got, want, strict=True):
        if not mx.allclose(g, w, rtol=1e-5, atol=1e-6).item():
            raise RuntimeError("native hc_mixes disagrees with its twin")


@cache
def native_ops() -> ModuleType | None:
    """The native CPU operations module, built if needed; None (said once on stderr) when it
    cannot be had or when ``DS4MLX_KERNELS=mlx`` asks for the pure-MLX twins."""
    if os.environ.get("DS4MLX_KERNELS", "").strip().lower() == "mlx":
        return None
    target = cache_root() / f"cpu_ops-{build_key()}"
    try:
        module_path = _built_module(target) if target.is_dir() else None
        if module_path is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.parent / f"{target.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                module_path = _built_module(target) if target.is_dir() else None
                if module_path is None:
                    print("ds4mlx: building the native CPU operations (once)...", file=sys.stderr)
                    module_path = build(target)
        module = _import(module_path)
        _check(module)
        return module
    except Exception as exc:  # any failure leaves the twins in use, said once
        print(
            f"ds4mlx: native CPU operations unavailable ({exc}); using the MLX twins",
            file=sys.stderr,
        )
        return None
