#!/usr/bin/env python3
"""Train ``assets/glm-tiny.gguf``, a small GLM-5.3-Flash-style model with its built-in NextN (MTP)
layer, from scratch on the CPU.

Architecture ``glm5-next`` as llama.cpp reads it: mHC residual streams; KDA recurrent layers and
nope MLA layers with the k-pool DSA indexer (one MLA layer with its own indexer, one sharing it);
a leading dense FFN, then sigmoid-routed experts with a shared expert; and the NextN block (MLA +
experts) that predicts the token after next, which ``--mtp`` drafts with. Stages, each skippable
once its output exists:

1. data     the corpus and BPE that ``scripts/train_tiny.py`` builds, with GLM's special tokens
            added; the corpus's agent conversations re-rendered in GLM's template
2. train    ``build/glm-tiny.safetensors``: random init, then AdamW through the inference model's
            own forward (``glm5_next.Model.from_arrays``) on the next-token loss plus
            ``nextn_weight`` x the NextN layer's next-next-token loss
3. export   ``assets/glm-tiny.gguf``: llama.cpp's glm5-next tensor names and keys, quantized as
            llama-quantize quantizes glm5-next to a Q2_K mix
4. verify   held-out losses of the checkpoint and of the GGUF, and the NextN layer's greedy draft
            acceptance in the speculative loop (whose output must equal plain greedy decoding)

The indexer is not trained (its top-k selection has no gradient, and GLM's separate indexer loss is
not reproduced here): it keeps its seeded random initialisation. Every random choice is seeded: a
rerun on the same Python and MLX versions rebuilds the same model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ds4mlx  # first: preloads BLAS before anything imports mlx.core
from ds4mlx.engine.chat import glm5
from ds4mlx.engine.generate import DoneEvent, TokenEvent
from ds4mlx.engine.tokenizer import write_tokenizer_metadata
from ds4mlx.generation import generate
from ds4mlx.gguf import MetaValue, TensorToWrite, write_gguf
from ds4mlx.models.glm5_next import ARCH, Model, ModelArgs, tensor_shapes
from ds4mlx.models.moe import GatingFunc, SharedExpertMoE
from ds4mlx.speculation.nextn import load_nextn

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import tiny_training
import train_tiny
import train_tokenizer
from corpus.chat_samples import render_samples
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from tokenizers import Tokenizer as HFTokenizer

CHECKPOINT_PATH = train_tiny.BUILD / "glm-tiny.safetensors"
REPORT_PATH = train_tiny.BUILD / "glm-tiny-report.json"
GGUF_PATH = Path("assets") / "glm-tiny.gguf"
STAGES = ("train", "export", "verify")
T = GGMLQuantizationType
CONTEXT_LENGTH = 4096  # no RoPE: the context is bounded by memory only
# GLM's role and control tokens, never produced from plain text ...
CONTROL_TOKENS = [
    glm5.PREFIX[:7],
    glm5.PREFIX[7:],
    glm5.SYSTEM,
    glm5.USER,
    glm5.ASSISTANT,
    glm5.OBSERVATION,
    glm5.END_OF_TEXT,
]
# ... and its tool-call markup, one token each so that a tiny model learns it easily.
MARKUP_TOKENS = [
    glm5.CALL_START,
    glm5.CALL_END,
    glm5.KEY_START,
    glm5.KEY_END,
    glm5.VALUE_START,
    glm5.VALUE_END,
    "<tool_response>",
    "</tool_response>",
]


def model_args(vocab_size: int) -> ModelArgs:
    """Four layers, MLA (own indexer, dense FFN), KDA, MLA (sharing layer 0's indexer), KDA, and
    the NextN block, at d=256: the smallest width whose expert rows fit the K-quants' 256-value
    blocks."""
    layers, blocks = 4, 5
    return ModelArgs(
        vocab_size=vocab_size,
        hidden_size=256,
        num_layers=layers,
        nextn_layers=blocks - layers,
        num_heads=4,
        recurrent=(False, True, False, True, False),
        q_lora_rank=128,
        kv_lora_rank=128,
        qk_head_dim=64,
        v_head_dim=64,
        index_heads=4,
        index_head_dim=32,
        # 64 pools of 4 positions: beyond 256 positions a query attends a selection.
        index_topk=256,
        kpool=4,
        kpool_select_tail=True,
        index_full=(True, False, False, False),
        kda_head_dim=64,
        conv_kernel=4,
        kda_gate_lower_bound=-5.0,
        ff=512,
        n_dense_layers=1,
        n_experts=8,
        n_experts_used=2,
        n_shared_experts=1,
        expert_ff=(256,) * blocks,
        expert_weights_scale=1.0,
        expert_weights_norm=True,
        gating_func=GatingFunc.SIGMOID,
        swiglu_limits=(0.0,) * blocks,
        swiglu_limits_shared=(0.0,) * blocks,
        rms_norm_eps=1e-5,
        norm_eps=1e-5,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
    )


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 200
    window: int = 384  # tokens per step: past 256 positions the indexer selects
    chat_fraction: float = 0.35  # of the steps
    nextn_weight: float = 0.3  # DeepSeek-V3's MTP loss weight
    peak_lr: float = 3e-3
    final_lr_fraction: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # Aux-loss-free balancing (DeepSeek-V3), as train_tiny.py: the selection bias of an expert
    # that got fewer tokens than average rises by this much each step, else it falls.
    balance_rate: float = 0.01
    heldout_every: int = 20  # every n-th document of each kind is held out
    chat_samples: int = 3000  # the corpus's conversations, re-rendered in GLM's template
    eval_windows: int = 8  # held-out windows of each kind per evaluation
    eval_points: int = 2  # evaluations during training (plus the final one)
    # Acceptance: greedy speculative decoding of held-out prompts.
    accept_prompts: int = 4  # of each kind
    accept_prompt_tokens: int = 96
    accept_tokens: int = 96


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def glm_tokenizer() -> HFTokenizer:
    """The tiny family's BPE (ds4-tiny's) with GLM's special tokens added after its own."""
    tokenizer = HFTokenizer.from_file(str(train_tiny.TOKENIZER_PATH))
    tokenizer.add_special_tokens(CONTROL_TOKENS)
    tokenizer.add_tokens(MARKUP_TOKENS)
    return tokenizer


