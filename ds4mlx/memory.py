"""What memory this machine can give and this process has used, from Linux's /proc where it
exists and portable fallbacks elsewhere: a leaf that the expert cache sizing, ``ds4 plan`` and
the measurements share."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path


def format_size(n: float) -> str:
    """A byte count as people read it: GiB from one GiB up, MiB below."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def proc_kib_bytes(path: str, key: str) -> int | None:
    """The ``key:`` line of a Linux /proc file such as /proc/meminfo or /proc/self/status (a
    value in kB), in bytes; None where the file or the line does not exist."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def physical_memory_bytes() -> int | None:
    """All physical memory; None when the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory_bytes() -> int | None:
    """Memory the system could give us now: Linux MemAvailable, else free physical pages, else
    all physical memory (macOS has neither of the first two); None when unknown."""
    available = proc_kib_bytes("/proc/meminfo", "MemAvailable")
    if available is not None:
        return available
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf(pages)
        except (ValueError, OSError, AttributeError):
            continue
    return None


def peak_rss_bytes() -> int:
    """This process's peak RSS. Linux: VmHWM, because ``ru_maxrss`` survives execve, so a child
    that a large process starts would report its parent's peak (the full ``ds4 bench`` showed
    its own 459 MiB for every experts run). Elsewhere ``ru_maxrss`` (bytes on macOS)."""
    peak = proc_kib_bytes("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


# On Apple silicon the GPU wires at most its recommended working set, by default about this
# share of memory (on machines above 36 GB; less below): a model needing more stays resident
# only with a higher ``sysctl iogpu.wired_limit_mb``.
GPU_WIRED_SHARE = 0.75
# A model above this share of the working set gets MLX's wired limit raised to all of it, so
# that its weights are not paged out between steps (mlx-lm's rule).
WIRE_SHARE = 0.9


def gpu_working_set_bytes() -> int | None:
    """The GPU's recommended working set (Metal's ``max_recommended_working_set_size``); None
    without Metal."""
    import mlx.core as mx

    if not mx.metal.is_available():
        return None
    return int(mx.device_info()["max_recommended_working_set_size"])


def wired_limit_sysctl(needed_bytes: int) -> str:
    """The command that lets the GPU wire ``needed_bytes`` on macOS."""
    return f"sudo sysctl iogpu.wired_limit_mb={-(-needed_bytes // 2**20)}"


def wire_model(model_bytes: int, working_set: int | None) -> str | None:
    """Raise MLX's wired limit to the GPU's ``working_set`` when a model of ``model_bytes``
    comes close to it; returns what was done (and, when the model exceeds the working set,
    the sysctl that would let it stay resident), or None when nothing was."""
    if working_set is None or model_bytes <= WIRE_SHARE * working_set:
        return None
    import mlx.core as mx

    mx.set_wired_limit(working_set)
    note = (
        f"the model takes {format_size(model_bytes)} of the GPU's {format_size(working_set)} "
        "working set: wired limit raised to all of it"
    )
    if model_bytes > working_set:
        note += f"; it does not fit: {wired_limit_sysctl(int(model_bytes * 1.1))} (then reload)"
    return note
