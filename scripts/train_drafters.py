#!/usr/bin/env python3
"""Distil the tiny DSpark and MTP drafters from the frozen tiny target.

Data: windows of the corpus (``scripts/build_corpus.py``) tokenized with the target's tokenizer,
mostly code, plus a pool of corpus pieces continued greedily by the target (made once at the
start: that is the text drafts are checked against at temperature 0). One stdlib file in
``HOLDOUT_EVERY`` is held out: the acceptance probes prompt with their beginnings. Each step runs
the frozen target over a few windows and trains the drafter on its distributions:

* DSpark, per block row k: 0.1 * CE(draft, target's greedy token) + 0.9 * L1(p_draft, p_target)
  + BCE(confidence, 1 - L1 / 2), weighted by exp(-k / 4); blocks anchored at random positions.
  The Markov head conditions on the target's greedy tokens (what an accepted draft holds), so a
  row k > 0 only trains where the window continues greedily after its anchor.
* MTP: 0.1 * CE + 0.9 * L1 at every position.

Drafter stages start as copies of the target's last layers, the head pieces as the target's;
``main_proj`` starts as the mean of the taps, the Markov and confidence heads at zero effect.
Training is deterministic for a given seed (fixed step counts, seeded sampling). The script
writes ``ds4-tiny-dspark.gguf`` (ds4's layout), ``ds4-tiny-dflash.gguf`` (llama.cpp's layout, the
same weights) and ``ds4-tiny-mtp.gguf``, then prints each drafter's measured greedy acceptance
on the held-out code prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ds4mlx
from ds4mlx.bench.speculation import HELD_OUT_CODE_FILES
from ds4mlx.loader import LoadedModel
from ds4mlx.models import deepseek4_dspark as dspark_net
from ds4mlx.models import deepseek4_mtp as mtp_net
from ds4mlx.models.deepseek4 import LayerCache
from ds4mlx.speculation import dspark, dspark_layout, mtp
from ds4mlx.speculation.config import DEFAULT_MTP_MARGIN
from ds4mlx.speculation.drafter import Drafter
from ds4mlx.speculation.probe import ProbeStats, greedy_continuation, probe_greedy
from ds4mlx.speculation.support_gguf import random_arrays

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from gguf import GGMLQuantizationType

HOLDOUT_EVERY = 10
CONTEXT_LENGTH = 4096  # recorded in the llama.cpp layout's metadata
CE_WEIGHT, L1_WEIGHT = 0.1, 0.9
POSITION_DECAY = 4.0  # DSpark row k weighs exp(-k / POSITION_DECAY)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


@dataclass
class Corpus:
    code: list[np.ndarray]
    chat: list[np.ndarray]
    held_out_code: list[np.ndarray]
    #: Training windows whose second half is the target's greedy continuation of the first.
    generated: list[np.ndarray] = field(default_factory=list)


def load_corpus(path: Path, target: LoadedModel, min_tokens: int) -> Corpus:
    documents = [json.loads(line) for line in path.open(encoding="utf-8")]
    documents.sort(key=lambda doc: doc["name"])
    corpus = Corpus([], [], [])
    n_code = 0
    for doc in documents:
        ids = np.array(target.tokenizer.encode(doc["text"]), dtype=np.int32)
        if len(ids) < min_tokens:
            continue
        if doc["name"].startswith("stdlib/"):
            held_out = n_code % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
            if Path(doc["name"]).name in HELD_OUT_CODE_FILES and not held_out:
                raise SystemExit(
                    f"{doc['name']} is a held-out bench prompt "
                    "(ds4mlx.bench.speculation) but would be trained on"
                )
            (corpus.held_out_code if held_out else corpus.code).append(ids)
            n_code += 1
        else:
            corpus.chat.append(ids)
    return corpus


def sample_windows(
    rng: np.random.Generator,
    corpus: Corpus,
    n: int,
    length: int,
    code_share: float,
    generated_share: float = 0.0,
) -> list[np.ndarray]:
    """Windows of ``length`` tokens: from the generated pool with probability
    ``generated_share``, else from code (``code_share``) or chat documents."""
    windows = []
    for _ in range(n):
        if corpus.generated and rng.random() < generated_share:
            pool = corpus.generated
        else:
            pool = corpus.code if rng.random() < code_share or not corpus.chat else corpus.chat
        doc = pool[rng.integers(len(pool))]
        start = rng.integers(len(doc) - length + 1)
        windows.append(doc[start : start + length])
    return windows


def generate_windows(
    target: LoadedModel,
    corpus: Corpus,
    rng: np.random.Generator,
    n: int,
    length: int,
    new_tokens: int,
    code_share: float,
) -> list[np.ndarray]:
    """``n`` training windows: a corpus piece continued by ``new_tokens`` greedy target tokens,
    the text drafts are checked against at temperature 0."""
    windows, start = [], time.perf_counter()
    for i, piece in enumerate(sample_windows(rng, corpus, n, length - new_tokens, code_share)):
        continuation = greedy_continuation(target, piece.tolist(), new_tokens, exact=False)
        windows.append(np.concatenate([piece, np.array(continuation, np.int32)]))
        if (i + 1) % 16 == 0 or i + 1 == n:
            elapsed = time.perf_counter() - start
            print(
                f"generated {i + 1}/{n} windows, {(i + 1) * new_tokens / elapsed:.0f} tokens/s, "
                f"ETA {elapsed / (i + 1) * (n - i - 1) / 60:.1f} min",
                flush=True,
            )
    return windows


@dataclass
class TargetView:
    """The frozen target's outputs on one window."""

    tokens: mx.array  # [T]
    taps: mx.array | None  # [T, n_taps * D] when layers were tapped
    streams: mx.array  # [T, hc, D]
    probs: mx.array  # [T, vocab]
    greedy: np.ndarray  # [T]