def render_glm(messages: list[dict]) -> str:
    """A conversation in GLM's template, ended as GLM ends a document. The tool schemas are left
    out: every sample would repeat them, and this small model is not trained as an agent."""
    return glm5.GLM5.render(messages, add_generation_prompt=False) + glm5.END_OF_TEXT


@dataclass
class Data:
    """Token streams (documents concatenated) to cut training and held-out windows from."""

    text_train: np.ndarray
    text_heldout: np.ndarray
    chat_train: np.ndarray
    chat_heldout: np.ndarray

    def windows(self, kind: str, count: int, length: int) -> list[np.ndarray]:
        """``count`` held-out windows of ``length`` tokens, evenly spread."""
        stream = self.text_heldout if kind == "text" else self.chat_heldout
        starts = np.linspace(0, len(stream) - length - 1, count).astype(int)
        return [train_tiny.text_window(stream, int(s), length) for s in starts]


def load_data(tokenizer: HFTokenizer, cfg: TrainConfig) -> Data:
    corpus = train_tiny.load_corpus(tokenizer, cfg.heldout_every)
    with open(train_tiny.CORPUS_DIR / "corpus.jsonl", encoding="utf-8") as handle:
        documents = [json.loads(line) for line in handle]
    stdlib = [d["text"] for d in documents if d["name"].startswith("stdlib/")]
    chats = list(render_samples(stdlib, cfg.chat_samples, cfg.seed, render=render_glm))
    encoded = [e.ids for e in tokenizer.encode_batch(chats, add_special_tokens=False)]
    train = [ids for i, ids in enumerate(encoded) if i % cfg.heldout_every]
    heldout = [ids for i, ids in enumerate(encoded) if not i % cfg.heldout_every]
    return Data(
        corpus.text_train,
        corpus.text_heldout,
        np.concatenate(train).astype(np.int32),
        np.concatenate(heldout).astype(np.int32),
    )


# --------------------------------------------------------------------------------------------
# Model construction and initialisation
# --------------------------------------------------------------------------------------------


