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
