#!/usr/bin/env python3
"""Make the DSpark llama.cpp fixtures in ``tests/fixtures/dspark_llamacpp`` (seeded).

A random deepseek4 target and random dflash-layout drafters (every matrix float32, so llama.cpp's
CPU matmuls do not quantize activations), each run through llama.cpp's own DSpark path with the
oracle's driver (``../shared/oracle/tools/dspark_driver.cpp``, built against llama.cpp 0c1e570)
on a short prompt (the first blocks inside the sliding window) and a long one (past it):

    NOFA=1 dspark_driver target.gguf <case>.gguf <case>.<prompt>.txt <case>.<prompt>.json \
        <rounds> 2 f32kv

The directory's ``manifest.json`` lists each run (``output``: the driver's JSON, next to it its
``.feats.bin``; ``target``, ``draft``, ``prompt``: its inputs; ``command``).
``tests/speculation/test_dspark_llamacpp.py`` replays every run of every such directory.

    python scripts/make_dspark_fixtures.py --driver /path/to/dspark_driver
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

from ds4mlx.gguf import MetaValue, open_gguf
from ds4mlx.models import deepseek4_dspark as dspark_net
from ds4mlx.models.deepseek4 import ModelArgs, tensor_shapes
from ds4mlx.models.deepseek4_mtp import stage_args
from ds4mlx.models.moe import GatingFunc
from ds4mlx.speculation import dspark_layout
from ds4mlx.speculation.dspark_layout import save_dspark_arrays
from ds4mlx.speculation.support_gguf import random_arrays, write_support_gguf

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "dspark_llamacpp"
SEED = 2317
CONTEXT = 256
F32 = GGMLQuantizationType.F32
LAYERS = 3
ARGS = ModelArgs(
    vocab_size=64,
    hidden_size=16,
    num_layers=LAYERS,
    num_heads=2,
    head_dim=64,
    rope_dims=16,
    q_lora_rank=8,
    o_groups=2,
    o_lora_rank=4,
    sliding_window=16,
    compress_ratios=(0, 4, 128),
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_scaling_type="none",
    rope_freq_scale=1.0,
    rope_orig_ctx=CONTEXT,
    n_experts=4,
    n_experts_used=2,
    n_shared_experts=1,
    expert_ff=8,
    expert_weights_scale=1.5,
    expert_weights_norm=True,
    gating_func=GatingFunc.SQRT_SOFTPLUS,
    swiglu_limits=(10.0,) * LAYERS,
    swiglu_limits_shared=(10.0,) * LAYERS,
    n_hash_layers=0,
    index_heads=1,
    index_head_dim=64,
    index_topk=2,
    hc_mult=4,
    hc_sinkhorn_iters=3,
    hc_eps=1e-6,
)
# llama.cpp's DeepSeek-V4 cache Hadamard-rotates indexer keys in blocks of at least 64: smaller
# head dims abort its graph, hence 64 here.
NOISE = ARGS.vocab_size - 1
# (name, tokens, driver rounds): the short prompt's first blocks stay inside the window of 16.
PROMPTS = (("short", 6, 3), ("long", 40, 6))


def tokenizer_metadata(vocab: int) -> dict[str, MetaValue]:
    """llama.cpp's test tokenizer (ids used directly), as its test-llama-archs writes it."""
    s, i32, f32 = GGUFValueType.STRING, GGUFValueType.INT32, GGUFValueType.FLOAT32
    return {
        "tokenizer.ggml.model": MetaValue("test", s),
        "tokenizer.ggml.tokens": MetaValue([f"tok_{i}" for i in range(vocab)], s),
        "tokenizer.ggml.token_type": MetaValue([1] * vocab, i32),
        "tokenizer.ggml.scores": MetaValue([0.0] * vocab, f32),
        "tokenizer.ggml.add_bos_token": MetaValue(False, GGUFValueType.BOOL),
    }


def write_target(path: Path, rng: np.random.Generator) -> None:
    arrays = random_arrays(tensor_shapes(ARGS), rng)
    metadata = ARGS.to_gguf_metadata(CONTEXT) | tokenizer_metadata(ARGS.vocab_size)
    write_support_gguf(path, "deepseek4", metadata, arrays, matrix_type=F32)


