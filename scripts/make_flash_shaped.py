"""Write a sparse GGUF shaped exactly like DeepSeek-V4-Flash (the Q2 build), for rehearsals.

The file has the real checkpoint's ``deepseek4.*`` metadata, tensor names, shapes and types
(routed gate/up IQ2_XXS, routed down Q2_K, other matrices Q8_0, routers/norms/mixes F32, hash
tables I32) and a byte-level BPE tokenizer of the real vocabulary size (129,280 tokens, the
DeepSeek special tokens at their ids). Numbers from ``shared/design/ds4-reference.md``.

Tensor data stays a hole in a sparse file (reads as zeros, takes no disk) except the tensors that
decide routing and scale, which get seeded random values so that routing spreads over the
experts: routers, selection biases, norms, mHC mixes, attention sinks, hash tables, and (unless
``--no-seed-embeddings``) the token embedding and the output head, without which every token
would have the same hidden state and so the same experts and the same next token.

    python scripts/make_flash_shaped.py /work/flash/flash.gguf            # 43 layers, ~86 GB
    python scripts/make_flash_shaped.py /tmp/f.gguf --layers 3 --experts 8 --vocab 2048

It writes in seconds; ``du`` shows only the seeded bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ds4mlx  # noqa: F401  (first: preloads BLAS before anything imports mlx.core)
from ds4mlx.engine.chat.deepseek4 import ASSISTANT, BOS, EOS, THINK_END, THINK_START, USER
from ds4mlx.engine.tokenizer import TokenType, _byte_to_char
from ds4mlx.gguf import quantize
from ds4mlx.gguf.validate import validate_gguf
from ds4mlx.models.deepseek4 import ARCH, CSA_RATIO, HCA_RATIO, ModelArgs, tensor_shapes
from ds4mlx.models.moe import GatingFunc

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGML_QUANT_VERSION,
    GGUF_DEFAULT_ALIGNMENT,
    GGMLQuantizationType,
    GGUFWriter,
    LlamaFileType,
)
from gguf import GGUFValueType as V

T = GGMLQuantizationType

# DeepSeek-V4-Flash (ds4-reference.md).
FLASH_LAYERS = 43
FLASH_EXPERTS = 256
FLASH_VOCAB = 129_280
FLASH_CONTEXT = 1_048_576  # YaRN x16 from 65,536
BPE_END = 128_000  # DeepSeek's BPE ids end here; added (special) tokens follow
ADDED_END = 128_815  # then llama.cpp's converter pads with [PAD{i}] up to the vocab size
MIN_VOCAB = 3 + 256 + 16
SEED_CHUNK_BLOCKS = 1 << 20  # Q8_0 blocks generated and written per step (34 MiB)


def flash_args(
    layers: int = FLASH_LAYERS, experts: int = FLASH_EXPERTS, vocab: int = FLASH_VOCAB
) -> ModelArgs:
    """DS4-Flash's hyper-parameters, with ``layers``/``experts``/``vocab`` reducible for tests
    (every width stays real)."""
    ratios = tuple(0 if i < 2 else (CSA_RATIO if i % 2 == 0 else HCA_RATIO) for i in range(layers))
    return ModelArgs(
        vocab_size=vocab,
        hidden_size=4096,
        num_layers=layers,
        num_heads=64,
        head_dim=512,
        rope_dims=64,
        q_lora_rank=1024,
        o_groups=8,
        o_lora_rank=1024,
        sliding_window=128,
        compress_ratios=ratios,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        compress_rope_theta=160000.0,
        rope_scaling_type="yarn",
        rope_freq_scale=1 / 16,
        rope_orig_ctx=65536,
        n_experts=experts,
        n_experts_used=min(6, experts),
        n_shared_experts=1,
        expert_ff=2048,
        expert_weights_scale=1.5,
        expert_weights_norm=True,
        gating_func=GatingFunc.SQRT_SOFTPLUS,
        swiglu_limits=(10.0,) * layers,
        swiglu_limits_shared=(10.0,) * layers,
        n_hash_layers=min(3, layers),
        index_heads=64,
        index_head_dim=128,
        index_topk=512,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        hc_eps=1e-6,
    )


def tensor_type(name: str, shape: tuple[int, ...]) -> GGMLQuantizationType:
    """The Q2 build's type of each tensor (llama-quantize keeps routers in F32)."""
    if name.endswith("ffn_gate_tid2eid.weight"):
        return T.I32
    if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
        return T.IQ2_XXS
    if name.endswith("ffn_down_exps.weight"):
        return T.Q2_K
    if len(shape) == 1 or name.endswith("ffn_gate_inp.weight"):
        return T.F32
    return T.Q8_0


