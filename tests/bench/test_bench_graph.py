"""The graph-size benchmark: exact primitive counts per decode step, attributed to blocks.

Counts are deterministic, so they are pinned here as upper bounds: a change that makes the
decode graph bigger fails this test (times are never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import ds4mlx
from ds4mlx import kernels
from ds4mlx.diagnostics.graph import (
    BLOCKS,
    FLASH_RATIOS,
    GraphCount,
    count_step,
    primitive_names,
    project_to_ratios,
)
from ds4mlx.diagnostics.metal_graph import (
    KernelCall,
    StandInKernel,
    dispatches,
    metal_configuration,
)
from ds4mlx.kernels import metal

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from mlx.utils import tree_flatten

ROOT = Path(__file__).resolve().parents[2]
DS4_TINY = ROOT / "assets" / "ds4-tiny.gguf"
GLM_TINY = ROOT / "assets" / "glm-tiny.gguf"
PROMPT = [(i * 7919 + 13) % 6144 for i in range(32)]
# Upper bounds for one decode step after a 32-token prompt (measured, with a little room), by
# weight mode: "auto" is the CPU default, the GGUF blocks as stored (native), whose products
# are one block-kernel primitive each (the fused native tiles read float32 matrices only);
# "f32" takes the fused tiles (mHC site, MoE tile, one call for all products of an input).
MAX_PRIMITIVES = {
    (DS4_TINY, "auto"): 420,
    (GLM_TINY, "auto"): 570,
    (DS4_TINY, "f32"): 168,
    (GLM_TINY, "f32"): 385,
}
# A step as a Mac builds it (``--backend metal``) after a 100-token context (the CSA indexer
# selecting its top-16 blocks), a 6-row verify, and the decode step's 43-layer projection.
METAL_CONTEXT = 100
# (219 / 235 / 1,574 measured.)
MAX_METAL_PRIMITIVES = 225
MAX_METAL_VERIFY_PRIMITIVES = 240
MAX_METAL_FLASH_PRIMITIVES = 1590


def test_primitive_names_counts_only_pending_work():
    x = mx.ones((4,))
    mx.eval(x)
    y = mx.exp(x) + 1  # the scalar is broadcast
    assert sorted(primitive_names(y)) == ["Add", "Broadcast", "Exp"]
    assert sorted(primitive_names(mx.exp(x) * mx.exp(x))) == ["Exp", "Exp", "Multiply"]
    mx.eval(y)
    assert primitive_names(y) == []


@pytest.mark.parametrize(
    ("path", "weights"), list(MAX_PRIMITIVES), ids=lambda v: getattr(v, "stem", v)
)
def test_decode_step_counts_are_exact_attributed_and_bounded(path, weights):
    model = ds4mlx.load_model(path, weights_dtype=weights)
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
    assert first.uncut_total <= MAX_PRIMITIVES[path, weights]
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


def bench_graph(*options: str, model: Path = DS4_TINY) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_graph.py"),
            "-m",
            str(model),
            "--steps",
            "1",
            "--json",
            *options,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout)


@pytest.mark.parametrize("weights", ["auto", "f32"])
def test_bench_graph_script_json(weights):
    report = bench_graph("--weights-dtype", weights)
    for key in (
        "primitives_per_token",
        "dispatches_per_token",
        "per_block",
        "build_ms",
        "eval_ms",
        "verify",
        "flash_43_layer_primitives_per_token",
    ):
        assert key in report
    assert report["backend"] == "cpu"
    assert report["primitives_per_token"] <= MAX_PRIMITIVES[DS4_TINY, weights]
    assert report["dispatches_per_token"] <= report["primitives_per_token"]
    assert report["verify"]["rows"] == 6
    assert report["flash_43_layer_primitives_per_token"] > report["primitives_per_token"]


def test_bench_graph_script_counts_the_mac_configuration():
    report = bench_graph("--backend", "metal", "--context", str(METAL_CONTEXT))
    assert (report["backend"], report["weights_dtype"]) == ("metal", "native")
    assert report["primitives_per_token"] <= MAX_METAL_PRIMITIVES
    assert report["verify"]["primitives"] <= MAX_METAL_VERIFY_PRIMITIVES
    assert report["flash_43_layer_primitives_per_token"] <= MAX_METAL_FLASH_PRIMITIVES
    # Every Metal kernel launch is a dispatch; views are not.
    assert report["dispatches_per_token"] >= report["decode"]["top_primitives"]["Depends"]
    assert report["dispatches_per_token"] < report["primitives_per_token"]


# The same with streamed experts in a slab that holds them all (the steady state: every step's
# experts cached). Each layer's tile runs compiled in three parts around the attention and the
# host's read of the routing (models.deepseek4.Block._streamed_tile): measured 279 / 295 /
# 2,004, from 405 / 421 / 2,945 when streamed tiles ran uncompiled. The counts include what
# the routing's host read evaluates mid-step (diagnostics.graph.count_step).
MAX_METAL_STREAMED_PRIMITIVES = 285
MAX_METAL_STREAMED_VERIFY_PRIMITIVES = 300
MAX_METAL_STREAMED_FLASH_PRIMITIVES = 2030


def test_bench_graph_script_counts_the_mac_configuration_with_streamed_experts():
    report = bench_graph(
        "--backend", "metal", "--context", str(METAL_CONTEXT), "--experts", "stream"
    )
    assert report["experts"] == "stream"
    assert report["primitives_per_token"] <= MAX_METAL_STREAMED_PRIMITIVES
    assert report["verify"]["primitives"] <= MAX_METAL_STREAMED_VERIFY_PRIMITIVES
    assert report["flash_43_layer_primitives_per_token"] <= MAX_METAL_STREAMED_FLASH_PRIMITIVES
    # The MoE's work is attributed to it, not to "other".
    assert report["per_block"]["moe"] > report["per_block"]["other"]


# glm-tiny's steady decode step (the script decodes the context's last tokens one at a time, so
# a KDA layer's rollback states have settled and its compiled tile replays): 157 on the Mac
# (issue 33 asks for 350 at most), 92 on the CPU in float32 (at most 250), since a KDA layer's
# tile between its projections is one fused operation (kernels.kda_tile; 328 and 317 before)
# and an MLA layer attends in one kernels.sparse_attention with its indexer's products fused
# into its own, its per-head matrices frozen (187 and 183 before) and applied as one grouped
# product each (kernels.grouped_linear: one native primitive on the CPU; on the Mac the same
# dispatches as before it, with 8 more views). A KDA layer's states live in a ring written in
# place (2 primitives a layer: the slots' index broadcast and the newest state's slice).
MAX_GLM_METAL_PRIMITIVES = 160
MAX_GLM_F32_PRIMITIVES = 94


def test_bench_graph_script_counts_glms_steady_step():
    mac = bench_graph("--backend", "metal", model=GLM_TINY)
    assert mac["primitives_per_token"] <= MAX_GLM_METAL_PRIMITIVES
    cpu = bench_graph("--weights-dtype", "f32", model=GLM_TINY)
    assert cpu["primitives_per_token"] <= MAX_GLM_F32_PRIMITIVES


def test_stand_ins_refuse_a_kernel_reading_its_outputs_shape():
    """MLX declares the shapes of a kernel's inputs only (grow_rows, grow_row_pairs and
    pool_blocks once read their outputs' and would not have compiled on a Mac)."""
    spec = {"name": "k", "input_names": ["x"], "output_names": ["out"]}
    StandInKernel([], source="out[0] = x[x_shape[0] - 1];  // not out_shape", **spec)
    with pytest.raises(ValueError, match="shape of its output out"):
        StandInKernel([], source="if (i < out_shape[0]) { out[i] = x[i]; }", **spec)


