"""Live cross-check against llama.cpp itself: our logits for the shipped models equal its logits.

This is the external proof that our GGUF writer and reader agree with the reference
implementation. Skipped unless ``llama-cpp-python`` is importable (the optional ``bench`` extra).
"""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx.bench.llamacpp_peer import LlamaCppModel, llamacpp_available
from ds4mlx.gguf import open_gguf

import numpy as np
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
# llama.cpp's CPU kernels round activations to Q8 before quantized dot products.
QUANTIZED_TOLERANCE = 2e-3


def shipped_models() -> list[Path]:
    return sorted(
        p for p in ASSETS.glob("*.gguf") if open_gguf(p).arch in ("deepseek4", "glm5-next")
    )


@pytest.mark.skipif(
    not llamacpp_available(), reason="llama-cpp-python is not installed (pip install -e '.[bench]')"
)
@pytest.mark.parametrize("path", shipped_models(), ids=lambda p: p.name)
def test_shipped_model_matches_llamacpp(path: Path):
    model = ds4mlx.load_model(path)
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    tokens = model.tokenizer.encode(text)[:48]
    peer = LlamaCppModel(str(path), n_ctx=256)
    try:
        ref = peer.eval(tokens)
    finally:
        peer.close()
    ours = model.logits(tokens)
    nmse = float(np.mean((ours - ref) ** 2) / np.mean(ref**2))
    assert nmse < QUANTIZED_TOLERANCE, f"NMSE {nmse:.3g} against llama.cpp"
