"""The streamed expert store: routed experts read on demand from the GGUF file.

Experts stay in the GGUF file. A fixed-capacity slab (per expert format: the gate/up/down weights
of one expert per slot, each an MLX array with a leading slot dim, written in place) caches them;
the batch is the slab itself with the pairs remapped to slots, so results are bit-identical to
resident ones. A layer whose experts in use outnumber the slots runs in several batches of pairs
(each evaluated before its slots are refilled). Reads are positional and bounded
(``experts.reader``) on a thread pool; an MoE layer may hint the next layer's likely experts so
their reads overlap this layer's compute (prefill).

Memory: the slab plus the staging of hinted reads is the budget, allocated once. Slots are only
written when no queued computation reads the slab, so MLX updates the slab in place instead of
copying it, and an evicted expert is never kept alive by a pending graph. Reading a routing
evaluates everything it depends on, earlier layers' experts included, except where the routing
is a hash of the token ids (DeepSeek-V4's first layers): so before a write the newest layer's
expert outputs are evaluated too, which depend on every earlier layer's (a pending one made MLX
copy a whole slab per hashed layer: twice the cache in peak memory).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

from ds4mlx.experts.options import AUTO_SHARE, ExpertOptions
from ds4mlx.experts.policy import SlotPolicy
from ds4mlx.experts.reader import ExpertReader, ExpertTensor
from ds4mlx.experts.store import (
    ExpertBatch,
    ExpertStats,
    ExpertStore,
    LayerExperts,
)
from ds4mlx.gguf import GGUFError, GGUFFile
from ds4mlx.gguf.quants import HostWeight, cpu_keeps_blocks, to_device
from ds4mlx.kernels import PACKED_KERNELS, Weight
from ds4mlx.memory import available_memory_bytes, format_size

import mlx.core as mx
import numpy as np

HOTLIST_FORMAT = "ds4mlx-expert-hotlist"
# Hotness halves every this many routing steps of each layer (about this many decoded tokens).
HALF_LIFE_STEPS = 64
# Share of the slots above the minimum kept as staging for hinted (prefetched) reads.
STAGING_SHARE = 1 / 8
# Slots' worth of MLX memory outside the slab while experts are written into it: the expert's
# device copy being written, and the freed buffers MLX keeps for reuse (its cache limit).
MLX_CACHE_SLOTS = 2
WRITE_SLOTS = 1 + MLX_CACHE_SLOTS
# Without the Metal kernels or the CPU's block kernels, packed experts (Q2_K, Q6_K, IQ2_XXS) are
# decoded to float32 before their matmuls (``kernels.twins``): a batch decodes at most this many
# bytes of experts, so that a prefill routed to hundreds of DeepSeek-V4-Flash experts (96 MiB
# each in float32) never holds them all decoded at once.
TWIN_BATCH_BYTES = 256 * 2**20


class _Slab:
    """``capacity`` expert slots of one format: per projection, MLX arrays [capacity, ...]."""

    def __init__(self, template: tuple[HostWeight, ...], capacity: int):
        self.template = template
        self.parts: list[list[mx.array]] = []
        for host in template:
            arrays = []
            for part in host.parts:
                dtype = mx.bfloat16 if host.kind == "bf16" else mx.array(part[:0]).dtype
                arrays.append(mx.zeros((capacity, *part.shape), dtype))
            self.parts.append(arrays)
        mx.eval(self.arrays())
        self.slot_bytes = sum(h.nbytes for h in template)
        self.nbytes = self.slot_bytes * capacity

    def arrays(self) -> list[mx.array]:
        return [a for arrays in self.parts for a in arrays]

    def write(self, slot: int, expert: tuple[HostWeight, ...]) -> None:
        for arrays, host in zip(self.parts, expert, strict=True):
            for j, part in enumerate(host.parts):
                if host.kind == "bf16":  # numpy has no bfloat16 view: MLX writes the slot
                    arrays[j][slot] = mx.view(mx.array(part), mx.bfloat16)
                else:
                    # Nothing queued reads the slab (the module docstring), so the slot's
                    # bytes are overwritten where they lie: one copy from the read buffer,
                    # where an MLX array of the part and MLX's slice update (element by element
                    # for bytes) took two more and fresh pages for each temporary.
                    np.asarray(memoryview(arrays[j]))[slot] = part
        # A slice update is evaluated now, while nothing else references the slab: MLX then
        # writes it in place (a pending reader would force a copy of the whole slab).
        mx.eval(self.arrays())

    def weights(self, slots: np.ndarray | None = None) -> tuple[Weight, Weight, Weight]:
        """The slab's weights, or (``slots``) copies of just those slots, in that order."""
        parts = self.parts
        if slots is not None:
            taken = mx.array(np.asarray(slots, np.int32))
            parts = [[a[taken] for a in arrays] for arrays in parts]
        gate, up, down = (to_device(h, a) for h, a in zip(self.template, parts, strict=True))
        return gate, up, down


