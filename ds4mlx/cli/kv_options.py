"""The prompt-cache flags of ds4-server and ds4-agent: how many bytes of prompt states to keep in
memory, and the disk folder (with its budget) that keeps them across restarts."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from ds4mlx.generation import DiskTier, PromptCache, format_size, model_fingerprint

GIB = 1 << 30
DEFAULT_MEMORY_GIB = 2.0
DEFAULT_DISK_GIB = 16.0

log = logging.getLogger("ds4mlx.kvcache")


def _gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size in GiB, got '{text}'") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a size in GiB of at least 0, got {text}")
    return value


def add_kv_cache_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("prompt cache (KV states reused across requests)")
    group.add_argument(
        "--kv-memory-space",
        type=_gib,
        default=DEFAULT_MEMORY_GIB,
        metavar="GiB",
        help="keep the states after recent prompts in memory, up to this many "
        f"GiB, least recently used out first (default {DEFAULT_MEMORY_GIB:g}"
        "; 0: only the sessions' own)",
    )
    group.add_argument(
        "--kv-disk-dir",
        type=Path,
        metavar="DIR",
        help="also keep them in DIR, where they survive restarts: a prompt that "
        "starts with a kept one prefills only the rest",
    )
    group.add_argument(
        "--kv-disk-space",
        type=_gib,
        default=DEFAULT_DISK_GIB,
        metavar="GiB",
        help="most GiB of state files in --kv-disk-dir, least recently used "
        f"removed first (default {DEFAULT_DISK_GIB:g})",
    )


def check_kv_cache_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuses (``parser.error``) a disk folder that cannot be used."""
    folder: Path | None = args.kv_disk_dir
    if folder is None:
        return
    if folder.exists() and not folder.is_dir():
        parser.error(f"--kv-disk-dir {folder} is not a folder")
    if args.kv_disk_space <= 0:
        parser.error("--kv-disk-space must be positive with --kv-disk-dir")
    # Made now, not after the model has loaded (minutes for a large one), so that a folder that
    # cannot be made or written fails at once; owner-only, as the cache makes it.
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--kv-disk-dir {folder} cannot be created: {exc.strerror or exc}")
    if not os.access(folder, os.W_OK | os.X_OK):
        parser.error(f"--kv-disk-dir {folder} is not writable")


def prompt_cache_for(args: argparse.Namespace, model: Any) -> PromptCache | None:
    """The prompt cache the flags ask for over ``model`` (an ``api.LoadedModel``); None when
    they ask for none. OSError when the disk folder cannot be created."""
    memory = int(args.kv_memory_space * GIB)
    disk = None
    if args.kv_disk_dir is not None:
        disk = DiskTier(args.kv_disk_dir, int(args.kv_disk_space * GIB), model_fingerprint(model))
        log.info(
            "kv cache: %d saved prompt states in %s (budget %s)",
            len(disk),
            args.kv_disk_dir,
            format_size(disk.budget),
        )
    if disk is None and memory == 0:
        return None
    return PromptCache(memory, disk)
