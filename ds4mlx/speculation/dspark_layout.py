"""DSpark drafter files: the two layouts that hold a drafter's configuration and tensors
(``models.deepseek4_dspark``: ``DSparkConfig``, ``tensor_shapes``); reading, checking, writing
and converting them.

* ds4 (``general.architecture = deepseek4-dspark``): keys ``dspark.block_size``,
  ``dspark.markov_rank``, ``dspark.noise_token_id``, ``dspark.target_layer_ids`` (0-based: the
  output of layer i, ``ForwardOutput.layers[i]``), ``dspark.stage_count``; stage tensors
  ``mtp.{s}.*`` named like the target's ``blk.{i}.*``; ``mtp.0.main_proj`` / ``main_norm``; the
  last stage holds ``norm``, ``hc_head_{fn,base,scale}``, ``markov_head.markov_w{1,2}`` and
  ``confidence_head.proj`` (all with the ``.weight`` suffix; an optional ``.bias``). Stage
  hyper-parameters are the target's (ds4 hard-codes the real model's).
* llama.cpp (``general.architecture = dflash``), read as llama.cpp 0c1e570 reads it
  (``src/models/dflash.cpp``: ``load_arch_hparams``, ``load_arch_tensors``, ``graph_dsv4``,
  ``build_dspark_markov_head``; ``common/speculative.cpp``): the stages' hyper-parameters are the
  file's own ``dflash.*`` keys; ``dflash.block_size`` (default 16), ``dflash.target_layers``
  (the *input* of layer t: t - 1 here, and 0 the token embedding), the noise token as
  ``tokenizer.ggml.mask_token_id``, ``dflash.sample_from_anchor`` (default true); tensors
  ``blk.{s}.*``, ``fc`` (optional ``fc.scale``), ``enc.output_norm``, ``output_norm``,
  ``output_hc_*``, ``markov_w1``, ``markov_w2`` (optional ``markov_w2.scale``), ``conf_proj``
  (optional ``.bias``), and optionally the drafter's own ``token_embd`` / ``output`` (preferred
  to the target's; ``token_embd`` doubles as the head without ``output``) and ``d2t`` (a reduced
  draft vocabulary for ``markov_w2``: row i biases target token ``d2t[i]``).

Canonical tensor names (``models.deepseek4_dspark``'s) are llama.cpp's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ds4mlx.gguf import GGUFError, GGUFFile, MetaValue, open_gguf
from ds4mlx.models.deepseek4 import ModelArgs
from ds4mlx.models.deepseek4_dspark import (
    CONF_BIAS,
    CONF_PROJ,
    D2T,
    EMBEDDING_TAP,
    HC_HEAD_BASE,
    HC_HEAD_FN,
    HC_HEAD_SCALE,
    MAIN_NORM,
    MAIN_PROJ,
    MAIN_PROJ_SCALE,
    MARKOV_W1,
    MARKOV_W2,
    MARKOV_W2_SCALE,
    NORM,
    OUTPUT,
    TOKEN_EMBD,
    DSparkConfig,
    tensor_shapes,
)
from ds4mlx.models.deepseek4_mtp import stage_args
from ds4mlx.models.metadata import ArchMetadata, first
from ds4mlx.models.moe import GatingFunc
from ds4mlx.speculation.support_gguf import (
    identity_metadata,
    require_arch,
    tokenizer_metadata,
    write_support_gguf,
)

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

ARCH_DS4 = "deepseek4-dspark"
ARCH_LLAMA = "dflash"
LAYOUTS = {ARCH_DS4: "ds4's DSpark support file", ARCH_LLAMA: "llama.cpp's DSpark drafter"}
# The widest block accepted: one verify pass checks at most this many drafted rows.
MAX_BLOCK_SIZE = 16
# llama.cpp's default when a dflash file has no dflash.block_size (common/speculative.cpp).
LLAMA_DEFAULT_BLOCK_SIZE = 16
#: Tensors a dflash file may add (llama.cpp loads them with TENSOR_NOT_REQUIRED).
LLAMA_OPTIONAL = frozenset({MAIN_PROJ_SCALE, MARKOV_W2_SCALE, CONF_BIAS, TOKEN_EMBD, OUTPUT, D2T})
# DFlash variants llama.cpp knows that these drafters do not implement, by a tensor they carry.
UNSUPPORTED_TENSORS = {
    "selector_hidden.weight": "the DFlash2 selector (selector_* tensors)",
}


def ds4_name(name: str, stage_count: int) -> str:
    """ds4's name for the tensor llama.cpp calls ``name``."""
    if name.startswith("blk."):
        return "mtp." + name.removeprefix("blk.")
    last = f"mtp.{stage_count - 1}"
    names = {
        MAIN_PROJ: "mtp.0.main_proj.weight",
        MAIN_NORM: "mtp.0.main_norm.weight",
        NORM: f"{last}.norm.weight",
        HC_HEAD_FN: f"{last}.hc_head_fn.weight",
        HC_HEAD_BASE: f"{last}.hc_head_base.weight",
        HC_HEAD_SCALE: f"{last}.hc_head_scale.weight",
        MARKOV_W1: f"{last}.markov_head.markov_w1.weight",
        MARKOV_W2: f"{last}.markov_head.markov_w2.weight",
        CONF_PROJ: f"{last}.confidence_head.proj.weight",
        CONF_BIAS: f"{last}.confidence_head.proj.bias",
    }
    if name not in names:
        raise GGUFError(
            f"tensor '{name}' has no place in ds4's DSpark layout (only llama.cpp's "
            "dflash layout holds it)"
        )
    return names[name]


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def read_config(gguf: GGUFFile, target: ModelArgs) -> tuple[DSparkConfig, ModelArgs]:
    """The drafter's configuration and its stages' hyper-parameters, from a file of either
    layout, validated against the target."""
    if require_arch(gguf, LAYOUTS) == ARCH_DS4:
        config = DSparkConfig(
            block_size=int(gguf.require("dspark.block_size")),
            noise_token_id=int(gguf.require("dspark.noise_token_id")),
            target_layers=tuple(int(i) for i in gguf.require("dspark.target_layer_ids")),
            stage_count=int(gguf.require("dspark.stage_count")),
            markov_rank=int(gguf.require("dspark.markov_rank")),
            confidence=False,
        )
        stages = config.stage_count
        w1, conf = ds4_name(MARKOV_W1, stages), ds4_name(CONF_PROJ, stages)
        if config.markov_rank and not gguf.has_tensor(w1):
            raise GGUFError(f"{gguf.path}: Markov rank {config.markov_rank} but no tensor '{w1}'")
        config = replace(config, confidence=bool(config.markov_rank) and gguf.has_tensor(conf))
        args = stage_args(target, max(stages, 1))
    else:
        config, args = _read_llama(gguf, target)
    _check_config(gguf, config, target)
    return config, args


