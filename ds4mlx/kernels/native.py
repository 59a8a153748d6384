"""Native CPU operations (``kernels/cpu_ops/*.cpp``), built on first use as an MLX extension.

On the CPU every MLX primitive costs microseconds of scheduling, so a step made of thousands of
tiny ops is bound by their number (``scripts/bench_graph.py``). A custom MLX primitive does such
work, e.g. the mHC mixes with their 20-round Sinkhorn, in one. Building one needs a C++ compiler,
CMake and nanobind (the latter two are dependencies of ds4mlx); it happens once per MLX version
and source change, into ``$DS4MLX_CACHE_DIR`` (default ``~/.cache/ds4mlx``), under a file lock
so that concurrent processes build it once. It takes about a minute on an idle 2-core machine
and three or more under load, so its progress is shown (cmake's percentages, with the time).

Anything that fails (no compiler, an MLX built with another nanobind ABI, a result that differs
from the twin) leaves the pure-MLX twins in use and says so once on stderr. A failed build is
remembered (``cpu_ops-KEY.failed`` beside the build log), so that every later process does not
spend minutes failing again; a change of sources or versions is a new key and builds afresh, and
``DS4MLX_REBUILD_NATIVE=1`` retries the same one (after installing a compiler, say).
``DS4MLX_KERNELS=mlx`` turns the native operations off, like the Metal kernels.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TextIO

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


class _BuildProgress:
    """Says how far the build is from cmake's ``[ NN%]`` lines, with the time so far: on a
    terminal one line redrawn at every new percentage, elsewhere a line every tenth (a log gets
    a dozen lines, not a hundred)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.terminal = sys.stderr.isatty()
        self.shown = -1

    def line(self, text: str) -> None:
        match = _PERCENT.match(text)
        if match is None:
            return
        percent = int(match[1])
        step = percent if self.terminal else percent // 10
        if step == self.shown:
            return
        self.shown = step
        message = f"ds4mlx: building the native CPU operations: {percent}% ({self.seconds()} s)"
        if self.terminal:
            print(f"\r{message}", end="", file=sys.stderr, flush=True)
        else:
            print(message, file=sys.stderr, flush=True)

    def seconds(self) -> str:
        return f"{time.monotonic() - self.started:.0f}"

    def end(self) -> None:
        """Ends the redrawn line, so that what follows starts on its own."""
        if self.terminal and self.shown >= 0:
            print(file=sys.stderr, flush=True)


_PERCENT = re.compile(r"\[\s*(\d+)%\]")


def _run_logged(command: list[str], log: TextIO, progress: _BuildProgress) -> int:
    """Run ``command`` with its output into ``log``, each line shown to ``progress``."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            progress.line(line)
    return process.returncode


def build(target: Path, progress: _BuildProgress | None = None) -> Path:
    """Configure and build the extension into ``target``, saying how far it is to
    ``progress``; returns the module's path. Raises RuntimeError with the tail of the build log
    when the build fails."""
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
        progress = progress or _BuildProgress()
        with open(log_path, "w") as log:
            for command in commands:
                if _run_logged(command, log, progress) != 0:
                    log.flush()
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
                    module_path = _build_once(target)
        module = _import(module_path)
        _check(module)
        return module
    except Exception as exc:  # any failure leaves the twins in use, said once
        print(
            f"ds4mlx: native CPU operations unavailable ({exc}); using the MLX twins",
            file=sys.stderr,
        )
        return None


def _build_once(target: Path) -> Path:
    """``build`` unless this very build (same key) failed before: then its remembered error,
    until ``DS4MLX_REBUILD_NATIVE=1`` asks to try again."""
    failed = target.parent / f"{target.name}.failed"
    if failed.is_file() and os.environ.get("DS4MLX_REBUILD_NATIVE", "") != "1":
        raise RuntimeError(
            f"its build failed before: {failed.read_text().strip()}; "
            "DS4MLX_REBUILD_NATIVE=1 tries again"
        )
    print(
        "ds4mlx: building the native CPU operations, once per MLX version and source change "
        "(a minute or more; several on a busy machine)...",
        file=sys.stderr,
        flush=True,
    )
    progress = _BuildProgress()
    try:
        module_path = build(target, progress)
    except (RuntimeError, OSError) as exc:
        failed.write_text(f"{exc}\n")
        raise
    finally:
        progress.end()
    failed.unlink(missing_ok=True)
    print(
        f"ds4mlx: built the native CPU operations in {progress.seconds()} s",
        file=sys.stderr,
        flush=True,
    )
    return module_path
