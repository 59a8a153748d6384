#!/usr/bin/env python3
"""Train ds4mlx's embedded default model, ``assets/ds4-tiny.gguf``, from scratch on the CPU.

A DeepSeek-V4-architecture model small enough to train in minutes, with every feature of the real
one: mHC residual streams, CSA/HCA compressed attention with a lightning indexer, a sliding
window, sinks, grouped low-rank output, hash-routed and score-routed experts with a shared expert,
clamped SwiGLU and YaRN RoPE. Stages, each skippable once its output exists:

1. corpus     ``build/corpus/``            (``scripts/build_corpus.py``)
2. tokenizer  ``build/tokenizer.json``     (``scripts/train_tokenizer.py``)
3. train      ``build/ds4-tiny.safetensors``: random init, then AdamW through the inference
              model's own forward (``deepseek4.Model.from_arrays``)
4. export     ``assets/ds4-tiny.gguf``: quantized in the real DeepSeek-V4-Flash GGUFs' mix
5. verify     held-out NLL of the checkpoint and of the GGUF, greedy chat generations

Every random choice is seeded: a rerun on the same Python and MLX versions rebuilds the same
corpus, tokenizer and model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ds4mlx  # first: preloads BLAS before anything imports mlx.core
from ds4mlx.agent.tool_schemas import AGENT_TOOLS, SYSTEM_PROMPT
from ds4mlx.engine.chat import deepseek4
from ds4mlx.engine.generate import TokenEvent
from ds4mlx.engine.sampling import SamplingOptions
from ds4mlx.engine.tokenizer import write_tokenizer_metadata
from ds4mlx.generation import generate
from ds4mlx.gguf import MetaValue, quantize
from ds4mlx.kernels import linear, swiglu
from ds4mlx.loader import LoadedModel
from ds4mlx.models.cache import ModelState
from ds4mlx.models.deepseek4 import ARCH, Model, ModelArgs, tensor_shapes
from ds4mlx.models.moe import GatingFunc, RoutedExperts

import build_corpus
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import tiny_training
import train_tokenizer
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf import GGUFValueType as V
from tokenizers import Tokenizer as HFTokenizer

BUILD = Path("build")
CORPUS_DIR = BUILD / "corpus"
TOKENIZER_PATH = BUILD / "tokenizer.json"
CHECKPOINT_PATH = BUILD / "ds4-tiny.safetensors"
REPORT_PATH = BUILD / "ds4-tiny-report.json"
GGUF_PATH = Path("assets") / "ds4-tiny.gguf"
STAGES = ("corpus", "tokenizer", "train", "export", "verify")
T = GGMLQuantizationType


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def model_args(vocab_size: int) -> ModelArgs:
    """The tiny model: DeepSeek-V4-Flash's structure at d=256 (the smallest width K-quants
    allow: Q2_K/Q4_K/Q6_K rows are multiples of 256 values)."""
    layers = 6
    return ModelArgs(
        vocab_size=vocab_size,
        hidden_size=256,
        num_layers=layers,
        num_heads=4,
        head_dim=64,
        rope_dims=32,
        q_lora_rank=128,
        o_groups=2,
        o_lora_rank=64,
        sliding_window=64,
        # Two plain sliding-window layers, then CSA (4) and HCA (128) alternating.
        compress_ratios=(0, 0, 4, 128, 4, 128),
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        compress_rope_theta=160000.0,
        rope_scaling_type="yarn",
        rope_freq_scale=1.0 / 4.0,
        rope_orig_ctx=1024,
        n_experts=8,
        n_experts_used=2,
        n_shared_experts=1,
        expert_ff=256,
        expert_weights_scale=1.5,
        expert_weights_norm=True,
        gating_func=GatingFunc.SQRT_SOFTPLUS,
        swiglu_limits=(10.0,) * layers,
        swiglu_limits_shared=(10.0,) * layers,
        n_hash_layers=1,
        index_heads=4,
        index_head_dim=64,
        # 16 of the 256 CSA blocks of a 1024-token context.
        index_topk=16,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
    )


CONTEXT_LENGTH = 4096  # rope_orig_ctx times the YaRN factor


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 1000
    # Every chat sample opens with the same ~840 tokens (BOS, the agent's system prompt and its
    # ten tool schemas), so its tool calls sit at positions 840 and beyond. A chat step
    # continues the model state after that prefix with the rest of several samples back to
    # back (a multi-turn conversation); the loss is on the assistant turns only. No gradient
    # flows into the prefix (the model never has to write it), so its state is only recomputed
    # every ``prefix_refresh`` chat steps: the weights move little in between.
    chat_tokens: int = 256  # continuation length of a chat step
    prefix_refresh: int = 8
    text_window: int = 512
    # Half the steps: the chat format is learned in a few hundred steps, code and prose need
    # every token they can get.
    chat_fraction: float = 0.5  # of the steps
    peak_lr: float = 3e-3
    final_lr_fraction: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # Aux-loss-free balancing (DeepSeek-V3): each step, the selection bias of an expert that got
    # fewer tokens than average rises by this much, and falls for one that got more.
    balance_rate: float = 0.01
    heldout_every: int = 20  # every n-th document of each kind is held out
    eval_documents: int = 5  # held-out chats, and held-out text windows, per evaluation
    eval_points: int = 2  # evaluations during training (plus the final one)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


@dataclass
class ChatTokens:
    """A chat's token ids after the shared prefix, and which of them the assistant writes."""

    ids: np.ndarray
    assistant: np.ndarray  # bool, per token

    @classmethod
    def from_ids(cls, ids: np.ndarray, assistant_id: int, eos_id: int) -> ChatTokens:
        """An assistant turn runs from after ``<｜Assistant｜>`` through its EOS."""
        assistant = np.zeros(len(ids), bool)
        inside = False
        for index, token in enumerate(ids.tolist()):
            assistant[index] = inside
            if token == assistant_id:
                inside = True
            elif token == eos_id:
                inside = False
        return cls(ids, assistant)

    @classmethod
    def packed(cls, chats: list[ChatTokens], length: int) -> ChatTokens:
        """``chats`` back to back, cut to ``length`` tokens."""
        return cls(
            np.concatenate([c.ids for c in chats])[:length],
            np.concatenate([c.assistant for c in chats])[:length],
        )


