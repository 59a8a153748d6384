"""A decoding session compiles each Metal kernel once, however long its context grows.

MLX names a kernel library by its source and template arguments: a template argument that
follows the context (a key count, a length) compiles a new library every time it changes. A
stand-in for ``mx.fast.metal_kernel`` records each launch's kernel and template while ds4-tiny
decodes 400 tokens through the Metal wrappers (on a Mac with the real kernels behind it).
"""

from __future__ import annotations

from pathlib import Path

import ds4mlx
from ds4mlx import kernels
from ds4mlx.generation import SpeculationConfig, TokenEvent, generate
from ds4mlx.kernels import metal
from ds4mlx.models import compressed_attention

import mlx.core as mx
import pytest

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
DECODE_TOKENS = 400
WARM_TOKENS = 8  # the prompt and the first decode steps use every kernel once
NO_METAL = "Metal is not available (needs macOS on Apple silicon with MLX's Metal backend)"


class RecordingKernel:
    """What ``mx.fast.metal_kernel`` returns, standing in: records (tokens decoded so far,
    name, template) per launch and runs the real kernel, or without Metal returns zeros."""

    def __init__(self, name: str, real, launches: list, progress: dict):
        self.name, self.real, self.launches, self.progress = name, real, launches, progress

    def __call__(self, inputs, template, **launch):
        arguments = tuple((key, str(value)) for key, value in template)
        self.launches.append((self.progress["tokens"], self.name, arguments))
        if self.real is not None:
            return self.real(inputs=inputs, template=template, **launch)
        # Which kernels and templates run depends on shapes and positions only, not on values.
        return [
            mx.zeros(shape, dtype)
            for shape, dtype in zip(launch["output_shapes"], launch["output_dtypes"], strict=True)
        ]


def _through_metal(function):
    """``function`` with the native CPU operations out of the way, so it takes the Metal path."""

    def routed(*args, **kwargs):
        native = kernels._native_cpu_ops
        kernels._native_cpu_ops = lambda: None
        try:
            return function(*args, **kwargs)
        finally:
            kernels._native_cpu_ops = native

    return routed


def _clear_kernel_caches() -> None:
    for cached in (
        metal._kernel,
        metal._body_kernel,
        metal._sparse_attention_function,
        metal._sinkhorn_function,
    ):
        cached.cache_clear()


def decode_and_record(monkeypatch, on_metal: bool) -> list[tuple[int, str, tuple]]:
    """ds4-tiny decodes DECODE_TOKENS tokens through the Metal wrappers; every launch's
    (tokens decoded before it, kernel name, template arguments)."""
    launches: list = []
    progress = {"tokens": 0}
    real = mx.fast.metal_kernel

    def recording(name, **spec):
        return RecordingKernel(
            name, real(name=name, **spec) if on_metal else None, launches, progress
        )

    monkeypatch.setattr(mx.fast, "metal_kernel", recording)
    monkeypatch.setattr(kernels, "_backend", metal)
    monkeypatch.setattr(
        compressed_attention, "sparse_attention", _through_metal(kernels.sparse_attention)
    )
    _clear_kernel_caches()
    try:
        model = ds4mlx.load_model(TINY_MODEL)
        prompt = model.tokenizer.encode("Once upon a time, in a land of sparse attention,")
        config = SpeculationConfig()
        for event in generate(model.new_session(), prompt, DECODE_TOKENS, None, None, config):
            progress["tokens"] += isinstance(event, TokenEvent)
    finally:
        _clear_kernel_caches()
    assert progress["tokens"] == DECODE_TOKENS
    return launches


def assert_each_kernel_compiled_once(launches: list[tuple[int, str, tuple]]) -> None:
    used = {name for _, name, _ in launches}
    assert "ds4_sparse_attention" in used
    templates = {(name, arguments) for _, name, arguments in launches}
    assert len(templates) == len(used), sorted(templates)
    warm = {(name, arguments) for tokens, name, arguments in launches if tokens < WARM_TOKENS}
    assert templates == warm  # nothing new once the context grows


def test_a_long_decode_compiles_each_kernel_once(monkeypatch):
    assert_each_kernel_compiled_once(decode_and_record(monkeypatch, on_metal=False))


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
def test_a_long_decode_on_metal_compiles_each_kernel_once(monkeypatch):
    """On a Mac: the real kernels, each launch's template recorded on its way to MLX."""
    assert_each_kernel_compiled_once(decode_and_record(monkeypatch, on_metal=True))
