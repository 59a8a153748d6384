"""``support_gguf``, what the drafters' support files share: how each tensor is stored, the
untrained test weights, the architecture check, and the target identity (what enters it, and the
refusal that names both files)."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.gguf import GGUFError, MetaValue, TensorToWrite, open_gguf, write_gguf
from ds4mlx.speculation.support_gguf import (
    TARGET_FILE_KEY,
    TARGET_ID_KEY,
    check_target,
    identity_metadata,
    random_arrays,
    require_arch,
    storage_type,
    target_fingerprint,
    tokenizer_metadata,
    write_support_gguf,
)

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

T = GGMLQuantizationType
V = GGUFValueType


@pytest.mark.parametrize(
    ("name", "shape", "matrix_type", "stored"),
    [
        ("d2t", (48,), T.Q8_0, T.I32),
        ("blk.0.attn_q.weight", (64, 32), T.Q8_0, T.Q8_0),
        ("blk.0.attn_q.weight", (64, 256), T.Q4_K, T.Q4_K),
        ("blk.0.attn_q.weight", (64, 48), T.Q8_0, T.F32),  # rows not whole blocks
        ("blk.0.attn_q.weight", (64, 32), T.Q4_K, T.F32),  # 32 is no 256-value block
        ("blk.0.attn_q.weight", (2, 3, 32), T.Q8_0, T.Q8_0),  # an expert stack
        ("output_norm.weight", (64,), T.Q8_0, T.F32),
        ("blk.0.hc_attn_fn.weight", (24, 64), T.Q8_0, T.F32),
        ("conf_proj.weight", (4, 64), T.Q8_0, T.F32),
        ("confidence_head.proj.weight", (4, 64), T.Q8_0, T.F32),
    ],
)
def test_how_each_tensor_is_stored(name, shape, matrix_type, stored):
    assert storage_type(name, shape, matrix_type) == stored


def test_storage_defaults_to_q8_0():
    assert storage_type("w.weight", (4, 32)) == T.Q8_0


def test_untrained_weights_are_well_behaved():
    shapes = {
        "output_norm.weight": (8,),
        "blk.0.attn_sinks.weight": (4,),
        "blk.0.attn_q.bias": (8,),
        "blk.0.hc_attn_base.weight": (6,),
        "blk.0.hc_attn_scale.weight": (3,),
        "blk.0.attn_q.weight": (64, 400),
    }
    arrays = random_arrays(shapes, np.random.default_rng(0))
    assert list(arrays) == list(shapes)
    assert all(arrays[n].shape == s and arrays[n].dtype == np.float32 for n, s in shapes.items())
    np.testing.assert_array_equal(arrays["output_norm.weight"], np.ones(8))
    for name in ("blk.0.attn_sinks.weight", "blk.0.attn_q.bias", "blk.0.hc_attn_base.weight"):
        np.testing.assert_array_equal(arrays[name], np.zeros(shapes[name]))
    np.testing.assert_array_equal(arrays["blk.0.hc_attn_scale.weight"], np.full(3, np.float32(0.1)))
    matmul = arrays["blk.0.attn_q.weight"]
    assert np.var(matmul) == pytest.approx(1 / 400, rel=0.05)  # variance 1 / fan-in
    assert abs(np.mean(matmul)) < 0.01


def test_the_architecture_must_be_an_allowed_one(tmp_path: Path):
    path = tmp_path / "d.gguf"
    write_gguf(path, "llama", {}, [])
    gguf_file = open_gguf(path)
    assert require_arch(gguf_file, {"deepseek4": "ds4", "llama": "dflash"}) == "llama"
    with pytest.raises(GGUFError) as caught:
        require_arch(gguf_file, {"deepseek4-mtp": "ds4's MTP", "glm-nextn": "GLM's NextN"})
    assert str(caught.value) == (
        f"{path}: architecture 'llama' is not a supported drafter; expected "
        "'deepseek4-mtp' (ds4's MTP), 'glm-nextn' (GLM's NextN)"
    )


def write_target(path: Path, tensors: list[TensorToWrite], metadata=None, alignment=32) -> Path:
    write_gguf(path, "deepseek4", metadata or {}, tensors, alignment=alignment)
    return path


def fingerprint_of(path: Path) -> str:
    return target_fingerprint(open_gguf(path))


def test_the_identity_is_the_weights_only(tmp_path: Path):
    """Metadata, tensor order and alignment do not enter it; a tensor's name, type, shape and
    bytes do (each changed alone: the same bytes reshaped, renamed or typed otherwise)."""
    a = TensorToWrite("a.weight", np.arange(64, dtype=np.float32).reshape(2, 32), T.F32)
    b = TensorToWrite("b.weight", np.ones(32, np.float32), T.F32)
    base = fingerprint_of(write_target(tmp_path / "base.gguf", [a, b]))
    same = [
        write_target(tmp_path / "meta.gguf", [a, b], {"x": 1}),
        write_target(tmp_path / "order.gguf", [b, a]),
        write_target(tmp_path / "aligned.gguf", [a, b], alignment=256),
    ]
    assert [fingerprint_of(path) for path in same] == [base] * 3
    reshaped = TensorToWrite("a.weight", a.array.reshape(4, 16), T.F32)
    renamed = TensorToWrite("c.weight", a.array, T.F32)
    retyped = TensorToWrite("a.weight", a.array.view(np.int32), T.I32)  # the same bytes
    changed = TensorToWrite("a.weight", a.array + np.eye(2, 32, dtype=np.float32), T.F32)
    others = [
        fingerprint_of(write_target(tmp_path / f"{i}.gguf", [tensor, b]))
        for i, tensor in enumerate((reshaped, renamed, retyped, changed))
    ]
    assert len({base, *others}) == 5


def target_with_identity(tmp_path: Path, **named: str) -> tuple[Path, Path]:
    target = write_target(tmp_path / "target.gguf", [TensorToWrite("w", np.ones(32, np.float32))])
    metadata = {TARGET_ID_KEY: MetaValue("0123456789abcdef0123", V.STRING)}
    metadata |= {k: MetaValue(v, V.STRING) for k, v in named.items()}
    support = tmp_path / "drafter.gguf"
    write_support_gguf(support, "deepseek4-mtp", metadata, {})
    return support, target


@pytest.mark.parametrize(
    ("named", "trained_for"), [({}, "another model"), ({TARGET_FILE_KEY: "big.gguf"}, "big.gguf")]
)
def test_a_drafter_for_another_target_names_both(tmp_path: Path, named, trained_for):
    support, target = target_with_identity(tmp_path, **named)
    with pytest.raises(GGUFError) as caught:
        check_target(open_gguf(support), open_gguf(target))
    actual = fingerprint_of(target)
    assert str(caught.value) == (
        f"{support} was trained for a different target ({trained_for}, identity "
        f"0123456789abcdef...) than {target} (identity {actual[:16]}...); load the matching "
        "target, or skip the check (check_target=False) at your own risk"
    )


def test_the_identity_a_drafter_records_is_checked(tmp_path: Path):
    target = write_target(tmp_path / "target.gguf", [TensorToWrite("w", np.ones(32, np.float32))])
    recorded = identity_metadata(open_gguf(target))
    assert recorded == {
        TARGET_ID_KEY: MetaValue(fingerprint_of(target), V.STRING),
        TARGET_FILE_KEY: MetaValue("target.gguf", V.STRING),  # the name, not the whole path
    }
    support = tmp_path / "drafter.gguf"
    write_support_gguf(support, "deepseek4-mtp", recorded, {})
    check_target(open_gguf(support), open_gguf(target))
    unrecorded = tmp_path / "unrecorded.gguf"
    write_support_gguf(unrecorded, "deepseek4-mtp", {}, {})
    check_target(open_gguf(unrecorded), open_gguf(support))  # nothing recorded: not checked


def test_only_the_tokenizer_keys_are_carried_with_their_types(tmp_path: Path):
    metadata = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.token_type": [1, 3],
        "tokenizer.ggml.bos_token_id": MetaValue(0, V.UINT32),
        "tokenizer.ggml.scores": MetaValue([0.5, 1.0], V.FLOAT32),
        "general.name": "not a tokenizer key",
        "deepseek4.tokenizer.x": 1,
    }
    target = open_gguf(write_target(tmp_path / "target.gguf", [], metadata))
    assert tokenizer_metadata(target) == {
        "tokenizer.ggml.model": MetaValue("gpt2", V.STRING),
        "tokenizer.ggml.token_type": MetaValue([1, 3], V.INT32),
        "tokenizer.ggml.bos_token_id": MetaValue(0, V.UINT32),
        "tokenizer.ggml.scores": MetaValue([0.5, 1.0], V.FLOAT32),
    }


def test_given_storage_types_win(tmp_path: Path):
    path = tmp_path / "drafter.gguf"
    arrays = {"a.weight": np.ones((2, 32)), "b.weight": np.ones((2, 256)), "d2t": np.arange(4)}
    write_support_gguf(
        path, "deepseek4-mtp", {}, arrays, types={"a.weight": T.F16}, matrix_type=T.Q4_K
    )
    written = open_gguf(path)
    assert [written.tensor_type(name) for name in arrays] == [T.F16, T.Q4_K, T.I32]