@dataclass
class Corpus:
    """The tokenized corpus. Chats are stored after their shared prefix."""

    chat_prefix: np.ndarray
    chat_train: list[ChatTokens]
    chat_heldout: list[ChatTokens]
    text_train: np.ndarray  # documents concatenated
    text_heldout: np.ndarray


def shared_prefix_length(documents: list[list[int]]) -> int:
    first = np.asarray(documents[0])
    length = len(first)
    for document in documents[1:]:
        n = min(length, len(document))
        mismatch = np.flatnonzero(first[:n] != np.asarray(document[:n]))
        length = int(mismatch[0]) if len(mismatch) else n
    return length


def load_corpus(tokenizer: HFTokenizer, heldout_every: int) -> Corpus:
    """Tokenize the corpus; every ``heldout_every``-th chat and text document is held out."""
    names, texts = [], []
    with open(CORPUS_DIR / "corpus.jsonl", encoding="utf-8") as handle:
        for line in handle:
            document = json.loads(line)
            names.append(document["name"])
            texts.append(document["text"])
    encoded = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    chats = [ids for name, ids in zip(names, encoded, strict=True) if name.startswith("chat/")]
    others = [ids for name, ids in zip(names, encoded, strict=True) if not name.startswith("chat/")]
    prefix = shared_prefix_length(chats)
    assistant_id = tokenizer.token_to_id(deepseek4.ASSISTANT)
    eos_id = tokenizer.token_to_id(deepseek4.EOS)
    rests = [
        ChatTokens.from_ids(np.asarray(ids[prefix:], np.int32), assistant_id, eos_id)
        for ids in chats
    ]

    def split(documents: list) -> tuple[list, list]:
        return (
            [d for i, d in enumerate(documents) if i % heldout_every],
            [d for i, d in enumerate(documents) if not i % heldout_every],
        )

    chat_train, chat_heldout = split(rests)
    text_train, text_heldout = split(others)
    return Corpus(
        np.asarray(chats[0][:prefix], np.int32),
        chat_train,
        chat_heldout,
        np.concatenate(text_train).astype(np.int32),
        np.concatenate(text_heldout).astype(np.int32),
    )


