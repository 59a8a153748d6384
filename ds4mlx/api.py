"""The public API: ``load_model(path)`` -> a model with ``logits``, ``new_session``, a tokenizer."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import mlx.core as mx
import numpy as np

from ds4mlx.engine.chat import ChatFormat, chat_format_for_arch
from ds4mlx.engine.session import Session
from ds4mlx.engine.tokenizer import NumericTokenizer, Tokenizer, load_tokenizer
from ds4mlx.gguf import GGUFFile, open_gguf
from ds4mlx.models import model_class_for

WEIGHTS_DTYPES = ("auto", "f32", "native")


def resolve_weights_dtype(weights_dtype: str) -> str:
    """``auto``: float32 on the CPU backend (BLAS-backed), GGUF-native quantization on Metal."""
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"weights_dtype must be one of {WEIGHTS_DTYPES}, got '{weights_dtype}'")
    if weights_dtype == "auto":
        return "native" if mx.metal.is_available() else "f32"
    return weights_dtype


class LoadedModel:
    """A model loaded from a GGUF file, with its tokenizer and chat format."""

    def __init__(self, path: Path, gguf_file: GGUFFile, network, weights_dtype: str):
        self.path = path
        self.gguf = gguf_file
        self.network = network
        self.weights_dtype = weights_dtype
        self.tokenizer: Tokenizer | NumericTokenizer = load_tokenizer(gguf_file)
        # Fixtures with llama.cpp's dummy vocabulary have no chat format: prompts stay raw.
        self.chat_format: ChatFormat | None = (
            None if isinstance(self.tokenizer, NumericTokenizer)
            else chat_format_for_arch(gguf_file.arch)
        )

    @property
    def args(self):
        return self.network.args

    def args_summary(self) -> str:
        a = self.args
        return (f"{self.gguf.arch}, {a.num_layers} layers, d={a.hidden_size}, "
                f"vocab {a.vocab_size}, weights {self.weights_dtype}")

    def render_user_prompt(self, text: str) -> str:
        """``text`` as one user turn followed by the assistant prompt, in the model's template."""
        if self.chat_format is None:
            raise ValueError(f"{self.path.name} has no chat template (no real tokenizer)")
        return self.chat_format.render([{"role": "user", "content": text}])

    def new_session(self) -> Session:
        return Session(self.network)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits [T, vocab] (float32) of ``tokens`` computed as one batched prefill."""
        return self.new_session().feed(tokens)


def load_model(
    path: str | Path,
    weights_dtype: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> LoadedModel:
    """Open, validate and load a GGUF model of any supported architecture."""
    path = Path(path)
    dtype = resolve_weights_dtype(weights_dtype)
    gguf_file = open_gguf(path)
    if progress is not None:
        progress(f"loading {path.name} ({path.stat().st_size / 2**20:.1f} MiB, "
                 f"{gguf_file.arch}, weights {dtype})")
    network = model_class_for(gguf_file).from_gguf(gguf_file)
    return LoadedModel(path, gguf_file, network, dtype)