def target_view(target: LoadedModel, window: np.ndarray, taps: tuple[int, ...]) -> TargetView:
    tokens = mx.array(window)
    out = target.network.forward(
        tokens, target.network.new_state(), capture_layers=taps, return_hidden=True
    )
    tap = mx.concatenate([out.layers[i] for i in taps], axis=-1) if taps else None
    probs = mx.softmax(out.logits, axis=-1, precise=True)
    mx.eval(tap, probs, out.head_input)
    return TargetView(tokens, tap, out.head_input, probs, np.array(mx.argmax(out.logits, -1)))


def distillation_terms(
    logits: mx.array, view_probs: mx.array, labels: mx.array
) -> tuple[mx.array, mx.array]:
    """Per row: (0.1 * CE + 0.9 * L1 of the drafter's logits against the target, L1)."""
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    l1 = mx.sum(mx.abs(mx.exp(logp) - view_probs), axis=-1)
    ce = -mx.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
    return CE_WEIGHT * ce + L1_WEIGHT * l1, l1


# --------------------------------------------------------------------------------------------
# DSpark
# --------------------------------------------------------------------------------------------


def copy_target_tensor(
    target: LoadedModel, source: str, shape: tuple[int, ...]
) -> np.ndarray | None:
    """Target tensor ``source`` as float32 of ``shape``, or None when absent or of another size."""
    if not target.gguf.has_tensor(source):
        return None
    values = target.gguf.dequantize(source)
    return values.reshape(shape) if values.size == math.prod(shape) else None


