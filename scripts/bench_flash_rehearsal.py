#!/usr/bin/env python3
"""The real-scale rehearsal: a DeepSeek-V4-Flash-sized GGUF (``make_flash_shaped.py``) loaded
with streamed experts and native weights, a prompt prefilled and a few tokens decoded greedily.

Prints, side by side with the memory plan (``ds4 plan``): load time, RSS after load and peak RSS
(VmHWM) against the bound "dense weights + expert cache + 10%", time to first token, seconds per
decoded token, expert bytes read and hit rate per decoded token, the primitives one decode step
runs at full depth, and the process's file reads (/proc/self/io) against the file's size.

    python scripts/bench_flash_rehearsal.py -m /work/flash/ds4-flash-shaped.gguf --expert-cache 4

``rchar`` counts every byte read() returned, holes of a sparse file included; ``read_bytes``
counts what came from the block device, which is nothing for holes and so says little with a
sparse file: both are printed, and pages touched through the memory map (the dense weights)
are counted by the loader (``dense bytes converted``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import ds4mlx  # noqa: F401  (first: preloads BLAS before anything imports mlx.core)
from ds4mlx.cli.plan import describe
from ds4mlx.diagnostics.graph import primitive_names
from ds4mlx.experts import ExpertOptions, StreamedStore
from ds4mlx.experts import streamed as streamed_store
from ds4mlx.gguf import GGUFFile
from ds4mlx.load_plan import plan_memory
from ds4mlx.loader import load_model
from ds4mlx.memory import format_size

import mlx.core as mx
import numpy as np


def proc_io() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        key, value = line.split(":")
        fields[key] = int(value)
    return fields


def proc_status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def progress(message: str) -> None:
    print(f"[rehearsal] {message}", file=sys.stderr, flush=True)


class PrimitiveCounter:
    """Counts the primitives one step runs, although the streamed store evaluates the routing of
    each MoE layer in the middle of it: the graph pending at each such point (and at every other
    evaluation) is counted just before it runs, so each primitive is counted once. Expert writes
    into the cache slab are counted apart."""

    def __init__(self) -> None:
        self.names: Counter[str] = Counter()  # the model's primitives, by name
        self.slab_writes = 0
        self._in_write = False

    @property
    def model(self) -> int:
        return self.names.total()

    def __enter__(self) -> PrimitiveCounter:
        self._eval, self._async_eval = mx.eval, mx.async_eval
        self._batches = StreamedStore._batches
        self._write = streamed_store._Slab.write
        counter = self

        def counting(real):
            def evaluate(*arrays):
                names = primitive_names(*_flatten(arrays))
                if counter._in_write:
                    counter.slab_writes += len(names)
                else:
                    counter.names.update(names)
                return real(*arrays)

            return evaluate

        def batches(store, layer, indices):
            counter.names.update(primitive_names(indices))  # np.array(indices) runs these
            return counter._batches(store, layer, indices)

        def write(slab, slot, expert):
            counter._in_write = True
            try:
                return counter._write(slab, slot, expert)
            finally:
                counter._in_write = False

        mx.eval, mx.async_eval = counting(self._eval), counting(self._async_eval)
        StreamedStore._batches = batches
        streamed_store._Slab.write = write
        return self

    def __exit__(self, *exc) -> None:
        mx.eval, mx.async_eval = self._eval, self._async_eval
        StreamedStore._batches = self._batches
        streamed_store._Slab.write = self._write


def _flatten(obj):
    if isinstance(obj, mx.array):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _flatten(item)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--expert-cache", type=float, default=4.0, help="GiB (default 4)")
    parser.add_argument("-p", "--prompt", default="Hello")
    parser.add_argument("-n", "--n-predict", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    io_start = proc_io()
    # Tensor bytes the loader converted from the memory map (mmap reads are not in rchar).
    converted = []
    mark_loaded = GGUFFile.mark_loaded

    def counting_mark_loaded(gguf, name, nbytes=None):
        converted.append(gguf.layout.tensors[name].nbytes if nbytes is None else nbytes)
        return mark_loaded(gguf, name, nbytes)

    GGUFFile.mark_loaded = counting_mark_loaded
    started = time.perf_counter()
    try:
        model = load_model(
            args.model,
            weights_dtype="native",
            experts=ExpertOptions(stream=True, cache_gib=args.expert_cache),
        )
    finally:
        GGUFFile.mark_loaded = mark_loaded
    load_s = time.perf_counter() - started
    rss_loaded = proc_status_bytes("VmRSS")
    progress(f"loaded in {load_s:.1f} s, RSS {format_size(rss_loaded)}")
    plan = plan_memory(model.gguf, "native")
    store = model.experts
    budget = store.stats().budget_bytes or int(args.expert_cache * 2**30)
    bound = plan.streamed_bound(budget)

    session = model.new_session()
    prompt = model.tokenizer.encode(args.prompt, add_special=True)
    started = time.perf_counter()
    token = int(np.argmax(session.feed(prompt)[-1]))
    ttft = time.perf_counter() - started
    progress(
        f"first token after {ttft:.1f} s ({len(prompt)} prompt tokens), RSS "
        f"{format_size(proc_status_bytes('VmRSS'))}"
    )
    generated = [token]
    after_prefill = store.stats()
    steps, primitives, slab_primitives, top = [], None, None, {}
    for step in range(args.n_predict - 1):
        started = time.perf_counter()
        if step == 1:  # counted on the second decode step (the first one warms the graph)
            with PrimitiveCounter() as counter:
                logits = session.feed([token])
            primitives, slab_primitives = counter.model, counter.slab_writes
            top = dict(counter.names.most_common(12))
        else:
            logits = session.feed([token])
        steps.append(time.perf_counter() - started)
        progress(
            f"decode step {step + 1}: {steps[-1]:.1f} s, RSS "
            f"{format_size(proc_status_bytes('VmRSS'))}, {store.stats().summary()}"
        )
        token = int(np.argmax(logits[-1]))
        generated.append(token)
    final = store.stats()
    io_end = proc_io()
    model.close()

    decode_tokens = max(len(steps), 1)
    lookups = (final.hits - after_prefill.hits) + (final.misses - after_prefill.misses)
    figures = {
        "model": str(args.model),
        "file_bytes": plan.file_bytes,
        "prompt_tokens": len(prompt),
        "generated": generated,
        "text": model.tokenizer.decode(generated),
        "load_s": round(load_s, 2),
        "rss_after_load_bytes": rss_loaded,
        "peak_rss_bytes": proc_status_bytes("VmHWM"),
        "bound_bytes": bound,
        "dense_bytes_in_memory": plan.dense_bytes,
        "tensor_bytes_converted_at_load": sum(converted),
        "expert_budget_bytes": budget,
        "expert_cache_bytes": final.capacity_bytes,
        "ttft_s": round(ttft, 2),
        "decode_s_per_token": [round(s, 2) for s in steps],
        "mean_s_per_token": round(sum(steps) / decode_tokens, 2),
        "expert_bytes_read_prefill": after_prefill.bytes_read,
        "expert_bytes_read_per_decode_token": (final.bytes_read - after_prefill.bytes_read)
        // decode_tokens,
        "decode_hit_rate": ((final.hits - after_prefill.hits) / lookups) if lookups else None,
        "overall_hit_rate": final.hit_rate,
        "expert_stats": final.as_dict(),
        "primitives_per_decode_step": primitives,
        "slab_write_primitives_that_step": slab_primitives,
        "top_primitives": top,
        "rchar": io_end["rchar"] - io_start["rchar"],
        "read_bytes": io_end["read_bytes"] - io_start["read_bytes"],
    }
    figures["rchar_share_of_file"] = figures["rchar"] / plan.file_bytes
    print(describe(plan, []))
    print(
        f"load {figures['load_s']} s | RSS after load {format_size(rss_loaded)} | peak RSS "
        f"{format_size(figures['peak_rss_bytes'])} vs bound {format_size(bound)} (dense "
        f"{format_size(plan.dense_bytes)} + cache budget {format_size(budget)} + 10%)"
    )
    print(
        f"TTFT {figures['ttft_s']} s ({len(prompt)} prompt tokens) | decode "
        f"{figures['decode_s_per_token']} s/token, mean {figures['mean_s_per_token']}"
    )
    print(
        f"experts: read {format_size(figures['expert_bytes_read_per_decode_token'])} per "
        f"decoded token, decode hit rate {figures['decode_hit_rate']}, prefill read "
        f"{format_size(after_prefill.bytes_read)} | {final.summary()}"
    )
    print(
        f"primitives per decode step ({model.args.num_layers} layers): {primitives} (+ "
        f"{slab_primitives} writing experts into the slab); most frequent: {top}"
    )
    print(f"loader converted {format_size(sum(converted))} of tensors through the memory map")
    print(
        f"/proc/self/io: rchar {format_size(figures['rchar'])} "
        f"({figures['rchar_share_of_file']:.2%} of the {format_size(plan.file_bytes)} file), "
        f"read_bytes {format_size(figures['read_bytes'])}"
    )
    print(f"tokens {generated} -> {figures['text']!r}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
