#!/usr/bin/env python3
"""Decode and prefill speed of ds4mlx next to llama.cpp's CPU build on the same GGUF, in one run.

llama.cpp is measured through ``llama-cpp-python`` (``pip install -e '.[bench]'``) when importable.
Each side: one warm-up, then the median (min..max) of ``--runs`` runs. Prints a Markdown table and
the ds4mlx / llama.cpp ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import mlx.core as mx

import ds4mlx  # noqa: F401  (preloads the BLAS before mlx.core)


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
    try:
        import llama_cpp
    except ImportError:
        return None
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_batch=n_ctx,
                          logits_all=False, verbose=False)

    def run(prompt: list[int], n_decode: int) -> tuple[float, float]:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        prefill = time.perf_counter() - start
        token = int(llm.scores[llm.n_tokens - 1].argmax())
        start = time.perf_counter()
        for _ in range(n_decode):
            llm.eval([token])
            token = int(llm.scores[llm.n_tokens - 1].argmax())
        return len(prompt) / prefill, n_decode / (time.perf_counter() - start)

    return run


def measure(run, prompt: list[int], n_decode: int, runs: int) -> tuple[list[float], list[float]]:
    run(prompt[:8], 4)  # warm-up: first-call allocations and graph caches
    results = [run(prompt, n_decode) for _ in range(runs)]
    return [r[0] for r in results], [r[1] for r in results]


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.1f}..{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("-n", "--n-decode", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--weights-dtype", default="auto", choices=("auto", "f32", "native"))
    args = parser.parse_args()

    model = ds4mlx.load_model(args.model, weights_dtype=args.weights_dtype)
    ours = ds4mlx_runner(model)
    vocab = model.args.vocab_size
    prompt = [(i * 7919 + 13) % vocab for i in range(args.prompt_tokens)]
    n_ctx = args.prompt_tokens + args.n_decode + 16

    print(f"machine: {platform.machine()} {platform.system()}, {os.cpu_count()} cores, "
          f"mlx {mx.__version__} ({mx.default_device()}), BLAS {ds4mlx._blas.loaded_blas}")
    print(f"model: {args.model}; prompt {args.prompt_tokens} tokens, decode {args.n_decode} "
          f"tokens, median of {args.runs} (min..max)\n")
    rows = [("ds4mlx", measure(ours, prompt, args.n_decode, args.runs))]
    peer = llamacpp_runner(args.model, n_ctx, args.threads)
    if peer is None:
        print("(llama-cpp-python is not importable: install the 'bench' extra for the peer)\n")
    else:
        rows.append(("llama.cpp (CPU)", measure(peer, prompt, args.n_decode, args.runs)))

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
