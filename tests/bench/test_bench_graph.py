"""The graph-size benchmark: exact primitive counts per decode step, attributed to blocks.

Counts are deterministic, so they are pinned here as upper bounds: a change that makes the
decode graph bigger fails this test (times are never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ds4mlx
from ds4mlx.diagnostics.graph import (
    BLOCKS,
    FLASH_RATIOS,
    GraphCount,
    count_step,
    primitive_names,
    project_to_ratios,
)

import mlx.core as mx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DS4_TINY = ROOT / "assets" / "ds4-tiny.gguf"
GLM_TINY = ROOT / "assets" / "glm-tiny.gguf"
PROMPT = [(i * 7919 + 13) % 6144 for i in range(32)]
# Upper bounds for one decode step after a 32-token prompt (measured, with a little room).
MAX_PRIMITIVES = {DS4_TINY: 190, GLM_TINY: 570}


def test_primitive_names_counts_only_pending_work():
    x = mx.ones((4,))
    mx.eval(x)
    y = mx.exp(x) + 1  # the scalar is broadcast
    assert sorted(primitive_names(y)) == ["Add", "Broadcast", "Exp"]
    assert sorted(primitive_names(mx.exp(x) * mx.exp(x))) == ["Exp", "Exp", "Multiply"]
    mx.eval(y)
    assert primitive_names(y) == []


@pytest.mark.parametrize("path", [DS4_TINY, GLM_TINY], ids=lambda p: p.stem)
def test_decode_step_counts_are_exact_attributed_and_bounded(path):
    model = ds4mlx.load_model(path)
    session = model.new_session()
    prompt = [t % model.args.vocab_size for t in PROMPT]
    session.feed(prompt)
    first = count_step(model.network, session.state.copy(), [1])
    second = count_step(model.network, session.state.copy(), [1])
    assert (first.uncut_total, dict(first.per_block)) == (
        second.uncut_total,
        dict(second.per_block),
    )
    assert set(first.per_block) <= set(BLOCKS)
    assert sum(first.per_block.values()) == first.attributed_total
    # Attribution runs compiled tiles uncompiled: it sees at least the work of the real step.
    assert first.attributed_total >= first.uncut_total
    assert sorted(first.per_layer) == list(range(len(model.network.blocks)))
    # Cuts only move evaluation; they may split a few shared nodes, never hide work.
    assert first.uncut_total <= first.total <= first.uncut_total * 1.05
    assert first.uncut_total <= MAX_PRIMITIVES[path]
    # Counting left the model as it was: a step now gives the logits of an unprofiled one.
    before = np.array(model.network.forward(mx.array([1]), session.state.copy()))
    count_step(model.network, session.state.copy(), [1])
    assert model.network.forward.__func__ is type(model.network).forward
    np.testing.assert_array_equal(session.feed([1]), before)


def test_projection_scales_layers_by_kind():
    count = GraphCount(total=10 + 100 + 200 + 300)
    count.per_layer.update({0: 100, 1: 200, 2: 300})
    assert project_to_ratios(count, (0, 4, 128), (0, 0, 4)) == 10 + 100 + 100 + 200
    assert project_to_ratios(count, (0, 4, 128), FLASH_RATIOS) == (
        10 + 2 * 100 + 21 * 200 + 20 * 300
    )
    with pytest.raises(ValueError, match="ratio"):
        project_to_ratios(count, (0, 4, 4), (128,))


def test_bench_graph_script_json():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_graph.py"),
            "-m",
            str(DS4_TINY),
            "--steps",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    report = json.loads(out.stdout)
    for key in (
        "primitives_per_token",
        "per_block",
        "build_ms",
        "eval_ms",
        "verify",
        "flash_43_layer_primitives_per_token",
    ):
        assert key in report
    assert report["primitives_per_token"] <= MAX_PRIMITIVES[DS4_TINY]
    assert report["verify"]["rows"] == 6
    assert report["flash_43_layer_primitives_per_token"] > report["primitives_per_token"]
