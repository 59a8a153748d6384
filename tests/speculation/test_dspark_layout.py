"""DSpark files: what a dflash file may hold and what is refused by name, the layout converter,
matrix types, and drafting from a bonus-anchor drafter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ds4mlx
from ds4mlx.gguf import GGUFError, MetaValue, TensorToWrite, open_gguf, write_gguf
from ds4mlx.models import deepseek4_dspark as dspark_net
from ds4mlx.models.deepseek4 import ModelArgs
from ds4mlx.speculation import dspark, dspark_layout
from ds4mlx.speculation.dspark_layout import convert_dspark
from ds4mlx.speculation.probe import rows_between
from ds4mlx.speculation.support_gguf import (
    FULL_HASH_BYTES,
    random_arrays,
    target_fingerprint,
    tokenizer_metadata,
    write_support_gguf,
)

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

from .tiny_targets import write_target

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "dspark_llamacpp"
CONFIG = dspark_net.DSparkConfig(
    block_size=4,
    noise_token_id=95,
    target_layers=(1, 2),
    stage_count=1,
    markov_rank=16,
    confidence=True,
)
PROMPT = [5, 17, 33, 2, 61, 40, 8, 90, 12, 12, 71, 3]
T = GGMLQuantizationType


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A random target and one drafter in both layouts."""
    root = tmp_path_factory.mktemp("layout")
    target = write_target(root / "target.gguf", seed=0)
    arrays = random_arrays(dspark_net.tensor_shapes(target.args, CONFIG), np.random.default_rng(5))
    paths = {}
    for arch in (dspark_layout.ARCH_DS4, dspark_layout.ARCH_LLAMA):
        paths[arch] = root / f"{arch}.gguf"
        dspark.save_dspark(paths[arch], arch, CONFIG, target, arrays, context_length=256)
    return target, paths, root


def rewrite(
    source: Path,
    dest: Path,
    *,
    meta: dict[str, MetaValue] | None = None,
    drop: tuple[str, ...] = (),
    tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """``source`` again, with metadata keys added or replaced, keys dropped, tensors added."""
    gguf = open_gguf(source)
    values = {
        key: MetaValue(gguf.get(key), field.types[-1])
        for key, field in gguf.reader.fields.items()
        if not key.startswith(("GGUF.", "general.")) and key not in drop
    }
    arrays = {name: gguf.dequantize(name) for name in gguf.tensor_names()}
    types = {name: gguf.tensor_type(name) for name in gguf.tensor_names()}
    write_support_gguf(
        dest, gguf.arch, values | (meta or {}), arrays | (tensors or {}), types=types
    )
    return dest


def observed(drafter, target, prompt=PROMPT, next_token=7):
    out = target.new_session().feed_hidden(prompt, drafter.capture_layers)
    drafter.observe(prompt, next_token, rows_between(out, 0, len(prompt)))
    return drafter


U32, BOOL, STRING = GGUFValueType.UINT32, GGUFValueType.BOOL, GGUFValueType.STRING


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(tensors={"selector_hidden.weight": np.zeros((16, 64), np.float32)}),
            "DFlash2 selector",
        ),
        (
            dict(tensors={"blk.0.extra.weight": np.zeros((4, 64), np.float32)}),
            "not part of a DeepSeek-V4 DSpark drafter: blk.0.extra.weight",
        ),
        (dict(meta={"dflash.attention.causal": MetaValue(True, BOOL)}), "attention.causal"),
        (dict(meta={"dflash.embedding_length_out": MetaValue(256, U32)}), "embedding_length_out"),
        (
            dict(meta={"dflash.attention.compress_ratios": MetaValue([4], U32)}),
            "uncompressed attention",
        ),
        (dict(meta={"dflash.embedding_length": MetaValue(32, U32)}), "drafter width 32"),
        (
            dict(meta={"dflash.sample_from_anchor": MetaValue("maybe", STRING)}),
            "sample_from_anchor",
        ),
        (dict(drop=("dflash.hyper_connection.count",)), "without DeepSeek-V4 stages"),
        (dict(drop=("dflash.block_size",)), "Markov head needs dflash.block_size"),
        (dict(meta={"dflash.target_layers": MetaValue([0, 9], U32)}), "target layers"),
        (dict(meta={"dflash.block_count": MetaValue(0, U32)}), "block_count 0 must be at least 1"),
        (dict(meta={"dflash.vocab_size": MetaValue(999, U32)}), "drafter vocabulary 999 differs"),
        (dict(meta={"dflash.expert_gating_func": MetaValue(1, U32)}), "sqrt-softplus .* got 1"),
        (dict(meta={"dflash.attention.value_length": MetaValue(7, U32)}), "value_length =="),
        (
            dict(meta={"dflash.attention.output_group_count": MetaValue(0, U32)}),
            "do not split into 0 output groups",
        ),
        (
            dict(meta={"dflash.attention.output_group_count": MetaValue(3, U32)}),
            "do not split into 3 output groups",
        ),
        (dict(meta={"dflash.attention.sliding_window": MetaValue(0, U32)}), "must be positive"),
    ],
)
def test_unsupported_dflash_files_are_refused_by_name(made, change, message):
    target, paths, root = made
    path = rewrite(paths[dspark_layout.ARCH_LLAMA], root / "changed.gguf", **change)
    with pytest.raises(GGUFError, match=message):
        dspark.load_dspark(path, target)


