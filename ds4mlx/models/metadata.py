"""An architecture's ``{arch}.*`` hyper-parameters in a GGUF file, read as llama.cpp reads them."""

from __future__ import annotations

from typing import Any

from ds4mlx.gguf import GGUFError, GGUFFile


def first(value: Any) -> Any:
    """A per-layer key's first entry (llama.cpp's ``n_head()`` and the like), or the scalar."""
    return value[0] if isinstance(value, (list, tuple)) else value


class ArchMetadata:
    """``key``/``req``/``opt`` name, require or default one ``{arch}.{name}`` key."""

    def __init__(self, gguf: GGUFFile, arch: str):
        self.gguf = gguf
        self.arch = arch

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def req(self, name: str) -> Any:
        return self.gguf.require(self.key(name))

    def opt(self, name: str, default: Any) -> Any:
        return self.gguf.get(self.key(name), default)

    def error(self, message: str) -> GGUFError:
        return GGUFError(f"{self.gguf.path}: {message}")

    def per_layer(self, name: str, value: Any, count: int) -> tuple[Any, ...]:
        """llama.cpp's ``get_key_or_arr``: a scalar holds for every layer, an array needs at
        least ``count`` entries (its first ``count`` are used)."""
        if not isinstance(value, (list, tuple)):
            return (value,) * count
        if len(value) < count:
            raise self.error(
                f"metadata '{self.key(name)}' has {len(value)} entries, expected {count}"
            )
        return tuple(value[:count])

    def vocab_size(self) -> int:
        """``vocab_size``, else the tokenizer's token count, else the embedding's rows."""
        vocab = self.opt("vocab_size", None)
        if vocab is None:
            tokens = self.gguf.get("tokenizer.ggml.tokens")
            vocab = (
                len(tokens)
                if tokens is not None
                else self.gguf.tensor_shape("token_embd.weight")[0]
            )
        return int(vocab)
