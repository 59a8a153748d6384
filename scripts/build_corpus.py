#!/usr/bin/env python3
"""Build the tiny model family's training corpus from text present on any machine.

Sources, in a fixed order: the top-level modules of the running interpreter's standard library
(source text, docstrings included), the hand-written prose in ``scripts/corpus/prose/``, and chat
samples rendered in the DeepSeek-V4 template (some with DSML tool calls) by
``scripts/corpus/chat_samples.py``. A manifest (file list + sha256 + sizes + Python version) makes a
rebuild checkable: the same interpreter version gives byte-identical output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROSE_DIR = HERE / "corpus" / "prose"

# Large generated tables and test scaffolding teach the tiny model little.
EXCLUDED_MODULES = {"pydoc_data", "this.py", "antigravity.py", "__phello__.foo.py"}


def stdlib_sources(max_bytes: int) -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for path in sorted(lib.glob("*.py")):
        if path.name in EXCLUDED_MODULES:
            continue
        size = path.stat().st_size
        if total + size > max_bytes:
            continue
        chosen.append(path)
        total += size
    return chosen


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build(out_dir: Path, max_stdlib_bytes: int, chat_samples: int, seed: int) -> dict:
    sys.path.insert(0, str(HERE / "corpus"))
    from chat_samples import render_samples  # local helper, imports ds4mlx

    out_dir.mkdir(parents=True, exist_ok=True)
    documents: list[tuple[str, str]] = []
    for path in stdlib_sources(max_stdlib_bytes):
        documents.append(
            (f"stdlib/{path.name}", path.read_text(encoding="utf-8", errors="replace"))
        )
    for path in sorted(PROSE_DIR.glob("*.txt")):
        documents.append((f"prose/{path.name}", path.read_text(encoding="utf-8")))
    stdlib_texts = [text for name, text in documents if name.startswith("stdlib/")]
    for index, sample in enumerate(render_samples(stdlib_texts, chat_samples, seed)):
        documents.append((f"chat/{index:05d}", sample))

    entries = []
    with open(out_dir / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for name, text in documents:
            handle.write(json.dumps({"name": name, "text": text}, ensure_ascii=False) + "\n")
            entries.append(
                {"name": name, "bytes": len(text.encode()), "sha256": sha256(text.encode())}
            )
    manifest = {
        "python": sys.version.split()[0],
        "seed": seed,
        "documents": entries,
        "corpus_sha256": sha256((out_dir / "corpus.jsonl").read_bytes()),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build/corpus"))
    parser.add_argument("--max-stdlib-bytes", type=int, default=4_000_000)
    parser.add_argument("--chat-samples", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", type=Path, help="compare the rebuild with this manifest")
    args = parser.parse_args()
    manifest = build(args.out, args.max_stdlib_bytes, args.chat_samples, args.seed)
    total = sum(d["bytes"] for d in manifest["documents"])
    print(
        f"{len(manifest['documents'])} documents, {total / 1e6:.1f} MB, "
        f"sha256 {manifest['corpus_sha256'][:16]}",
        file=sys.stderr,
    )
    if args.check:
        expected = json.loads(args.check.read_text())
        if expected["corpus_sha256"] != manifest["corpus_sha256"]:
            raise SystemExit(
                f"corpus differs from {args.check} "
                f"(built with Python {expected['python']}, now {manifest['python']})"
            )
        print("corpus matches the manifest", file=sys.stderr)


if __name__ == "__main__":
    main()