@pytest.mark.parametrize("side", [-1, 1])
def test_value_length_and_vocabulary_must_match_on_either_side(made, side):
    target, paths, root = made
    key_length = open_gguf(paths[dspark_layout.ARCH_LLAMA]).get("dflash.attention.key_length")
    for key, value, message in (
        ("dflash.attention.value_length", key_length + side, "value_length == key_length"),
        ("dflash.vocab_size", target.args.vocab_size + side, "drafter vocabulary"),
    ):
        meta = {key: MetaValue(value, U32)}
        path = rewrite(paths[dspark_layout.ARCH_LLAMA], root / f"side{side}.gguf", meta=meta)
        with pytest.raises(GGUFError, match=message):
            dspark.load_dspark(path, target)


@pytest.mark.parametrize("spelled", ["true", "false"])
def test_sample_from_anchor_spelled_as_text_is_read_as_llama_cpp_reads_it(made, spelled):
    target, paths, root = made
    meta = {"dflash.sample_from_anchor": MetaValue(spelled, STRING)}
    path = rewrite(paths[dspark_layout.ARCH_LLAMA], root / f"anchor-{spelled}.gguf", meta=meta)
    config, _ = dspark_layout.read_config(open_gguf(path), target.args)
    assert config.sample_from_anchor is (spelled == "true")


@pytest.mark.parametrize(
    ("stages", "rank", "message"),
    [
        (0, 0, "stage count 0 must be at least 1"),
        # The Markov head is read from the last stage's names: one stage fewer misses it.
        (CONFIG.stage_count - 1, CONFIG.markov_rank, "Markov rank 16 but no tensor 'mtp."),
    ],
)
def test_ds4_layout_stage_counts_that_miss_the_tensors_are_refused(made, stages, rank, message):
    target, paths, root = made
    meta = {
        "dspark.stage_count": MetaValue(stages, U32),
        "dspark.markov_rank": MetaValue(rank, U32),
    }
    path = rewrite(paths[dspark_layout.ARCH_DS4], root / f"stages-{stages}.gguf", meta=meta)
    with pytest.raises(GGUFError, match=message):
        dspark.load_dspark(path, target)


@pytest.mark.parametrize(("block_size", "refused"), [(1, True), (2, False)])
def test_drafting_from_the_mask_rows_needs_a_block_of_two(made, block_size, refused):
    # Without the anchor row a block of one has no row to draft from.
    target, paths, root = made
    meta = {
        "dflash.sample_from_anchor": MetaValue(False, BOOL),
        "dflash.block_size": MetaValue(block_size, U32),
    }
    path = rewrite(paths[dspark_layout.ARCH_LLAMA], root / f"block-{block_size}.gguf", meta=meta)
    if refused:
        with pytest.raises(GGUFError, match="needs a block of at least 2"):
            dspark.load_dspark(path, target)
    else:
        drafter = dspark.load_dspark(path, target)
        assert not drafter.config.sample_from_anchor and drafter.config.block_size == 2


