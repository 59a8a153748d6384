#!/usr/bin/env python3
"""Time to first token of a repeated long prompt on ds4-server with its prompt cache:

* cold: the first request of a fresh server over an empty ``--kv-disk-dir``;
* warm from memory: the same prompt again after another long prompt has taken the server's
  one session, so the state comes from the in-memory prompt cache, not from the session;
* warm from disk: the same prompt on a new server process over the same ``--kv-disk-dir``
  (a restart), whose memory holds nothing yet.

Each row reports the median of ``--repeats`` measurements (a new folder and new servers each
time), the prompt tokens and the cached tokens the server reports. Greedy raw completions; the
generated texts of the three rows are compared (a restored state must give the cold answer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ds4mlx.bench.machine import machine_description
from ds4mlx.bench.server import server_process
from ds4mlx.cli.options import DEFAULT_MODEL

import httpx

SENTENCE = (
    "The {i}th reader of the build log found that the compiler had warned about "
    "an unused variable in module {i} and fixed it before the release. "
)


@dataclass(frozen=True)
class Measure:
    first_token: float  # seconds from sending the request to the first streamed text
    prompt_tokens: int
    cached_tokens: int
    text: str


def long_prompt(tag: str, tokens: int, client: httpx.Client, url: str) -> str:
    """A prompt of about ``tokens`` tokens (counted by the server's tokenizer)."""
    text = f"{tag}\n"
    i = 0
    while True:
        chunk = "".join(SENTENCE.format(i=i + k) for k in range(20))
        count = len(client.post(f"{url}/tokenize", json={"content": text + chunk}).json()["tokens"])
        if count > tokens:
            return text
        text += chunk
        i += 20


def complete(client: httpx.Client, url: str, prompt: str, max_tokens: int) -> Measure:
    body = {
        "model": "default",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    text, usage = "", {}
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                if choice.get("text") and first is None:
                    first = time.perf_counter() - start
                text += choice.get("text") or ""
            usage = chunk.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return Measure(
        first if first is not None else time.perf_counter() - start,
        usage.get("prompt_tokens", 0),
        cached,
        text,
    )


def one_round(model: str, tokens: int, max_tokens: int, flags: list[str]) -> dict[str, Measure]:
    with tempfile.TemporaryDirectory(prefix="kv-bench-") as folder:
        server_flags = [*flags, "--kv-disk-dir", folder]
        with httpx.Client(timeout=3600) as client:
            with server_process(model, server_flags) as url:
                prompt = long_prompt("Report A.", tokens, client, url)
                other = long_prompt("Report B, another one.", tokens, client, url)
                cold = complete(client, url, prompt, max_tokens)
                complete(client, url, other, max_tokens)  # takes the one session
                memory = complete(client, url, prompt, max_tokens)
            files = sorted(Path(folder).glob("kv-*.safetensors"))
            with server_process(model, server_flags) as url:
                disk = complete(client, url, prompt, max_tokens)
        sizes = ", ".join(f"{f.stat().st_size / 2**20:.1f}" for f in files)
        print(f"snapshot files before the restart: {len(files)} ({sizes} MiB)")
        return {"cold": cold, "warm, from memory": memory, "warm, from disk after a restart": disk}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-m", "--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--tokens", type=int, default=4096, help="prompt length (default 4096)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("flags", nargs="*", help="more ds4-server flags (after --)")
    args = parser.parse_args()
    flags = ["-c", str(args.ctx), "--temp", "0", *args.flags]
    print(f"machine: {machine_description()}")
    print(
        f"model: {Path(args.model).name}; a {args.tokens}-token prompt, {args.max_tokens} "
        f"tokens generated, median of {args.repeats} rounds; ds4-server {' '.join(flags)}"
    )
    rounds = [
        one_round(args.model, args.tokens, args.max_tokens, flags) for _ in range(args.repeats)
    ]
    print("| case | time to first token (s) | prompt tokens | cached tokens |")
    print("|---|---|---|---|")
    for case in rounds[0]:
        measures = [r[case] for r in rounds]
        print(
            f"| {case} | {statistics.median(m.first_token for m in measures):.3f} | "
            f"{measures[0].prompt_tokens} | {measures[0].cached_tokens} |"
        )
    texts = {m.text for r in rounds for m in r.values()}
    print(f"generated texts: {'all equal' if len(texts) == 1 else f'{len(texts)} different'}")


if __name__ == "__main__":
    main()
