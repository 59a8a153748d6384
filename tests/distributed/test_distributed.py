"""Tensor/expert parallel inference over mx.distributed: the shard plan, the sliced weights and
a real 2-rank run on loopback (mlx.launch, ring backend) against the single-process model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ds4mlx.cli.distributed import shared_seed
from ds4mlx.cli.main import Messages
from ds4mlx.cli.main import main as ds4_main
from ds4mlx.distributed import (
    DistributedError,
    RankGroup,
    ShardError,
    ShardPlan,
    TensorSlice,
    check_same_model,
    init_group,
    model_fingerprint,
)
from ds4mlx.distributed.launch import free_port_block, launch_local
from ds4mlx.distributed.model import ExpertShard
from ds4mlx.distributed.weights import ShardedGGUFWeights, slice_raw
from ds4mlx.gguf import open_gguf
from ds4mlx.gguf.quants import resident_nbytes
from ds4mlx.kernels import PackedWeight, gather_linear, linear
from ds4mlx.loader import load_model, resolve_weights_dtype
from ds4mlx.models.deepseek4 import ModelArgs, tensor_shapes
from ds4mlx.models.moe import RoutedExperts

import mlx.core as mx
import numpy as np
import pytest

from tests.kernels.ggml_blocks import integer_rounded

ASSETS = Path(__file__).resolve().parents[2] / "assets"
TINY = ASSETS / "ds4-tiny.gguf"
DSPARK = ASSETS / "ds4-tiny-dspark.gguf"
NMSE_TOLERANCE = 1e-5  # the llama.cpp oracle tests' tolerance
LAUNCH_TIMEOUT_S = 420  # two ranks on a loaded 2-core machine: ~40 s; a hang fails the test


def nmse(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean((ours - ref) ** 2) / np.mean(ref**2))


@pytest.fixture(scope="module")
def tiny():
    return open_gguf(TINY)


@pytest.fixture(scope="module")
def args(tiny) -> ModelArgs:
    return ModelArgs.from_gguf(tiny)


def single_rank() -> RankGroup:
    """The group of a process not started by mlx.launch: one rank, collectives are identity."""
    return RankGroup(mx.distributed.init())


def test_plan_rejects_world_sizes_that_do_not_divide(args):
    assert (args.o_groups, args.n_experts) == (2, 8)
    with pytest.raises(ShardError, match="2 attention output groups .* and 8 routed experts"):
        ShardPlan.for_model(args, 0, 3)
    with pytest.raises(ShardError, match="2 attention output groups") as err:
        ShardPlan.for_model(args, 0, 4)
    assert "routed experts" not in str(err.value)
    with pytest.raises(ShardError, match="rank 2 is not in a group of 2"):
        ShardPlan.for_model(args, 2, 2)


def test_plan_splits_heads_groups_and_experts(args):
    plans = [ShardPlan.for_model(args, r, 2) for r in range(2)]
    assert [p.experts for p in plans] == [(0, 4), (4, 8)]
    local = plans[1].local_args
    assert (local.num_heads, local.o_groups) == (2, 1)
    shapes = plans[1].local_shapes(tensor_shapes(args))
    assert shapes["blk.2.attn_q_b.weight"] == (2 * 64, 128)
    assert shapes["blk.2.attn_sinks.weight"] == (2,)
    assert shapes["blk.2.attn_output_a.weight"] == (64, 128)
    assert shapes["blk.2.attn_output_b.weight"] == (256, 64)
    assert shapes["blk.2.ffn_down_exps.weight"] == (4, 256, 256)
    # Replicated: the router (every rank routes over all experts), the indexer, the head.
    for name in (
        "blk.2.ffn_gate_inp.weight",
        "blk.2.indexer.attn_q_b.weight",
        "blk.2.ffn_gate_shexp.weight",
        "output.weight",
        "token_embd.weight",
    ):
        assert shapes[name] == tensor_shapes(args)[name]


def test_rank_slices_reassemble_the_whole_tensor(tiny, args):
    """Each sharded tensor (Q8_0 rows and columns, Q2_K/Q4_K expert stacks, F32 sinks) read as
    two ranks' slices from the memory map equals the whole tensor, cut where the plan says."""
    shapes = tensor_shapes(args)
    ranks = [
        ShardedGGUFWeights(shapes, tiny, "f32", ShardPlan.for_model(args, r, 2), single_rank())
        for r in range(2)
    ]
    checked = set()
    for name in (
        "blk.0.attn_q_b.weight",
        "blk.0.attn_output_a.weight",
        "blk.0.attn_output_b.weight",
        "blk.3.ffn_gate_exps.weight",
        "blk.3.ffn_down_exps.weight",
        "blk.3.attn_sinks.weight",
    ):
        whole = tiny.dequantize(name)
        parts = [np.array(w.param(name) if whole.ndim == 1 else w.matrix(name)) for w in ranks]
        cut = ranks[0].plan.tensor_slice(name)
        np.testing.assert_array_equal(np.concatenate(parts, axis=cut.axis), whole)
        checked.add(tiny.tensor_type(name).name)
    assert {"Q8_0", "Q2_K", "Q4_K", "F32"} <= checked