@pytest.mark.parametrize(
    "block_size", [dspark_layout.MAX_BLOCK_SIZE, dspark_layout.MAX_BLOCK_SIZE + 1]
)
def test_the_largest_block_loads_and_one_more_is_refused(made, block_size):
    target, paths, root = made
    meta = {"dflash.block_size": MetaValue(block_size, U32)}
    path = rewrite(paths[dspark_layout.ARCH_LLAMA], root / f"block-{block_size}.gguf", meta=meta)
    if block_size > dspark_layout.MAX_BLOCK_SIZE:
        with pytest.raises(GGUFError, match=f"block size {block_size} is outside"):
            dspark.load_dspark(path, target)
    else:
        assert dspark.load_dspark(path, target).config.block_size == block_size


def test_a_targets_empty_tokenizer_array_is_left_out_of_a_drafter_file(ds4_fixture_path, tmp_path):
    # llama.cpp writes an empty tokenizer.ggml.merges for this target; a GGUF writer refuses
    # an empty array, so the drafter file carries the target's other tokenizer keys only.
    target = open_gguf(ds4_fixture_path)
    assert target.get("tokenizer.ggml.merges") == []
    path = tmp_path / "drafter.gguf"
    write_support_gguf(
        path, dspark_layout.ARCH_LLAMA, tokenizer_metadata(target), {"x": np.zeros((2, 32))}
    )
    written = open_gguf(path)
    carried = [key for key in written.layout.metadata if key.startswith("tokenizer.")]
    expected = [
        key
        for key in target.layout.metadata
        if key.startswith("tokenizer.") and target.get(key) != []
    ]
    assert carried == expected and "tokenizer.ggml.tokens" in carried
    assert all(written.get(key) == target.get(key) for key in carried)


def test_d2t_is_checked(made):
    target, paths, root = made
    d2t = np.arange(0, 96, 2, dtype=np.int32)  # 48 draft rows
    w2 = np.ones((48, CONFIG.markov_rank), np.float32)
    for extra, message in (
        ({"output.weight": np.zeros((48, 64), np.float32)}, "d2t.*own output"),
        ({"d2t": np.zeros(48, np.int32)}, "same target token"),
        ({"d2t": d2t + 2}, "outside the vocabulary"),
    ):
        tensors = {"d2t": d2t, "markov_w2.weight": w2} | extra
        path = rewrite(paths[dspark_layout.ARCH_LLAMA], root / "d2t.gguf", tensors=tensors)
        with pytest.raises(GGUFError, match=message):
            dspark.load_dspark(path, target)
    good = rewrite(
        paths[dspark_layout.ARCH_LLAMA],
        root / "d2t.gguf",
        tensors={"d2t": d2t, "markov_w2.weight": w2},
    )
    drafter = observed(dspark.load_dspark(good, target), target)
    assert drafter.config.draft_vocab == 48
    bias = np.array(drafter.net.markov_bias(mx.array([3], dtype=mx.int32)))[0]
    assert (bias[1::2] == 0).all() and (bias[::2] != 0).all()  # only d2t's tokens are biased


def test_a_drafter_without_markov_head_drafts_from_the_mask_rows(made):
    """llama.cpp drafts a DFlash-style file (no Markov head) from rows 1 .., as DFlash."""
    target, paths, root = made
    gguf = open_gguf(paths[dspark_layout.ARCH_LLAMA])
    path = root / "plain.gguf"
    keep = [n for n in gguf.tensor_names() if not n.startswith(("markov", "conf_proj"))]
    write_gguf(
        path,
        "dflash",
        {
            k: MetaValue(gguf.get(k), f.types[-1])
            for k, f in gguf.reader.fields.items()
            if not k.startswith(("GGUF.", "general."))
        },
        [TensorToWrite(n, gguf.dequantize(n), gguf.tensor_type(n)) for n in keep],
    )
    drafter = observed(dspark.load_dspark(path, target), target)
    assert not drafter.config.sample_from_anchor and drafter.max_draft == 3
    draft = drafter.propose(5)
    assert draft.tokens == drafter.block().picks.tolist()[1:] and draft.confidences is None


