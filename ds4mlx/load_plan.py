"""The memory plan: what loading a model would need, read from its GGUF header alone (tensor
table and metadata) before anything is loaded. Dense bytes, routed-expert bytes, both as stored
and as held in memory in the chosen weights mode (``quants.resident_nbytes`` follows the loader's
conversions), the KV cache per 1k tokens at the model's shape, and for a memory size the verdict:
resident, streamed (``--ssd-stream``) with which expert cache, or not at all. ``ds4 plan`` prints
it, and ``ds4`` refuses to load a model resident when it says the model cannot fit
(``check_resident``), instead of swapping or being killed.

A verdict keeps ``HEADROOM`` (10%) above the weights, cache and KV it counts, for activations,
MLX's buffer cache and the converted tensor in flight while loading, adds ``RUNTIME_BYTES`` for
the process itself (interpreter, MLX, the parsed GGUF header: 0.4 GiB measured with
DeepSeek-V4-Flash's 129k-token vocabulary), and uses at most ``USABLE_SHARE`` of the memory: the
OS and other processes need the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ds4mlx.experts.options import AUTO_SHARE
from ds4mlx.gguf import WEIGHT_MODES, GGUFFile, open_gguf
from ds4mlx.gguf.quants import resident_nbytes, row_codes_nbytes
from ds4mlx.gguf.validate import validate_gguf

USABLE_SHARE = 0.85
HEADROOM = 1.10
RUNTIME_BYTES = 512 * 2**20
KV_TOKENS = 1024  # "per 1k tokens"
ROUTED_MARK = "_exps."  # stacked routed-expert tensors: blk.N.ffn_{gate,up,down}_exps.weight
GIB = 2**30


@dataclass(frozen=True)
class Verdict:
    """How the model fits a memory size: ``kind`` "resident", "streamed" or "none";
    ``cache_bytes`` the expert cache to give --expert-cache when streamed."""

    kind: str
    memory_bytes: int
    needed_bytes: int  # with HEADROOM: what the verdict's configuration uses at peak
    cache_bytes: int = 0
    cached_share: float = 0.0  # of the routed experts, when streamed

    def flags(self) -> str:
        if self.kind == "streamed":
            # Rounded down to 0.1 GiB: the cache must not grow past the plan.
            return f"--ssd-stream --expert-cache {int(self.cache_bytes / GIB * 10) / 10}"
        return ""


@dataclass(frozen=True)
class MemoryPlan:
    """A model's memory needs in one weights mode, from its GGUF header."""

    path: Path
    arch: str
    mode: str
    file_bytes: int
    dense_file_bytes: int
    routed_file_bytes: int
    dense_bytes: int  # held in memory in ``mode``
    routed_bytes: int
    expert_bytes: int  # one expert (gate + up + down) in memory, the largest layer's
    n_experts: int  # per layer
    n_used: int
    moe_layers: int
    kv_fixed_bytes: int | None  # sliding windows and compressor state: the same at any length
    kv_bytes_per_1k: int | None  # grows with the context
    ctx: int
    trained_ctx: int = 0  # the model's own context (GGUF context_length); 0 when not given

    @property
    def kv_bytes(self) -> int:
        if self.kv_bytes_per_1k is None or self.kv_fixed_bytes is None:
            return 0
        return self.kv_fixed_bytes + self.kv_bytes_per_1k * self.ctx // KV_TOKENS

    @property
    def min_cache_bytes(self) -> int:
        """The smallest expert cache a streamed run accepts: one layer's top-k experts."""
        return self.n_used * self.expert_bytes

    def resident_needed(self) -> int:
        return int(
            (self.dense_bytes + self.routed_bytes + self.kv_bytes) * HEADROOM + RUNTIME_BYTES
        )

    def streamed_needed(self, cache_bytes: int) -> int:
        return int((self.dense_bytes + cache_bytes + self.kv_bytes) * HEADROOM + RUNTIME_BYTES)

    def verdict(self, memory_bytes: int) -> Verdict:
        usable = memory_bytes * USABLE_SHARE
        if self.resident_needed() <= usable:
            return Verdict("resident", memory_bytes, self.resident_needed())
        if not self.routed_bytes:
            return Verdict("none", memory_bytes, self.resident_needed())
        room = int((usable - RUNTIME_BYTES) / HEADROOM) - self.dense_bytes - self.kv_bytes
        cache = min(room, int(AUTO_SHARE * self.routed_bytes))
        if cache < self.min_cache_bytes:
            return Verdict(
                "none",
                memory_bytes,
                self.streamed_needed(self.min_cache_bytes),
                self.min_cache_bytes,
            )
        return Verdict(
            "streamed", memory_bytes, self.streamed_needed(cache), cache, cache / self.routed_bytes
        )

    def context_that_fits(self, memory_bytes: int, streamed: bool) -> int | None:
        """The longest context whose KV cache fits ``memory_bytes`` beside the weights (all of
        them, or with ``streamed`` the smallest expert cache), at most the model's own; None
        when the plan cannot say (no trained context, or a cache it does not model)."""
        if not self.trained_ctx or self.kv_bytes_per_1k is None or self.kv_fixed_bytes is None:
            return None
        weights = self.dense_bytes + (self.min_cache_bytes if streamed else self.routed_bytes)
        usable = memory_bytes * USABLE_SHARE
        room = int((usable - RUNTIME_BYTES) / HEADROOM) - weights - self.kv_fixed_bytes
        if not self.kv_bytes_per_1k:
            return self.trained_ctx
        return max(0, min(self.trained_ctx, room * KV_TOKENS // self.kv_bytes_per_1k))

    def streamed_bound(self, cache_bytes: int) -> int:
        """The peak RSS bound of a streamed run with this cache that the rehearsal checks:
        dense weights + cache + KV, plus 10% (without ``RUNTIME_BYTES``)."""
        return int((self.dense_bytes + cache_bytes + self.kv_bytes) * HEADROOM)


def plan_memory(gguf: GGUFFile, mode: str, ctx: int = 4096) -> MemoryPlan:
    """The plan of an opened (validated) GGUF; ``mode`` "f32" or "native"."""
    if mode not in WEIGHT_MODES:
        raise ValueError(f"weights mode must be one of {', '.join(WEIGHT_MODES)}, got '{mode}'")
    tensors = gguf.layout.tensors
    dense_file = routed_file = dense = routed = 0
    per_layer_expert: dict[str, int] = {}
    experts_per_layer: dict[str, int] = {}
    for name, info in tensors.items():
        held = resident_nbytes(info.qtype, info.shape, mode)
        # A resident load also keeps the row kernels' codes (a streamed slot does not).
        codes = row_codes_nbytes(info.qtype, info.shape, mode)
        if ROUTED_MARK in name:
            routed_file += info.nbytes
            routed += held + codes
            if not name.endswith("_exps.weight"):  # per-expert scale companions: no geometry
                continue
            layer = name.split(ROUTED_MARK)[0].rsplit(".", 1)[0]
            n = info.shape[0] if len(info.shape) == 3 else 1
            experts_per_layer[layer] = n
            per_layer_expert[layer] = per_layer_expert.get(layer, 0) + held // n
        else:
            dense_file += info.nbytes
            dense += held + codes
    arch = gguf.arch
    used = gguf.get(f"{arch}.expert_used_count", 0)
    n_used = int(used[0] if isinstance(used, list) else used)
    kv_fixed, kv_per_1k = _kv_bytes(gguf, arch)
    return MemoryPlan(
        path=gguf.path,
        arch=arch,
        mode=mode,
        file_bytes=gguf.path.stat().st_size,
        dense_file_bytes=dense_file,
        routed_file_bytes=routed_file,
        dense_bytes=dense,
        routed_bytes=routed,
        expert_bytes=max(per_layer_expert.values(), default=0),
        n_experts=max(experts_per_layer.values(), default=0),
        n_used=n_used,
        moe_layers=len(experts_per_layer),
        kv_fixed_bytes=kv_fixed,
        kv_bytes_per_1k=kv_per_1k,
        ctx=ctx,
        trained_ctx=int(gguf.get(f"{arch}.context_length", 0) or 0),
    )


def _kv_bytes(gguf: GGUFFile, arch: str) -> tuple[int | None, int | None]:
    """(fixed, per 1k tokens) float32 cache bytes of a deepseek4 model; (None, None) for
    architectures whose cache the plan does not model."""
    if arch != "deepseek4":
        return None, None
    from ds4mlx.models.deepseek4 import CACHE_SLACK, CSA_RATIO, ModelArgs

    args = ModelArgs.from_gguf(gguf)
    fixed = per_1k = 0
    for ratio in args.compress_ratios[: args.num_layers]:
        # The raw keys of the sliding window (K = V, one head), plus the slack rows a decode
        # tile and a speculative rollback keep.
        fixed += (args.sliding_window + CACHE_SLACK) * args.head_dim * 4
        if not ratio:
            continue
        # Compressed keys (and, for CSA, the indexer's keys) of every completed block.
        dims = [args.head_dim] + ([args.index_head_dim] if ratio == CSA_RATIO else [])
        per_1k += KV_TOKENS // ratio * sum(dims) * 4
        # Each compressor's pending kv and score rows: the open block (two when CSA blocks
        # overlap, with rows twice as wide) plus the slack.
        overlap = 2 if ratio == CSA_RATIO else 1
        fixed += sum(2 * (overlap * ratio + CACHE_SLACK) * overlap * dim * 4 for dim in dims)
    return fixed, per_1k


def plan_model(path: str | Path, mode: str, ctx: int = 4096) -> MemoryPlan:
    """The plan of the GGUF at ``path`` (opened and validated here; raises GGUFError)."""
    return plan_memory(open_gguf(path), mode, ctx)


@dataclass(frozen=True)
class Oversized:
    """A model that does not fit resident in ``available`` bytes: its plan, the verdict for
    that memory, and whether it would fit at all with native weights (asked only in f32 mode,
    when streaming alone does not make it fit)."""

    plan: MemoryPlan
    available: int
    verdict: Verdict
    fits_native: bool = False


def check_resident(path: str | Path, mode: str, ctx: int, available: int) -> Oversized | None:
    """None when the model at ``path`` can be loaded resident in ``mode`` with ``available``
    bytes; else why not. The common case (it fits) costs one bounded walk of the header."""
    layout = validate_gguf(path)
    weights = sum(
        resident_nbytes(t.qtype, t.shape, mode) + row_codes_nbytes(t.qtype, t.shape, mode)
        for t in layout.tensors.values()
    )
    if weights * HEADROOM + RUNTIME_BYTES <= available:
        return None
    gguf = open_gguf(path)
    plan = plan_memory(gguf, mode, ctx)
    if plan.resident_needed() <= available:
        return None
    verdict = plan.verdict(available)
    fits_native = (
        verdict.kind != "streamed"
        and mode == "f32"
        and plan_memory(gguf, "native", ctx).verdict(available).kind != "none"
    )
    return Oversized(plan, available, verdict, fits_native)