class _ExpertRead:
    """One expert's read in flight: a future per tensor (gate, up, down), so that a lone miss
    (decode with a good hit rate) converts on several cores at once instead of one."""

    def __init__(self, store: StreamedStore, layer: _StreamedLayer, expert: int):
        self.parts = [
            store.executor.submit(store.reader.read_tensor, tensor, expert)
            for tensor in layer.tensors
        ]

    def result(self) -> tuple[HostWeight, ...]:
        return tuple(part.result() for part in self.parts)

    def cancel(self) -> bool:
        """True when no part will run (else the started ones finish on their own)."""
        return all([part.cancel() for part in self.parts])

    def done(self) -> bool:
        return all(part.done() for part in self.parts)


@dataclass
class _Pool:
    """The layers whose experts share a format, their slab, policy and staged reads."""

    layers: list[_StreamedLayer]
    slab: _Slab | None = None
    policy: SlotPolicy | None = None
    capacity: int = 0
    staging: int = 0
    window: int = 1  # demand reads in flight at once
    reserved: int = 0  # slots' worth of budget kept for them
    # Experts per batch when their weights are decoded before the matmuls (TWIN_BATCH_BYTES);
    # each batch then holds copies of exactly its experts. None: batches use the whole slab.
    decode_batch: int | None = None
    inflight: dict[int, _ExpertRead] = field(default_factory=dict)  # key -> hinted read
    draining: list[_ExpertRead] = field(default_factory=list)  # unwanted reads still running

    def staged(self) -> int:
        self.draining = [f for f in self.draining if not f.done()]
        return len(self.inflight) + len(self.draining)


class _StreamedLayer(LayerExperts):
    def __init__(
        self,
        store: StreamedStore,
        prefix: str,
        tensors: tuple[ExpertTensor, ...],
        n_used: int,
        key_base: int,
    ):
        self.store = store
        self.prefix = prefix
        self.tensors = tensors
        self.n_experts = tensors[0].n_experts
        self.n_used = n_used
        self.key_base = key_base
        self.pool: _Pool | None = None

    @property
    def prefetches(self) -> bool:  # type: ignore[override]
        self.store.finish_loading()
        return self.pool is not None and self.pool.staging > 0

    def signature(self, mode: str | None) -> tuple:
        return (mode, tuple((t.qtype, t.expert_shape) for t in self.tensors))

    def batches(self, indices: mx.array) -> Iterator[ExpertBatch]:
        return self.store._batches(self, indices)

    def map_batches(
        self, indices: mx.array, compute: Callable[[ExpertBatch], mx.array]
    ) -> Iterator[tuple[ExpertBatch, mx.array]]:
        for batch, result in super().map_batches(indices, compute):
            self.store.newest_result = result
            yield batch, result

    def prefetch(self, indices: mx.array) -> None:
        self.store._prefetch(self, indices)