def _read_llama(gguf: GGUFFile, target: ModelArgs) -> tuple[DSparkConfig, ModelArgs]:
    path = gguf.path
    for name, what in UNSUPPORTED_TENSORS.items():
        if gguf.has_tensor(name):
            raise GGUFError(f"{path}: {what} is not supported (tensor '{name}')")
    if gguf.get("dflash.hyper_connection.count") is None:
        raise GGUFError(
            f"{path}: a DFlash drafter without DeepSeek-V4 stages "
            "(no dflash.hyper_connection.count) is not supported"
        )
    if _flag(gguf, "dflash.attention.causal", False):
        raise GGUFError(
            f"{path}: dflash.attention.causal = true (causal drafting) is not supported"
        )
    args = _llama_stage_args(gguf, target)
    out = gguf.get("dflash.embedding_length_out")
    if out is not None and int(out) != args.hidden_size:
        # llama.cpp reads the confidences with this row size and aborts ("tensor read out of
        # bounds"); ds4mlx wrote streams x width here before it knew.
        raise GGUFError(
            f"{path}: dflash.embedding_length_out = {out} differs from the "
            f"embedding length {args.hidden_size}; llama.cpp cannot run this file. "
            "Rewrite it without the key: scripts/convert_dspark.py"
        )
    w1 = MARKOV_W1
    rank = gguf.tensor_shape(w1)[-1] if gguf.has_tensor(w1) else 0
    optional = frozenset(name for name in LLAMA_OPTIONAL if gguf.has_tensor(name))
    draft_vocab = None
    if D2T in optional:
        draft_vocab = gguf.tensor_shape(D2T)[-1]
        d2t = np.asarray(gguf.raw(D2T)).reshape(-1).astype(np.int64)
        if d2t.size and (d2t.min() < 0 or d2t.max() >= args.vocab_size):
            raise GGUFError(
                f"{path}: d2t maps draft rows outside the vocabulary of {args.vocab_size}"
            )
        if len(np.unique(d2t)) != len(d2t):
            raise GGUFError(f"{path}: d2t maps two draft rows to the same target token")
    if draft_vocab is not None and (OUTPUT in optional or TOKEN_EMBD in optional):
        # graph_dsv4 adds the scattered Markov bias to the head's draft-vocabulary logits:
        # llama.cpp 0c1e570 aborts on such a file (its DFlash graph scatters, DSpark's does not).
        raise GGUFError(
            f"{path}: a reduced draft vocabulary (d2t) with the drafter's own "
            "output head is not supported (llama.cpp's DeepSeek-V4 drafter cannot "
            "run it either)"
        )
    known = set(
        tensor_shapes(
            args,
            DSparkConfig(
                1, 0, (0,), args.num_layers, rank, True, optional=optional, draft_vocab=draft_vocab
            ),
        )
    )
    unknown = sorted(set(gguf.tensor_names()) - known)
    if unknown:
        # llama.cpp refuses a file with tensors it does not create, and so does this reader.
        raise GGUFError(
            f"{path}: tensors not part of a DeepSeek-V4 DSpark drafter: "
            + ", ".join(unknown[:8])
            + (" ..." if len(unknown) > 8 else "")
        )
    if rank and gguf.get("dflash.block_size") is None:
        # build_dspark_markov_head asserts on it; only plain DFlash drafts default to 16.
        raise GGUFError(f"{path}: a Markov head needs dflash.block_size")
    layers = tuple(
        int(t) - 1 if int(t) > 0 else EMBEDDING_TAP for t in gguf.require("dflash.target_layers")
    )
    config = DSparkConfig(
        block_size=int(gguf.get("dflash.block_size", LLAMA_DEFAULT_BLOCK_SIZE)),
        noise_token_id=int(gguf.require("tokenizer.ggml.mask_token_id")),
        target_layers=layers,
        stage_count=args.num_layers,
        markov_rank=rank,
        confidence=bool(rank) and gguf.has_tensor(CONF_PROJ),
        # Without a Markov head common/speculative.cpp drafts as DFlash does, from the mask
        # rows 1 .. whatever the key says.
        sample_from_anchor=_flag(gguf, "dflash.sample_from_anchor", True) and rank > 0,
        per_row_window=True,
        optional=optional,
        draft_vocab=draft_vocab,
    )
    if not config.sample_from_anchor and config.block_size < 2:
        raise GGUFError(f"{path}: dflash.sample_from_anchor = false needs a block of at least 2")
    return config, args