def text_window(stream: np.ndarray, start: int, length: int) -> np.ndarray:
    """``length`` tokens from ``start``, wrapping around at the end of the stream."""
    return np.take(stream, np.arange(start, start + length), mode="wrap")


@dataclass
class EvalSet:
    """Fixed held-out data: chats (continuing the shared prefix) and text windows."""

    chats: list[ChatTokens]
    texts: list[np.ndarray]

    @classmethod
    def from_corpus(cls, corpus: Corpus, cfg: TrainConfig) -> EvalSet:
        picks = np.linspace(0, len(corpus.chat_heldout) - 1, cfg.eval_documents).astype(int)
        starts = np.linspace(
            0, len(corpus.text_heldout) - cfg.text_window - 2, cfg.eval_documents
        ).astype(int)
        return cls(
            [corpus.chat_heldout[i] for i in picks],
            [text_window(corpus.text_heldout, s, cfg.text_window + 1) for s in starts],
        )


# --------------------------------------------------------------------------------------------
# Model construction and initialisation
# --------------------------------------------------------------------------------------------


class GroupedRoutedExperts(RoutedExperts):
    """``RoutedExperts`` for training: the (token, expert) pairs are sorted by expert and each
    expert runs one plain matmul on its rows. The same result as ``gather_mm``, which MLX's
    CPU backend runs (and differentiates) several times slower; the price is reading the routing
    on the host, a synchronisation per layer. ``load`` accumulates the tokens per expert, for
    balancing."""

    def __init__(self, experts: RoutedExperts):
        super().__init__(experts.gate, experts.up, experts.down, swiglu_limit=experts.swiglu_limit)
        self.load = np.zeros(experts.gate.shape[0], np.int64)

    def __call__(self, x: mx.array, indices: mx.array, weights: mx.array) -> mx.array:
        flat = indices.flatten()
        counts = np.bincount(np.array(flat), minlength=len(self.load))
        self.load += counts
        order = mx.argsort(flat)
        rows = order // indices.shape[1]  # the token of each sorted pair
        inputs, pair_weights = x[rows], weights.flatten()[order]
        outputs, start = [], 0
        for expert, count in enumerate(counts.tolist()):
            if count:
                span = slice(start, start + count)
                hidden = swiglu(
                    linear(inputs[span], self.gate[expert]),
                    linear(inputs[span], self.up[expert]),
                    self.swiglu_limit,
                )
                outputs.append(linear(hidden, self.down[expert]) * pair_weights[span, None])
            start += count
        return mx.zeros(x.shape, x.dtype).at[rows].add(mx.concatenate(outputs))


def training_model(
    args: ModelArgs, arrays: Mapping[str, mx.array]
) -> tuple[Model, list[GroupedRoutedExperts]]:
    """The inference model on ``arrays``, with grouped routed experts (in layer order)."""
    model = Model.from_arrays(args, arrays)
    grouped = []
    for block in model.blocks:
        block.moe.experts = GroupedRoutedExperts(block.moe.experts)
        grouped.append(block.moe.experts)
    return model, grouped


