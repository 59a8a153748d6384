"""How routed experts are held: the options behind --ssd-stream, --expert-cache,
--expert-hotlist and --save-expert-hotlist."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# ``auto``: this share of the routed experts' resident size, capped by available memory.
AUTO_SHARE = 0.8


@dataclass(frozen=True)
class ExpertOptions:
    """``stream``: keep routed experts in the GGUF and cache them in a slab of ``cache_gib``
    GiB (None = auto). ``hotlist``: warm-start file; written back at close with
    ``save_hotlist``."""

    stream: bool = False
    cache_gib: float | None = None
    hotlist: Path | None = None
    save_hotlist: bool = False
    # Reads overlap on an SSD's queues, but each also converts on a CPU core.
    read_threads: int = min(4, os.cpu_count() or 1)
    prefetch: bool = True

    def __post_init__(self) -> None:
        if self.cache_gib is not None and not self.cache_gib > 0:
            raise ValueError(f"expert cache must be a positive number of GiB, got {self.cache_gib}")
        if self.read_threads < 1:
            raise ValueError(f"read_threads must be at least 1, got {self.read_threads}")
        if self.save_hotlist and self.hotlist is None:
            raise ValueError("--save-expert-hotlist needs --expert-hotlist FILE")
        if not self.stream and (self.cache_gib is not None or self.hotlist is not None):
            raise ValueError("--expert-cache and --expert-hotlist apply to --ssd-stream only")


def parse_cache_budget(text: str) -> float | None:
    """``auto`` -> None, else a positive number of GiB; ValueError otherwise."""
    text = text.strip().lower()
    if text == "auto":
        return None
    try:
        value = float(text.removesuffix("gib").removesuffix("g"))
    except ValueError:
        raise ValueError(
            f"expert cache: expected GiB (e.g. 12 or 0.5) or 'auto', got '{text}'"
        ) from None
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"expert cache: expected a positive number of GiB, got '{text}'")
    return value