def _flag(gguf: GGUFFile, key: str, default: bool) -> bool:
    """A boolean key as llama.cpp's ``llama_model_meta_val_str`` compares it: "true" or not."""
    value = gguf.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    raise GGUFError(f"{gguf.path}: metadata '{key}' is {value!r}, expected true or false")


def _llama_stage_args(gguf: GGUFFile, target: ModelArgs) -> ModelArgs:
    """The stages' hyper-parameters from the ``dflash.*`` keys llama.cpp reads for a
    DeepSeek-V4 drafter (``load_arch_hparams`` and the generic loader)."""
    meta = ArchMetadata(gguf, ARCH_LLAMA)
    req, opt = meta.req, meta.opt
    stages = int(req("block_count"))
    if stages < 1:
        raise meta.error(f"dflash.block_count {stages} must be at least 1")
    hidden = int(req("embedding_length"))
    if hidden != target.hidden_size:
        raise meta.error(
            f"drafter width {hidden} differs from the target's {target.hidden_size}"
            " (the target's features feed fc)"
        )
    vocab = meta.vocab_size()
    if vocab != target.vocab_size:
        raise meta.error(
            f"drafter vocabulary {vocab} differs from the target's {target.vocab_size}"
        )
    ratios = [int(r) for r in opt("attention.compress_ratios", [0] * stages)]
    if any(ratios[:stages]):
        raise meta.error("DSpark stages must use uncompressed attention (compress_ratios 0)")
    gating = int(req("expert_gating_func"))
    if gating != GatingFunc.SQRT_SOFTPLUS:
        raise meta.error(
            "DSpark stages need sqrt-softplus expert scoring "
            f"(dflash.expert_gating_func {int(GatingFunc.SQRT_SOFTPLUS)}), "
            f"got {gating}"
        )
    head_dim = int(req("attention.key_length"))
    if int(opt("attention.value_length", head_dim)) != head_dim:
        raise meta.error("DSpark stages need value_length == key_length")
    heads = int(first(req("attention.head_count")))
    groups = int(req("attention.output_group_count"))
    if groups < 1 or heads % groups:
        raise meta.error(f"{heads} heads do not split into {groups} output groups")
    window = int(req("attention.sliding_window"))
    if window < 1:
        raise meta.error("dflash.attention.sliding_window must be positive")

    def per_stage(name: str, value: Any) -> tuple[float, ...]:
        return tuple(float(v) for v in meta.per_layer(name, value, stages))

    clamp = per_stage("swiglu_clamp_exp", req("swiglu_clamp_exp"))
    shared = opt("swiglu_clamp_shexp", None)
    return replace(
        target,
        vocab_size=vocab,
        num_layers=stages,
        num_heads=heads,
        head_dim=head_dim,
        rope_dims=int(req("rope.dimension_count")),
        q_lora_rank=int(req("attention.q_lora_rank")),
        o_groups=groups,
        o_lora_rank=int(req("attention.output_lora_rank")),
        sliding_window=window,
        compress_ratios=(0,) * stages,
        rms_norm_eps=float(req("attention.layer_norm_rms_epsilon")),
        rope_theta=float(opt("rope.freq_base", 10000.0)),
        n_experts=int(req("expert_count")),
        n_experts_used=int(first(req("expert_used_count"))),
        n_shared_experts=int(req("expert_shared_count")),
        expert_ff=int(first(req("expert_feed_forward_length"))),
        expert_weights_scale=float(req("expert_weights_scale")),
        expert_weights_norm=bool(req("expert_weights_norm")),
        gating_func=GatingFunc(gating),
        swiglu_limits=clamp,
        swiglu_limits_shared=clamp if shared is None else per_stage("swiglu_clamp_shexp", shared),
        n_hash_layers=0,
        hc_mult=int(req("hyper_connection.count")),
        hc_sinkhorn_iters=int(req("hyper_connection.sinkhorn_iterations")),
        hc_eps=float(req("hyper_connection.epsilon")),
    )


