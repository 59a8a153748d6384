"""How big a decode step's MLX graph is: primitives per token, by block and by layer.

On the CPU every primitive costs a few microseconds of scheduling whatever its size, and on Metal
each is a dispatch, so for a small-batch decode step the primitive count, not the FLOPs, sets the
floor of a token's time. Counts are deterministic (a test may bound them); times are not.

How counting works: ``mx.export_to_dot`` writes the unevaluated graph behind some arrays, one
``shape=rectangle`` node per primitive application (a compiled function's fused kernel is one).
Attribution to blocks cuts the graph where a block's code starts and ends: the arrays pending at
a cut are counted for the block whose code built them and then evaluated, so every primitive is
counted once, by the block that made it. Cuts cannot change what each block builds, only where
evaluation happens, so the per-block sum equals the uncut total unless the cuts split a compiled
region; both are reported. Compiled decode tiles (``models.tiles``) run uncompiled for the
attribution, so the per-block counts are those of the uncompiled graph (more than the total,
which is the step as it runs).
"""

from __future__ import annotations

import importlib
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ds4mlx.models.tiles import uncompiled

import mlx.core as mx
import numpy as np

#: The blocks a step's primitives are attributed to ("other": embedding, cache bookkeeping and
#: whatever runs outside the named pieces).
BLOCKS = ("mhc", "attention", "indexer", "moe", "head", "other")

_RECTANGLE = re.compile(r'label ="([^"]*)", shape=rectangle')


def _arrays(obj: Any, out: list[mx.array]) -> list[mx.array]:
    """Every mx.array inside ``obj`` (through tuples, lists, dicts and dataclasses)."""
    if isinstance(obj, mx.array):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            _arrays(item, out)
    elif isinstance(obj, dict):
        for item in obj.values():
            _arrays(item, out)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            _arrays(getattr(obj, name), out)
    return out


def primitive_names(*arrays: mx.array) -> list[str]:
    """The primitive applications (by name) still to run to evaluate ``arrays``."""
    if not arrays:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.dot"
        mx.export_to_dot(str(path), *arrays)
        return _RECTANGLE.findall(path.read_text())


@dataclass
class GraphCount:
    """Primitive counts of one profiled computation."""

    total: int = 0  # the sum of the cuts (between layers)
    uncut_total: int = 0  # the same step counted on its whole graph
    attributed_total: int = 0  # the sum over blocks (compiled tiles run uncompiled for it)
    per_block: Counter = field(default_factory=Counter)
    per_layer: Counter = field(default_factory=Counter)
    per_name: Counter = field(default_factory=Counter)
    uncut_names: list[str] = field(default_factory=list)  # the uncut graph's primitives


class _Profiler:
    """Patches the model's pieces with cutting wrappers while active (see the module doc)."""

    def __init__(self, real_eval: Callable[..., None]):
        self.real_eval = real_eval
        self.count = GraphCount()
        self.tags: list[str] = []
        self.layer: int | None = None

    def cut(self, obj: Any) -> None:
        """Count the pending graph behind the arrays in ``obj`` for the current block (and
        layer), then evaluate it."""
        arrays = _arrays(obj, [])
        names = primitive_names(*arrays)
        tag = self.tags[-1] if self.tags else "other"
        self.count.total += len(names)
        self.count.per_block[tag] += len(names)
        self.count.per_name.update(names)
        if self.layer is not None:
            self.count.per_layer[self.layer] += len(names)
        if arrays:
            self.real_eval(*arrays)

    def wrap(self, fn: Callable[..., Any], tag: str) -> Callable[..., Any]:
        """``fn`` counted as block ``tag``."""
        return self._cutting(fn, lambda _: self.tags.append(tag), self.tags.pop)

    def wrap_layer(
        self, fn: Callable[..., Any], layer_of: Callable[[Any], int]
    ) -> Callable[..., Any]:
        """A block's ``__call__``, its work counted for layer ``layer_of(block)``."""
        return self._cutting(
            fn,
            lambda args: setattr(self, "layer", layer_of(args[0])),
            lambda: setattr(self, "layer", None),
        )

    def _cutting(
        self, fn: Callable[..., Any], enter: Callable[[tuple], None], leave: Callable[[], Any]
    ) -> Callable[..., Any]:
        def cutting(*args: Any, **kwargs: Any) -> Any:
            self.cut((args, kwargs))  # what the caller built so far is the caller's
            enter(args)
            try:
                out = fn(*args, **kwargs)
                self.cut(out)
            finally:
                leave()
            return out

        return cutting


