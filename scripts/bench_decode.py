#!/usr/bin/env python3
"""Decode and prefill speed of ds4mlx next to llama.cpp's CPU build on the same GGUF, in one run.

llama.cpp is measured through ``llama-cpp-python`` (``pip install -e '.[bench]'``) when importable.
Each side: one warm-up, then the median (min..max) of ``--runs`` runs. Prints a Markdown table and
the ds4mlx / llama.cpp ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import ds4mlx  # noqa: F401  (preloads the BLAS before mlx.core)
from ds4mlx.bench.llamacpp_peer import llamacpp_available
from ds4mlx.bench.machine import machine_description

import mlx.core as mx


def ds4mlx_runner(model):
    def run(prompt: list[int], n_decode: int) -> tuple[float, float]:
        session = model.new_session()
        start = time.perf_counter()
        token = int(mx.argmax(session.feed_mx(prompt)[-1]))
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(n_decode):
            token = int(mx.argmax(session.feed_mx([token])[-1]))
        return len(prompt) / prefill, n_decode / (time.perf_counter() - start)

    return run


def llamacpp_runner(path: str, n_ctx: int, threads: int):
    from ds4mlx.bench.llamacpp_peer import LlamaCppModel

    llm = LlamaCppModel(path, n_ctx=n_ctx, threads=threads)

    def run(prompt: list[int], n_decode: int) -> tuple[float, float]:
        llm.reset()
        start = time.perf_counter()
        token = int(llm.eval(prompt, all_logits=False)[-1].argmax())
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(n_decode):
            token = int(llm.eval([token], all_logits=False)[-1].argmax())
        return len(prompt) / prefill, n_decode / (time.perf_counter() - start)

    return run


def measure_llamacpp_in_child(args, prompt: list[int], n_ctx: int):
    """llama.cpp runs in a child process: an abort inside it (GGML_ASSERT) must not end the bench.

    Returns (prefill, decode) lists, or a string saying why there is no measurement.
    """
    if not llamacpp_available():
        return "llama-cpp-python is not importable; install the 'bench' extra"
    request = json.dumps({"model": args.model, "n_ctx": n_ctx, "threads": args.threads,
                          "prompt": prompt, "n_decode": args.n_decode, "runs": args.runs})
    child = subprocess.run([sys.executable, __file__, "--llamacpp-child", request],
                           capture_output=True, text=True)
    if child.returncode != 0:
        reason = next((line for line in child.stderr.splitlines() if "GGML_ASSERT" in line
                       or "error" in line.lower()), f"exit status {child.returncode}")
        return f"llama.cpp failed on this model: {reason.strip()[-160:]}"
    return tuple(json.loads(child.stdout.strip().splitlines()[-1]))


def llamacpp_child(request_json: str) -> None:
    request = json.loads(request_json)
    run = llamacpp_runner(request["model"], request["n_ctx"], request["threads"])
    print(json.dumps(measure(run, request["prompt"], request["n_decode"], request["runs"])))


def measure(run, prompt: list[int], n_decode: int, runs: int) -> tuple[list[float], list[float]]:
    run(prompt[:8], 4)  # warm-up: first-call allocations and graph caches
    results = [run(prompt, n_decode) for _ in range(runs)]
    return [r[0] for r in results], [r[1] for r in results]


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}..{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("-n", "--n-decode", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--weights-dtype", default="auto", choices=("auto", "f32", "native"))
    parser.add_argument("--llamacpp-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llamacpp_child:
        llamacpp_child(args.llamacpp_child)
        return

    if not args.model:
        parser.error("-m/--model is required")
    model = ds4mlx.load_model(args.model, weights_dtype=args.weights_dtype)
    ours = ds4mlx_runner(model)
    vocab = model.args.vocab_size
    prompt = [(i * 7919 + 13) % vocab for i in range(args.prompt_tokens)]
    n_ctx = args.prompt_tokens + args.n_decode + 16

    print(f"machine: {machine_description()}")
    print(f"model: {args.model}; prompt {args.prompt_tokens} tokens, decode {args.n_decode} "
          f"tokens, median of {args.runs} (min..max)\n")
    rows = [("ds4mlx", measure(ours, prompt, args.n_decode, args.runs))]
    peer = measure_llamacpp_in_child(args, prompt, n_ctx)
    if isinstance(peer, str):
        print(f"(llama.cpp peer not measured: {peer})\n")
    else:
        rows.append(("llama.cpp (CPU)", peer))

    print("| engine | prefill t/s | decode t/s |")
    print("| --- | --- | --- |")
    for name, (prefill, decode) in rows:
        print(f"| {name} | {fmt(prefill)} | {fmt(decode)} |")
    if len(rows) == 2:
        (_, (p0, d0)), (_, (p1, d1)) = rows
        prefill_ratio = statistics.median(p0) / statistics.median(p1)
        decode_ratio = statistics.median(d0) / statistics.median(d1)
        print(f"\nratio ds4mlx / llama.cpp: prefill {prefill_ratio:.2f}x, "
              f"decode {decode_ratio:.2f}x")


if __name__ == "__main__":
    main()