def is_fixed(name: str) -> bool:
    """Tensors not trained by gradient: hash tables and the balancing-driven selection bias."""
    return name.endswith(("ffn_gate_tid2eid.weight", "exp_probs_b.bias"))


def init_tensor(
    name: str, shape: tuple[int, ...], args: ModelArgs, rng: np.random.Generator
) -> np.ndarray:
    hc = args.hc_mult
    if name.endswith("ffn_gate_tid2eid.weight"):
        # Each token id routes to n_experts_used distinct experts, as the real model's table.
        return np.stack(
            [rng.choice(args.n_experts, shape[1], replace=False) for _ in range(shape[0])]
        ).astype(np.int32)
    if name.endswith("_norm.weight"):
        return np.ones(shape, np.float32)
    if name.endswith(("_base.weight", "_scale.weight")):
        return hyper_connection_init(name, shape, hc)
    if len(shape) == 1:  # sinks, selection bias
        return np.zeros(shape, np.float32)
    if name.endswith("_ape.weight"):
        return np.zeros(shape, np.float32)  # equal gates: a block starts as the mean of its rows
    std = 0.02
    if name.endswith(("attn_output_b.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")):
        std /= math.sqrt(2 * args.num_layers)  # residual-stream writers (GPT-2's scaling)
    return (rng.standard_normal(shape) * std).astype(np.float32)


def hyper_connection_init(name: str, shape: tuple[int, ...], hc: int) -> np.ndarray:
    """mHC mixes that start as a plain pre-norm residual: ``pre`` averages the streams
    (sigmoid(b) = 1/hc), ``post`` writes the block output to every stream with weight
    2 sigmoid(0) = 1, ``comb`` is close to the identity; the learned ``fn`` projections start
    with a small ``scale``."""
    if name.endswith("_scale.weight"):
        return np.full(shape, 0.1, np.float32)
    pre = np.full(hc, -math.log(hc - 1), np.float32)
    if name == "output_hc_base.weight":
        return pre
    post = np.zeros(hc, np.float32)
    comb = np.where(np.eye(hc, dtype=bool), 4.0, 0.0).astype(np.float32)  # softmax -> 0.95 I
    return np.concatenate([pre, post, comb.reshape(-1)])


def init_arrays(args: ModelArgs, seed: int) -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    """(trainable tensors, fixed tensors) by GGUF name."""
    rng = np.random.default_rng(seed)
    trainable, fixed = {}, {}
    for name, shape in tensor_shapes(args).items():
        target = fixed if is_fixed(name) else trainable
        target[name] = mx.array(init_tensor(name, shape, args, rng))
    return trainable, fixed


def save_checkpoint(arrays: Mapping[str, mx.array], args: ModelArgs, report: dict) -> None:
    tiny_training.save_checkpoint(CHECKPOINT_PATH, arrays, args, report)


def load_checkpoint() -> tuple[dict[str, mx.array], ModelArgs, dict]:
    return tiny_training.load_checkpoint(CHECKPOINT_PATH, ModelArgs)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def text_nll(model: Model, window: np.ndarray) -> tuple[mx.array, int]:
    """Summed next-token NLL of ``window`` (its tokens but the last predict the next ones)."""
    tokens = mx.array(window)
    logits = model.forward(tokens[:-1], model.new_state(), evaluate=False)
    return nn.losses.cross_entropy(logits, tokens[1:], reduction="sum"), len(window) - 1


def prefix_state(model: Model, prefix: np.ndarray) -> tuple[ModelState, mx.array]:
    """The model's state after the shared chat prefix, and the prefix's last logits row."""
    state = model.new_state()
    logits = model.forward(mx.array(prefix), state)
    return state, logits[-1:]


