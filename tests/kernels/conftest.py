"""Import ds4mlx before any test module imports mlx.core, so its BLAS preload takes effect."""

import ds4mlx  # noqa: F401