def init_from_target(
    target: LoadedModel,
    shapes: Mapping[str, tuple[int, ...]],
    source_name: Callable[[str], str],
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Random arrays for ``shapes``, overwritten with the target's tensor ``source_name(name)``
    wherever the target has one of that size."""
    arrays = random_arrays(shapes, rng)
    for name, shape in shapes.items():
        copied = copy_target_tensor(target, source_name(name), shape)
        if copied is not None:
            arrays[name] = copied
    return arrays


def last_layer_source(target: LoadedModel, n_stages: int, prefix: str) -> Callable[[str], str]:
    """Stage s of a drafter (tensors ``{prefix}{s}.*``) starts as target layer
    ``n_layers - n_stages + s``; other names map to themselves."""
    n_layers = target.args.num_layers

    def source(name: str) -> str:
        if not name.startswith(prefix):
            return name
        stage, rest = name.removeprefix(prefix).split(".", 1)
        return f"blk.{max(0, n_layers - n_stages + int(stage))}.{rest}"

    return source


def init_dspark(
    target: LoadedModel, config: dspark_net.DSparkConfig, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    shapes = dspark_net.tensor_shapes(target.args, config)
    arrays = init_from_target(
        target, shapes, last_layer_source(target, config.stage_count, "blk."), rng
    )
    d, n_taps = target.args.hidden_size, len(config.target_layers)
    arrays[dspark_net.MAIN_PROJ] = np.tile(np.eye(d, dtype=np.float32) / n_taps, (1, n_taps))
    arrays[dspark_net.MARKOV_W2] = np.zeros(shapes[dspark_net.MARKOV_W2], np.float32)
    arrays[dspark_net.CONF_PROJ] = np.zeros(shapes[dspark_net.CONF_PROJ], np.float32)
    return arrays


@dataclass
class DSparkBatchItem:
    taps: mx.array
    anchors: np.ndarray
    blocks: mx.array  # [M, B]: anchor token then noise
    prev: mx.array  # [M * B]: the token each row's Markov bias conditions on
    probs: mx.array  # [M * B, vocab]: the target's distribution for each row
    labels: mx.array  # [M * B]: the target's greedy token for each row
    weights: mx.array  # [M * B]: position weight, 0 past the window's end


def dspark_item(
    view: TargetView, config: dspark_net.DSparkConfig, n_anchors: int, rng: np.random.Generator
) -> DSparkBatchItem:
    length, size = len(view.greedy), config.block_size
    anchors = np.sort(rng.choice(np.arange(1, length - 1), size=n_anchors, replace=False))
    rows = anchors[:, None] + np.arange(size)  # the target row whose next token row k predicts
    rows = np.minimum(rows, length - 1)
    tokens = np.array(view.tokens)
    # Row k > 0 trains only where the window continues greedily after the anchor: its target
    # distribution then conditions on the very tokens an accepted draft holds.
    greedy_next = np.concatenate([[True], tokens[1:] == view.greedy[:-1]])
    follows = np.cumprod(greedy_next[rows[:, 1:]], axis=1)
    valid = (anchors[:, None] + np.arange(size) < length) & np.concatenate(
        [np.ones((n_anchors, 1), bool), follows.astype(bool)], axis=1
    )
    prev = np.concatenate([tokens[anchors][:, None], view.greedy[rows[:, :-1]]], axis=1)
    blocks = np.full((n_anchors, size), config.noise_token_id, np.int32)
    blocks[:, 0] = tokens[anchors]
    weights = np.exp(-np.arange(size) / POSITION_DECAY)[None, :] * valid
    flat_rows = mx.array(rows.reshape(-1))
    return DSparkBatchItem(
        view.taps,
        anchors,
        mx.array(blocks),
        mx.array(prev.reshape(-1).astype(np.int32)),
        view.probs[flat_rows],
        mx.array(view.greedy[rows.reshape(-1)].astype(np.int32)),
        mx.array(weights.reshape(-1).astype(np.float32)),
    )


def dspark_loss(
    arrays: dict[str, mx.array],
    target: LoadedModel,
    config: dspark_net.DSparkConfig,
    items: list[DSparkBatchItem],
) -> mx.array:
    net = dspark_net.net_from_arrays(target.args, config, arrays, dspark.target_head(target))
    total = mx.array(0.0)
    weight_sum = 0.0
    for item in items:
        contexts = [
            dspark_net.BlockContext(keys, 0, item.anchors, config.block_size, net.window)
            for keys in net.context_keys(item.taps, 0)
        ]
        hidden = net.hidden(item.blocks, contexts)
        logits = net.logits(hidden) + net.markov_bias(item.prev)
        row_loss, l1 = distillation_terms(logits, item.probs, item.labels)
        accept = mx.stop_gradient(1.0 - 0.5 * l1)
        confidence = mx.clip(net.confidence(hidden, item.prev), 1e-6, 1 - 1e-6)
        bce = -(accept * mx.log(confidence) + (1 - accept) * mx.log(1 - confidence))
        total = total + mx.sum((row_loss + bce) * item.weights)
        weight_sum += float(mx.sum(item.weights))
    return total / weight_sum


# --------------------------------------------------------------------------------------------
# MTP
# --------------------------------------------------------------------------------------------


def init_mtp(target: LoadedModel, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = mtp_net.tensor_shapes(target.args)
    head_sources = {
        mtp_net.NORM: "output_norm.weight",
        mtp_net.HC_HEAD_FN: "output_hc_fn.weight",
        mtp_net.HC_HEAD_BASE: "output_hc_base.weight",
        mtp_net.HC_HEAD_SCALE: "output_hc_scale.weight",
    }
    block_source = last_layer_source(target, 1, "mtp.")

    def source(name: str) -> str:
        return head_sources.get(name) or block_source(name)

    arrays = init_from_target(target, shapes, source, rng)
    # The target's streams pass through at first; the token embedding's share is learnt.
    arrays[mtp_net.H_PROJ] = np.eye(target.args.hidden_size, dtype=np.float32)
    arrays[mtp_net.E_PROJ] *= 0.1
    return arrays


def mtp_loss(arrays: dict[str, mx.array], target: LoadedModel, views: list[TargetView]) -> mx.array:
    net = mtp_net.net_from_arrays(target.args, arrays, dspark.target_head(target))
    total = mx.array(0.0)
    rows = 0
    for view in views:
        # Row j: the token at j + 1 with the target's streams at j predicts the token at j + 2.
        _, logits, _ = net(view.tokens[1:-1], view.streams[:-2], 1, LayerCache())
        labels = mx.array(view.greedy[1:-1].astype(np.int32))
        row_loss, _ = distillation_terms(logits, view.probs[1:-1], labels)
        total = total + mx.sum(row_loss)
        rows += row_loss.shape[0]
    return total / rows


# --------------------------------------------------------------------------------------------
# Training and measuring
# --------------------------------------------------------------------------------------------


def train(
    name: str,
    arrays: dict[str, np.ndarray],
    steps: int,
    lr: float,
    batch: Callable[[int], object],
    loss_fn: Callable[..., mx.array],
    tokens_per_step: int,
) -> dict[str, np.ndarray]:
    """AdamW with warm-up and cosine decay; prints loss, tokens/s and ETA."""
    params = {k: mx.array(v) for k, v in arrays.items()}
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(lr * 0.01, lr, max(1, steps // 20)),
            optim.cosine_decay(lr, steps, lr * 0.05),
        ],
        [max(1, steps // 20)],
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.0)
    grad_fn = mx.value_and_grad(loss_fn)
    start, smoothed = time.perf_counter(), None
    for step in range(1, steps + 1):
        loss, grads = grad_fn(params, batch(step))
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        params = optimizer.apply_gradients(grads, params)
        mx.eval(params, optimizer.state, loss)
        smoothed = float(loss) if smoothed is None else 0.9 * smoothed + 0.1 * float(loss)
        if step % 10 == 0 or step == steps:
            elapsed = time.perf_counter() - start
            eta = elapsed / step * (steps - step)
            print(
                f"{name} step {step}/{steps} loss {smoothed:.4f} "
                f"{tokens_per_step * step / elapsed:.0f} tokens/s "
                f"elapsed {elapsed / 60:.1f} min ETA {eta / 60:.1f} min",
                flush=True,
            )
    return {k: np.array(v) for k, v in params.items()}


def measure(
    target: LoadedModel,
    drafter: Drafter,
    prompts: list[tuple[list[int], list[int]]],
    confidence_threshold: float = 0.0,
) -> ProbeStats:
    total = ProbeStats()
    for prompt, continuation in prompts:
        total.add(probe_greedy(target, drafter, prompt, continuation, confidence_threshold))
    return total


def eval_prompts(
    target: LoadedModel, corpus: Corpus, n: int, prompt_tokens: int, new_tokens: int
) -> list[tuple[list[int], list[int]]]:
    """Beginnings of held-out code files and the target's greedy continuations."""
    prompts = []
    for doc in corpus.held_out_code[:n]:
        prompt = [int(t) for t in doc[:prompt_tokens]]
        prompts.append((prompt, greedy_continuation(target, prompt, new_tokens)))
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=Path("assets/ds4-tiny.gguf"))
    parser.add_argument("--corpus", type=Path, default=Path("build/corpus/corpus.jsonl"))
    parser.add_argument("--out-dir", type=Path, default=Path("assets"))
    parser.add_argument("--drafters", choices=["dspark", "mtp", "both"], default="both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=128, help="tokens per training window")
    parser.add_argument("--batch", type=int, default=4, help="windows per step")
    parser.add_argument("--code-share", type=float, default=0.75)
    parser.add_argument(
        "--generated",
        type=int,
        default=96,
        help="windows continued greedily by the target, made once",
    )
    parser.add_argument("--generated-tokens", type=int, default=64)
    parser.add_argument("--generated-share", type=float, default=0.5)
    parser.add_argument("--dspark-steps", type=int, default=500)
    parser.add_argument("--mtp-steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--anchors", type=int, default=32, help="DSpark blocks per window")
    parser.add_argument("--block-size", type=int, default=5)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--markov-rank", type=int, default=64)
    parser.add_argument("--taps", type=int, default=3, help="tap the target's last N layers")
    parser.add_argument(
        "--noise-token",
        type=int,
        default=None,
        help="default: the tokenizer's BOS (never generated mid-text)",
    )
    parser.add_argument("--mtp-draft", type=int, default=3)
    parser.add_argument(
        "--matrix-type",
        choices=("q8_0", "f16", "bf16", "f32"),
        default="q8_0",
        help="how the DSpark files store their matrices (ds4's files: Q8_0)",
    )
    parser.add_argument("--eval-prompts", type=int, default=12)
    parser.add_argument("--eval-prompt-tokens", type=int, default=64)
    parser.add_argument("--eval-new-tokens", type=int, default=64)
    args = parser.parse_args()

    mx.random.seed(args.seed)
    target = ds4mlx.load_model(args.target, weights_dtype="f32")
    corpus = load_corpus(
        args.corpus, target, min_tokens=max(args.window, args.eval_prompt_tokens + 1)
    )
    print(
        f"target {target.args_summary()}; corpus: {len(corpus.code)} code, "
        f"{len(corpus.chat)} chat, {len(corpus.held_out_code)} held-out code documents"
    )
    prompts = eval_prompts(
        target, corpus, args.eval_prompts, args.eval_prompt_tokens, args.eval_new_tokens
    )
    corpus.generated = generate_windows(
        target,
        corpus,
        np.random.default_rng(args.seed + 2),
        args.generated,
        args.window,
        args.generated_tokens,
        args.code_share,
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    n_layers = target.args.num_layers
    taps = tuple(range(max(0, n_layers - args.taps), n_layers))
    noise = args.noise_token
    if noise is None:
        bos = target.tokenizer.bos_id
        noise = target.args.vocab_size - 1 if bos is None else bos

    if args.drafters in ("dspark", "both"):
        rng = np.random.default_rng(args.seed)
        config = dspark_net.DSparkConfig(
            args.block_size, noise, taps, args.stages, args.markov_rank, confidence=True
        )

        def dspark_batch(_step: int) -> list[DSparkBatchItem]:
            windows = sample_windows(
                rng, corpus, args.batch, args.window, args.code_share, args.generated_share
            )
            return [
                dspark_item(target_view(target, w, taps), config, args.anchors, rng)
                for w in windows
            ]

        arrays = train(
            "dspark",
            init_dspark(target, config, rng),
            args.dspark_steps,
            args.lr,
            dspark_batch,
            lambda params, items: dspark_loss(params, target, config, items),
            args.batch * args.window,
        )
        for arch, file in (
            (dspark_layout.ARCH_DS4, "ds4-tiny-dspark.gguf"),
            (dspark_layout.ARCH_LLAMA, "ds4-tiny-dflash.gguf"),
        ):
            dspark.save_dspark(
                args.out_dir / file,
                arch,
                config,
                target,
                arrays,
                context_length=CONTEXT_LENGTH,
                matrix_type=GGMLQuantizationType[args.matrix_type.upper()],
            )
        drafter = dspark.load_dspark(args.out_dir / "ds4-tiny-dspark.gguf", target)
        for threshold in (0.0, 0.7):
            stats = measure(target, drafter, prompts, threshold)
            print(
                f"dspark (confidence >= {threshold}): tau {stats.tau:.3f}, acceptance "
                f"{stats.acceptance_rate:.3f} over {stats.cycles} verifies"
            )

    if args.drafters in ("mtp", "both"):
        rng = np.random.default_rng(args.seed + 1)

        def mtp_batch(_step: int) -> list[TargetView]:
            windows = sample_windows(
                rng, corpus, args.batch, args.window, args.code_share, args.generated_share
            )
            return [target_view(target, w, ()) for w in windows]

        arrays = train(
            "mtp",
            init_mtp(target, rng),
            args.mtp_steps,
            args.lr,
            mtp_batch,
            lambda params, views: mtp_loss(params, target, views),
            args.batch * args.window,
        )
        mtp.save_mtp(args.out_dir / "ds4-tiny-mtp.gguf", target, arrays)
        for margin in (0.0, DEFAULT_MTP_MARGIN):
            drafter = mtp.load_mtp(
                target, args.out_dir / "ds4-tiny-mtp.gguf", max_draft=args.mtp_draft, margin=margin
            )
            stats = measure(target, drafter, prompts)
            print(
                f"mtp (draft {args.mtp_draft}, margin {margin}): tau {stats.tau:.3f}, "
                f"acceptance {stats.acceptance_rate:.3f} over {stats.cycles} verifies"
            )


if __name__ == "__main__":
    main()