def test_dispatches_leave_out_views():
    assert dispatches(["Reshape", "Slice", "Matmul", "Depends", "Broadcast", "Add"]) == 3


def test_metal_configuration_records_the_kernel_calls_and_restores_everything():
    # Three Q2_K matrices [64, 256] (84 bytes a 256-value block); the stand-ins read no value.
    q2k = kernels.PackedWeight(mx.zeros((3, 64, 84), mx.uint8), GGMLQuantizationType.Q2_K)
    x = mx.ones((8, 256))
    comb = mx.ones((8, 4, 4))
    mx.eval(q2k.data, x, comb)
    norm = mx.fast.rms_norm
    with metal_configuration() as calls:
        assert kernels.dispatch.native_cpu_ops() is None
        y = kernels.linear(x, kernels.PackedWeight(q2k.data[0], q2k.qtype))
        g = kernels.gather_linear(x[:2, None, None], q2k, mx.array([[2], [0]], mx.uint32))
        s = kernels.sinkhorn(comb, 20, 1e-6)
        n = mx.fast.rms_norm(x, None, 1e-6)
    linear_call, gather_call, sinkhorn_call = calls
    # The packed mat-vec: 8 simdgroups of 4 weight rows a threadgroup (64 rows: 2 groups), all
    # 8 x rows in one tile; the gather's single x row takes the 1-row tile.
    assert linear_call == KernelCall(
        "ds4_q2_k_linear",
        (
            ("T", mx.float32),
            ("K", 256),
            ("N", 64),
            ("SIMDGROUPS", 8),
            ("ROWS", 4),
            ("XROWS", 8),
            ("XSHARE", 1),
        ),
        (((1, 8, 256), mx.float32), ((64, 84), mx.uint8), ((1,), mx.uint32), ((1,), mx.int32)),
        (((1, 8, 64), mx.float32),),
        (32 * 8 * 2, 1, 1),
        (32 * 8, 1, 1),
    )
    assert gather_call.template[-2:] == (("XROWS", 1), ("XSHARE", 1))
    assert gather_call.inputs[0] == ((2, 1, 256), mx.float32)
    assert gather_call.inputs[2] == ((2,), mx.uint32)
    assert gather_call.outputs == (((2, 1, 64), mx.float32),)
    assert gather_call.grid == (32 * 8 * 2, 1, 2)
    assert sinkhorn_call.name == "ds4_sinkhorn"
    assert sinkhorn_call.template == (("HC", 4), ("ITERS", 20))
    assert (y.shape, g.shape, s.shape, n.shape) == ((8, 64), (2, 1, 1, 64), (8, 4, 4), (8, 256))
    # Each kernel, and each mx.fast operation, is one primitive as on the GPU.
    assert primitive_names(n) == ["Depends"]
    assert primitive_names(s).count("Depends") == 1
    assert mx.default_device() == mx.cpu and mx.fast.rms_norm is norm
    assert (
        kernels.dispatch.backend is kernels.twins and kernels.dispatch.native_cpu_ops() is not None
    )


