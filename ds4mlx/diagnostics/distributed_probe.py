"""One rank of a measured distributed run:
``python -m ds4mlx.diagnostics.distributed_probe --out DIR ...`` (under ``mlx.launch`` for several
ranks, or alone for the single-process reference).

Each rank loads its shard, computes the prompt's logits, decodes greedily with the target alone
and, given ``--drafter``, with DSpark, then writes ``DIR/rank{r}.json`` (tokens, timings, peak
RSS, weight bytes, bytes summed) and ``DIR/rank{r}_logits.npy``. All ranks must produce the
same tokens; each rank's file lets a caller check that.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ds4mlx.distributed.group import init_group, watchdog
from ds4mlx.experts.store import weight_nbytes
from ds4mlx.generation import (
    DrafterKind,
    SamplingOptions,
    SpeculationConfig,
    TokenEvent,
    generate,
    load_drafter,
)
from ds4mlx.kernels import PackedWeight, QuantizedWeight
from ds4mlx.loader import LoadedModel, load_model
from ds4mlx.memory import peak_rss_bytes

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten


def weight_bytes(model: LoadedModel) -> int:
    """Bytes of the model's weights held by this process (its shard, plus replicated tensors):
    its arrays and its quantized weights (GGUF blocks or MLX's layouts, module attributes that
    MLX's parameter tree does not list)."""
    arrays = sum(
        v.nbytes for _, v in tree_flatten(model.network.parameters()) if isinstance(v, mx.array)
    )
    quantized = {
        id(w): w
        for module in model.network.modules()
        for w in vars(module).values()
        if isinstance(w, (PackedWeight, QuantizedWeight))
    }
    return arrays + sum(weight_nbytes(w) for w in quantized.values())


def greedy(
    model: LoadedModel, prompt: list[int], n: int, config: SpeculationConfig | None
) -> tuple[list[int], float]:
    """(greedy tokens after ``prompt``, decode tokens/s), speculating when ``config`` asks."""
    drafter = None if config is None else load_drafter(config, model)
    tokens, tps = [], 0.0
    for event in generate(model.new_session(), prompt, n, SamplingOptions(), drafter, config):
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
        else:
            tps = event.stats.decode_tps
    return tokens, tps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--drafter", help="DSpark support GGUF (adds a speculative run)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--single", action="store_true", help="no group: the reference run")
    parser.add_argument("--prompt-len", type=int, default=48)
    parser.add_argument("-n", "--n-predict", type=int, default=24)
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="exit with a message if the run takes longer (a stuck rank)",
    )
    args = parser.parse_args(argv)

    done = watchdog(args.timeout, "the probe run")
    ranks = None if args.single else init_group("ring")
    rank = 0 if ranks is None else ranks.rank
    started = time.perf_counter()
    model = load_model(args.model, ranks=ranks)
    load_seconds = time.perf_counter() - started
    # Token ids from the middle of the vocabulary: any model, no tokenizer needed.
    vocab = model.args.vocab_size
    prompt = [int(t) for t in (np.arange(args.prompt_len) * 37 + 11) % (vocab - 16) + 8]

    def summed() -> int:
        return 0 if ranks is None else ranks.summed_bytes

    # The greedy run's prefill is this same one-chunk feed of the prompt, so the difference of
    # the two byte counts is what its decode steps summed.
    start = summed()
    logits = model.logits(prompt)
    prefill_bytes = summed() - start
    plain, plain_tps = greedy(model, prompt, args.n_predict, None)
    decode_bytes = summed() - start - 2 * prefill_bytes
    report: dict = {
        "rank": rank,
        "size": 1 if ranks is None else ranks.size,
        "load_seconds": load_seconds,
        "weight_bytes": weight_bytes(model),
        "greedy": plain,
        "greedy_decode_tps": plain_tps,
        # The first token comes from the prefill; each later one from one decode step.
        "summed_bytes_per_token": decode_bytes / max(1, len(plain) - 1),
        "prefill_summed_bytes": prefill_bytes,
        "prompt_tokens": len(prompt),
    }
    if args.drafter:
        config = SpeculationConfig(kind=DrafterKind.DSPARK, support_path=Path(args.drafter))
        report["dspark"], report["dspark_decode_tps"] = greedy(
            model, prompt, args.n_predict, config
        )
    report["peak_rss_bytes"] = peak_rss_bytes()
    args.out.mkdir(parents=True, exist_ok=True)
    np.save(args.out / f"rank{rank}_logits.npy", logits)
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    model.close()
    done.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