def continuation_nll(
    model: Model, state: ModelState, last_logits: mx.array, tokens: ChatTokens
) -> tuple[mx.array, mx.array]:
    """Summed NLL of all of ``tokens`` and of its assistant tokens, continuing ``state`` (left
    as it was; ``last_logits``, its last logits row, predicts the first token)."""
    ids = mx.array(tokens.ids)
    logits = model.forward(ids[:-1], state.copy(), evaluate=False)
    nll = nn.losses.cross_entropy(mx.concatenate([last_logits, logits]), ids)
    return mx.sum(nll), mx.sum(nll * mx.array(tokens.assistant))


def heldout_nll(model: Model, prefix: np.ndarray, eval_set: EvalSet) -> dict[str, float]:
    """Mean NLL per token of the held-out chats after the shared prefix (all tokens, and the
    assistant's), and of the text windows."""
    state, last_logits = prefix_state(model, prefix)
    chat_sum = assistant_sum = 0.0
    for tokens in eval_set.chats:
        total, assistant = continuation_nll(model, state, last_logits, tokens)
        chat_sum, assistant_sum = chat_sum + total.item(), assistant_sum + assistant.item()
    text_sum, text_count = 0.0, 0
    for window in eval_set.texts:
        nll, count = text_nll(model, window)
        text_sum, text_count = text_sum + nll.item(), text_count + count
    return {
        "chat": chat_sum / sum(len(c.ids) for c in eval_set.chats),
        "assistant": assistant_sum / sum(int(c.assistant.sum()) for c in eval_set.chats),
        "text": text_sum / text_count,
    }


def unigram_nll(corpus: Corpus, eval_set: EvalSet, vocab_size: int) -> dict[str, float]:
    """``heldout_nll``'s figures for add-one token frequencies of the training data: the
    baseline that shows what the model learned beyond them."""

    def log_probs(ids: np.ndarray) -> np.ndarray:
        counts = np.bincount(ids, minlength=vocab_size) + 1.0
        return np.log(counts / counts.sum())

    chat_log_probs = log_probs(np.concatenate([c.ids for c in corpus.chat_train]))
    text_log_probs = log_probs(corpus.text_train)
    return {
        "chat": -float(np.mean(chat_log_probs[np.concatenate([c.ids for c in eval_set.chats])])),
        "assistant": -float(
            np.mean(chat_log_probs[np.concatenate([c.ids[c.assistant] for c in eval_set.chats])])
        ),
        "text": -float(np.mean(text_log_probs[np.concatenate([w[1:] for w in eval_set.texts])])),
    }


