"""What a model's ``forward(..., return_hidden=True)`` returns besides the logits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class ForwardOutput:
    """Logits with the hidden states drafters and MTP heads consume.

    ``layers[i]``: mean over the mHC streams of the hidden state after layer i, [T, D], for each
    requested layer (llama.cpp's ``layer_inp[i + 1]``). ``head_input``: the streams after the
    last layer, [T, hc, D], before the head collapses them. ``final_hidden``: after that
    collapse and the output norm, [T, D] (the LM head's input).
    """

    logits: mx.array
    layers: dict[int, mx.array]
    head_input: mx.array
    final_hidden: mx.array


def capture_set(capture_layers: Sequence[int], return_hidden: bool, n_layers: int) -> set[int]:
    """``forward``'s ``capture_layers`` as a set, checked (ValueError) against the layer count."""
    if capture_layers and not return_hidden:
        raise ValueError("capture_layers needs return_hidden=True")
    capture = set(capture_layers)
    bad = sorted(i for i in capture if not 0 <= i < n_layers)
    if bad:
        raise ValueError(f"capture_layers {bad} out of range [0, {n_layers})")
    return capture
