"""A decoding session compiles each Metal kernel once, however long its context grows.

MLX names a kernel library by its source and template arguments: a template argument that
follows the context (a key count, a length) compiles a new library every time it changes.
ds4-tiny decodes 400 tokens as a Mac builds its steps, and every kernel launch is recorded with
its template (``ds4mlx.diagnostics.metal_graph``: its stand-ins here, the real kernels on a Mac).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import ds4mlx
from ds4mlx.diagnostics.metal_graph import KernelCall, metal_configuration, recorded_kernels
from ds4mlx.generation import SpeculationConfig, TokenEvent, generate
from ds4mlx.kernels import metal

import pytest

TINY_MODEL = Path(__file__).resolve().parents[2] / "assets" / "ds4-tiny.gguf"
DECODE_TOKENS = 400
NO_METAL = "Metal is not available (needs macOS on Apple silicon with MLX's Metal backend)"


def decode_and_record(
    recording: AbstractContextManager[list[KernelCall]],
) -> list[tuple[int, str, tuple]]:
    """ds4-tiny decodes DECODE_TOKENS tokens while ``recording`` records the kernel calls;
    every launch's (tokens decoded before it, kernel name, template arguments)."""
    decoded_before: list[int] = []  # per call, the tokens decoded before it
    with recording as calls:
        model = ds4mlx.load_model(TINY_MODEL, weights_dtype="native")
        prompt = model.tokenizer.encode("Once upon a time, in a land of sparse attention,")
        tokens = 0
        events = generate(
            model.new_session(), prompt, DECODE_TOKENS, None, None, SpeculationConfig()
        )
        for event in events:
            decoded_before.extend([tokens] * (len(calls) - len(decoded_before)))
            tokens += isinstance(event, TokenEvent)
    assert tokens == DECODE_TOKENS
    return [
        (before, call.name, tuple((key, str(value)) for key, value in call.template))
        for before, call in zip(decoded_before, calls, strict=False)
    ]


def assert_each_kernel_compiled_once(launches: list[tuple[int, str, tuple]]) -> None:
    used = {name for _, name, _ in launches}
    assert {
        "ds4_sparse_attention",
        "ds4_indexer_scores",
        "ds4_indexer_top_k",
        "ds4_pool_blocks",
    } <= used
    # A kernel may take a few templates (each layer kind's RoPE, hash-routed and biased
    # routing), and some are first used later (HCA pooling after 128 tokens); a template that
    # followed the context would keep bringing new ones as it grows.
    half = DECODE_TOKENS // 2
    early = {(name, arguments) for tokens, name, arguments in launches if tokens < half}
    late = {(name, arguments) for tokens, name, arguments in launches if tokens >= half}
    assert late <= early, sorted(late - early)


def test_a_long_decode_compiles_each_kernel_once():
    assert_each_kernel_compiled_once(decode_and_record(metal_configuration()))


@pytest.mark.skipif(not metal.metal_available(), reason=NO_METAL)
def test_a_long_decode_on_metal_compiles_each_kernel_once():
    """On a Mac: the real kernels, each launch's template recorded on its way to MLX."""
    assert_each_kernel_compiled_once(decode_and_record(recorded_kernels()))