def test_the_mac_configuration_holds_no_half_precision_matrix():
    """glm-tiny's F16 matrices and per-head stacks load in the compute dtype on the GPU path,
    so no product converts a whole matrix per call (its MLA stacks did, four AsTypes a step)."""
    with metal_configuration():
        model = ds4mlx.load_model(GLM_TINY, weights_dtype="native")
        session = model.new_session()
        session.feed(PROMPT[:8])
        step = count_step(model.network, session.state.copy(), [1])
    dtypes = {v.dtype for _, v in tree_flatten(model.network.parameters()) if v.ndim >= 2}
    assert dtypes == {mx.float32}
    assert "AsType" not in step.uncut_names


def test_the_mac_decode_step_passes_flat_streams_between_blocks():
    """On the GPU each block's streams come out [T, hc * D], as the next site reads them (no
    view between blocks), while a caller still sees the hidden states in their shapes."""
    with metal_configuration():
        model = ds4mlx.load_model(DS4_TINY, weights_dtype="native")
        session = model.new_session()
        session.feed(PROMPT[:4])
        state, tokens = session.state, mx.array([1], mx.int32)
        hc, dim = model.args.hc_mult, model.args.hidden_size
        blocks = model.network._tile_layers(
            model.network._embed(tokens), tokens, state.pos, list(state.layers), 1
        )
        with kernels.inference():
            shapes = [after.shape for after in blocks]
        out = model.network.forward(tokens, state, capture_layers=[1], return_hidden=True)
    assert shapes == [(1, hc, dim)] * len(model.network.blocks)
    assert out.head_input.shape == (1, hc, dim) and out.layers[1].shape == (1, dim)
    block = model.network.blocks[0]
    with metal_configuration(), kernels.inference():
        streams = block._tile_ffn(mx.zeros((8, hc, dim)), mx.zeros((8,), mx.int32), 1)
    assert streams.shape == (8, hc * dim)