def trained_shapes(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model but the NextN block's own embedding and head, which fall back
    to the trunk's (as in GLM's releases)."""
    skipped = ("nextn.embed_tokens.weight", "nextn.shared_head_head.weight")
    return {n: s for n, s in tensor_shapes(args).items() if not n.endswith(skipped)}


def is_fixed(name: str) -> bool:
    """Tensors not trained by gradient: the balancing-driven selection bias, and the indexer,
    whose discrete selection gives it none (weight decay alone would shrink it to ties)."""
    return name.endswith("exp_probs_b.bias") or ".indexer" in name


def init_tensor(
    name: str, shape: tuple[int, ...], args: ModelArgs, rng: np.random.Generator
) -> np.ndarray:
    """KDA's tensors and the embedding here; the rest as ``train_tiny.init_tensor`` (norms 1,
    mHC as a plain residual, small random matrices) with GLM's residual-stream writers scaled
    down."""
    if name.endswith(("nextn.enorm.weight", "nextn.hnorm.weight")):
        return np.ones(shape, np.float32)  # norms whose names lack train_tiny's "_norm"
    if name.endswith(".ssm_a"):
        return -np.ones(shape, np.float32)  # ssm_a = -exp(A_log): A_log = 0 in every head
    if name.endswith("ssm_dt.bias"):
        # Decays from 0.99 to 0.55 per position: channels with long and short memories.
        return rng.uniform(-6.0, -2.0, shape).astype(np.float32)
    if ".ssm_conv1d_" in name:
        conv = 0.1 * rng.standard_normal(shape)
        conv[..., -1] += 1.0  # starts as the current position's projection
        return conv.astype(np.float32)
    if name == "token_embd.weight":
        # Unit rows: GLM's blocks emit normed values (latents, the KDA output norm), which would
        # drown a small embedding and with it the token's identity.
        return rng.standard_normal(shape).astype(np.float32)
    if name.endswith(
        ("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")
    ):
        std = 0.02 / math.sqrt(2 * (args.num_layers + args.nextn_layers))
        return (rng.standard_normal(shape) * std).astype(np.float32)
    return train_tiny.init_tensor(name, shape, args, rng)


def init_arrays(args: ModelArgs, seed: int) -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    """(trainable tensors, fixed tensors) by GGUF name."""
    rng = np.random.default_rng(seed)
    trainable, fixed = {}, {}
    for name, shape in trained_shapes(args).items():
        target = fixed if is_fixed(name) else trainable
        target[name] = mx.array(init_tensor(name, shape, args, rng))
    return trainable, fixed


def training_model(
    args: ModelArgs, arrays: Mapping[str, mx.array]
) -> tuple[Model, dict[int, train_tiny.GroupedRoutedExperts]]:
    """The inference model on ``arrays``, with train_tiny's grouped routed experts, by layer
    (the NextN block's as layer ``num_layers``)."""
    model = Model.from_arrays(args, arrays)
    ffns = {i: block.ffn for i, block in enumerate(model.blocks)}
    if model.mtp is not None:
        ffns[args.num_layers] = model.mtp.ffn
    grouped = {}
    for layer, ffn in ffns.items():
        if isinstance(ffn, SharedExpertMoE):
            ffn.experts = grouped[layer] = train_tiny.GroupedRoutedExperts(ffn.experts)
    return model, grouped


def save_checkpoint(arrays: Mapping[str, mx.array], args: ModelArgs, report: dict) -> None:
    tiny_training.save_checkpoint(CHECKPOINT_PATH, arrays, args, report)


def load_checkpoint() -> tuple[dict[str, mx.array], ModelArgs, dict]:
    return tiny_training.load_checkpoint(CHECKPOINT_PATH, ModelArgs)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def window_nll(
    model: Model, window: np.ndarray, evaluate: bool = False
) -> tuple[mx.array, mx.array]:
    """Mean next-token NLL of ``window`` (its tokens but the last predict the next ones) and
    mean next-next-token NLL of the NextN layer (row t: the trunk's hidden state at t and the
    token at t + 1 predict the token at t + 2)."""
    ids = mx.array(window)
    out = model.forward(ids[:-1], model.new_state(), return_hidden=True, evaluate=evaluate)
    main = nn.losses.cross_entropy(out.logits, ids[1:], reduction="mean")
    draft = model.mtp_logits(
        out.final_hidden[:-1], ids[1:-1], model.new_mtp_state(), evaluate=evaluate
    )
    return main, nn.losses.cross_entropy(draft, ids[2:], reduction="mean")


def heldout_nll(model: Model, data: Data, cfg: TrainConfig) -> dict[str, dict[str, float]]:
    """Mean held-out NLL per kind of window (and both), of the trunk and of the NextN layer."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("text", "chat"):
        sums = np.zeros(2)
        for window in data.windows(kind, cfg.eval_windows, cfg.window + 1):
            main, nextn = window_nll(model, window, evaluate=True)
            sums += (main.item(), nextn.item())
        out[kind] = {"main": sums[0] / cfg.eval_windows, "nextn": sums[1] / cfg.eval_windows}
    out["all"] = {k: (out["text"][k] + out["chat"][k]) / 2 for k in ("main", "nextn")}
    return out


def show_nll(label: str, nll: dict[str, dict[str, float]]) -> str:
    return (
        f"{label}  "
        + "  ".join(f"{kind} {v['main']:.3f}/{v['nextn']:.3f}" for kind, v in nll.items())
        + "  (next-token / NextN next-next-token)"
    )


def train(cfg: TrainConfig, data: Data, vocab_size: int) -> None:
    args = model_args(vocab_size)
    mx.random.seed(cfg.seed)
    params, fixed = init_arrays(args, cfg.seed)
    n_params = sum(v.size for v in params.values()) + sum(v.size for v in fixed.values())
    print(f"model: {n_params / 1e6:.2f}M parameters; {cfg.steps} steps of {cfg.window} tokens")

    optimizer = tiny_training.Optimizer(cfg, params)

    def loss_and_load(
        groups: tiny_training.Groups, window: np.ndarray
    ) -> tuple[mx.array, tuple[mx.array, mx.array, dict[int, mx.array]]]:
        model, experts = training_model(args, groups["matrices"] | groups["vectors"] | fixed)
        main, nextn = window_nll(model, window)
        loads = {layer: mx.array(e.load) for layer, e in experts.items()}
        return main + cfg.nextn_weight * nextn, (main, nextn, loads)

    step_fn = mx.value_and_grad(loss_and_load)
    rng = np.random.default_rng(cfg.seed + 1)
    eval_steps = tiny_training.evaluation_steps(cfg.steps, cfg.eval_points)
    log = tiny_training.ProgressLog(cfg.steps, optimizer.schedule)
    for step in range(1, cfg.steps + 1):
        kind = "chat" if rng.random() < cfg.chat_fraction else "text"
        stream = data.chat_train if kind == "chat" else data.text_train
        window = train_tiny.text_window(stream, int(rng.integers(len(stream))), cfg.window + 1)
        (_, (main, nextn, loads)), grads = step_fn(optimizer.groups, window)
        grad_norm = optimizer.step(grads)
        tiny_training.rebalance_experts(fixed, loads, cfg.balance_rate)
        mx.eval(optimizer.groups, optimizer.state(), fixed, main, nextn)
        log.record(
            step,
            kind,
            (main.item(), nextn.item()),
            cfg.window,
            grad_norm,
            lambda mean: f"{mean[0]:.3f}/{mean[1]:.3f}",
        )
        if step in eval_steps:
            nll = heldout_nll(Model.from_arrays(args, optimizer.params() | fixed), data, cfg)
            print(show_nll(f"step {step:4d}  held-out NLL", nll), flush=True)
            log.history.append({"step": step, "heldout_nll": nll})
    minutes = log.elapsed_minutes()
    report = {
        "config": asdict(cfg),
        "parameters": n_params,
        "train_minutes": minutes,
        "history": log.history,
    }
    save_checkpoint(optimizer.params() | fixed, args, report)
    print(f"trained in {minutes:.1f} min -> {CHECKPOINT_PATH}")


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------

# llama-quantize leaves these glm5-next tensors unquantized (llama-quant.cpp); stored as F16.
UNQUANTIZED = (
    "indexer.attn_q_b",
    "indexer.attn_k",
    "indexer.proj",
    "indexer_compressor_gate",
    "ssm_f_a.weight",
    "ssm_f_b.weight",
    "ssm_g_a.weight",
    "ssm_g_b.weight",
    "ssm_beta.weight",
    "attn_kv_a_mqa.weight",
    "attn_k_b.weight",
    "attn_v_b.weight",
)


def export_type(name: str, shape: tuple[int, ...]) -> GGMLQuantizationType:
    """The tensor's type in a Q2_K mix as ds4-tiny's export makes it (2-bit routed gate/up,
    4-bit routed down and token embedding, Q6_K output head, Q8_0 for the other matrices), with
    llama-quantize's glm5-next exceptions: the mHC mixes, the indexer, the KDA gate/decay
    projections and MLA's latent projections stay unquantized (F16 here); conv, router and
    vectors F32."""
    if (
        len(shape) == 1
        or "ssm_conv1d" in name
        or "ffn_gate_inp" in name
        or "indexer_compressor_ape" in name
    ):
        return T.F32
    if "hc_" in name or any(part in name for part in UNQUANTIZED):
        return T.F16
    if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
        return T.Q2_K
    if name.endswith(("ffn_down_exps.weight", "token_embd.weight")):
        return T.Q4_K
    if name == "output.weight":
        return T.Q6_K
    return T.Q8_0


def tokenizer_metadata(tokenizer: HFTokenizer, vocab_size: int) -> dict[str, Any]:
    """The ``tokenizer.*`` keys llama.cpp's converter writes for a GLM-5 tokenizer: no BOS (the
    template opens with ``[gMASK]<sop>``), EOS ``<|endoftext|>``, and the turn markers that end
    an assistant turn as end-of-turn (``<|user|>``) and end-of-message (``<|observation|>``)."""
    collector = GGUFWriter(None, ARCH)  # without a file a GGUFWriter only collects key/values
    write_tokenizer_metadata(
        collector,
        tokenizer,
        pre=train_tokenizer.PRE,
        eos_token=glm5.END_OF_TEXT,
        add_bos=False,
        vocab_size=vocab_size,
    )
    collector.add_eot_token_id(tokenizer.token_to_id(glm5.USER))
    collector.add_eom_token_id(tokenizer.token_to_id(glm5.OBSERVATION))
    # Arrays carry no item type until GGUFWriter writes them (strings, or INT32 token types):
    # write_gguf infers the same from the items.
    return {
        key: value.value
        if value.type == GGUFValueType.ARRAY
        else MetaValue(value.value, value.type)
        for key, value in collector.kv_data[0].items()
        if key.startswith("tokenizer.")
    }


def export(tokenizer: HFTokenizer) -> None:
    arrays, args, _ = load_checkpoint()
    metadata: dict[str, Any] = {"general.name": "glm-tiny"}
    metadata |= args.to_gguf_metadata(CONTEXT_LENGTH)
    metadata |= tokenizer_metadata(tokenizer, args.vocab_size)
    tensors = [
        TensorToWrite(name, np.array(arrays[name]), export_type(name, shape))
        for name, shape in trained_shapes(args).items()
    ]
    GGUF_PATH.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(GGUF_PATH, ARCH, metadata, tensors)
    print(f"exported {GGUF_PATH} ({GGUF_PATH.stat().st_size / 2**20:.2f} MiB)")


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------


def acceptance_prompts(data: Data, cfg: TrainConfig, assistant: int) -> list[list[int]]:
    """Held-out prompts: text windows, and chat windows cut after their last ``assistant``
    token (a turn opens)."""
    prompts = [
        w.tolist() for w in data.windows("text", cfg.accept_prompts, cfg.accept_prompt_tokens)
    ]
    for window in data.windows("chat", cfg.accept_prompts, 4 * cfg.accept_prompt_tokens):
        tokens = window.tolist()
        opened = [i for i, t in enumerate(tokens) if t == assistant]
        prompts.append(tokens[: (opened[-1] if opened else len(tokens) - 1) + 1])
    return prompts


def measure_acceptance(
    loaded: ds4mlx.loader.LoadedModel, prompts: list[list[int]], n_tokens: int
) -> dict[str, Any]:
    """Greedy speculative decoding with the NextN drafter against plain greedy decoding."""
    totals = {
        "drafted": 0,
        "accepted": 0,
        "drafted_passes": 0,
        "verify_passes": 0,
        "plain_seconds": 0.0,
        "spec_seconds": 0.0,
        "identical": True,
    }
    for prompt in prompts:
        tick = time.perf_counter()
        plain = [
            e.token
            for e in generate(loaded.new_session(), prompt, n_tokens)
            if isinstance(e, TokenEvent)
        ]
        totals["plain_seconds"] += time.perf_counter() - tick
        tick = time.perf_counter()
        spec, stats = [], None
        for event in generate(loaded.new_session(), prompt, n_tokens, drafter=load_nextn(loaded)):
            if isinstance(event, DoneEvent):
                stats = event.stats
            else:
                spec.append(event.token)
        totals["spec_seconds"] += time.perf_counter() - tick
        totals["identical"] &= spec == plain
        totals["drafted"] += stats.drafted_tokens
        totals["accepted"] += stats.accepted_tokens
        totals["drafted_passes"] += stats.drafted_passes
        totals["verify_passes"] += stats.verify_passes
    totals["acceptance"] = totals["accepted"] / max(totals["drafted"], 1)
    totals["tau"] = (totals["accepted"] + totals["drafted_passes"]) / max(
        totals["drafted_passes"], 1
    )
    return totals


def verify(cfg: TrainConfig, data: Data, tokenizer: HFTokenizer) -> None:
    arrays, args, report = load_checkpoint()
    checkpoint_nll = heldout_nll(Model.from_arrays(args, arrays), data, cfg)
    loaded = ds4mlx.load_model(GGUF_PATH)
    gguf_nll = heldout_nll(loaded.network, data, cfg)
    print(f"held-out NLL (uniform: {math.log(args.vocab_size):.3f})")
    print(show_nll("  f32 checkpoint", checkpoint_nll))
    print(show_nll("  quantized GGUF", gguf_nll))
    prompts = acceptance_prompts(data, cfg, tokenizer.token_to_id(glm5.ASSISTANT))
    accept = measure_acceptance(loaded, prompts, cfg.accept_tokens)
    print(
        f"NextN greedy drafts: {accept['accepted']}/{accept['drafted']} accepted "
        f"({accept['acceptance']:.1%}), tau {accept['tau']:.2f}; speculative output "
        f"{'equals' if accept['identical'] else 'DIFFERS FROM'} plain greedy output; "
        f"{accept['spec_seconds']:.1f} s vs {accept['plain_seconds']:.1f} s plain"
    )
    sample = tokenizer.decode(data.text_heldout[:48].tolist())
    prompt = tokenizer.encode(sample, add_special_tokens=False).ids
    tokens = [
        e.token for e in generate(loaded.new_session(), prompt, 64) if isinstance(e, TokenEvent)
    ]
    print(f"--- greedy continuation of held-out text\n{sample}|>>|{tokenizer.decode(tokens)}")
    report |= {
        "heldout_windows": {"count": cfg.eval_windows, "tokens": cfg.window},
        "checkpoint_heldout_nll": checkpoint_nll,
        "gguf_heldout_nll": gguf_nll,
        "uniform_nll": math.log(args.vocab_size),
        "nextn_acceptance": accept,
        "gguf_bytes": GGUF_PATH.stat().st_size,
    }
    REPORT_PATH.write_text(json.dumps(report, indent=1) + "\n")
    print(f"report -> {REPORT_PATH}")
    if not accept["identical"]:
        raise SystemExit("speculative decoding did not reproduce plain greedy decoding")


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

    for needed in (train_tiny.CORPUS_DIR / "corpus.jsonl", train_tiny.TOKENIZER_PATH):
        if not needed.is_file():
            raise SystemExit(
                f"{needed} is missing: build the tiny family's corpus and BPE "
                "first (python scripts/train_tiny.py --skip train --skip export "
                "--skip verify)"
            )
    tokenizer = glm_tokenizer()
    data = load_data(tokenizer, cfg) if "train" in stages or "verify" in stages else None
    if "train" in stages:
        train(cfg, data, tokenizer.get_vocab_size())
    if "export" in stages:
        export(tokenizer)
    if "verify" in stages:
        verify(cfg, data, tokenizer)


if __name__ == "__main__":
    sys.exit(main())
