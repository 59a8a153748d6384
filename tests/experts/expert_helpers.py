"""Shared helpers for the expert-store tests: loading a model resident or streamed at a share
of its routed experts, and feeding it in the chunkings the engine uses."""

from __future__ import annotations

import os
from pathlib import Path

import ds4mlx
from ds4mlx.experts import ExpertOptions, StreamedStore
from ds4mlx.gguf import open_gguf

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY = REPO_ROOT / "assets" / "ds4-tiny.gguf"
ORACLE_DIR = Path(os.environ.get("DS4MLX_ORACLE_DIR", REPO_ROOT.parent / "shared" / "oracle"))


def routed_info(path: Path, weights_dtype: str = "auto") -> tuple[int, int, int]:
    """(routed bytes as computed with, bytes of one expert, the most experts a token uses)."""
    model = ds4mlx.load_model(path, weights_dtype=weights_dtype)
    routed = model.expert_stats().routed_bytes
    keys = sum(
        m.experts.layer.gate.shape[0]
        for _, m in model.network.named_modules()
        if type(m).__name__ == "SharedExpertMoE"
    )
    n_used = max(
        m.n_used for _, m in model.network.named_modules() if type(m).__name__ == "SharedExpertMoE"
    )
    return routed, routed // keys, n_used


def budget_gib(path: Path, share: float | str, weights_dtype: str = "auto") -> float:
    """A budget of ``share`` of the routed experts, or "min": one layer's top-k (also the
    floor: a model with few experts, e.g. 2 of 2 used, cannot stream with less)."""
    routed, per_expert, n_used = routed_info(path, weights_dtype)
    minimum = per_expert * n_used + 1
    if share == "min":
        return minimum / 2**30
    return max(routed * share + 1, minimum) / 2**30


def streamed(path: Path, gib: float, weights_dtype: str = "auto", **options):
    return ds4mlx.load_model(
        path,
        weights_dtype=weights_dtype,
        experts=ExpertOptions(stream=True, cache_gib=gib, **options),
    )


def feed_patterns(model, tokens: list[int]) -> list[np.ndarray]:
    """Logits of one batch, then prefill + one-token decode + a 3-row verify chunk."""
    out = [model.logits(tokens)]
    session = model.new_session()
    half = len(tokens) // 2
    out.append(session.feed(tokens[:half]))
    for t in tokens[half : half + 4]:
        out.append(session.feed([t]))
    out.append(session.feed(tokens[half + 4 : half + 7]))
    return out


# The tiny model's MoE layers: 6, of 8 experts each, all of one format.
TINY_MOE_LAYERS = 6
TINY_EXPERTS = 8


def expert_names(layer: int) -> tuple[str, str, str]:
    return tuple(f"blk.{layer}.ffn_{p}_exps.weight" for p in ("gate", "up", "down"))


def make_store(
    slots: float | None = None, layers: int = TINY_MOE_LAYERS, n_used: int = 2, **options
) -> StreamedStore:
    """A streamed store of the tiny model's layers, built by hand (no model loaded), each
    layer routing ``n_used`` experts a token; ``slots``: a budget of that many experts' bytes."""
    options = {"read_threads": 2, **options}
    store = StreamedStore(open_gguf(TINY), "native", ExpertOptions(stream=True, **options))
    for i in range(layers):
        store.layer(expert_names(i), None, n_used=n_used)
    if slots is not None:
        slot_bytes = sum(store.reader.read_tensor(t, 0).nbytes for t in store.layers[0].tensors)
        budget = ExpertOptions(stream=True, cache_gib=slots * slot_bytes / 2**30, **options)
        store.options = budget
    return store
