"""DSpark drafts exactly as llama.cpp's own DSpark path does (``dflash`` layout).

Each fixture directory holds runs of the oracle's driver (``../shared/oracle/tools/
dspark_driver.cpp``: llama.cpp 0c1e570, flash attention off, F32 KV cache): a deepseek4 target,
a dflash drafter, and the driver's JSON (every round's anchor, the committed tokens, the drafted
ids, the Markov-biased draft logits and the confidences) with the target features it injected
(``<output>.feats.bin``). ``manifest.json`` lists the runs under ``runs`` (or ``fixtures``):
``output`` (or ``json``), ``draft`` (or ``drafter``), ``target`` (default ``target.gguf``);
without one, every ``<name>.json`` is a run of drafter ``<name>.gguf`` (or of ``<name>`` up to
its first dot) over ``target.gguf``. Directories: ``tests/fixtures/dspark_llamacpp`` (made by
``scripts/make_dspark_fixtures.py``), and every ``dspark*`` folder of the oracle directory
(``$DS4MLX_ORACLE_DIR`` or ``../shared/oracle``) and of ``$DS4MLX_DSPARK_FIXTURES``.

Every round of every run is replayed twice: once on the features llama.cpp injected (the
drafter alone), once end to end on this repository's target. Both must draft llama.cpp's ids
exactly, with logits within 1e-4.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import ds4mlx
from ds4mlx.speculation import dspark
from ds4mlx.speculation.drafter import TargetRows
from ds4mlx.speculation.probe import rows_between

import mlx.core as mx
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
ORACLE_DIR = Path(os.environ.get("DS4MLX_ORACLE_DIR") or REPO.parent / "shared" / "oracle")
LOGIT_TOLERANCE = 1e-4
CONFIDENCE_TOLERANCE = 1e-5


def fixture_dirs() -> list[Path]:
    dirs = [REPO / "tests" / "fixtures" / "dspark_llamacpp"]
    dirs += sorted(p for p in ORACLE_DIR.glob("dspark*") if p.is_dir())
    extra = os.environ.get("DS4MLX_DSPARK_FIXTURES")
    if extra:
        dirs += [Path(p) for p in extra.split(os.pathsep)]
    return [d for d in dirs if d.is_dir()]


@dataclass(frozen=True)
class Run:
    name: str
    output: Path
    target: Path
    draft: Path


def runs_in(directory: Path) -> list[Run]:
    manifest = directory / "manifest.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        entries = data.get("runs", data.get("fixtures", []))
        runs = []
        for e in entries:
            output = e.get("output", e.get("json"))
            runs.append(
                Run(
                    e.get("name", output),
                    directory / output,
                    directory / e.get("target", "target.gguf"),
                    directory / e.get("draft", e.get("drafter")),
                )
            )
        return runs
    runs = []
    for output in sorted(directory.glob("*.json")):
        stem = output.stem
        draft = directory / f"{stem}.gguf"
        if not draft.is_file():
            draft = directory / f"{stem.split('.')[0]}.gguf"
        runs.append(Run(stem, output, directory / "target.gguf", draft))
    return runs


RUNS = [run for directory in fixture_dirs() for run in runs_in(directory)]


@functools.cache
def load_target(path: Path):
    return ds4mlx.load_model(path, weights_dtype="f32")


def check_round(drafter: dspark.DSparkDrafter, expected: dict, vocab: int, where: str) -> None:
    rows = drafter.block()
    mx.eval(rows.logits, rows.picks)
    logits = np.array(rows.logits)
    reference = np.array(expected["logits"], np.float32).reshape(-1, vocab)
    assert rows.picks.tolist() == expected["drafted"], where
    np.testing.assert_allclose(logits, reference, rtol=0, atol=LOGIT_TOLERANCE, err_msg=where)
    if rows.confidences is not None and min(expected["confidences"]) >= 0:
        np.testing.assert_allclose(
            np.array(rows.confidences),
            expected["confidences"],
            rtol=0,
            atol=CONFIDENCE_TOLERANCE,
            err_msg=where,
        )


def rounds(run: Run) -> tuple[dict, list[dict]]:
    data = json.loads(run.output.read_text())
    assert data["rounds"], f"{run.output}: no rounds"
    return data, data["rounds"]


pytestmark = pytest.mark.skipif(not RUNS, reason="no DSpark llama.cpp fixtures")


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_drafts_on_llamacpp_features(run: Run):
    """The drafter alone, fed the very target features llama.cpp injected."""
    target = load_target(run.target)
    drafter = dspark.load_dspark(run.draft, target, check_target_id=False)
    data, all_rounds = rounds(run)
    assert data["block_size"] == drafter.config.block_size
    assert data["mask_token_id"] == drafter.config.noise_token_id
    width = len(drafter.config.target_layers) * target.args.hidden_size
    feats_path = Path(f"{run.output}.feats.bin")
    if not feats_path.is_file():
        pytest.skip(f"{run.name}: no {feats_path.name}")
    feats = np.fromfile(feats_path, dtype=np.float32).reshape(-1, width)
    prompt = data["prompt"]
    drafter.observe_taps(mx.array(feats[: len(prompt)]), 0, all_rounds[0]["anchor"])
    start = len(prompt)
    for r in all_rounds:
        assert r["n_past"] == start
        check_round(drafter, r, target.args.vocab_size, f"{run.name} round {r['round']}")
        committed = r["committed"]
        drafter.observe_taps(
            mx.array(feats[start : start + len(committed)]), start, r["next_anchor"]
        )
        start += len(committed)


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_drafts_end_to_end(run: Run):
    """This repository's target computes the features, the drafter drafts: llama.cpp's ids."""
    target = load_target(run.target)
    drafter = dspark.load_dspark(run.draft, target, check_target_id=False)
    data, all_rounds = rounds(run)
    session = target.new_session()
    prompt = data["prompt"]
    out = session.feed_hidden(prompt, drafter.capture_layers)
    drafter.observe(prompt, all_rounds[0]["anchor"], rows_between(out, 0, len(prompt)))
    start = len(prompt)
    for r in all_rounds:
        check_round(drafter, r, target.args.vocab_size, f"{run.name} round {r['round']}")
        committed = r["committed"]
        out = session.feed_hidden(committed, drafter.capture_layers)
        rows = TargetRows(start, dict(out.layers), out.head_input, out.final_hidden)
        drafter.observe(committed, r["next_anchor"], rows)
        start += len(committed)
