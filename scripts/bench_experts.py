"""Resident vs streamed routed experts on a synthetic model: tokens/s, hit rate, bytes read per
token and peak RSS at 100/50/25/10% expert-cache budgets, warm and cold page cache separately.

Each configuration runs in its own subprocess (peak RSS is per process). "cold" drops the model
file's pages with posix_fadvise(DONTNEED) before loading, so reads come from the disk where the
kernel honours it (the output says whether it could); "warm" reads hit the page cache.

    python scripts/bench_experts.py --size-mb 2048 --tokens 32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_synthetic_moe import EXPERT_TYPES, experts_for_size, write_synthetic_moe  # noqa: E402

RUN = textwrap.dedent("""
    import json, os, resource, sys, time
    import ds4mlx
    from ds4mlx.experts import ExpertOptions

    path, share, cold, routed, n_tokens = sys.argv[1], sys.argv[2], sys.argv[3] == "1", \\
        int(sys.argv[4]), int(sys.argv[5])
    dropped = False
    if cold and hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        dropped = True
    experts = None if share == "resident" else ExpertOptions(
        stream=True, cache_gib=float(share) * routed / 2**30)
    model = ds4mlx.load_model(path, weights_dtype="native", experts=experts)
    session = model.new_session()
    logits = session.feed(list(range(1, 17)))
    start_stats = model.expert_stats()
    started = time.perf_counter()
    for _ in range(n_tokens):
        logits = session.feed([int(logits[-1].argmax())])
    seconds = time.perf_counter() - started
    stats = model.expert_stats()
    model.close()
    print(json.dumps({"tps": n_tokens / seconds, "hit_rate": stats.hit_rate,
                      "bytes_per_token": (stats.bytes_read - start_stats.bytes_read) / n_tokens,
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "gbps": stats.read_gbps, "dropped": dropped,
                      "routed": stats.routed_bytes}))
""")


def run(path: Path, share: str, cold: bool, routed: int, tokens: int) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, str(path), share, "1" if cold else "0",
                          str(routed), str(tokens)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"run {share} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="an existing synthetic GGUF (else written)")
    parser.add_argument("--size-mb", type=float, default=256, help="routed experts to write")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16, help="decoded tokens per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model
        if path is None:
            path = Path(tmp) / "synthetic.gguf"
            experts = experts_for_size(int(args.size_mb * 2**20), layers=args.layers,
                                       hidden=1024, expert_ff=1024, qtype=EXPERT_TYPES["Q4_K"])
            write_synthetic_moe(path, layers=args.layers, experts=experts, vocab=512)
        resident = {cold: run(path, "resident", cold, 0, args.tokens) for cold in (False, True)}
        routed = resident[False]["routed"]
        print(f"model {path.name}: {path.stat().st_size / 2**20:.0f} MiB file, routed experts "
              f"{routed / 2**20:.0f} MiB as computed; {args.tokens} decoded tokens per run")
        print(f"{'cache':>10} {'pages':>6} {'tok/s':>7} {'vs res':>7} {'hit':>6} "
              f"{'MiB/tok':>8} {'GB/s':>6} {'peak RSS MiB':>13}")
        for cold in (False, True):
            label = "cold" if cold else "warm"
            base = resident[cold]
            rows = [("resident", base)] + [
                (f"{share:.0%}", run(path, str(share), cold, routed, args.tokens))
                for share in (1.0, 0.5, 0.25, 0.10)]
            for name, r in rows:
                pages = label if not cold or r["dropped"] else "warm?"
                print(f"{name:>10} {pages:>6} {r['tps']:7.2f} {r['tps'] / base['tps']:6.2f}x "
                      f"{r['hit_rate']:6.1%} {r['bytes_per_token'] / 2**20:8.2f} "
                      f"{r['gbps']:6.2f} {r['peak_rss'] / 2**20:13.0f}")
        print("warm: the file's pages may be in the OS page cache; cold: dropped with "
              "posix_fadvise(DONTNEED) before each run (reads from the disk).")


if __name__ == "__main__":
    main()