def flash_tensors(args: ModelArgs) -> dict[str, tuple[tuple[int, ...], GGMLQuantizationType]]:
    """name -> (numpy-order shape, type), in llama.cpp's layout: the grouped output LoRA as
    [groups, rank, group_dim]."""
    out = {}
    for name, shape in tensor_shapes(args).items():
        if name.endswith("attn_output_a.weight"):
            shape = (args.o_groups, shape[0] // args.o_groups, shape[1])
        out[name] = (shape, tensor_type(name, shape))
    return out


def tensor_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return int(np.prod(shape)) // block * size


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

COMMON_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water "
    "been call who oil its now find long down day did get come made may part hello world "
    "capital france paris python function code write explain why because answer question"
).split()


@dataclass(frozen=True)
class SyntheticVocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]


def synthetic_vocab(vocab: int, rng: np.random.Generator) -> SyntheticVocab:
    """A valid byte-level BPE of exactly ``vocab`` tokens laid out like DeepSeek's: BOS, EOS and
    pad at 0..2, the 256 byte tokens, merged tokens up to id 128,000, CONTROL tokens (chat
    markers, then placeholders) up to 128,815, and [PAD{i}] UNUSED rows to the vocabulary size.
    Every merge joins two tokens already in the vocabulary, so each merged token is reachable."""
    if vocab < MIN_VOCAB:
        raise ValueError(
            f"vocab {vocab} is too small: the specials, the 256 byte tokens and a "
            f"few merges need {MIN_VOCAB}"
        )
    bpe_end = min(BPE_END, vocab - 8)
    added_end = min(ADDED_END, vocab)
    tokens = [BOS, EOS, "<｜▁pad▁｜>"]
    types = [TokenType.CONTROL] * 3
    byte_chars = list(_byte_to_char().values())
    tokens += byte_chars
    types += [TokenType.NORMAL] * 256
    seen = set(tokens)
    # Common words first (so that English prompts take a few tokens a word, not one a
    # character), then merges that grow random words from letters, the space marker and a few
    # common characters.
    alphabet = [c for c in byte_chars if c.isalnum() and c.isascii()] + ["Ġ", "'", "-", "."]
    grown = list(alphabet)
    merges = []
    for word in COMMON_WORDS:
        for text in (word, "Ġ" + word, word.capitalize(), "Ġ" + word.capitalize()):
            for end in range(2, len(text) + 1):
                if len(tokens) >= bpe_end:
                    break
                merged = text[:end]
                if merged not in seen:
                    seen.add(merged)
                    tokens.append(merged)
                    types.append(TokenType.NORMAL)
                    merges.append(f"{text[: end - 1]} {text[end - 1]}")
    while len(tokens) < bpe_end:
        left = grown[int(rng.integers(len(grown)))]
        right = alphabet[int(rng.integers(len(alphabet)))]
        merged = left + right
        if merged in seen or len(merged) > 12:
            continue
        seen.add(merged)
        tokens.append(merged)
        types.append(TokenType.NORMAL)
        merges.append(f"{left} {right}")
        grown.append(merged)
    added = [USER, ASSISTANT, THINK_START, THINK_END]
    added += [f"<｜place▁holder▁no▁{i}｜>" for i in range(added_end - len(tokens) - len(added))]
    tokens += added[: added_end - len(tokens)]
    types += [TokenType.CONTROL] * (len(tokens) - len(types))
    tokens += [f"[PAD{i}]" for i in range(len(tokens), vocab)]
    types += [TokenType.UNUSED] * (vocab - len(types))
    return SyntheticVocab(tokens, [int(t) for t in types], merges)


# --------------------------------------------------------------------------------------------
# Seeded values
# --------------------------------------------------------------------------------------------