def test_bonus_anchor_drafts_come_after_row_0():
    if not (FIXTURES / "own_head.gguf").is_file():
        pytest.skip("no llama.cpp fixtures")
    target = ds4mlx.load_model(FIXTURES / "target.gguf", weights_dtype="f32")
    drafter = dspark.load_dspark(FIXTURES / "own_head.gguf", target)
    assert drafter.config.target_layers == (dspark_net.EMBEDDING_TAP, 2)
    assert drafter.capture_layers == (2,)  # the embedding is not a layer output
    assert drafter.max_draft == 4 and not drafter.config.sample_from_anchor
    observed(drafter, target, [1, 2, 3, 4, 5, 6], 7)
    rows = drafter.block()
    draft = drafter.propose(9)
    assert draft.tokens == rows.picks.tolist()[1:]
    np.testing.assert_allclose(draft.confidences, np.array(rows.confidences)[1:], rtol=1e-6)
    assert drafter.propose(2).tokens == draft.tokens[:2]


def test_converter_round_trip_keeps_every_tensor(made, tmp_path):
    target, paths, _ = made
    there = tmp_path / "as-dflash.gguf"
    back = tmp_path / "back.gguf"
    convert_dspark(
        paths[dspark_layout.ARCH_DS4], there, dspark_layout.ARCH_LLAMA, target.gguf, target.args
    )
    convert_dspark(there, back, dspark_layout.ARCH_DS4, target.gguf, target.args)
    for a, b in ((paths[dspark_layout.ARCH_LLAMA], there), (paths[dspark_layout.ARCH_DS4], back)):
        ga, gb = open_gguf(a), open_gguf(b)
        assert sorted(ga.tensor_names()) == sorted(gb.tensor_names())
        for name in ga.tensor_names():
            assert ga.tensor_type(name) == gb.tensor_type(name)
            assert np.array_equal(np.asarray(ga.raw(name)), np.asarray(gb.raw(name))), name
    f32 = tmp_path / "f32.gguf"
    convert_dspark(
        there,
        f32,
        dspark_layout.ARCH_LLAMA,
        target.gguf,
        target.args,
        keep_types=False,
        matrix_type=T.F32,
    )
    assert open_gguf(f32).tensor_type("blk.0.attn_q_a.weight") == T.F32
    kept = tmp_path / "kept.gguf"  # float32 (GGML type 0) is a type to keep too
    convert_dspark(f32, kept, dspark_layout.ARCH_LLAMA, target.gguf, target.args)
    assert open_gguf(kept).tensor_type("blk.0.attn_q_a.weight") == T.F32
    assert open_gguf(there).tensor_type("blk.0.attn_q_a.weight") == T.Q8_0


def test_converter_script_and_what_ds4_layout_cannot_hold(made, tmp_path):
    target, paths, _ = made
    dest = tmp_path / "f16.gguf"
    script = REPO / "scripts" / "convert_dspark.py"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            str(paths[dspark_layout.ARCH_DS4]),
            str(dest),
            "--target",
            str(target.gguf.path),
            "--layout",
            "dflash",
            "--matrix-type",
            "f16",
        ],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert open_gguf(dest).tensor_type("blk.0.attn_q_a.weight") == T.F16
    if (FIXTURES / "own_head.gguf").is_file():
        fixture_target = open_gguf(FIXTURES / "target.gguf")
        with pytest.raises(GGUFError, match="ds4's layout"):
            convert_dspark(
                FIXTURES / "own_head.gguf",
                tmp_path / "x.gguf",
                dspark_layout.ARCH_DS4,
                fixture_target,
                ModelArgs.from_gguf(fixture_target),
            )


def test_integer_tensors_are_written_as_integers(tmp_path):
    path = tmp_path / "ints.gguf"
    write_gguf(
        path,
        "test",
        {},
        [
            TensorToWrite("d2t", np.array([3, 1, 2]), T.I64),
            TensorToWrite("w", np.ones((2, 32), np.float32)),
        ],
    )
    gguf = open_gguf(path)
    assert gguf.tensor_type("d2t") == T.I64
    assert np.asarray(gguf.raw("d2t")).tolist() == [3, 1, 2]
    with pytest.raises(ValueError, match="I32 needs integers"):
        write_gguf(path, "test", {}, [TensorToWrite("d2t", np.array([0.5]), T.I32)])


