"""ds4mlx: a local inference engine for DeepSeek-V4-Flash and GLM-5.3-Flash GGUF models on MLX."""

from ds4mlx._blas import load_optimised_blas

load_optimised_blas()  # must run before anything imports mlx.core

from ds4mlx.loader import load_model  # noqa: E402

__all__ = ["load_model"]
__version__ = "0.1.0"