class StreamedStore(ExpertStore):
    """Routed experts read on demand from the GGUF file into a bounded slab cache."""

    def __init__(self, gguf: GGUFFile, mode: str | None, options: ExpertOptions):
        self.gguf = gguf
        self.mode = mode
        self.options = options
        self.reader = ExpertReader(gguf.path, mode)
        self.executor = ThreadPoolExecutor(
            options.read_threads, thread_name_prefix="ds4mlx-experts"
        )
        self.layers: list[_StreamedLayer] = []
        self.pools: list[_Pool] = []
        self.n_keys = 0
        self.started = False
        self.budget_bytes = 0
        self.routed_bytes = 0
        self._stats = ExpertStats("streamed")
        # The newest layer's expert outputs, maybe not evaluated yet (they read the slab):
        # evaluated before a slot is written (module docstring).
        self.newest_result: mx.array | None = None

    # -- registration and sizing -------------------------------------------------------------

    def layer(
        self, names: tuple[str, str, str], load: Callable[[str], Weight], n_used: int
    ) -> LayerExperts:
        if self.started:
            raise RuntimeError("expert layers must all be registered before the first use")
        layout = self.gguf.layout.tensors
        missing = [n for n in names if n not in layout]
        if missing:
            raise GGUFError(f"{self.gguf.path}: missing tensor '{missing[0]}'")
        tensors = tuple(
            ExpertTensor.from_info(self.gguf.path, layout[n], self.reader.file_size) for n in names
        )
        if len({t.n_experts for t in tensors}) != 1:
            raise GGUFError(
                f"{self.gguf.path}: expert tensors {', '.join(names)} disagree on "
                "the number of experts"
            )
        prefix = names[0].rsplit(".", 2)[0]
        layer = _StreamedLayer(self, prefix, tensors, n_used, self.n_keys)
        if not 0 < n_used <= layer.n_experts:
            raise ValueError(f"{prefix}: {n_used} experts used of {layer.n_experts}")
        self.n_keys += layer.n_experts
        self.layers.append(layer)
        return layer

    def finish_loading(self) -> None:
        """Sizes and allocates the slabs, then warm-starts from the hot-list (once)."""
        if self.started:
            return
        self.started = True
        if not self.layers:
            return
        groups: dict[tuple, list[_StreamedLayer]] = {}
        for layer in self.layers:
            groups.setdefault(layer.signature(self.mode), []).append(layer)
        templates = [self.reader.read_expert(layers[0].tensors, 0) for layers in groups.values()]
        slot_bytes = [sum(h.nbytes for h in t) for t in templates]
        totals = [sum(layer.n_experts for layer in layers) for layers in groups.values()]
        minimums = [max(layer.n_used for layer in layers) for layers in groups.values()]
        self.routed_bytes = sum(b * n for b, n in zip(slot_bytes, totals, strict=True))
        budget = self._budget_bytes()
        minimum = sum(b * n for b, n in zip(slot_bytes, minimums, strict=True))
        if budget < minimum:
            raise ValueError(
                f"expert cache of {format_size(budget)} is below the minimum "
                f"{format_size(minimum)} (one layer's top-{max(minimums)} experts)"
            )
        self.budget_bytes = budget
        spare = budget - minimum
        half_life = HALF_LIFE_STEPS * len(self.layers)
        for layers, template, size, total, low in zip(
            groups.values(), templates, slot_bytes, totals, minimums, strict=True
        ):
            share = size * total / self.routed_bytes
            slots = min(total, low + int(spare * share // size))
            staging = reserved = 0
            window = self.options.read_threads
            if slots < total:
                # Converted experts waiting for a slot (demand reads in flight) are part of
                # the budget too: as many as there is room for, at least one.
                # Each costs about two slots while it converts (the bytes read + the result);
                # writing into the slab costs WRITE_SLOTS more.
                window = max(1, min(window, (slots - low) // 2))
                reserved = min(2 * window + WRITE_SLOTS, slots - low)  # none at the minimum
                slots -= reserved
                if self.options.prefetch:
                    staging = min(
                        max(layer.n_experts for layer in layers), int((slots - low) * STAGING_SHARE)
                    )
                    slots -= staging
            pool = _Pool(
                layers,
                capacity=slots,
                staging=staging,
                window=window,
                reserved=reserved,
                decode_batch=_decode_batch(template, layers[0]),
            )
            pool.slab = _Slab(template, slots)
            pool.policy = SlotPolicy(self.n_keys, slots, half_life)
            for layer in layers:
                layer.pool = pool
            self.pools.append(pool)
        self._stats.capacity_bytes = sum(
            (p.capacity + p.staging + p.reserved) * p.slab.slot_bytes for p in self.pools
        )
        # Each reader thread converts about one slot's worth at a time.
        _configure_malloc(self.options.read_threads * max(p.slab.slot_bytes for p in self.pools))
        # MLX keeps freed buffers for reuse: the copies of written experts and activation
        # buffers would sit outside the budget. A few slots' worth is enough to reuse them.
        mx.set_cache_limit(
            min(mx.set_cache_limit(0), MLX_CACHE_SLOTS * max(p.slab.slot_bytes for p in self.pools))
        )
        if self.options.hotlist is not None and self.options.hotlist.exists():
            self.load_hotlist(self.options.hotlist)
        elif self.options.hotlist is not None and not self.options.save_hotlist:
            raise ValueError(f"expert hot-list {self.options.hotlist} does not exist")

    def _budget_bytes(self) -> int:
        if self.options.cache_gib is not None:
            return int(self.options.cache_gib * 2**30)
        budget = AUTO_SHARE * self.routed_bytes
        available = available_memory_bytes()
        if available is not None:
            budget = min(budget, AUTO_SHARE * available)
        return int(budget)

    # -- routing steps -----------------------------------------------------------------------

    def _batches(self, layer: _StreamedLayer, indices: mx.array) -> Iterator[ExpertBatch]:
        self.finish_loading()
        pool = layer.pool
        policy = pool.policy
        # Reading the routing evaluates what it depends on (not earlier layers' experts when it
        # is a hash of the token ids: ``_ensure`` evaluates those before it writes a slot).
        routing = np.array(indices).astype(np.int64)
        flat = routing.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= layer.n_experts):
            raise ValueError(f"{layer.prefix}: expert index out of range 0..{layer.n_experts}")
        experts, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        keys = layer.key_base + experts
        policy.tick()
        cached = policy.lookup(keys) >= 0
        policy.record_use(keys, counts)  # hotness counts routed tokens
        self._stats.routing_steps += 1
        self._stats.hits += int(cached.sum())
        self._stats.misses += int((~cached).sum())
        self._drop_unwanted_prefetches(layer, pool, keys)
        batch = (
            pool.capacity if pool.decode_batch is None else min(pool.capacity, pool.decode_batch)
        )
        if len(experts) <= batch:
            slots = self._ensure(layer, pool, keys)
            if pool.decode_batch is None:
                remapped = slots[inverse].reshape(routing.shape).astype(np.int32)
                yield ExpertBatch(*pool.slab.weights(), mx.array(remapped))
            else:  # copies of the used slots, in ``experts`` order: each decoded once
                position = inverse.reshape(routing.shape).astype(np.int32)
                yield ExpertBatch(*pool.slab.weights(slots), mx.array(position))
            return
        # More experts than one batch takes: batches of at most ``batch`` experts, cached ones
        # first (they cost no read).
        order = np.argsort(~cached, kind="stable")
        for start in range(0, len(experts), batch):
            chunk = order[start : start + batch]
            slot_of = np.full(len(experts), -1, np.int64)
            slot_of[chunk] = self._ensure(layer, pool, keys[chunk])
            if pool.decode_batch is None:
                index_of, weights = slot_of, pool.slab.weights()
            else:
                index_of = np.full(len(experts), -1, np.int64)
                index_of[chunk] = np.arange(len(chunk))
                weights = pool.slab.weights(slot_of[chunk])
            pair_index = index_of[inverse]
            pairs = np.flatnonzero(pair_index >= 0)
            pairs = pairs[np.argsort(pair_index[pairs], kind="stable")]
            yield ExpertBatch(*weights, mx.array(pair_index[pairs].astype(np.int32)), pairs)

    def _ensure(self, layer: _StreamedLayer, pool: _Pool, keys: np.ndarray) -> np.ndarray:
        """Slots holding ``keys`` (at most the capacity), reading the missing experts."""
        slots = pool.policy.lookup(keys).copy()
        missing = np.flatnonzero(slots < 0)
        if not len(missing):
            return slots
        if self.newest_result is not None:
            mx.eval(self.newest_result)
            self.newest_result = None
        victims = pool.policy.victims(len(missing), protected=keys)
        reads: deque[tuple[int, _ExpertRead]] = deque()
        todo = deque(missing.tolist())
        window = pool.window  # bounds the converted experts waiting for a slot
        filled = 0
        while todo or reads:
            while todo and len(reads) < window:
                i = todo.popleft()
                read = pool.inflight.pop(int(keys[i]), None)
                if read is not None:
                    self._stats.prefetch_used += 1
                else:
                    read = _ExpertRead(self, layer, int(keys[i]) - layer.key_base)
                reads.append((i, read))
            i, read = reads.popleft()
            slot = int(victims[filled])
            filled += 1
            self._fill(pool, slot, int(keys[i]), read.result())
            slots[i] = slot
        return slots

    def _fill(self, pool: _Pool, slot: int, key: int, expert: tuple[HostWeight, ...]) -> None:
        if pool.policy.assign(slot, key) >= 0:
            self._stats.evictions += 1
        pool.slab.write(slot, expert)

    def _prefetch(self, layer: _StreamedLayer, indices: mx.array) -> None:
        """Starts reads of the predicted experts (most-routed first) into the staging room."""
        self.finish_loading()
        pool = layer.pool
        if pool is None or pool.staging == 0:
            return
        experts, counts = np.unique(np.array(indices).reshape(-1), return_counts=True)
        for expert in experts[np.argsort(-counts, kind="stable")].tolist():
            key = layer.key_base + expert
            if pool.policy.lookup(np.array([key]))[0] >= 0 or key in pool.inflight:
                continue
            if pool.staged() >= pool.staging:
                break
            pool.inflight[key] = _ExpertRead(self, layer, expert)
            self._stats.prefetched += 1

    def _drop_unwanted_prefetches(
        self, layer: _StreamedLayer, pool: _Pool, keys: np.ndarray
    ) -> None:
        """Hinted reads for this layer that its routing does not need: cancel or let drain."""
        wanted = set(keys.tolist())
        end = layer.key_base + layer.n_experts
        for key in [k for k in pool.inflight if layer.key_base <= k < end and k not in wanted]:
            read = pool.inflight.pop(key)
            if not read.cancel():
                pool.draining.append(read)

    # -- hot-list ----------------------------------------------------------------------------

    def save_hotlist(self, path: str | Path) -> int:
        """Writes the experts with any hotness, hottest first; returns how many."""
        self.finish_loading()
        by_key = {}
        for layer in self.layers:
            for key in range(layer.key_base, layer.key_base + layer.n_experts):
                by_key[key] = (layer.prefix, key - layer.key_base)
        entries = []
        for pool in self.pools:
            keys, hot = pool.policy.hottest()
            pool_keys = {
                k
                for layer in pool.layers
                for k in range(layer.key_base, layer.key_base + layer.n_experts)
            }
            entries += [
                (float(h), *by_key[int(k)])
                for k, h in zip(keys, hot, strict=True)
                if int(k) in pool_keys
            ]
        entries.sort(key=lambda e: -e[0])
        document = {
            "format": HOTLIST_FORMAT,
            "version": 1,
            "model": self.gguf.path.name,
            "experts": [
                {"layer": layer, "expert": expert, "hotness": round(hot, 6)}
                for hot, layer, expert in entries
            ],
        }
        Path(path).write_text(json.dumps(document, indent=1) + "\n")
        return len(entries)

    def load_hotlist(self, path: str | Path) -> int:
        """Seeds hotness from a hot-list and fills the slots with its hottest experts; returns
        how many were read. Raises ValueError for a file that is not a hot-list of this model."""
        self.finish_loading()
        path = Path(path)
        try:
            document = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"expert hot-list {path}: cannot read it: {exc}") from None
        if not isinstance(document, dict) or document.get("format") != HOTLIST_FORMAT:
            raise ValueError(f"expert hot-list {path}: not a {HOTLIST_FORMAT} file")
        layers = {layer.prefix: layer for layer in self.layers}
        entries = document.get("experts")
        if not isinstance(entries, list):
            raise ValueError(f"expert hot-list {path}: 'experts' must be a list")
        seeded: list[tuple[float, _StreamedLayer, int]] = []
        for n, entry in enumerate(entries):
            try:
                layer = layers[entry["layer"]]
                expert, hot = entry["expert"], float(entry["hotness"])
            except (KeyError, TypeError, ValueError):
                raise ValueError(
                    f"expert hot-list {path}: entry {n} ({entry!r}) does not name "
                    "a routed-expert layer of this model with an expert and a "
                    "hotness"
                ) from None
            if (
                not isinstance(expert, int)
                or not 0 <= expert < layer.n_experts
                or not math.isfinite(hot)
                or hot < 0
            ):
                raise ValueError(
                    f"expert hot-list {path}: entry {n} ({entry!r}) is out of "
                    f"range ({layer.n_experts} experts, hotness >= 0)"
                )
            seeded.append((hot, layer, expert))
        read = 0
        for pool in self.pools:
            mine = sorted((s for s in seeded if s[1].pool is pool), key=lambda s: -s[0])
            if not mine:
                continue
            keys = np.array([layer.key_base + e for _, layer, e in mine])
            pool.policy.set_hotness(keys, np.array([h for h, _, _ in mine]))
            for _, layer, expert in mine[: pool.capacity]:
                key = np.array([layer.key_base + expert])
                if pool.policy.lookup(key)[0] < 0:
                    self._ensure(layer, pool, key)
                    read += 1
        self._stats.warm_loaded += read
        return read

    # -- the rest ----------------------------------------------------------------------------

    def drop_page_cache(self) -> bool:
        """Drops the model file's pages from the OS page cache (cold-read measurements)."""
        return self.reader.drop_page_cache()

    def stats(self) -> ExpertStats:
        s = self._stats
        s.bytes_read = self.reader.bytes_read
        s.reads = self.reader.reads
        s.read_seconds = self.reader.read_seconds
        s.budget_bytes = self.budget_bytes
        s.routed_bytes = self.routed_bytes
        s.resident_bytes = sum(
            int((p.policy.slot_key >= 0).sum()) * p.slab.slot_bytes for p in self.pools
        )
        return ExpertStats(**{f.name: getattr(s, f.name) for f in fields(s)})

    def close(self) -> None:
        # Only after routing steps ran: a failed or idle run must not overwrite a hot-list.
        if (
            self.options.save_hotlist
            and self.options.hotlist is not None
            and self._stats.routing_steps
        ):
            self.save_hotlist(self.options.hotlist)
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.reader.close()


def _configure_malloc(scratch_bytes: int) -> None:
    """glibc keeps freed large blocks in its heaps once its adaptive mmap threshold has grown,
    and each reader thread gets a heap of its own that keeps what it freed, so expert buffers
    read and freed again would stay in the process's RSS. A fixed 256 KiB threshold serves them
    and the larger conversion temporaries from mmap, unmapped on free; one heap for all threads
    (set before the reader threads start) stops per-thread heaps from holding the smaller
    ones. RSS then follows the budget.

    But a fresh mapping faults in every page it touches: measured, 1,400 page faults per
    converted tensor, more than doubling its conversion time. glibc serves large requests from
    free room at the heap top before mapping new memory, so the heap keeps ``scratch_bytes``
    there when it trims (M_TOP_PAD): the conversion temporaries reuse those pages. No-op where
    glibc's mallopt is not available."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_top_pad, m_mmap_threshold, m_arena_max = -2, -3, -8
    mallopt(m_mmap_threshold, 1 << 18)
    mallopt(m_top_pad, scratch_bytes)
    mallopt(m_arena_max, 1)


def _decode_batch(template: tuple[HostWeight, ...], layer: _StreamedLayer) -> int | None:
    """``_Pool.decode_batch`` for experts of this format: set when the weights are packed blocks
    that the twin kernels decode to float32 (neither Metal nor the CPU's block kernels, which
    compute on the slab's blocks where they lie)."""
    if PACKED_KERNELS == "metal" or cpu_keeps_blocks():
        return None
    if not any(h.kind == "packed" for h in template):
        return None
    decoded = sum(4 * math.prod(t.expert_shape) for t in layer.tensors)
    return max(1, TWIN_BATCH_BYTES // decoded)