def _check_config(gguf: GGUFFile, config: DSparkConfig, target: ModelArgs) -> None:
    path = gguf.path
    if not 1 <= config.block_size <= MAX_BLOCK_SIZE:
        raise GGUFError(f"{path}: block size {config.block_size} is outside [1, {MAX_BLOCK_SIZE}]")
    if not 0 <= config.noise_token_id < target.vocab_size:
        raise GGUFError(
            f"{path}: noise token {config.noise_token_id} is outside the target's "
            f"vocabulary of {target.vocab_size}"
        )
    layers = config.target_layers
    lowest = EMBEDDING_TAP if gguf.arch == ARCH_LLAMA else 0
    bad = [i for i in layers if not lowest <= i < target.num_layers]
    if not layers or bad:
        raise GGUFError(
            f"{path}: target layers {list(layers)} do not fit the target's "
            f"{target.num_layers} layers"
        )
    if config.stage_count < 1:
        raise GGUFError(f"{path}: stage count {config.stage_count} must be at least 1")


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def layout_tensors(
    arch: str, config: DSparkConfig, arrays: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """``arrays`` (canonical names) under the names of ``arch``'s layout."""
    if arch == ARCH_DS4:
        if not config.per_row_window and config.sample_from_anchor:
            return {ds4_name(name, config.stage_count): a for name, a in arrays.items()}
        raise GGUFError(
            "ds4's layout holds only drafters with ds4's window rule that sample from the anchor"
        )
    return dict(arrays)


def save_dspark_arrays(
    path: str | Path,
    arch: str,
    config: DSparkConfig,
    args: ModelArgs,
    target_gguf: GGUFFile,
    arrays: Mapping[str, np.ndarray],
    *,
    context_length: int,
    types: Mapping[str, GGMLQuantizationType] | None = None,
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
) -> None:
    """Write a drafter in the layout of ``arch`` (``ARCH_DS4`` or ``ARCH_LLAMA``) from float32
    arrays under canonical names (``D2T``: integers), recording ``target_gguf``'s identity.

    ``args``: the stages' hyper-parameters (written as ``dflash.*`` keys in llama.cpp's layout).
    Matrices are stored as ``matrix_type`` unless ``types`` (canonical name -> type) says
    otherwise, e.g. the types of the file they were converted from.
    """
    u32 = GGUFValueType.UINT32
    meta = identity_metadata(target_gguf)
    tensors = layout_tensors(arch, config, arrays)
    rename = {
        name: ds4_name(name, config.stage_count) if arch == ARCH_DS4 else name for name in arrays
    }
    stored_types = {rename[name]: qtype for name, qtype in (types or {}).items() if name in rename}
    if arch == ARCH_DS4:
        meta |= {
            "dspark.block_size": MetaValue(config.block_size, u32),
            "dspark.markov_rank": MetaValue(config.markov_rank, u32),
            "dspark.noise_token_id": MetaValue(config.noise_token_id, u32),
            "dspark.target_layer_ids": MetaValue(list(config.target_layers), u32),
            "dspark.stage_count": MetaValue(config.stage_count, u32),
        }
    else:
        s_args = stage_args(args, config.stage_count)
        for key, value in s_args.to_gguf_metadata(context_length).items():
            name = key.split(".", 1)[1]
            # embedding_length_out is the target's mHC head width (streams x width); llama.cpp
            # reads a drafter's confidences with it as their row size, so a dflash file must
            # not carry it (llama.cpp's own converter writes it for deepseek4 only).
            if name != "embedding_length_out":
                meta[f"{ARCH_LLAMA}.{name}"] = value
        meta |= tokenizer_metadata(target_gguf) | {
            "dflash.block_size": MetaValue(config.block_size, u32),
            "dflash.target_layers": MetaValue([i + 1 for i in config.target_layers], u32),
            "tokenizer.ggml.mask_token_id": MetaValue(config.noise_token_id, u32),
        }
        if not config.sample_from_anchor:
            meta["dflash.sample_from_anchor"] = MetaValue(False, GGUFValueType.BOOL)
    write_support_gguf(Path(path), arch, meta, tensors, types=stored_types, matrix_type=matrix_type)


def convert_dspark(
    source: str | Path,
    dest: str | Path,
    arch: str,
    target_gguf: GGUFFile,
    target: ModelArgs,
    *,
    keep_types: bool = True,
    matrix_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    context_length: int = 4096,
) -> DSparkConfig:
    """Rewrite drafter ``source`` (either layout) as ``dest`` in ``arch``'s layout, for the
    target in ``target_gguf``; returns the written configuration. The weights are the same;
    the window rule is the new layout's (see ``DSparkConfig.per_row_window``). With
    ``keep_types`` each tensor keeps its stored type (exact for F32, F16, BF16 and Q8_0, whose
    values re-encode to the same blocks), else matrices become ``matrix_type``."""
    gguf = open_gguf(source)
    config, args = read_config(gguf, target)
    stored_name = (
        (lambda n: n) if gguf.arch == ARCH_LLAMA else (lambda n: ds4_name(n, config.stage_count))
    )
    arrays: dict[str, np.ndarray] = {}
    types: dict[str, GGMLQuantizationType] = {}
    for name, shape in tensor_shapes(args, config).items():
        stored = stored_name(name)
        if not gguf.has_tensor(stored):
            continue  # the optional confidence bias
        if name == D2T:
            arrays[name] = np.asarray(gguf.raw(stored)).reshape(shape)
        else:
            arrays[name] = gguf.dequantize(stored).reshape(shape)
        types[name] = gguf.tensor_type(stored)
    out = replace(config, per_row_window=arch == ARCH_LLAMA)
    save_dspark_arrays(
        dest,
        arch,
        out,
        args,
        target_gguf,
        arrays,
        context_length=int(gguf.get("dflash.context_length", context_length)),
        types=types if keep_types else None,
        matrix_type=matrix_type,
    )
    return out