def drafters(rng: np.random.Generator) -> dict[str, tuple[dspark_net.DSparkConfig, dict]]:
    """The drafters, by case name: configuration and float arrays (canonical names)."""
    base = dspark_net.DSparkConfig(
        block_size=5,
        noise_token_id=NOISE,
        target_layers=(0, 1, 2),
        stage_count=2,
        markov_rank=8,
        confidence=True,
        per_row_window=True,
    )
    cases = {
        # The plain DSpark drafter, two stages.
        "base": base,
        # llama.cpp's optional scales of fc and of the Markov bias.
        "scaled": replace(
            base,
            stage_count=1,
            optional=frozenset({dspark_net.MAIN_PROJ_SCALE, dspark_net.MARKOV_W2_SCALE}),
        ),
        # Its own embedding and head, the token embedding as a tap (target_layers entry 0),
        # a bonus anchor slot, one stage.
        "own_head": replace(
            base,
            target_layers=(dspark_net.EMBEDDING_TAP, 2),
            stage_count=1,
            sample_from_anchor=False,
            optional=frozenset({dspark_net.TOKEN_EMBD, dspark_net.OUTPUT}),
        ),
        # A reduced draft vocabulary for the Markov head.
        "d2t": replace(base, stage_count=1, draft_vocab=40, optional=frozenset({dspark_net.D2T})),
    }
    out = {}
    for name, config in cases.items():
        args = stage_args(ARGS, config.stage_count)
        arrays = random_arrays(dspark_net.tensor_shapes(args, config), rng)
        arrays[dspark_net.MARKOV_W2] *= 8.0  # a Markov bias strong enough to change picks
        arrays[dspark_net.CONF_BIAS] = np.array([0.3], np.float32)
        if dspark_net.MAIN_PROJ_SCALE in config.optional:
            arrays[dspark_net.MAIN_PROJ_SCALE] = np.array([1.7], np.float32)
            arrays[dspark_net.MARKOV_W2_SCALE] = np.array([2.5], np.float32)
        if dspark_net.D2T in config.optional:
            arrays[dspark_net.D2T] = rng.permutation(ARGS.vocab_size)[: config.draft_vocab].astype(
                np.int32
            )
        out[name] = (config, arrays)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", type=Path, required=True, help="the built dspark_driver")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    target = args.out / "target.gguf"
    write_target(target, rng)
    target_gguf = open_gguf(target)
    prompts = {
        name: (rng.integers(0, NOISE, size=n).tolist(), rounds) for name, n, rounds in PROMPTS
    }
    runs = []
    env = os.environ | {"NOFA": "1"}
    for case, (config, arrays) in drafters(rng).items():
        draft = args.out / f"{case}.gguf"
        save_dspark_arrays(
            draft,
            dspark_layout.ARCH_LLAMA,
            config,
            stage_args(ARGS, config.stage_count),
            target_gguf,
            arrays,
            context_length=CONTEXT,
            matrix_type=F32,
        )
        for prompt_name, (tokens, rounds) in prompts.items():
            prompt = args.out / f"{case}.{prompt_name}.txt"
            prompt.write_text(" ".join(map(str, tokens)) + "\n")
            output = args.out / f"{case}.{prompt_name}.json"
            command = [
                str(args.driver),
                target.name,
                draft.name,
                prompt.name,
                output.name,
                str(rounds),
                "2",
                "f32kv",
            ]
            subprocess.run(command, cwd=args.out, env=env, check=True, stderr=subprocess.DEVNULL)
            # The prefill's features again (the start of .feats.bin): not needed.
            Path(f"{output}.feats0.bin").unlink()
            runs.append(
                {
                    "name": f"{case}.{prompt_name}",
                    "target": target.name,
                    "draft": draft.name,
                    "prompt": prompt.name,
                    "output": output.name,
                    "command": "NOFA=1 dspark_driver " + " ".join(command[1:]),
                }
            )
    manifest = {
        "generator": "llama.cpp 0c1e570 (llama-cpp-python 0.3.36), CPU, "
        "../shared/oracle/tools/dspark_driver.cpp",
        "seed": SEED,
        "runs": runs,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
