#!/usr/bin/env python3
"""Decode speed of 1 rank vs N ranks (mlx.launch, ring backend on loopback) and the collective
traffic per token, with a projection onto a two-machine link as a model, not a measurement.

Each configuration runs ``ds4mlx.diagnostics.distributed_probe`` (greedy decode, and DSpark with
``--drafter``). On one machine the ranks share its cores and talk over loopback TCP, so N ranks
are not expected to be faster; what carries over to two Macs is the traffic: per decode step
every layer ``all_sum``s two float32 partials (the attention output over the decode tile of
``DECODE_TILE`` rows, the routed experts' output over the real row), which the probe counts.
The projection is ``allsums * latency + wire_bytes / bandwidth`` per token, added to the
measured 1-rank compute time split N ways (an optimistic bound: it assumes the split compute
scales perfectly).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import ds4mlx  # noqa: F401  (preloads the BLAS before mlx.core)
from ds4mlx.distributed.launch import launch_local
from ds4mlx.gguf import open_gguf
from ds4mlx.models.deepseek4 import DECODE_TILE, ModelArgs

ASSETS = Path(__file__).resolve().parents[1] / "assets"


def run(n: int, args: argparse.Namespace, out: Path) -> dict:
    probe = ["--model", args.model, "-n", str(args.n_decode), "--out", str(out)]
    if args.drafter:
        probe += ["--drafter", args.drafter]
    result = launch_local(
        n,
        "ds4mlx.diagnostics.distributed_probe",
        probe + (["--single"] if n == 1 else []),
        args.timeout,
    )
    path = out / "rank0.json"
    if not path.is_file():
        raise SystemExit(f"{n} rank(s) failed (rc {result.returncode}):\n{result.stderr}")
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default=str(ASSETS / "ds4-tiny.gguf"))
    parser.add_argument(
        "--drafter",
        default=str(ASSETS / "ds4-tiny-dspark.gguf"),
        help="DSpark support GGUF ('' for none)",
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("-n", "--n-decode", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--link-gbit",
        type=float,
        default=40.0,
        help="modelled link bandwidth in Gbit/s (default 40: Thunderbolt 4)",
    )
    parser.add_argument(
        "--link-efficiency",
        type=float,
        default=0.5,
        help="share of the nominal bandwidth TCP over the link reaches",
    )
    parser.add_argument(
        "--latency-us",
        type=float,
        default=50.0,
        help="modelled latency of one small all_sum in microseconds",
    )
    args = parser.parse_args()

    margs = ModelArgs.from_gguf(open_gguf(args.model))
    with tempfile.TemporaryDirectory() as tmp:
        one = run(1, args, Path(tmp) / "one")
        many = run(args.ranks, args, Path(tmp) / "many")

    n = args.ranks
    payload = many["summed_bytes_per_token"]
    # The traffic this run should have: two all_sums per layer, [DECODE_TILE, D] and [1, D].
    expected = margs.num_layers * (DECODE_TILE + 1) * margs.hidden_size * 4
    wire = payload * 2 * (n - 1) / n  # a ring all-reduce sends this much per rank
    allsums = 2 * margs.num_layers
    bandwidth = args.link_gbit * 1e9 / 8 * args.link_efficiency
    comm_s = allsums * args.latency_us * 1e-6 + wire / bandwidth
    compute_s = 1.0 / one["greedy_decode_tps"] / n

    print(
        f"model {args.model}: {margs.num_layers} layers, d={margs.hidden_size}, "
        f"{margs.n_experts} experts; {args.n_decode} greedy tokens"
    )
    print("| ranks | greedy tok/s | DSpark tok/s | weights/rank MiB | peak RSS/rank MiB |")
    print("|---|---|---|---|---|")
    for ranks, rep in ((1, one), (n, many)):
        dspark = f"{rep['dspark_decode_tps']:.1f}" if "dspark_decode_tps" in rep else "-"
        print(
            f"| {ranks} | {rep['greedy_decode_tps']:.1f} | {dspark} | "
            f"{rep['weight_bytes'] / 2**20:.1f} | {rep['peak_rss_bytes'] / 2**20:.0f} |"
        )
    print(
        f"all_sum payload per decode token: {payload / 1024:.1f} KiB in {allsums} all_sums "
        f"(expected {expected / 1024:.1f} KiB); ring wire bytes per rank "
        f"{wire / 1024:.1f} KiB"
    )
    print(
        f"model of a {n}-machine link ({args.link_gbit:g} Gbit/s at "
        f"{args.link_efficiency:.0%}, {args.latency_us:g} us per all_sum): "
        f"{comm_s * 1e3:.2f} ms/token communication + {compute_s * 1e3:.2f} ms/token compute "
        f"(1-rank time / {n}) = {1 / (comm_s + compute_s):.1f} tok/s projected"
    )
    if "greedy" in one and one["greedy"] != many["greedy"]:
        raise SystemExit("error: the ranks' greedy output differs from one process")


if __name__ == "__main__":
    main()
