"""GGUF reading, validation and quantisation mapping; quantizing and writing GGUF files."""

from ds4mlx.gguf.errors import GGUFError
from ds4mlx.gguf.quantize import QUANTIZE_TYPES, quantize
from ds4mlx.gguf.quants import DEFAULT_WEIGHT_MODE, SUPPORTED_TYPES, WEIGHT_MODES
from ds4mlx.gguf.reader import GGUFFile, open_gguf
from ds4mlx.gguf.validate import GGUFLayout, TensorInfo, validate_gguf
from ds4mlx.gguf.writer import MetaValue, TensorToWrite, write_gguf

__all__ = [
    "DEFAULT_WEIGHT_MODE",
    "GGUFError",
    "GGUFFile",
    "GGUFLayout",
    "MetaValue",
    "QUANTIZE_TYPES",
    "SUPPORTED_TYPES",
    "TensorInfo",
    "TensorToWrite",
    "WEIGHT_MODES",
    "open_gguf",
    "quantize",
    "validate_gguf",
    "write_gguf",
]