def test_native_slices_compute_like_float32_slices(tiny, args):
    """With --weights-dtype native (the default) a slice keeps the file's quantization: the
    CPU's GGUF blocks (Metal: MLX-quantized rows and columns for Q8_0, Q4_K) and packed Q2_K
    expert stacks. The CPU's Q8_0 products take their input rounded to 8 bits (as llama.cpp
    does), so that is the float32 slice's input too."""
    shapes = tensor_shapes(args)
    plan = ShardPlan.for_model(args, 1, 2)
    native, f32 = (
        ShardedGGUFWeights(shapes, tiny, mode, plan, single_rank()) for mode in ("native", "f32")
    )
    x = mx.random.normal((3, 1, 1, 256), key=mx.random.key(0))
    pairs = mx.array([[0, 1], [2, 3], [1, 1]])
    for name in (
        "blk.1.attn_q_b.weight",
        "blk.1.attn_output_b.weight",
        "blk.2.ffn_gate_exps.weight",
        "blk.2.ffn_down_exps.weight",
    ):
        q, f = native.matrix(name), f32.matrix(name)
        assert not isinstance(q, mx.array)  # still quantized
        if f.ndim == 2:
            rows = x[:, 0, 0, : f.shape[1]]
            if isinstance(q, PackedWeight):
                rows = mx.array(integer_rounded(np.array(rows), q.qtype))
            ours, ref = linear(rows, q), rows @ f.T
        else:
            ours, ref = gather_linear(x, q, pairs, False), gather_linear(x, f, pairs, False)
        np.testing.assert_allclose(np.array(ours), np.array(ref), atol=1e-5)


@pytest.mark.parametrize("tokens", [5, 40])  # a decode tile (masked) and a prefill chunk
def test_expert_shards_add_up_to_the_whole_layer(tiny, tokens):
    """Two ranks simulated in one process: the outputs of the two expert ranges, summed, are
    the whole layer's routed output (rows over experts from both ranges and from one)."""
    stacks = [
        mx.array(tiny.dequantize(f"blk.1.ffn_{part}_exps.weight"))
        for part in ("gate", "up", "down")
    ]
    whole = RoutedExperts(*stacks, swiglu_limit=10.0)
    shards = [
        ExpertShard(
            RoutedExperts(*(s[lo : lo + 4] for s in stacks), swiglu_limit=10.0),
            lo,
            4,
            single_rank(),
        )
        for lo in (0, 4)
    ]
    key = mx.random.key(1)
    x = mx.random.normal((tokens, 256), key=key)
    indices = mx.random.randint(0, 8, (tokens, 2), key=key).astype(mx.int32)
    indices = mx.concatenate([indices[:-1], mx.array([[5, 6]], mx.int32)])  # one rank only
    weights = mx.random.uniform(shape=(tokens, 2), key=key)
    total = shards[0](x, indices, weights) + shards[1](x, indices, weights)
    np.testing.assert_allclose(
        np.array(total), np.array(whole(x, indices, weights)), rtol=1e-5, atol=1e-5
    )