# Where each block's code starts, per architecture: "module.Owner.attribute" under
# ds4mlx.models (a module-level function when there is no owner).
_PIECES: dict[str, dict[str, tuple[str, ...]]] = {
    "deepseek4": {
        "mhc": ("mhc.HyperConnection.__call__", "deepseek4.hc_expand"),
        "attention": (
            "deepseek4.Attention.__call__",
            "deepseek4.Attention.tile",
            "deepseek4.Attention._project",
            "deepseek4.Attention._extend",
            "deepseek4.Attention._extend_tile",
            "compressed_attention.CompressedAttention._attend_tile",
            "deepseek4.Attention.output",
        ),
        "indexer": (
            "compressed_attention.Compressor.rows",
            "compressed_attention.Compressor.pool",
            "compressed_attention.LightningIndexer.from_products",
            "compressed_attention.LightningIndexer.select",
            "compressed_attention.LightningIndexer.top_blocks",
        ),
        "moe": (
            "moe.SharedExpertMoE.__call__",
            "moe.SharedExpertMoE.tile",
            "moe.SharedExpertMoE.tile_routing",  # a streamed tile's (deepseek4.Block)
            "moe.SharedExpertMoE.tile_with_batch",
            "moe.SharedExpertMoE.tile_with_outputs",
        ),
        "head": ("deepseek4.Model.head", "deepseek4.Model._tile_head"),
    },
    "glm5_next": {
        "mhc": ("mhc.HyperConnection.__call__", "glm5_next.hc_expand"),
        "attention": (
            "kda.KDA.__call__",
            "kda.KDA.tile",
            "sparse_mla.SparseMLA.__call__",
            "sparse_mla.SparseMLA.project_tile",
            "sparse_mla.SparseMLA.attend_tile",
            "sparse_mla.SparseMLA.output_tile",
        ),
        "indexer": (
            "pool_indexer.PoolIndexer.pool",
            "pool_indexer.PoolIndexer.pool_tile",
            "pool_indexer.PoolIndexer.select",
            "pool_indexer.PoolIndexer.select_tile",
        ),
        "moe": ("moe.SharedExpertMoE.__call__", "moe.SharedExpertMoE.tile", "moe.SwiGLU.__call__"),
        "head": ("glm5_next.Model.head",),
    },
}


def _targets(arch: str) -> Iterator[tuple[Any, str, str]]:
    """(owner, attribute, block) of the code to cut at, for a model module's name."""
    for block, paths in _PIECES.get(arch, {}).items():
        for path in paths:
            module, *owners, attribute = path.split(".")
            owner: Any = importlib.import_module(f"ds4mlx.models.{module}")
            for name in owners:
                owner = getattr(owner, name)
            yield owner, attribute, block


