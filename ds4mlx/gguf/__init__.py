"""GGUF reading, validation and quantisation mapping."""

from ds4mlx.gguf.errors import GGUFError
from ds4mlx.gguf.quants import DEFAULT_WEIGHT_MODE, SUPPORTED_TYPES, WEIGHT_MODES
from ds4mlx.gguf.reader import GGUFFile, open_gguf
from ds4mlx.gguf.validate import GGUFLayout, TensorInfo, validate_gguf

__all__ = [
    "DEFAULT_WEIGHT_MODE",
    "GGUFError",
    "GGUFFile",
    "GGUFLayout",
    "SUPPORTED_TYPES",
    "TensorInfo",
    "WEIGHT_MODES",
    "open_gguf",
    "validate_gguf",
]
