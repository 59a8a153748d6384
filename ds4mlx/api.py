"""The public API: ``load_model(path)`` -> a model with ``logits`` and ``new_session``."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ds4mlx.engine.session import Session
from ds4mlx.gguf import open_gguf
from ds4mlx.models import model_class_for


class LoadedModel:
    """A model loaded from a GGUF file, with its tokenizer when the file has one."""

    def __init__(self, path: Path, gguf_file, network):
        self.path = path
        self.gguf = gguf_file
        self.network = network

    @property
    def args(self):
        return self.network.args

    def new_session(self) -> Session:
        return Session(self.network)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits [T, vocab] (float32) of ``tokens`` computed as one batched prefill."""
        return self.new_session().feed(tokens)


def load_model(path: str | Path) -> LoadedModel:
    path = Path(path)
    gguf_file = open_gguf(path)
    network = model_class_for(gguf_file).from_gguf(gguf_file)
    return LoadedModel(path, gguf_file, network)