@pytest.mark.parametrize("past", [False, True])
def test_target_layers_end_at_the_targets_last_layer(made, past):
    target, paths, root = made
    last = target.args.num_layers - 1
    # dflash.target_layers name the input of layer t, which is layer t - 1's output.
    meta = {"dflash.target_layers": MetaValue([1, last + 1 + past], U32)}
    path = rewrite(paths[dspark_layout.ARCH_LLAMA], root / f"layers-{past}.gguf", meta=meta)
    if past:
        with pytest.raises(GGUFError, match="target layers"):
            dspark.load_dspark(path, target)
    else:
        assert dspark.load_dspark(path, target).config.target_layers[-1] == last


def test_the_target_identity_covers_the_end_of_a_large_tensor(tmp_path):
    # Past FULL_HASH_BYTES a tensor is hashed in windows: the last one ends at its last byte.
    large = np.zeros(3 * FULL_HASH_BYTES // 4, np.float32)
    changed = large.copy()
    changed[-1] = 1.0
    identities = []
    for name, array in (("a", large), ("b", changed)):
        path = tmp_path / f"{name}.gguf"
        write_gguf(path, "deepseek4", {}, [TensorToWrite("w.weight", array, T.F32)])
        identities.append(target_fingerprint(open_gguf(path)))
    assert identities[0] != identities[1]


def test_converter_keeps_d2t_a_missing_bias_and_the_bonus_anchor(made, tmp_path):
    """A dflash file with a reduced draft vocabulary (``d2t``), no confidence bias and drafts
    after row 0 converts to one with the same: the index table as stored integers, no bias
    made up, and ``dflash.sample_from_anchor`` false."""
    target, paths, _ = made
    source = open_gguf(paths[dspark_layout.ARCH_LLAMA])
    arrays = {
        name: source.dequantize(name)
        for name in source.tensor_names()
        if name != dspark_net.CONF_BIAS
    }
    types = {name: source.tensor_type(name) for name in arrays}
    d2t = np.arange(0, 96, 2, dtype=np.int32)  # 48 draft rows
    arrays |= {"d2t": d2t, "markov_w2.weight": np.ones((48, CONFIG.markov_rank), np.float32)}
    values = {
        key: MetaValue(source.get(key), field.types[-1])
        for key, field in source.reader.fields.items()
        if not key.startswith(("GGUF.", "general."))
    }
    values["dflash.sample_from_anchor"] = MetaValue(False, BOOL)
    given, converted = tmp_path / "given.gguf", tmp_path / "converted.gguf"
    write_support_gguf(given, dspark_layout.ARCH_LLAMA, values, arrays, types=types)
    config = convert_dspark(
        given, converted, dspark_layout.ARCH_LLAMA, target.gguf, target.args, context_length=256
    )
    assert (config.sample_from_anchor, config.draft_vocab) == (False, 48)
    assert dspark_net.CONF_BIAS not in config.optional
    written = open_gguf(converted)
    assert written.get("dflash.sample_from_anchor") is False
    assert written.tensor_type("d2t") == T.I32
    np.testing.assert_array_equal(np.asarray(written.raw("d2t")), d2t)
    assert not written.has_tensor(dspark_net.CONF_BIAS)
    assert sorted(written.tensor_names()) == sorted(arrays)


@pytest.mark.parametrize("extra", [8, 9])
def test_unknown_tensors_are_named_up_to_eight(made, extra):
    target, paths, root = made
    tensors = {f"x{i}.weight": np.zeros((2, 32), np.float32) for i in range(extra)}
    path = rewrite(paths[dspark_layout.ARCH_LLAMA], root / "unknown.gguf", tensors=tensors)
    with pytest.raises(GGUFError) as refused:
        dspark.load_dspark(path, target)
    named = ", ".join(f"x{i}.weight" for i in range(8))
    assert str(refused.value) == (
        f"{path}: tensors not part of a DeepSeek-V4 DSpark drafter: {named}"
        + (" ..." if extra > 8 else "")
    )


def test_an_output_length_equal_to_the_embedding_length_loads(made):
    """Only an ``embedding_length_out`` that differs from the embedding length breaks
    llama.cpp's confidences; the same length is harmless."""
    target, paths, root = made
    width = MetaValue(target.args.hidden_size, U32)
    path = rewrite(
        paths[dspark_layout.ARCH_LLAMA],
        root / "same-width.gguf",
        meta={"dflash.embedding_length_out": width},
    )
    assert (
        dspark.load_dspark(path, target).config
        == dspark.load_dspark(paths[dspark_layout.ARCH_LLAMA], target).config
    )