def test_the_mac_decode_step_launches_the_metal_kernels_it_should():
    with metal_configuration() as calls:
        model = ds4mlx.load_model(DS4_TINY, weights_dtype="native")
        session = model.new_session()
        session.feed(PROMPT)
        before = len(calls)
        session.feed([1])
    step = Counter(call.name for call in calls[before:])
    blocks = len(model.network.blocks)
    csa = sum(1 for ratio in model.args.compress_ratios[:blocks] if ratio == 4)
    hca = sum(1 for ratio in model.args.compress_ratios[:blocks] if ratio == 128)
    # Per block: two mHC sites (each with its streams' norm and the block input's norm) and two
    # expansions, RoPE on the queries and the keys with their norms, RoPE on the de-rotated
    # output (and the indexer's queries in CSA layers), the routed gate and up
    # matrices (Q2_K in the tiny model; its Q4_K down matrices are MLX's own quantized kind)
    # between the routing and the sum, the attention, the window's growth and each compressor's
    # pending rows' (keys and scores in one launch; CSA layers have two compressors); then the
    # Q6_K head. Before them, the tile's token embeddings as its streams.
    assert step == Counter(
        ds4_embed_streams=1,
        ds4_hc_site_norm=2 * blocks + 1,  # and the head's collapse with its norms
        ds4_hc_expand=2 * blocks,
        ds4_norm_rope=2 * blocks,
        ds4_rope=blocks + csa,
        ds4_q2_k_linear=2 * blocks,
        ds4_moe_route=blocks,
        ds4_moe_combine=blocks,
        ds4_sparse_attention=blocks,
        ds4_grow_rows=blocks,
        ds4_grow_row_pairs=2 * csa + hca,
        ds4_q6_k_linear=1,
    )
    # The launches are the Metal path's own: the packed mat-vec's threadgroup shape for each
    # matrix and x-row count (the routed experts' one row a pair, read in place, the head's
    # tile), the attention in threadgroups of all 4 query heads of ds4-tiny times 2 key splits,
    # one per tile row.
    for call in calls[before:]:
        if call.name.endswith("_linear"):
            x_shape, _ = call.inputs[0]
            n_out = call.outputs[0][0][-1]
            if len(x_shape) == 2:
                # A routed tile's pairs: the tile itself, each row read by its k experts, and
                # the routing's indices as it made them, its real rows' (no view of either).
                real, slots = call.outputs[0][0][:2]
                assert call.inputs[2][0] == (real, slots) and real <= x_shape[0]
                batches, rows, share = real * slots, 1, slots
            else:
                (batches, rows, _), share = x_shape, 1
            launch = metal.matvec_launch(n_out, rows)
            assert call.template[-4:] == (
                ("SIMDGROUPS", launch.simdgroups),
                ("ROWS", launch.rows),
                ("XROWS", launch.x_rows),
                ("XSHARE", share),
            )
            assert call.grid == launch.grid(n_out, rows, batches)
        if call.name == "ds4_sparse_attention":
            (tokens, heads, dim), dtype = call.inputs[0]
            assert call.template == (("T_", dtype), ("D", dim), ("HEADS", 4), ("SPLITS", 2))
            assert (heads, call.grid, call.threadgroup) == (4, (256, 1, tokens), (256, 1, 1))
