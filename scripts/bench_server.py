#!/usr/bin/env python3
"""ds4-server under concurrent load, with and without ``--batched-session``, and under hostile
bodies, in one run.

Load: for each setting the script starts ``ds4-server`` on a free loopback port with the given
model (default: the shipped tiny model), fires ``--requests`` streamed completions at once, and
reports requests/s, generated tokens/s, and the p50/p99 of the request latency and of the time
to the first token; on the unbatched server the same requests also run one after another, the
baseline concurrency must not lose to. Greedy decoding, distinct prompts, the same requests for
every setting; the generated texts are compared across settings (batched decoding is exact, so
they must agree).

New sampling parameters: ten streamed requests in a row, each with a temperature and top-p of its
own; the time to the first token of each, which after the first must stay under half a second
(a new value must not compile anything: issue 36).

Hostile bodies: a 12 MB chat request (time to its 400, and the slowest ``/health`` answered
while it is sent and refused), then the server's resident memory before and after ten refused
24 MB bodies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ds4mlx.bench.machine import machine_description
from ds4mlx.bench.server import server_process
from ds4mlx.cli.options import DEFAULT_MODEL

import httpx

MODEL_ID = "bench"
PROMPTS = [
    "def add_{index}(a, b):\n",
    "import os\n\n\ndef list_files_{index}(path):\n",
    "class Stack{index}:\n    def __init__(self):\n",
    "# Read the file and count its lines ({index})\n",
    "for i in range({index}):\n",
]


@dataclass(frozen=True)
class Outcome:
    latency: float  # seconds from sending the request to the end of its stream
    first_token: float  # seconds from sending it to the first generated text
    tokens: int
    text: str


@dataclass(frozen=True)
class Run:
    setting: str
    wall: float
    outcomes: list[Outcome]

    def row(self) -> list[str]:
        latencies = [o.latency for o in self.outcomes]
        firsts = [o.first_token for o in self.outcomes]
        tokens = sum(o.tokens for o in self.outcomes)
        return [
            self.setting,
            f"{self.wall:.1f}",
            f"{len(self.outcomes) / self.wall:.2f}",
            f"{tokens / self.wall:.1f}",
            f"{percentile(latencies, 50):.2f}",
            f"{percentile(latencies, 99):.2f}",
            f"{percentile(firsts, 50):.2f}",
            f"{percentile(firsts, 99):.2f}",
        ]


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile, interpolated linearly between the closest ranks."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def one_request(
    client: httpx.AsyncClient, url: str, index: int, max_tokens: int, **sampling: float
) -> Outcome:
    # Raw completions: the tiny model answers chat prompts with tool-call markup, which arrives
    # only once complete, while raw code prompts stream text token by token.
    body = {
        "model": MODEL_ID,
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
        "prompt": PROMPTS[index % len(PROMPTS)].format(index=index),
        **sampling,
    }
    start = time.perf_counter()
    first, tokens, text = None, 0, ""
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk["choices"]:
                if choice["text"] and first is None:
                    first = time.perf_counter() - start
                text += choice["text"]
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - start
    return Outcome(latency, latency if first is None else first, tokens, text)


async def load(
    url: str, n_requests: int, max_tokens: int, concurrent: bool = True
) -> tuple[float, list[Outcome]]:
    limits = httpx.Limits(max_connections=n_requests + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        await one_request(client, url, n_requests, 4)  # warm-up, outside the measurement
        start = time.perf_counter()
        if concurrent:
            outcomes = list(
                await asyncio.gather(
                    *(one_request(client, url, i, max_tokens) for i in range(n_requests))
                )
            )
        else:
            outcomes = [await one_request(client, url, i, max_tokens) for i in range(n_requests)]
        return time.perf_counter() - start, outcomes


async def new_temperatures(url: str, max_tokens: int) -> list[tuple[float, float, float]]:
    """(temperature, top_p, seconds to the first token) of ten requests in a row on one prompt,
    each with values never asked for before."""
    async with httpx.AsyncClient(timeout=None) as client:
        await one_request(client, url, 0, 4)  # the prompt's prefill, outside the measurement
        rows = []
        for i in range(10):
            temperature, top_p = 0.7 + 0.01 * i, 0.95 - 0.005 * i
            outcome = await one_request(
                client, url, 0, max_tokens, temperature=temperature, top_p=top_p
            )
            rows.append((temperature, top_p, outcome.first_token))
        return rows


def sampling_parameters(url: str, max_tokens: int) -> None:
    rows = asyncio.run(new_temperatures(url, max_tokens))
    for temperature, top_p, first in rows:
        print(f"temperature {temperature:.2f} top_p {top_p:.3f}: first token in {first:.3f} s")
    slowest = max(first for _, _, first in rows[1:])
    verdict = "met" if slowest < 0.5 else "NOT met"
    print(
        f"slowest time to first token after the first: {slowest:.3f} s (first {rows[0][2]:.3f} "
        f"s; target < 0.5 s: {verdict})"
    )


def server_rss_mib(url: str) -> float:
    """Resident memory of the ds4-server process listening on ``url``'s port (Linux /proc)."""
    flag = ["--port", str(urlsplit(url).port)]
    for process in Path("/proc").iterdir():
        try:
            argv = (process / "cmdline").read_bytes().decode().split("\0")
            status = (process / "status").read_text()
        except OSError:
            continue
        if "ds4mlx.cli.server" in argv and any(
            argv[i : i + 2] == flag for i in range(len(argv) - 1)
        ):
            kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
            return int(kib) / 1024
    raise RuntimeError(f"no ds4-server process for {url}")