def seeded(
    name: str, shape: tuple[int, ...], args: ModelArgs, rng: np.random.Generator
) -> np.ndarray | None:
    """Float/int values for the small tensors that decide routing and scale; None = a hole."""
    if name.endswith("ffn_gate_tid2eid.weight"):  # distinct experts per token
        keys = rng.random((shape[0], args.n_experts), dtype=np.float32)
        return np.argsort(keys, axis=1)[:, : shape[1]].astype(np.int32)
    if name.endswith("ffn_gate_inp.weight"):  # router
        return rng.normal(0, 1 / np.sqrt(shape[1]), shape).astype(np.float32)
    if name.endswith("exp_probs_b.bias"):
        return rng.normal(0, 0.05, shape).astype(np.float32)
    if "_norm" in name:
        return (1 + rng.normal(0, 0.1, shape)).astype(np.float32)
    if name.endswith("attn_sinks.weight"):
        return rng.normal(0, 1, shape).astype(np.float32)
    if "hc_" in name:  # mHC mixes: fn, base, scale (output_hc_* too)
        scale = 1 / np.sqrt(shape[-1]) if len(shape) == 2 else 0.1
        return rng.normal(0, scale, shape).astype(np.float32)
    return None


def q8_0_blocks(n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q8_0 blocks (f16 scale, 32 int8) as raw bytes, without a float round trip."""
    blocks = np.empty((n_blocks, 34), np.uint8)
    scales = rng.uniform(0.5, 1.5, n_blocks).astype(np.float16) * np.float16(0.02 / 127)
    blocks[:, :2] = scales.view(np.uint8).reshape(-1, 2)
    blocks[:, 2:] = rng.integers(-127, 128, (n_blocks, 32), dtype=np.int8).view(np.uint8)
    return blocks


def big_seeded_chunks(nbytes: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """A Q8_0 matrix (embedding, output head) of ``nbytes`` in chunks of raw blocks."""
    n_blocks = nbytes // 34
    for start in range(0, n_blocks, SEED_CHUNK_BLOCKS):
        yield q8_0_blocks(min(SEED_CHUNK_BLOCKS, n_blocks - start), rng)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def metadata(args: ModelArgs, vocab: SyntheticVocab) -> dict[str, tuple[object, V, V | None]]:
    """key -> (value, type, item type): the ``deepseek4.*`` keys the loader and llama.cpp read,
    the converter's other keys for this model, and the tokenizer."""
    meta: dict[str, tuple[object, V, V | None]] = {}
    for key, value in args.to_gguf_metadata(FLASH_CONTEXT).items():
        is_list = isinstance(value.value, list)
        meta[key] = (
            value.value,
            V.ARRAY if is_list else value.value_type,
            value.value_type if is_list else None,
        )
    extra = {
        "leading_dense_block_count": (0, V.UINT32),
        "feed_forward_length": (args.expert_ff, V.UINT32),
        "nextn_predict_layers": (0, V.UINT32),  # ds4 ships the MTP block as a separate file
        "rope.scaling.yarn_beta_fast": (32.0, V.FLOAT32),
        "rope.scaling.yarn_beta_slow": (1.0, V.FLOAT32),
    }
    for name, (value, value_type) in extra.items():
        meta[f"{ARCH}.{name}"] = (value, value_type, None)
    meta |= {
        "general.name": ("DeepSeek-V4-Flash (flash-shaped rehearsal file)", V.STRING, None),
        "general.file_type": (int(LlamaFileType.MOSTLY_IQ2_XXS), V.UINT32, None),
        "general.quantization_version": (GGML_QUANT_VERSION, V.UINT32, None),
        "tokenizer.ggml.model": ("gpt2", V.STRING, None),
        "tokenizer.ggml.pre": ("deepseek-v3", V.STRING, None),
        "tokenizer.ggml.tokens": (vocab.tokens, V.ARRAY, V.STRING),
        "tokenizer.ggml.token_type": (vocab.token_types, V.ARRAY, V.INT32),
        "tokenizer.ggml.merges": (vocab.merges, V.ARRAY, V.STRING),
        "tokenizer.ggml.bos_token_id": (0, V.UINT32, None),
        "tokenizer.ggml.eos_token_id": (1, V.UINT32, None),
        "tokenizer.ggml.padding_token_id": (2, V.UINT32, None),
        "tokenizer.ggml.add_bos_token": (True, V.BOOL, None),
        "tokenizer.ggml.add_eos_token": (False, V.BOOL, None),
    }
    return meta


@dataclass(frozen=True)
class Written:
    path: Path
    args: ModelArgs
    apparent_bytes: int
    disk_bytes: int
    seeded_bytes: int
    seconds: float


def write_flash_shaped(
    path: str | Path,
    *,
    layers: int = FLASH_LAYERS,
    experts: int = FLASH_EXPERTS,
    vocab: int = FLASH_VOCAB,
    seed: int = 0,
    seed_embeddings: bool = True,
) -> Written:
    """Writes the sparse file atomically (a temporary next to ``path``, then a rename)."""
    started = time.perf_counter()
    path = Path(path)
    rng = np.random.default_rng(seed)
    args = flash_args(layers, experts, vocab)
    tensors = flash_tensors(args)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        writer = GGUFWriter(temporary, ARCH)
        writer.add_custom_alignment(GGUF_DEFAULT_ALIGNMENT)
        for key, (value, value_type, item_type) in metadata(
            args, synthetic_vocab(vocab, rng)
        ).items():
            writer.add_key_value(key, value, value_type, item_type)
        for name, (shape, qtype) in tensors.items():
            writer.add_tensor_info(
                name, shape, np.dtype(np.float32), tensor_nbytes(shape, qtype), raw_dtype=qtype
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
        seeded_bytes = _fill(temporary, args, tensors, rng, seed_embeddings)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    stat = path.stat()
    return Written(
        path, args, stat.st_size, stat.st_blocks * 512, seeded_bytes, time.perf_counter() - started
    )


def _fill(
    path: Path,
    args: ModelArgs,
    tensors: dict[str, tuple[tuple[int, ...], GGMLQuantizationType]],
    rng: np.random.Generator,
    seed_embeddings: bool,
) -> int:
    """Extends the header-only file to its full (sparse) size and writes the seeded tensors;
    returns the bytes written."""
    header_bytes = path.stat().st_size
    align = GGUF_DEFAULT_ALIGNMENT
    data_offset = -(-header_bytes // align) * align
    offsets, end = {}, 0
    for name, (shape, qtype) in tensors.items():
        offsets[name] = data_offset + end
        end += -(-tensor_nbytes(shape, qtype) // align) * align
    written = 0
    with open(path, "r+b") as file:
        file.truncate(data_offset + end)  # the holes
        fd = file.fileno()
        for name, (shape, qtype) in tensors.items():
            if name in ("token_embd.weight", "output.weight"):
                if seed_embeddings:
                    position = offsets[name]
                    for chunk in big_seeded_chunks(tensor_nbytes(shape, qtype), rng):
                        written += os.pwrite(fd, chunk.tobytes(), position)
                        position += chunk.nbytes
                continue
            values = seeded(name, shape, args, rng)
            if values is None:
                continue
            raw = values if qtype in (T.F32, T.I32) else quantize(values, qtype)
            written += os.pwrite(fd, np.ascontiguousarray(raw).tobytes(), offsets[name])
    layout = validate_gguf(path)  # the offsets written must be the ones the file declares
    for name, offset in offsets.items():
        if layout.tensors[name].file_offset != offset:
            raise RuntimeError(
                f"tensor '{name}' placed at {offset}, the file says "
                f"{layout.tensors[name].file_offset}"
            )
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the GGUF to write (sparse)")
    parser.add_argument("--layers", type=int, default=FLASH_LAYERS)
    parser.add_argument("--experts", type=int, default=FLASH_EXPERTS)
    parser.add_argument(
        "--vocab",
        type=int,
        default=FLASH_VOCAB,
        help="vocabulary size (default the real 129,280; smaller for tests)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-seed-embeddings",
        action="store_true",
        help="leave the token embedding and output head as holes too",
    )
    args = parser.parse_args(argv)
    if args.layers < 1 or args.experts < 1:
        parser.error("--layers and --experts must be positive")
    try:
        written = write_flash_shaped(
            args.out,
            layers=args.layers,
            experts=args.experts,
            vocab=args.vocab,
            seed=args.seed,
            seed_embeddings=not args.no_seed_embeddings,
        )
    except (ValueError, OSError) as exc:
        print(f"make_flash_shaped: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"{written.path}: {written.args.num_layers} layers, {written.args.n_experts} experts, "
        f"vocab {written.args.vocab_size}; apparent size {written.apparent_bytes / 1e9:.2f} GB "
        f"({written.apparent_bytes / 2**30:.2f} GiB), on disk (du) "
        f"{written.disk_bytes / 2**20:.1f} MiB, seeded {written.seeded_bytes / 2**20:.1f} MiB, "
        f"written in {written.seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
