"""GGUF reading, validation and quantisation mapping."""

from ds4mlx.gguf.errors import GGUFError
from ds4mlx.gguf.reader import GGUFFile, open_gguf

__all__ = ["GGUFError", "GGUFFile", "open_gguf"]
