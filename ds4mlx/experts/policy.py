"""Which routed experts occupy a slab's slots, and which slot gives way next.

Eviction ranks cached experts by route hotness first (per-expert usage counts that decay with a
half-life, so an expert used often stays even if it was not used in the last few steps), then by
recency (least recently used first) among equal hotness. Bookkeeping lives in numpy arrays
indexed by expert key, so choosing victims among thousands of slots is a few vector ops, not a
Python loop per slot.
"""

from __future__ import annotations

import numpy as np


class SlotPolicy:
    """Slot <-> expert-key map of a fixed number of slots, with hotness and recency per key.

    Keys are dense ints (``layer * n_experts + expert``). ``tick`` advances the decay clock;
    ``record_use`` bumps the keys used by one routing step; ``victims`` picks the slots to
    refill, never one holding a protected key.
    """

    def __init__(self, n_keys: int, capacity: int, half_life: float):
        if capacity <= 0:
            raise ValueError(f"a slab needs at least one slot, got {capacity}")
        if half_life <= 0:
            raise ValueError(f"hotness half-life must be positive, got {half_life}")
        self.capacity = capacity
        self.half_life = half_life
        self.slot_key = np.full(capacity, -1, np.int64)
        self.key_slot = np.full(n_keys, -1, np.int64)
        self._hot = np.zeros(n_keys, np.float64)  # hotness as of _hot_clock
        self._hot_clock = np.zeros(n_keys, np.float64)
        self._last_use = np.full(n_keys, -1, np.int64)  # use sequence number; -1 = never
        self.clock = 0.0
        self._seq = 0

    def tick(self, steps: float = 1.0) -> None:
        self.clock += steps

    def hotness(self, keys: np.ndarray) -> np.ndarray:
        """Current (decayed) hotness of ``keys``."""
        age = self.clock - self._hot_clock[keys]
        return self._hot[keys] * np.exp2(-age / self.half_life)

    def set_hotness(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Seed hotness (a hot-list warm start)."""
        self._hot[keys] = values
        self._hot_clock[keys] = self.clock

    def record_use(self, keys: np.ndarray, counts: np.ndarray | int = 1) -> None:
        """One routing step used ``keys`` (``counts`` uses each)."""
        self._hot[keys] = self.hotness(keys) + counts
        self._hot_clock[keys] = self.clock
        self._seq += 1
        self._last_use[keys] = self._seq

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key, -1 where it is not cached."""
        return self.key_slot[keys]

    def victims(self, n: int, protected: np.ndarray) -> np.ndarray:
        """``n`` slots to refill: empty ones first, then the coldest, least recently used cached
        experts; never a slot holding a ``protected`` key. Raises if there are not enough."""
        candidates = np.ones(self.capacity, bool)
        held = self.key_slot[protected]
        candidates[held[held >= 0]] = False
        slots = np.flatnonzero(candidates)
        if len(slots) < n:
            raise RuntimeError(
                f"{n} slots needed but only {len(slots)} of {self.capacity} are "
                "free of experts in use"
            )
        keys = self.slot_key[slots]
        empty = keys < 0
        safe = np.where(empty, 0, keys)
        hot = np.where(empty, -1.0, self.hotness(safe))  # empty slots rank first
        recent = np.where(empty, -1, self._last_use[safe])
        order = np.lexsort((slots, recent, hot))  # hotness, then recency, then slot number
        return slots[order[:n]]

    def assign(self, slot: int, key: int) -> int:
        """Put ``key`` in ``slot``; returns the key it evicts (-1 if the slot was empty)."""
        old = int(self.slot_key[slot])
        if old >= 0:
            self.key_slot[old] = -1
        self.slot_key[slot] = key
        self.key_slot[key] = slot
        return old

    def hottest(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(keys, hotness) of every key with any hotness, hottest first (a hot-list)."""
        keys = np.flatnonzero(self._hot > 0)
        hot = self.hotness(keys)
        order = np.argsort(-hot, kind="stable")[:limit]
        return keys[order], hot[order]
