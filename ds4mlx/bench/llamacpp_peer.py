"""llama.cpp (through ``llama-cpp-python``'s low-level API) as a peer for benchmarks and checks.

Uses llama.cpp's C API directly rather than ``llama_cpp.Llama`` because the model must load with
``use_extra_bufts = False``: llama.cpp's CPU weight repacking (an "extra buffer type") holds
tensors that some deepseek4 graph nodes then cannot use, and the scheduler aborts with
``GGML_ASSERT(*cur_backend_id != -1)``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import numpy as np


def llamacpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCppModel:
    """One llama.cpp model + context on the CPU; ``eval`` appends tokens and returns logits."""

    def __init__(self, path: str, n_ctx: int = 512, threads: int = 2):
        import llama_cpp as llama

        self._llama = llama
        llama.llama_backend_init()
        model_params = llama.llama_model_default_params()
        model_params.n_gpu_layers = 0
        model_params.use_extra_bufts = False
        self.model = llama.llama_model_load_from_file(path.encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        ctx_params = llama.llama_context_default_params()
        ctx_params.n_ctx = ctx_params.n_batch = ctx_params.n_ubatch = n_ctx
        ctx_params.n_threads = ctx_params.n_threads_batch = threads
        self.ctx = llama.llama_init_from_model(self.model, ctx_params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {path}")
        self.n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(self.model))
        self.n_past = 0

    def reset(self) -> None:
        self._llama.llama_memory_clear(self._llama.llama_get_memory(self.ctx), True)
        self.n_past = 0

    def eval(self, tokens: Sequence[int], all_logits: bool = True) -> np.ndarray:
        """Decode ``tokens`` as one batch after what came before; logits [n, vocab] (only the
        last row unless ``all_logits``)."""
        llama, n = self._llama, len(tokens)
        batch = llama.llama_batch_init(n, 0, 1)
        try:
            for i, token in enumerate(tokens):
                batch.token[i] = int(token)
                batch.pos[i] = self.n_past + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if all_logits or i == n - 1 else 0
            batch.n_tokens = n
            status = llama.llama_decode(self.ctx, batch)
            if status != 0:
                raise RuntimeError(f"llama_decode failed with status {status}")
        finally:
            llama.llama_batch_free(batch)
        self.n_past += n
        rows = range(n) if all_logits else [n - 1]
        return np.stack(
            [
                np.ctypeslib.as_array(
                    llama.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)
                ).copy()
                for i in rows
            ]
        )

    def close(self) -> None:
        if self.ctx:
            self._llama.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            self._llama.llama_model_free(self.model)
            self.model = None
