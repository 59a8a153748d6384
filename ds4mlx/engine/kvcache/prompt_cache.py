"""A cache of session states by token prefix: in memory (LRU, bounded by bytes) and on disk.

A request whose prompt starts with a cached state's tokens restores that state and prefills only
the rest. Entries are the states right after a prompt's prefill (committed, never a speculative
draft's rows). The longest usable prefix wins: an entry whose tokens are all a prefix of the
prompt less its last token (a token must be left to feed), or one that goes past that prefix by
at most ``MAX_CUT`` tokens, when the model can roll its state back that far (a repeated prompt
hits its own entry less its last token; ``ChatService`` tries the rollback).

The disk tier keeps one snapshot file per entry (``snapshot_file``) in a folder that survives
restarts, bounded by bytes: before a write, the least recently used files go first (a hit
touches its file). A file that cannot be used here (another model, quantization or format
version, truncated, corrupt) costs one warning line, and never a wrong state: files of another
model are left for the processes that wrote them (they still count against the budget and may be
evicted); damaged ones are removed. A write that fails (a full disk) is one warning too, and the
request goes on.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ds4mlx.engine.kvcache.snapshot_file import (
    SUFFIX,
    SnapshotFileError,
    header_tokens,
    read_header,
    read_snapshot,
    snapshot_nbytes,
    write_snapshot,
)
from ds4mlx.engine.kvcache.state_codec import StateFormatError
from ds4mlx.engine.session import Snapshot

import numpy as np

log = logging.getLogger("ds4mlx.kvcache")

# How many tokens past the shared prefix an entry may hold and still be used, by rolling the
# restored state back (both architectures roll back at least this far over decode steps; a
# state that cannot is skipped).
MAX_CUT = 4
_PREFIX = "kv-"
# A temporary file older than this belongs to a write that was interrupted.
_STALE_TEMPORARY_SECONDS = 600.0

Warn = Callable[[str], None]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (vectorised: prompts run to 100k+)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n], np.int64) != np.asarray(b[:n], np.int64))
    return int(differ[0]) if differ.size else n


@dataclass(frozen=True)
class Candidate:
    """A cached entry usable for a prompt: restore it, then roll it back to ``share`` tokens
    when it holds more."""

    tokens: tuple[int, ...]
    share: int
    on_disk: bool

    @property
    def cut(self) -> int:
        return len(self.tokens) - self.share


def _usable_share(entry: Sequence[int], prompt: Sequence[int]) -> int | None:
    share = common_prefix(entry, prompt[:-1])
    return share if len(entry) - share <= MAX_CUT else None


class MemoryTier:
    """Snapshots by their tokens, least recently used first, within ``budget`` bytes."""

    def __init__(self, budget: int):
        self.budget = budget
        self._entries: OrderedDict[tuple[int, ...], tuple[Snapshot, int]] = OrderedDict()
        self.used = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, snapshot: Snapshot) -> None:
        size = snapshot_nbytes(snapshot)
        self.drop(snapshot.tokens)
        if size > self.budget:
            return
        while self.used + size > self.budget:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used -= evicted
        self._entries[snapshot.tokens] = (snapshot, size)
        self.used += size

    def drop(self, tokens: tuple[int, ...]) -> None:
        old = self._entries.pop(tokens, None)
        if old is not None:
            self.used -= old[1]

    def get(self, tokens: tuple[int, ...]) -> Snapshot | None:
        entry = self._entries.get(tokens)
        if entry is None:
            return None
        self._entries.move_to_end(tokens)
        return entry[0]

    def keys(self) -> list[tuple[int, ...]]:
        return list(self._entries)


class DiskTier:
    """Snapshot files in ``folder``, at most ``budget`` bytes of them in all."""

    def __init__(self, folder: str | Path, budget: int, fingerprint: str, warn: Warn = log.warning):
        self.folder = Path(folder)
        self.budget = budget
        self.fingerprint = fingerprint
        self.warn = warn
        # Owner-only, as the files in it (an existing folder keeps the mode its owner chose).
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._index: dict[tuple[int, ...], Path] = {}
        self._write_failing = False  # warned once until a write succeeds again
        self._scan()

    def __len__(self) -> int:
        return len(self._index)

    def keys(self) -> list[tuple[int, ...]]:
        return list(self._index)

    def path_for(self, tokens: Sequence[int]) -> Path:
        digest = hashlib.sha256(self.fingerprint.encode())
        digest.update(np.asarray(tokens, np.int64).tobytes())
        return self.folder / f"{_PREFIX}{digest.hexdigest()[:40]}{SUFFIX}"

    def _files(self) -> list[Path]:
        return [p for p in self.folder.glob(f"{_PREFIX}*{SUFFIX}") if p.is_file()]

    def _scan(self) -> None:
        now = time.time()
        for temporary in self.folder.glob(f".{_PREFIX}*.tmp{SUFFIX}"):
            try:
                if now - temporary.stat().st_mtime > _STALE_TEMPORARY_SECONDS:
                    temporary.unlink()
            except OSError:  # another process finished or removed it
                continue
        for path in self._files():
            try:
                metadata = read_header(path)
                tokens = header_tokens(path, metadata)
            except SnapshotFileError as exc:
                self._refuse(path, str(exc))
                continue
            if metadata.get("fingerprint") != self.fingerprint:
                self.warn(
                    f"kv cache: ignoring {path.name}: written for another model file or "
                    "quantization"
                )
                continue
            self._index[tokens] = path

    def _refuse(self, path: Path, reason: str) -> None:
        """One warning for an unusable file of this cache, which is then removed."""
        self.warn(f"kv cache: ignoring {reason}")
        path.unlink(missing_ok=True)

    def load(self, tokens: tuple[int, ...]) -> Snapshot | None:
        path = self._index.get(tokens)
        if path is None:
            return None
        try:
            snapshot = read_snapshot(path, self.fingerprint)
        except SnapshotFileError as exc:
            del self._index[tokens]
            if path.exists():
                self._refuse(path, str(exc))
            return None
        if snapshot.tokens != tokens:
            del self._index[tokens]
            self._refuse(path, f"{path}: its tokens changed since it was indexed")
            return None
        try:
            os.utime(path)  # most recently used: evicted last
        except OSError:
            pass
        return snapshot

    def usage(self) -> int:
        """Bytes of snapshot files in the folder (this model's and others')."""
        total = 0
        for path in self._files():
            try:
                total += path.stat().st_size
            except OSError:  # removed meanwhile
                continue
        return total

    def save(self, snapshot: Snapshot) -> bool:
        """Write ``snapshot`` unless it is there already, evicting the least recently used
        files to keep within the budget; False (with one warning) when it cannot be written."""
        path = self.path_for(snapshot.tokens)
        if snapshot.tokens in self._index and path.exists():
            return True
        # StateFormatError from here on is the caller's (PromptCache turns caching off).
        # The file is about the arrays' bytes plus a header the size of the token list.
        size = snapshot_nbytes(snapshot) + 16 * len(snapshot.tokens) + 65536
        if size > self.budget:
            self.warn(
                f"kv cache: a snapshot of {len(snapshot.tokens)} tokens "
                f"({size / 2**20:.1f} MiB) exceeds the disk budget "
                f"({self.budget / 2**20:.1f} MiB); not saved"
            )
            return False
        self._evict(self.budget - size)
        try:
            written = write_snapshot(path, snapshot, self.fingerprint)
        except OSError as exc:
            if not self._write_failing:
                self.warn(
                    f"kv cache: could not save a snapshot of {len(snapshot.tokens)} "
                    f"tokens to {self.folder}: {exc}"
                )
            self._write_failing = True
            return False
        self._write_failing = False
        self._index[snapshot.tokens] = path
        if written > size:  # the estimate fell short: the budget still holds
            self._evict(self.budget)
        return path.exists()

    def _evict(self, limit: int) -> None:
        """Remove the least recently used files until at most ``limit`` bytes remain."""
        files = []
        for path in self._files():
            try:
                stat = path.stat()
            except OSError:
                continue
            files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: (f[0], f[2].name)):
            if total <= limit:
                break
            path.unlink(missing_ok=True)
            total -= size
        self._index = {tokens: path for tokens, path in self._index.items() if path.exists()}

    def remove(self, tokens: tuple[int, ...]) -> None:
        path = self._index.pop(tokens, None)
        if path is not None:
            path.unlink(missing_ok=True)


class PromptCache:
    """The memory tier, and the disk tier when there is one, looked up together."""

    def __init__(self, memory_budget: int, disk: DiskTier | None = None, warn: Warn = log.warning):
        self.memory = MemoryTier(memory_budget)
        self.disk = disk
        self.warn = warn
        self._unsupported = False  # the model's state cannot be described: cache nothing

    def remember(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` in memory (the state right after a prompt's prefill)."""
        if self._usable(snapshot):
            self._guarded(self.memory.put, snapshot)

    def persist(self, snapshot: Snapshot) -> None:
        """Also keep ``snapshot`` on disk, when there is a disk tier."""
        if self.disk is not None and self._usable(snapshot):
            self._guarded(self.disk.save, snapshot)

    def _usable(self, snapshot: Snapshot) -> bool:
        return not self._unsupported and _consistent(snapshot) and len(snapshot.tokens) > 1

    def _guarded(self, keep: Callable[[Snapshot], object], snapshot: Snapshot) -> None:
        """A state the codec cannot describe (a cache class holding an unknown type) turns the
        cache off with one warning; requests go on without it."""
        try:
            keep(snapshot)
        except StateFormatError as exc:
            self._unsupported = True
            self.warn(f"kv cache: turned off: {exc}")

    def candidates(self, prompt: Sequence[int], longer_than: int) -> list[Candidate]:
        """Cached entries usable for ``prompt`` that share more than ``longer_than`` tokens
        with it, the longest share first; on a tie, the entry with fewer tokens to roll back
        (``Candidate.cut``), then memory before disk."""
        found: dict[tuple[int, ...], Candidate] = {}
        sources = [(False, self.memory.keys())]
        if self.disk is not None:
            sources.append((True, self.disk.keys()))
        for on_disk, keys in sources:
            for tokens in keys:
                share = _usable_share(tokens, prompt)
                if share is not None and share > longer_than and tokens not in found:
                    found[tokens] = Candidate(tokens, share, on_disk)
        return sorted(found.values(), key=lambda c: (-c.share, c.cut, c.on_disk))

    def load(self, candidate: Candidate) -> Snapshot | None:
        """The candidate's snapshot; None when its file turned out unusable (warned)."""
        snapshot = self.memory.get(candidate.tokens)
        if snapshot is not None or self.disk is None:
            return snapshot
        snapshot = self.disk.load(candidate.tokens)
        if snapshot is not None:
            self.memory.put(snapshot)
        return snapshot


def _consistent(snapshot: Snapshot) -> bool:
    """Whether the state is at the snapshot's last token (never mid-way through a lazy feed)."""
    return getattr(snapshot.state, "pos", len(snapshot.tokens)) == len(snapshot.tokens)
