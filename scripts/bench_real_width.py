#!/usr/bin/env python3
"""ds4mlx next to llama.cpp at DeepSeek-V4-Flash's real widths, on the CPU, in one run.

The model is the 4-layer flash-shaped file (``scripts/make_flash_shaped.py FILE --layers 4``:
n_embd 4096, 256 experts of ffn 2048, IQ2_XXS gate/up, Q2_K down, Q8_0 dense and the
129,280-token head; ~9 GB apparent, sparse), made here unless ``-m`` names one. Engines, run
interleaved (each repetition runs every engine once, so a loaded machine slows all alike), each
run in its own process so that its peak RSS is its own:

- llama.cpp through llama-cpp-python (the ``bench`` extra), ``use_extra_bufts=False`` (no CPU
  repacking, which aborts on some CPUs for these types), one and two threads;
- ds4mlx with resident experts, and streamed through a cache of half the experts' bytes.

Each run loads the model, prefills ``--prompt`` tokens and decodes ``-n`` more, greedily; it
reports load seconds, prefill tokens/s, decode seconds per token, CPU seconds per decoded
token (user + system of the whole process, all threads) and peak RSS. The table shows the
median of ``--runs`` and the ratios; ``--json`` prints one object instead.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
ENGINES = ("llama.cpp -t 1", "llama.cpp -t 2", "ds4mlx resident", "ds4mlx streamed 50%")
METRICS = ("load_s", "prefill_tps", "decode_s_per_token", "cpu_s_per_token", "peak_rss_gb")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux: KiB


def prompt_tokens(vocab_size: int, length: int) -> list[int]:
    from ds4mlx.bench.decode import synthetic_prompt

    return synthetic_prompt(vocab_size, length)


def run_llamacpp(path: str, threads: int, prompt: int, n_decode: int) -> dict[str, float]:
    from ds4mlx.bench.llamacpp_peer import LlamaCppModel

    start = time.perf_counter()
    llm = LlamaCppModel(path, n_ctx=prompt + n_decode + 16, threads=threads)
    load = time.perf_counter() - start
    start = time.perf_counter()
    token = int(llm.eval(prompt_tokens(llm.n_vocab, prompt), all_logits=False)[-1].argmax())
    prefill = time.perf_counter() - start
    cpu, start = cpu_seconds(), time.perf_counter()
    for _ in range(n_decode):
        token = int(llm.eval([token], all_logits=False)[-1].argmax())
    decode, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    return _result(load, prompt / prefill, decode / n_decode, cpu / n_decode)


def run_ds4mlx(path: str, streamed: bool, prompt: int, n_decode: int) -> dict[str, float]:
    import ds4mlx
    from ds4mlx.experts import ExpertOptions
    from ds4mlx.generation import generate
    from ds4mlx.gguf import open_gguf

    experts = None
    if streamed:
        tensors = open_gguf(path).layout.tensors
        expert_bytes = sum(info.nbytes for name, info in tensors.items() if "_exps." in name)
        experts = ExpertOptions(stream=True, cache_gib=expert_bytes / 2 / 2**30)
    start = time.perf_counter()
    model = ds4mlx.load_model(path, experts=experts)
    load = time.perf_counter() - start
    print(f"ds4mlx loaded in {load:.1f} s", file=sys.stderr)
    tokens = prompt_tokens(model.args.vocab_size, prompt)
    start, cpu_at_first, first = time.perf_counter(), 0.0, None
    for event in generate(model.new_session(), tokens, n_decode + 1):  # noqa: B007
        if first is None:  # the first token ends the prefill; the decode starts here
            first, cpu_at_first = time.perf_counter(), cpu_seconds()
    cpu = cpu_seconds() - cpu_at_first
    stats = event.stats  # the last event is generation's summary
    model.close()
    return _result(
        load, prompt / stats.prefill_seconds, stats.decode_seconds / n_decode, cpu / n_decode
    )


def _result(load: float, prefill_tps: float, decode: float, cpu: float) -> dict[str, float]:
    return {
        "load_s": load,
        "prefill_tps": prefill_tps,
        "decode_s_per_token": decode,
        "cpu_s_per_token": cpu,
        "peak_rss_gb": peak_rss_gb(),
    }


def child(engine: str, path: str, prompt: int, n_decode: int) -> None:
    """One engine's run, in this process; prints its result as one JSON line."""
    if engine.startswith("llama.cpp"):
        result = run_llamacpp(path, int(engine.rsplit(" ", 1)[1]), prompt, n_decode)
    else:
        result = run_ds4mlx(path, "streamed" in engine, prompt, n_decode)
    print(json.dumps(result))


