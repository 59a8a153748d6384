"""Model architectures, one file each, looked up by ``general.architecture``.

Every architecture module exposes ``Model.from_gguf(gguf_file, weights_dtype)`` returning an
object with:
  - ``args``: its ModelArgs dataclass (every architecture names ``vocab_size``, ``hidden_size``
    and ``num_layers`` alike),
  - ``new_state()``: an empty per-sequence state (all caches),
  - ``forward(tokens, state, capture_layers=(), return_hidden=False)``: logits [T, vocab] for
    int32 tokens [T] continuing ``state`` (which it advances), or a ``ForwardOutput`` with the
    hidden states drafters need; state objects have ``copy()`` giving an independent, cheap copy,
  - ``truncate(state, n_tokens)``: roll the state back by a few positions (a speculative
    verify's rejected rows) without recomputing anything,
  - ``max_invariant_rows``: chunks up to this many tokens give logits bit-identical to
    one-token decode (so greedy speculation reproduces plain greedy decoding exactly).

``models.base.TiledModel`` implements what the architectures share of this.
"""

from __future__ import annotations

import importlib

from ds4mlx.gguf import GGUFError, GGUFFile

ARCHITECTURES = {
    "deepseek4": "ds4mlx.models.deepseek4",
    "glm5-next": "ds4mlx.models.glm5_next",
}


def model_class_for(gguf_file: GGUFFile):
    arch = gguf_file.arch
    module_name = ARCHITECTURES.get(arch)
    if module_name is None:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise GGUFError(
            f"{gguf_file.path}: architecture '{arch}' is not supported (supported: {supported})"
        )
    return importlib.import_module(module_name).Model
