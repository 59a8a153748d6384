#!/usr/bin/env python3
"""ds4-server under concurrent load, with and without ``--batched-session``, in one run.

For each setting the script starts ``ds4-server`` on a free loopback port with the given model
(default: the shipped tiny model), fires ``--requests`` streamed completions at once, and
reports requests/s, generated tokens/s, and the p50/p99 of the request latency and of the time
to the first token. Greedy decoding, distinct prompts, the same requests for every setting; the
generated texts are compared across settings (batched decoding is exact, so they must agree).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from ds4mlx.bench.machine import machine_description
from ds4mlx.bench.server import server_process
from ds4mlx.cli.options import DEFAULT_MODEL

import httpx

MODEL_ID = "bench"
PROMPTS = ["def add_{index}(a, b):\n", "import os\n\n\ndef list_files_{index}(path):\n",
           "class Stack{index}:\n    def __init__(self):\n",
           "# Read the file and count its lines ({index})\n", "for i in range({index}):\n"]


@dataclass(frozen=True)
class Outcome:
    latency: float  # seconds from sending the request to the end of its stream
    first_token: float  # seconds from sending it to the first generated text
    tokens: int
    text: str


@dataclass(frozen=True)
class Run:
    sessions: int
    wall: float
    outcomes: list[Outcome]

    def row(self) -> list[str]:
        latencies = [o.latency for o in self.outcomes]
        firsts = [o.first_token for o in self.outcomes]
        tokens = sum(o.tokens for o in self.outcomes)
        return [f"--batched-session {self.sessions}", f"{len(self.outcomes) / self.wall:.2f}",
                f"{tokens / self.wall:.1f}", f"{percentile(latencies, 50):.2f}",
                f"{percentile(latencies, 99):.2f}", f"{percentile(firsts, 50):.2f}",
                f"{percentile(firsts, 99):.2f}"]


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile, interpolated linearly between the closest ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def one_request(client: httpx.AsyncClient, url: str, index: int,
                      max_tokens: int) -> Outcome:
    # Raw completions: the tiny model answers chat prompts with tool-call markup, which arrives
    # only once complete, while raw code prompts stream text token by token.
    body = {"model": MODEL_ID, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True},
            "prompt": PROMPTS[index % len(PROMPTS)].format(index=index)}
    start = time.perf_counter()
    first, tokens, text = None, 0, ""
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk["choices"]:
                if choice["text"] and first is None:
                    first = time.perf_counter() - start
                text += choice["text"]
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - start
    return Outcome(latency, latency if first is None else first, tokens, text)


async def load(url: str, n_requests: int, max_tokens: int) -> tuple[float, list[Outcome]]:
    limits = httpx.Limits(max_connections=n_requests + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        await one_request(client, url, n_requests, 4)  # warm-up, outside the measurement
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(one_request(client, url, i, max_tokens)
                                          for i in range(n_requests)))
        return time.perf_counter() - start, list(outcomes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests (M)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batched-session", type=int, default=4, metavar="N",
                        help="the batched setting measured next to --batched-session 1")
    parser.add_argument("-c", "--ctx", type=int, default=1024)
    parser.add_argument("server_flags", nargs="*",
                        help="more ds4-server flags for both settings (after --)")
    args = parser.parse_args()
    if args.requests < 1 or args.max_tokens < 1 or args.batched_session < 2:
        parser.error("--requests and --max-tokens must be positive, --batched-session >= 2")

    print(f"machine: {machine_description()}")
    print(f"model: {Path(args.model).name}; {args.requests} concurrent streamed requests, "
          f"max_tokens {args.max_tokens}, greedy\n")
    runs = []
    for sessions in (1, args.batched_session):
        flags = ["--alias", MODEL_ID, "-c", str(args.ctx), "--batched-session", str(sessions),
                 *args.server_flags]
        with server_process(args.model, flags) as url:
            wall, outcomes = asyncio.run(load(url, args.requests, args.max_tokens))
            runs.append(Run(sessions, wall, outcomes))

    header = ["setting", "req/s", "tok/s", "p50 latency s", "p99 latency s", "p50 TTFT s",
              "p99 TTFT s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for run in runs:
        print("| " + " | ".join(run.row()) + " |")
    texts = [[o.text for o in run.outcomes] for run in runs]
    same = sum(a == b for a, b in zip(texts[0], texts[1], strict=True))
    print(f"\n{same}/{args.requests} outputs identical across settings; "
          f"speed-up {runs[0].wall / runs[1].wall:.2f}x in wall time")


if __name__ == "__main__":
    main()
