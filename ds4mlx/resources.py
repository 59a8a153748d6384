"""Where the data ds4mlx ships lives: the tiny models (``assets/``) and the Metal kernel sources
(``metal/``).

In the source tree they are top-level folders beside the package (the project's layout); a
wheel carries them inside the package as ``ds4mlx/_data/assets`` and ``ds4mlx/_data/metal``
(``setup.py`` copies them there at build time), so an installed ds4mlx finds them wherever it
runs from.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The folder of shipped data ``name`` ("assets" or "metal"): the installed package's copy
    when there is one, else the source tree's."""
    packaged = _PACKAGE / "_data" / name
    return packaged if packaged.is_dir() else _PACKAGE.parent / name
