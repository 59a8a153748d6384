"""Write a random DeepSeek-V4 (``deepseek4``) GGUF with many large quantized routed experts.

For measuring expert streaming: the routed experts are most of the file (as in the real model),
so budgets, evictions and page-cache effects are real. The structure is ``train_tiny``'s tiny
model at a configurable width and expert count; non-routed weights are F32 from
``train_tiny.init_tensor``. Routed experts are quantized with ``ds4mlx.gguf.quantize``: a pool of
random rows is quantized once and every expert draws its rows from the pool at random, so that
gigabytes of distinct, valid K-quant experts are written in seconds, streamed tensor by tensor
(never the whole file in memory).

    python scripts/make_synthetic_moe.py /tmp/synthetic.gguf --size-mb 2048
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import ds4mlx  # noqa: F401  (first: preloads BLAS before anything imports mlx.core)
from ds4mlx.gguf import MetaValue, quantize
from ds4mlx.models.deepseek4 import ARCH, ModelArgs, tensor_shapes

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from gguf import GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter
from gguf import GGUFValueType as V
from train_tiny import init_tensor, model_args

T = GGMLQuantizationType
EXPERT_TYPES = {"Q4_K": T.Q4_K, "Q2_K": T.Q2_K, "Q8_0": T.Q8_0}
POOL_ROWS = 512  # distinct quantized rows each expert tensor draws from
CONTEXT_LENGTH = 4096


@dataclass(frozen=True)
class SyntheticModel:
    path: Path
    args: ModelArgs
    routed_bytes: int  # routed-expert bytes in the file
    file_bytes: int


def synthetic_args(
    *,
    layers: int,
    experts: int,
    n_used: int,
    hidden: int,
    expert_ff: int,
    vocab: int,
    hash_layers: int | None = None,
) -> ModelArgs:
    """``train_tiny``'s architecture at this size (its per-layer tuples resized); the first
    ``hash_layers`` layers route by a hash of the token id (default: train_tiny's count)."""
    base = model_args(vocab)
    ratios = tuple(base.compress_ratios[i % len(base.compress_ratios)] for i in range(layers))
    return replace(
        base,
        hidden_size=hidden,
        num_layers=layers,
        n_experts=experts,
        n_experts_used=n_used,
        expert_ff=expert_ff,
        compress_ratios=ratios,
        swiglu_limits=(10.0,) * layers,
        swiglu_limits_shared=(10.0,) * layers,
        n_hash_layers=min(base.n_hash_layers if hash_layers is None else hash_layers, layers),
    )


def experts_for_size(
    size_bytes: int, *, layers: int, hidden: int, expert_ff: int, qtype: GGMLQuantizationType
) -> int:
    """Experts per layer that make the routed experts about ``size_bytes``."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    per_expert = 3 * hidden * expert_ff // block * type_size
    return max(2, round(size_bytes / (layers * per_expert)))


def _expert_tensor(
    rng: np.random.Generator, shape: tuple[int, ...], qtype: GGMLQuantizationType, std: float
) -> np.ndarray:
    """[E, out, row_bytes] uint8: each expert's rows drawn from one quantized random pool."""
    n_experts, out, inner = shape
    pool = quantize((rng.standard_normal((POOL_ROWS, inner)) * std).astype(np.float32), qtype)
    rows = rng.integers(0, POOL_ROWS, size=(n_experts, out))
    return pool[rows]


def write_synthetic_moe(
    path: str | Path,
    *,
    layers: int = 4,
    experts: int = 32,
    n_used: int = 4,
    hidden: int = 1024,
    expert_ff: int = 1024,
    vocab: int = 1024,
    expert_type: str = "Q4_K",
    seed: int = 0,
    hash_layers: int | None = None,
) -> SyntheticModel:
    """Writes the model (atomically) and describes it."""
    if expert_type not in EXPERT_TYPES:
        raise ValueError(f"expert type {expert_type}: expected one of {', '.join(EXPERT_TYPES)}")
    qtype = EXPERT_TYPES[expert_type]
    args = synthetic_args(
        layers=layers,
        experts=experts,
        n_used=n_used,
        hidden=hidden,
        expert_ff=expert_ff,
        vocab=vocab,
        hash_layers=hash_layers,
    )
    rng = np.random.default_rng(seed)
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    writer = GGUFWriter(temporary, ARCH)
    metadata = {
        "general.name": MetaValue("ds4-synthetic-moe", V.STRING),
        "general.quantization_version": MetaValue(GGML_QUANT_VERSION, V.UINT32),
    }
    metadata |= args.to_gguf_metadata(CONTEXT_LENGTH)
    routed = 0
    try:
        for key, meta in metadata.items():
            if isinstance(meta.value, list):
                writer.add_key_value(key, meta.value, V.ARRAY, meta.value_type)
            else:
                writer.add_key_value(key, meta.value, meta.value_type)
        shapes = tensor_shapes(args)
        # Tensor infos first (the header lists them), data second: produced one at a time.
        plan: list[tuple[str, tuple[int, ...], GGMLQuantizationType]] = []
        for name, shape in shapes.items():
            if name.endswith("_exps.weight"):
                block, type_size = GGML_QUANT_SIZES[qtype]
                byte_shape = (*shape[:-1], shape[-1] // block * type_size)
                writer.add_tensor_info(
                    name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype
                )
                routed += int(np.prod(byte_shape))
                plan.append((name, shape, qtype))
            elif name.endswith("ffn_gate_tid2eid.weight"):
                writer.add_tensor_info(
                    name, shape, np.dtype(np.int32), 4 * int(np.prod(shape)), raw_dtype=T.I32
                )
                plan.append((name, shape, T.I32))
            else:
                writer.add_tensor_info(
                    name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)), raw_dtype=T.F32
                )
                plan.append((name, shape, T.F32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, shape, tensor_type in plan:
            if tensor_type in EXPERT_TYPES.values():
                std = 1 / np.sqrt(shape[-1])  # unit-scale activations through each expert
                data = _expert_tensor(rng, shape, tensor_type, std)
            else:
                data = init_tensor(name, shape, args, rng)
                data = data.astype(np.int32 if tensor_type == T.I32 else np.float32)
            writer.write_tensor_data(data)
        writer.close()
        temporary.replace(path)
    except BaseException:
        writer.close()
        temporary.unlink(missing_ok=True)
        raise
    return SyntheticModel(path, args, routed, path.stat().st_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path)
    parser.add_argument(
        "--size-mb", type=float, default=None, help="routed-expert size to aim for (sets --experts)"
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--n-used", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--expert-ff", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--expert-type", choices=sorted(EXPERT_TYPES), default="Q4_K")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hash-layers", type=int, default=None, help="layers routed by token hash (tiny's: 1)"
    )
    args = parser.parse_args()
    experts = args.experts
    if args.size_mb is not None:
        experts = experts_for_size(
            int(args.size_mb * 2**20),
            layers=args.layers,
            hidden=args.hidden,
            expert_ff=args.expert_ff,
            qtype=EXPERT_TYPES[args.expert_type],
        )
    started = time.perf_counter()
    model = write_synthetic_moe(
        args.output,
        layers=args.layers,
        experts=experts,
        n_used=args.n_used,
        hidden=args.hidden,
        expert_ff=args.expert_ff,
        vocab=args.vocab,
        expert_type=args.expert_type,
        seed=args.seed,
        hash_layers=args.hash_layers,
    )
    print(
        f"wrote {model.path}: {model.file_bytes / 2**20:.0f} MiB, routed experts "
        f"{model.routed_bytes / 2**20:.0f} MiB ({args.layers} layers x {experts} experts "
        f"{args.expert_type}, top-{args.n_used}) in {time.perf_counter() - started:.1f}s"
    )


if __name__ == "__main__":
    main()
