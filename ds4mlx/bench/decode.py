"""Target-only decode and prefill speed of ds4mlx and (when importable) llama.cpp on one GGUF.

Each engine gets one warm-up, then ``runs`` timed runs; the median with min..max is reported.
Prompts are synthetic token ids (every id valid for the vocabulary) so that the measured length
is exact at each context size. llama.cpp runs in a child process: an abort inside it
(``GGML_ASSERT``) must not end the benchmark.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ds4mlx.bench.llamacpp_peer import llamacpp_available
from ds4mlx.bench.samples import Samples
from ds4mlx.generation import generate

if TYPE_CHECKING:
    from ds4mlx.loader import LoadedModel

#: (prompt ids, tokens to decode) -> (prefill tokens/s, decode tokens/s)
Runner = Callable[[Sequence[int], int], tuple[float, float]]

PREFILL_CONTEXTS = (128, 512, 2048)


@dataclass
class DecodeResult:
    engine: str
    #: context length -> prefill tokens/s of a prompt that long
    prefill: dict[int, Samples]
    decode: Samples
    n_decode: int

    def as_json(self) -> dict:
        return {
            "engine": self.engine,
            "n_decode": self.n_decode,
            "prefill": {str(n): s.runs for n, s in self.prefill.items()},
            "decode": self.decode.runs,
        }


def synthetic_prompt(vocab_size: int, length: int) -> list[int]:
    """``length`` token ids spread over the vocabulary (a fixed, seed-free pattern)."""
    return [(i * 7919 + 13) % vocab_size for i in range(length)]


def ds4mlx_runner(model: LoadedModel) -> Runner:
    """Greedy generation as users get it (``engine.generate``: pipelined decoding, tokens
    sampled on the device); prefill time includes sampling the first token."""

    def run(prompt: Sequence[int], n_decode: int) -> tuple[float, float]:
        events = list(generate(model.new_session(), prompt, n_decode + 1))
        stats = events[-1].stats
        decode = n_decode / stats.decode_seconds if n_decode and stats.decode_seconds else 0.0
        return len(prompt) / stats.prefill_seconds, decode

    return run


def llamacpp_runner(path: str, n_ctx: int, threads: int) -> Runner:
    from ds4mlx.bench.llamacpp_peer import LlamaCppModel

    llm = LlamaCppModel(path, n_ctx=n_ctx, threads=threads)

    def run(prompt: Sequence[int], n_decode: int) -> tuple[float, float]:
        llm.reset()
        start = time.perf_counter()
        token = int(llm.eval(prompt, all_logits=False)[-1].argmax())
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(n_decode):
            token = int(llm.eval([token], all_logits=False)[-1].argmax())
        return len(prompt) / prefill, n_decode / max(time.perf_counter() - start, 1e-9)

    return run


def measure(
    run: Runner, vocab_size: int, contexts: Sequence[int], n_decode: int, runs: int, engine: str
) -> DecodeResult:
    """Prefill at each context length, and decode of ``n_decode`` tokens after the shortest
    prompt; one warm-up first (first-call allocations and graph caches)."""
    run(synthetic_prompt(vocab_size, 8), 4)
    prefill = {n: Samples() for n in contexts}
    decode = Samples()
    for _ in range(runs):
        for i, n in enumerate(sorted(contexts)):
            # Decode only after the shortest prompt: its speed barely depends on the context at
            # these sizes, and decoding after each would multiply the run time.
            p, d = run(synthetic_prompt(vocab_size, n), n_decode if i == 0 else 0)
            prefill[n].runs.append(p)
            if i == 0:
                decode.runs.append(d)
    return DecodeResult(engine, prefill, decode, n_decode)


def measure_ds4mlx(
    model: LoadedModel,
    contexts: Sequence[int] = PREFILL_CONTEXTS,
    n_decode: int = 64,
    runs: int = 3,
) -> DecodeResult:
    return measure(ds4mlx_runner(model), model.args.vocab_size, contexts, n_decode, runs, "ds4mlx")


def measure_llamacpp(
    path: str,
    vocab_size: int,
    contexts: Sequence[int] = PREFILL_CONTEXTS,
    n_decode: int = 64,
    runs: int = 3,
    threads: int = 2,
) -> DecodeResult | str:
    """llama.cpp's numbers, measured in a child process; a string says why there are none."""
    if not llamacpp_available():
        return "llama-cpp-python is not importable; install the 'bench' extra"
    request = json.dumps(
        {
            "path": path,
            "vocab": vocab_size,
            "contexts": list(contexts),
            "n_decode": n_decode,
            "runs": runs,
            "threads": threads,
        }
    )
    child = subprocess.run(
        [sys.executable, "-m", "ds4mlx.bench.decode", request], capture_output=True, text=True
    )
    if child.returncode != 0:
        reason = next(
            (
                line
                for line in child.stderr.splitlines()
                if "GGML_ASSERT" in line or "error" in line.lower()
            ),
            f"exit status {child.returncode}",
        )
        return f"llama.cpp failed on this model: {reason.strip()[-160:]}"
    data = json.loads(child.stdout.strip().splitlines()[-1])
    return DecodeResult(
        "llama.cpp (CPU)",
        {int(n): Samples(v) for n, v in data["prefill"].items()},
        Samples(data["decode"]),
        n_decode,
    )


def _llamacpp_child(request_json: str) -> None:
    request = json.loads(request_json)
    n_ctx = max(request["contexts"]) + request["n_decode"] + 16
    run = llamacpp_runner(request["path"], n_ctx, request["threads"])
    result = measure(
        run,
        request["vocab"],
        request["contexts"],
        request["n_decode"],
        request["runs"],
        "llama.cpp (CPU)",
    )
    print(json.dumps(result.as_json()))


def markdown_table(results: Sequence[DecodeResult]) -> str:
    contexts = sorted({n for r in results for n in r.prefill})
    header = "| engine | " + " | ".join(f"prefill {n} t/s" for n in contexts) + " | decode t/s |"
    lines = [header, "|---|" + "---:|" * (len(contexts) + 1)]
    for r in results:
        cells = [r.prefill[n].cell() if n in r.prefill else "-" for n in contexts]
        lines.append(f"| {r.engine} | " + " | ".join(cells) + f" | {r.decode.cell()} |")
    if len(results) == 2 and results[1].decode.median:
        ours, peer = results
        ratios = [
            f"prefill {n}: {ours.prefill[n].median / peer.prefill[n].median:.2f}x"
            for n in contexts
            if n in ours.prefill and n in peer.prefill and peer.prefill[n].median
        ]
        lines.append("")
        lines.append(
            f"ratio {ours.engine} / {peer.engine}: {', '.join(ratios)}, decode "
            f"{ours.decode.median / peer.decode.median:.2f}x"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # the llama.cpp child of measure_llamacpp
    _llamacpp_child(sys.argv[1])