def train(cfg: TrainConfig, corpus: Corpus, vocab_size: int) -> None:
    args = model_args(vocab_size)
    mx.random.seed(cfg.seed)
    params, fixed = init_arrays(args, cfg.seed)
    n_params = sum(v.size for v in params.values())
    idle_experts = args.num_layers * (args.n_experts - args.n_experts_used)
    n_active = n_params - idle_experts * 3 * args.expert_ff * args.hidden_size
    print(f"model: {n_params / 1e6:.2f}M parameters, {n_active / 1e6:.2f}M active per token")

    optimizer = tiny_training.Optimizer(cfg, params)

    def arrays_of(params: dict[str, mx.array]) -> dict[str, mx.array]:
        return params | fixed

    def loss_and_load(
        groups: tiny_training.Groups,
        window: np.ndarray | None,
        chats: ChatTokens | None,
        prefix: tuple[ModelState, mx.array] | None,
    ) -> tuple[mx.array, list[mx.array]]:
        model, experts = training_model(args, arrays_of(groups["matrices"] | groups["vectors"]))
        if chats is None:
            nll, count = text_nll(model, window)
            loss = nll / count
        else:
            _, assistant_nll = continuation_nll(model, *prefix, chats)
            loss = assistant_nll / int(chats.assistant.sum())
        return loss, [mx.array(e.load) for e in experts]

    step_fn = mx.value_and_grad(loss_and_load)
    rng = np.random.default_rng(cfg.seed + 1)
    eval_set = EvalSet.from_corpus(corpus, cfg)
    eval_steps = tiny_training.evaluation_steps(cfg.steps, cfg.eval_points)
    log = tiny_training.ProgressLog(cfg.steps, optimizer.schedule)
    prefix: tuple[ModelState, mx.array] | None = None
    chat_steps = 0
    for step in range(1, cfg.steps + 1):
        window, chats = None, None
        if rng.random() < cfg.chat_fraction:
            # Enough chats to fill the continuation: every chat is longer than 32 tokens.
            picks = rng.choice(len(corpus.chat_train), cfg.chat_tokens // 32, replace=False)
            chats = ChatTokens.packed([corpus.chat_train[i] for i in picks], cfg.chat_tokens)
            if chat_steps % cfg.prefix_refresh == 0:
                prefix = prefix_state(
                    training_model(args, arrays_of(optimizer.params()))[0], corpus.chat_prefix
                )
            chat_steps += 1
        else:
            start = int(rng.integers(len(corpus.text_train)))
            window = text_window(corpus.text_train, start, cfg.text_window + 1)
        (loss, loads), grads = step_fn(optimizer.groups, window, chats, prefix)
        grad_norm = optimizer.step(grads)
        tiny_training.rebalance_experts(
            fixed,
            {layer: loads[layer] for layer in range(args.n_hash_layers, args.num_layers)},
            cfg.balance_rate,
        )
        mx.eval(optimizer.groups, optimizer.state(), fixed, loss)
        log.record(
            step,
            "text" if chats is None else "assistant",
            loss.item(),
            cfg.text_window if chats is None else len(chats.ids),
            grad_norm,
            lambda mean: f"{mean:.3f}",
        )
        if step in eval_steps:
            nll = heldout_nll(
                training_model(args, arrays_of(optimizer.params()))[0], corpus.chat_prefix, eval_set
            )
            print(
                f"step {step:4d}  held-out NLL  chat {nll['chat']:.3f}  assistant "
                f"{nll['assistant']:.3f}  text {nll['text']:.3f}",
                flush=True,
            )
            log.history.append({"step": step, "heldout_nll": nll})
    minutes = log.elapsed_minutes()
    expert_loads = {layer: loads[layer].tolist() for layer in range(args.num_layers)}
    report = {
        "config": asdict(cfg),
        "parameters": n_params,
        "active_parameters": n_active,
        "train_minutes": minutes,
        "history": log.history,
        "last_step_expert_loads": expert_loads,
    }
    save_checkpoint(arrays_of(optimizer.params()), args, report)
    print(f"trained in {minutes:.1f} min -> {CHECKPOINT_PATH}")


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


def export_type(name: str, shape: tuple[int, ...]) -> GGMLQuantizationType:
    """The tensor's type in the real DeepSeek-V4-Flash Q2_K GGUFs (llama-quantize's choice, as
    in ``shared/oracle/deepseek4-a-kquant.gguf``): 2-bit routed gate/up, 4-bit routed down,
    Q6_K output head, Q8_0 for every other matrix; vectors and the router stay F32, and the
    hash tables int32."""
    if name.endswith("ffn_gate_tid2eid.weight"):
        return T.I32
    if len(shape) == 1 or name.endswith("ffn_gate_inp.weight"):
        return T.F32
    if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
        return T.Q2_K
    if name.endswith("ffn_down_exps.weight"):
        return T.Q4_K
    if name == "output.weight":
        return T.Q6_K
    return T.Q8_0


def tokenizer_metadata(tokenizer: HFTokenizer, vocab_size: int) -> dict[str, MetaValue]:
    """The ``tokenizer.*`` keys llama.cpp's converter would write for ``tokenizer``."""
    collector = GGUFWriter(None, ARCH)  # without a file a GGUFWriter only collects key/values
    write_tokenizer_metadata(
        collector,
        tokenizer,
        pre=train_tokenizer.PRE,
        bos_token=deepseek4.BOS,
        eos_token=deepseek4.EOS,
        add_bos=True,
        vocab_size=vocab_size,
    )
    metadata = {}
    for key, value in collector.kv_data[0].items():
        if not key.startswith("tokenizer."):
            continue
        value_type = value.type
        if value_type == V.ARRAY:
            # GGUFWriter types an array's items when writing: strings, or INT32 token types.
            value_type = V.STRING if isinstance(value.value[0], str) else V.INT32
        metadata[key] = MetaValue(value.value, value_type)
    return metadata


def write_model_gguf(
    path: Path,
    metadata: Mapping[str, MetaValue],
    tensors: Mapping[str, tuple[np.ndarray, GGMLQuantizationType]],
) -> None:
    """Write the GGUF atomically, quantizing float tensors with ``ds4mlx.gguf.quantize``.

    Not ``ds4mlx.gguf.write_gguf``: that stores float tensors only, and the hash-routing tables
    must be I32 (llama.cpp indexes experts with them through ggml_get_rows).
    """
    encoded = {
        name: array.astype(np.int32) if qtype == T.I32 else quantize(array, qtype)
        for name, (array, qtype) in tensors.items()
    }
    temporary = path.with_name(f".{path.name}.tmp")
    writer = GGUFWriter(temporary, ARCH)
    try:
        for key, meta in metadata.items():
            if isinstance(meta.value, list):
                writer.add_key_value(key, meta.value, V.ARRAY, meta.value_type)
            else:
                writer.add_key_value(key, meta.value, meta.value_type)
        for name, data in encoded.items():
            writer.add_tensor(name, data, raw_dtype=tensors[name][1])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(temporary, path)
    except BaseException:
        writer.close()
        temporary.unlink(missing_ok=True)
        raise


def export(tokenizer: HFTokenizer) -> None:
    arrays, args, _ = load_checkpoint()
    metadata = {
        "general.name": MetaValue("ds4-tiny", V.STRING),
        # The type of most weights (the routed gate/up experts), as llama-quantize names its mix.
        "general.file_type": MetaValue(int(LlamaFileType.MOSTLY_Q2_K), V.UINT32),
        "general.quantization_version": MetaValue(GGML_QUANT_VERSION, V.UINT32),
    }
    metadata |= args.to_gguf_metadata(CONTEXT_LENGTH)
    metadata |= tokenizer_metadata(tokenizer, args.vocab_size)
    tensors = {
        name: (np.array(arrays[name]), export_type(name, shape))
        for name, shape in tensor_shapes(args).items()
    }
    GGUF_PATH.parent.mkdir(parents=True, exist_ok=True)
    write_model_gguf(GGUF_PATH, metadata, tensors)
    print(f"exported {GGUF_PATH} ({GGUF_PATH.stat().st_size / 2**20:.1f} MiB)")


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------

AGENT_PROMPTS = (
    "Run the tests.",
    "What does `dedent` do?",
    "List the workspace.",
)
SAMPLES_PER_PROMPT = 4  # sampled generations per prompt, besides the greedy one
SAMPLE_TEMPERATURE = 0.7


def agent_prompt(request: str) -> str:
    """``request`` as the agent sends it: its system prompt and tools, then the user turn."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": request}]
    return deepseek4.render_chat(messages, tools=AGENT_TOOLS)


def agent_reply(loaded: LoadedModel, request: str, sampling: SamplingOptions) -> dict[str, Any]:
    """The model's reply to an agent request, with the tool calls parsed from it."""
    prompt = loaded.tokenizer.encode(agent_prompt(request))
    tokens = [
        event.token
        for event in generate(
            loaded.new_session(),
            prompt,
            max_tokens=120,
            sampling=sampling,
            stop_tokens=loaded.tokenizer.stop_ids,
        )
        if isinstance(event, TokenEvent)
    ]
    text = loaded.tokenizer.decode(tokens)
    turn = loaded.chat_format.parse(text)
    return {
        "request": request,
        "temperature": sampling.temperature,
        "seed": sampling.seed,
        "output": text,
        "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in turn.tool_calls],
        "errors": [e.reason for e in turn.errors],
    }


def verify(cfg: TrainConfig, corpus: Corpus) -> None:
    arrays, args, report = load_checkpoint()
    eval_set = EvalSet.from_corpus(corpus, cfg)
    checkpoint_nll = heldout_nll(Model.from_arrays(args, arrays), corpus.chat_prefix, eval_set)
    loaded = ds4mlx.load_model(GGUF_PATH)
    gguf_nll = heldout_nll(loaded.network, corpus.chat_prefix, eval_set)
    unigram = unigram_nll(corpus, eval_set, args.vocab_size)
    print(f"held-out NLL (uniform: {math.log(args.vocab_size):.3f})")
    for label, nll in (
        ("f32 checkpoint", checkpoint_nll),
        ("quantized GGUF", gguf_nll),
        ("unigram", unigram),
    ):
        print(
            f"  {label:15s} chat {nll['chat']:.3f}  assistant {nll['assistant']:.3f}  "
            f"text {nll['text']:.3f}"
        )

    replies = []
    for request in AGENT_PROMPTS:
        replies.append(agent_reply(loaded, request, SamplingOptions()))
        print(
            f"--- {request!r}, greedy\n{replies[-1]['output']}\n"
            f"    tool calls: {replies[-1]['tool_calls']}  errors: {replies[-1]['errors']}"
        )
        for seed in range(SAMPLES_PER_PROMPT):
            sampling = SamplingOptions(temperature=SAMPLE_TEMPERATURE, seed=seed)
            replies.append(agent_reply(loaded, request, sampling))
            print(
                f"    sampled (seed {seed}): tool calls {replies[-1]['tool_calls']}  "
                f"errors {replies[-1]['errors']}"
            )
    well_formed = sum(bool(r["tool_calls"]) and not r["errors"] for r in replies)
    print(f"well-formed tool calls in {well_formed} of {len(replies)} replies")
    report |= {
        "checkpoint_heldout_nll": checkpoint_nll,
        "gguf_heldout_nll": gguf_nll,
        "unigram_heldout_nll": unigram,
        "uniform_nll": math.log(args.vocab_size),
        "agent_replies": replies,
        "well_formed_tool_calls": [well_formed, len(replies)],
        "gguf_bytes": GGUF_PATH.stat().st_size,
    }
    REPORT_PATH.write_text(json.dumps(report, indent=1) + "\n")
    print(f"report -> {REPORT_PATH}")


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--skip",
        action="append",
        choices=STAGES,
        default=[],
        help="skip a finished stage (repeatable)",
    )
    parser.add_argument(
        "--steps", type=int, default=TrainConfig.steps, help="training steps (default %(default)s)"
    )
    options = parser.parse_args()
    stages = [s for s in STAGES if s not in options.skip]
    cfg = TrainConfig(steps=options.steps)

    if "corpus" in stages:
        build_corpus.build(CORPUS_DIR, max_stdlib_bytes=4_000_000, chat_samples=3000, seed=0)
    if "tokenizer" in stages:
        train_tokenizer.train(CORPUS_DIR / "corpus.jsonl", vocab_size=6144).save(
            str(TOKENIZER_PATH)
        )
    tokenizer = HFTokenizer.from_file(str(TOKENIZER_PATH))
    corpus = None
    if "train" in stages or "verify" in stages:
        corpus = load_corpus(tokenizer, cfg.heldout_every)
    if "train" in stages:
        train(cfg, corpus, tokenizer.get_vocab_size())
    if "export" in stages:
        export(tokenizer)
    if "verify" in stages:
        verify(cfg, corpus)


if __name__ == "__main__":
    sys.exit(main())