def test_column_cut_inside_a_quantization_block_is_refused(tiny):
    name = "blk.0.attn_output_b.weight"  # Q8_0 [256, 128]: 32-value blocks
    with pytest.raises(ShardError, match="Q8_0 blocks of 32 values straddle .* column 16"):
        slice_raw(
            tiny.raw(name),
            tiny.tensor_type(name),
            tiny.tensor_shape(name),
            TensorSlice(-1, 1, 8),
            name,
        )


def test_fingerprints_tell_model_files_apart(tmp_path):
    assert np.array_equal(model_fingerprint(TINY), model_fingerprint(TINY))
    assert not np.array_equal(model_fingerprint(TINY), model_fingerprint(DSPARK))
    copy = tmp_path / "copy.gguf"
    data = bytearray(TINY.read_bytes())
    data[-1] ^= 1  # the last tensor's last byte differs
    copy.write_bytes(bytes(data))
    assert not np.array_equal(model_fingerprint(TINY), model_fingerprint(copy))
    check_same_model(single_rank(), TINY)  # one rank always agrees with itself


def test_without_mlx_launch_there_is_no_group(monkeypatch):
    for var in ("MLX_RANK", "MLX_HOSTFILE", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(DistributedError, match="start every rank with mlx.launch"):
        init_group()


def test_ds4_distributed_outside_a_group_fails_cleanly(monkeypatch, capsys):
    monkeypatch.delenv("MLX_RANK", raising=False)
    monkeypatch.delenv("MLX_HOSTFILE", raising=False)
    assert ds4_main(["--distributed", "-p", "hi", "-n", "2"]) == 1
    assert "mlx.launch" in capsys.readouterr().err


def test_shared_seed_keeps_a_given_seed_and_draws_one_otherwise():
    ranks = single_rank()
    assert shared_seed(ranks, 1234) == 1234
    assert 0 <= shared_seed(ranks, None) < 2**31


def test_one_rank_sharded_model_is_the_model():
    prompt = list(range(5, 45))
    plain = load_model(TINY).logits(prompt)
    sharded = load_model(TINY, ranks=single_rank())
    assert type(sharded.network).__name__ == "ShardedModel"
    np.testing.assert_array_equal(sharded.logits(prompt), plain)


@pytest.mark.skipif(shutil.which("mlx.launch") is None, reason="mlx.launch is not installed")
def test_two_ranks_on_loopback_match_one_process(tmp_path, capsys):
    """The acceptance run: 2 ranks (ring backend over 127.0.0.1) against the single-process
    model: prompt logits within the oracle tolerance, greedy output with and without DSpark
    identical, every rank holding half of the routed experts."""
    probe_args = [
        "--model",
        str(TINY),
        "--drafter",
        str(DSPARK),
        "-n",
        "20",
        "--timeout",
        str(LAUNCH_TIMEOUT_S - 20),
    ]
    runs = {}
    for n, folder, extra in ((1, "single", ["--single"]), (2, "ranks", [])):
        try:  # the reference is a process of its own too, so that peak RSS compares
            runs[folder] = launch_local(
                n,
                "ds4mlx.diagnostics.distributed_probe",
                [*probe_args, *extra, "--out", str(tmp_path / folder)],
                LAUNCH_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{n} rank(s) did not finish in {LAUNCH_TIMEOUT_S}s")

    def report(folder: str, rank: int) -> tuple[dict, np.ndarray]:
        path = tmp_path / folder / f"rank{rank}"
        run = runs[folder]
        assert path.with_suffix(".json").is_file(), (
            f"rank {rank} wrote no report (rc {run.returncode}):\n{run.stderr[-3000:]}"
        )
        return (
            json.loads(path.with_suffix(".json").read_text()),
            np.load(tmp_path / folder / f"rank{rank}_logits.npy"),
        )

    ref, ref_logits = report("single", 0)
    assert ref["greedy"] and ref["dspark"] == ref["greedy"]
    ranks = [report("ranks", r) for r in range(2)]
    mode = resolve_weights_dtype("auto")  # the probe's
    layout = open_gguf(TINY).layout.tensors
    expert_bytes = sum(
        resident_nbytes(i.qtype, i.shape, mode) for n, i in layout.items() if "_exps." in n
    )
    with capsys.disabled():
        print(
            f"\nsingle process: peak RSS {ref['peak_rss_bytes'] / 2**20:.0f} MiB, "
            f"weights {ref['weight_bytes'] / 2**20:.1f} MiB"
        )
    for rank, (rep, logits) in enumerate(ranks):
        assert rep["size"] == 2 and rep["rank"] == rank
        assert nmse(logits, ref_logits) <= NMSE_TOLERANCE
        assert rep["greedy"] == ref["greedy"]
        assert rep["dspark"] == ref["greedy"]
        # Half the routed experts (as the default weights hold them) and half the attention
        # output weights.
        assert rep["weight_bytes"] <= ref["weight_bytes"] - expert_bytes // 2
        assert rep["summed_bytes_per_token"] > 0
        with capsys.disabled():
            print(
                f"rank {rank}: peak RSS {rep['peak_rss_bytes'] / 2**20:.0f} MiB, "
                f"weights {rep['weight_bytes'] / 2**20:.1f} MiB, all_sum payload "
                f"{rep['summed_bytes_per_token'] / 1024:.1f} KiB/token"
            )
    # An all_sum hands every rank the same bits, so the ranks agree exactly.
    np.testing.assert_array_equal(ranks[0][1], ranks[1][1])


@pytest.mark.skipif(shutil.which("mlx.launch") is None, reason="mlx.launch is not installed")
def test_two_rank_ds4_writes_each_line_once():
    """Every rank runs the same generation; only rank 0 reports it, so the launcher's terminal
    shows each line once (it showed every line once per rank)."""
    try:
        run = launch_local(
            2,
            "ds4mlx.cli.main",
            ["--distributed", "-m", str(TINY), "-p", "hello", "-n", "4"],
            LAUNCH_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"2 ranks did not finish in {LAUNCH_TIMEOUT_S}s")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stderr.splitlines()
    assert sum(line.startswith("ds4: loaded") for line in lines) == 1, run.stderr
    assert sum(line.startswith("ds4: prompt ") for line in lines) == 1, run.stderr
    assert sum("100.0%" in line for line in lines) == 1, run.stderr


def test_a_follower_rank_reports_only_its_errors(capsys):
    follower = Messages(rank=1)
    follower.info("ds4: loaded")
    follower.progress("loading 100.0%")
    follower.error("no such file")
    Messages().error("no such file")
    assert capsys.readouterr().err == "ds4: rank 1: error: no such file\nds4: error: no such file\n"


def test_a_rank_that_dies_stops_rank_0_with_a_message(tmp_path):
    """Started without mlx.launch (which would kill the survivors itself): the ring backend
    fails rank 0's next collective once rank 1's sockets close, and ds4 says so."""
    base = free_port_block(2)
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{base}"], [f"127.0.0.1:{base + 1}"]]))
    env = {**os.environ, "MLX_HOSTFILE": str(hostfile)}
    leaver = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("peer_that_leaves.py")), str(TINY)],
        env={**env, "MLX_RANK": "1"},
    )
    try:
        rank0 = subprocess.run(
            [
                sys.executable,
                "-c",
                "from ds4mlx.cli.main import main; raise SystemExit(main())",
                "--distributed",
                "-m",
                str(TINY),
                "-p",
                "hello",
                "-n",
                "8",
            ],
            env={**env, "MLX_RANK": "0"},
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        leaver.wait(timeout=60)
    assert rank0.returncode == 1
    assert "ds4: error: distributed run stopped on rank 0" in rank0.stderr
    assert "connection to a peer was lost" in rank0.stderr
    assert rank0.stdout == ""