def chat_body(content_bytes: int) -> bytes:
    content = "hello world " * (content_bytes // 12)
    return json.dumps(
        {"model": MODEL_ID, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    ).encode()


async def refused_body(url: str, body: bytes) -> tuple[int, float, float]:
    """(status, seconds to the answer, slowest /health answered meanwhile)."""
    async with httpx.AsyncClient(timeout=None) as client:
        health: list[float] = []
        done = asyncio.Event()

        async def probe() -> None:
            while not done.is_set():
                started = time.perf_counter()
                await client.get(f"{url}/health")
                health.append(time.perf_counter() - started)
                await asyncio.sleep(0.02)

        prober = asyncio.create_task(probe())
        started = time.perf_counter()
        response = await client.post(
            f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        seconds = time.perf_counter() - started
        done.set()
        await prober
        return response.status_code, seconds, max(health, default=0.0)


def hostile(url: str) -> None:
    status, seconds, health = asyncio.run(refused_body(url, chat_body(12 * 2**20)))
    print(
        f"12 MB chat body: {status} in {seconds:.2f} s; slowest /health meanwhile "
        f"{health * 1000:.0f} ms"
    )
    before = server_rss_mib(url)
    big = chat_body(24 * 2**20)
    statuses = [asyncio.run(refused_body(url, big))[0] for _ in range(10)]
    after = server_rss_mib(url)
    print(
        f"ten 24 MB chat bodies: statuses {sorted(set(statuses))}; server RSS "
        f"{before:.0f} MiB before, {after:.0f} MiB after ({after - before:+.0f} MiB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-m", "--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--requests", type=int, default=50, help="concurrent requests (M)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--batched-session",
        type=int,
        default=8,
        metavar="N",
        help="the batched setting measured next to --batched-session 1",
    )
    parser.add_argument("-c", "--ctx", type=int, default=1024)
    parser.add_argument(
        "--sampling-only",
        action="store_true",
        help="only the new-sampling-parameters benchmark (one server, seconds)",
    )
    parser.add_argument(
        "server_flags", nargs="*", help="more ds4-server flags for both settings (after --)"
    )
    args = parser.parse_args()
    if args.requests < 1 or args.max_tokens < 1 or args.batched_session < 2:
        parser.error("--requests and --max-tokens must be positive, --batched-session >= 2")

    print(f"machine: {machine_description()}")
    print(
        f"model: {Path(args.model).name}; {args.requests} streamed requests, "
        f"max_tokens {args.max_tokens}, greedy\n"
    )
    if args.sampling_only:
        with server_process(args.model, ["--alias", MODEL_ID, "-c", str(args.ctx)]) as url:
            sampling_parameters(url, args.max_tokens)
        return
    runs = []
    for sessions in (1, args.batched_session):
        flags = [
            "--alias",
            MODEL_ID,
            "-c",
            str(args.ctx),
            "--batched-session",
            str(sessions),
            *args.server_flags,
        ]
        with server_process(args.model, flags) as url:
            if sessions == 1:
                sampling_parameters(url, args.max_tokens)
                print()
                hostile(url)
                print()
                wall, outcomes = asyncio.run(
                    load(url, args.requests, args.max_tokens, concurrent=False)
                )
                runs.append(Run("--batched-session 1, one after another", wall, outcomes))
            wall, outcomes = asyncio.run(load(url, args.requests, args.max_tokens))
            runs.append(Run(f"--batched-session {sessions}, all at once", wall, outcomes))

    header = [
        "setting",
        "wall s",
        "req/s",
        "tok/s",
        "p50 latency s",
        "p99 latency s",
        "p50 TTFT s",
        "p99 TTFT s",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for run in runs:
        print("| " + " | ".join(run.row()) + " |")
    texts = [[o.text for o in run.outcomes] for run in runs]
    same = sum(len({run[i] for run in texts}) == 1 for i in range(args.requests))
    print(
        f"\n{same}/{args.requests} outputs identical across settings; batched speed-up "
        f"{runs[1].wall / runs[2].wall:.2f}x in wall time over the unbatched concurrent run"
    )


if __name__ == "__main__":
    main()