def measure(engine: str, path: str, prompt: int, n_decode: int) -> dict[str, float] | str:
    """One run of ``engine`` in a child process: its result, or why there is none."""
    command = [sys.executable, __file__, "--child", engine, "-m", path]
    command += ["--prompt", str(prompt), "-n", str(n_decode)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()] or ["no output"]
        return f"exit status {done.returncode}: {lines[-1].strip()[-200:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def llamacpp_available() -> bool:
    from ds4mlx.bench.llamacpp_peer import llamacpp_available as available

    return available()


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {m: statistics.median(r[m] for r in runs) for m in METRICS}


def ratios(table: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """The acceptance ratios (None where an engine has no result)."""
    peer, ours = table.get("llama.cpp -t 1"), table.get("ds4mlx resident")
    streamed = table.get("ds4mlx streamed 50%")

    def ratio(a: dict | None, b: dict | None, metric: str) -> float | None:
        return None if a is None or b is None else a[metric] / b[metric]

    return {
        "decode_cpu_ratio": ratio(ours, peer, "cpu_s_per_token"),
        "prefill_ratio": ratio(ours, peer, "prefill_tps"),
        "rss_ratio": ratio(ours, peer, "peak_rss_gb"),
        "load_s": None if ours is None else ours["load_s"],
        "streamed_over_resident": ratio(streamed, ours, "decode_s_per_token"),
    }


def markdown(table: dict[str, dict[str, float]], failed: dict[str, str]) -> str:
    lines = [
        "| run | load s | prefill t/s | decode s/token | CPU s/token | peak RSS GB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for engine in ENGINES:
        if engine in table:
            r = table[engine]
            lines.append(
                f"| {engine} | {r['load_s']:.1f} | {r['prefill_tps']:.2f} | "
                f"{r['decode_s_per_token']:.3f} | {r['cpu_s_per_token']:.3f} | "
                f"{r['peak_rss_gb']:.2f} |"
            )
        elif engine in failed:
            lines.append(f"| {engine} | ({failed[engine]}) | | | | |")
    return "\n".join(lines)


def model_path(args: argparse.Namespace, workdir: Path) -> str:
    if args.model:
        return args.model
    path = workdir / "flash4.gguf"
    command = [sys.executable, str(SCRIPTS / "make_flash_shaped.py"), str(path), "--layers", "4"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", help="a flash-shaped GGUF (default: make one)")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    parser.add_argument("-n", "--n-decode", type=int, default=4, help="decoded tokens (4)")
    parser.add_argument("--runs", type=int, default=3, help="repetitions, median (3)")
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        # argparse formats help with %: an engine's "50%" must be written "50%%".
        help="comma-separated subset of: " + ", ".join(ENGINES).replace("%", "%%"),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prompt < 1 or args.n_decode < 1 or args.runs < 1:
        parser.error("--prompt, -n and --runs must be positive")
    if args.child:
        child(args.child, args.model, args.prompt, args.n_decode)
        return
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"unknown engines {unknown}; choose from {', '.join(ENGINES)}")
    failed: dict[str, str] = {}
    if not llamacpp_available():
        for engine in engines:
            if engine.startswith("llama.cpp"):
                failed[engine] = "llama-cpp-python not importable: install the bench extra"
        engines = [e for e in engines if e not in failed]
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as workdir:
        path = model_path(args, Path(workdir))
        runs: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
        for _ in range(args.runs):
            for engine in engines:
                if engine in failed:
                    continue
                result = measure(engine, path, args.prompt, args.n_decode)
                if isinstance(result, str):
                    failed[engine] = result
                else:
                    runs[engine].append(result)
    table = {e: medians(r) for e, r in runs.items() if r and e not in failed}
    if args.json:
        print(json.dumps({"engines": table, "failed": failed, **ratios(table)}))
        return
    print(
        f"model: {args.model or 'flash-shaped, 4 layers'}; prompt {args.prompt}, decode "
        f"{args.n_decode}; median of {args.runs}\n"
    )
    print(markdown(table, failed))
    print()
    for name, value in ratios(table).items():
        print(f"{name}: {'n/a' if value is None else f'{value:.3g}'}")


if __name__ == "__main__":
    main()