@contextmanager
def _patched(
    network: Any,
    profiler: _Profiler | None,
    sink: list[tuple[Any, ...]] | None,
    pieces: bool = True,
    reads: list[str] | None = None,
) -> Iterator[None]:
    """While active, ``mx.eval`` inside the model either cuts (``profiler``: at layers, and at
    blocks with ``pieces``) or only records its arguments (``sink``, to time graph building
    apart from evaluation). A host read of an MLX array mid-step (``np.array``: a streamed
    expert store reads each layer's routing) evaluates what it depends on: the profiler cuts
    there, and with ``reads`` the primitives it evaluates are listed there."""
    arch = type(network).__module__.rsplit(".", 1)[-1]
    saved: list[tuple[Any, str, Any]] = []
    real_eval, real_async, real_array = mx.eval, mx.async_eval, np.array

    def host_read(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, mx.array):
            if profiler is not None:
                profiler.cut(value)
            elif reads is not None:
                reads.extend(primitive_names(value))
        return real_array(value, *args, **kwargs)

    def swap(owner: Any, name: str, value: Any) -> None:
        saved.append(
            (owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name))
        )
        setattr(owner, name, value)

    try:
        if profiler is not None:
            for owner, name, tag in _targets(arch) if pieces else ():
                if name in vars(owner):
                    swap(owner, name, profiler.wrap(vars(owner)[name], tag))
            block_class = type(network.blocks[0])
            layers = {id(block): i for i, block in enumerate(network.blocks)}
            for entry in ("__call__", "tile"):  # a chunk's and a decode tile's
                if entry in vars(block_class):
                    wrapped = vars(block_class)[entry]
                    swap(block_class, entry, profiler.wrap_layer(wrapped, lambda b: layers[id(b)]))
            mx.eval = mx.async_eval = lambda *a: profiler.cut(a)
        elif sink is not None:
            mx.eval = mx.async_eval = lambda *a: sink.append(a)
        if profiler is not None or reads is not None:
            np.array = host_read
        yield
    finally:
        mx.eval, mx.async_eval, np.array = real_eval, real_async, real_array
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def count_step(network: Any, state: Any, tokens: Sequence[int]) -> GraphCount:
    """Primitives of one ``network.forward`` of ``tokens`` on ``state`` (advanced), per layer
    and per block; ``uncut_total`` is counted on the uncut graph of a copy of the same step."""
    ids = mx.array(list(tokens), dtype=mx.int32)
    uncut: list[tuple[Any, ...]] = []
    read: list[str] = []
    with _patched(network, None, uncut, reads=read):
        network.forward(ids, state.copy())
    uncut_names = read + primitive_names(*_arrays(uncut, []))
    # Layers as they run: cuts between layers split no compiled tile.
    layers = _Profiler(mx.eval)
    with _patched(network, layers, None, pieces=False):
        network.forward(ids, state.copy())
    # Blocks: the tiles' Python runs uncompiled (compiled, it runs only when first traced).
    blocks = _Profiler(mx.eval)
    with _patched(network, blocks, None), uncompiled():
        network.forward(ids, state)
    count = layers.count
    count.per_layer = Counter(dict(sorted(count.per_layer.items())))
    count.per_block = blocks.count.per_block
    count.attributed_total = blocks.count.total
    count.uncut_total = len(uncut_names)
    count.uncut_names = uncut_names
    return count


def time_step(network: Any, state: Any, tokens: Sequence[int], repeats: int) -> tuple[float, float]:
    """Median ms to build and to evaluate the graph of one forward of ``tokens``, repeated on
    copies of ``state`` (so every repeat computes the same step)."""
    ids = mx.array(list(tokens), dtype=mx.int32)
    build, run = [], []
    for _ in range(repeats):
        pending: list[tuple[Any, ...]] = []
        copy = state.copy()
        start = time.perf_counter()
        with _patched(network, None, pending):
            network.forward(ids, copy)
        middle = time.perf_counter()
        mx.eval(*_arrays(pending, []))
        end = time.perf_counter()
        build.append((middle - start) * 1e3)
        run.append((end - middle) * 1e3)
    return statistics.median(build), statistics.median(run)


# DeepSeek-V4-Flash's compress ratio per layer (ds4-reference): none in layers 0-1, then CSA (4)
# and HCA (128) alternating; 43 layers.
FLASH_RATIOS = (0, 0) + (4, 128) * 20 + (4,)


def project_to_ratios(count: GraphCount, ratios: Sequence[int], target: Sequence[int]) -> int:
    """Primitives per token of a model with per-layer compress ratios ``target``, from the
    measured ``count`` of a model with ``ratios``: each target layer costs the mean of the
    measured layers of its ratio, and the rest (embedding, head, bookkeeping) stays.

    The count does not depend on widths, expert count or top-k (the same ops run on bigger
    arrays), only on the kinds of layers, so the tiny model predicts the real one's graph.
    """
    by_ratio: dict[int, list[int]] = {}
    for layer, n in count.per_layer.items():
        by_ratio.setdefault(ratios[layer], []).append(n)
    missing = sorted(set(target) - set(by_ratio))
    if missing:
        raise ValueError(f"no measured layer with compress ratio {missing}")
    outside = count.total - sum(count.per_layer.values())
    return outside + round(sum(statistics.mean(by_ratio[r]) for r in target))
