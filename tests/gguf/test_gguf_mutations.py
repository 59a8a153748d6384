"""Structural mutations of a valid file (splices, and boundary integers written over the fields
that steer the parser), beyond test_gguf_fuzz's byte edits: every outcome is a GGUFError or a
valid load whose tensors all lie inside the file. Part of the robustness suite (issue 10)."""

from __future__ import annotations

import struct
from pathlib import Path

from ds4mlx.gguf import GGUFError, open_gguf

import pytest
from gguf_anatomy import Anatomy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Values a length, count, type or offset field can be tricked with: zero, one, sign and width
# boundaries, and sizes just past what any small file can hold.
BOUNDARIES = (
    0,
    1,
    2,
    31,
    32,
    63,
    64,
    255,
    256,
    2**15,
    2**16 - 1,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**53,
    2**63 - 1,
    2**63,
    2**64 - 1,
)


def field_offsets(anatomy: Anatomy) -> list[int]:
    """Byte offsets of every field the parser branches on."""
    offsets = [0, 4, 8, 16]  # magic, version, tensor count, key count
    for key in anatomy.keys.values():
        offsets += [key.start, key.value_type, key.value]
    for info in anatomy.tensor_infos.values():
        offsets += [info.start, info.n_dims, info.dims, info.type, info.offset]
    return offsets


def mutation(anatomy: Anatomy) -> st.SearchStrategy:
    size = len(anatomy.content)
    position = st.integers(0, size - 1)
    overwrite = st.tuples(
        st.just("overwrite"),
        st.sampled_from(field_offsets(anatomy)),
        st.sampled_from(BOUNDARIES),
        st.sampled_from((4, 8)),
    )
    delete = st.tuples(st.just("delete"), position, st.integers(1, 64))
    insert = st.tuples(st.just("insert"), position, st.binary(min_size=1, max_size=16))
    duplicate = st.tuples(st.just("duplicate"), position, st.integers(1, 64))
    return st.lists(st.one_of(overwrite, delete, insert, duplicate), min_size=1, max_size=3)


def apply(content: bytes, edits) -> bytes:
    data = bytearray(content)
    for edit in edits:
        kind, at = edit[0], min(edit[1], max(len(data) - 1, 0))
        if kind == "overwrite":
            value, width = edit[2], edit[3]
            packed = struct.pack("<Q", value)[:width] if value < 2**64 else b"\xff" * width
            data[at : at + width] = packed
        elif kind == "delete":
            del data[at : at + edit[2]]
        elif kind == "insert":
            data[at:at] = edit[2]
        else:
            data[at:at] = data[at : at + edit[2]]
    return bytes(data)


def load_all(path: Path) -> None:
    gguf_file = open_gguf(path)
    gguf_file.arch  # noqa: B018 - decoding a string value must not escape as UnicodeDecodeError
    size = path.stat().st_size
    for name, info in gguf_file.layout.tensors.items():
        # A layout the validator accepts must never point past the end of the file.
        assert 0 <= info.file_offset and info.file_offset + info.nbytes <= size, name
        for mode in ("f32", "native"):
            gguf_file.load_weight(name, mode)


@pytest.fixture(scope="module")
def mutated_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mutations") / "mutated.gguf"


def assert_clean_outcome(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    try:
        load_all(path)
    except GGUFError as exc:
        assert str(path) in str(exc)


# Mutated scales may be NaN or inf: the arithmetic warns, and that is not a failure.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(
    max_examples=1200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_mutated_file_opens_or_raises_gguf_error(data, anatomy: Anatomy, mutated_path: Path):
    assert_clean_outcome(mutated_path, apply(anatomy.content, data.draw(mutation(anatomy))))


# Fixed regression cases (field name, value, width) kept whatever the generator draws: counts
# and dimensions far beyond the file, a data offset at the top of the u64 range, a zero
# dimension (the fuzzer found that one, see test_gguf_hostile), a type id past the enum.
REGRESSIONS = [
    ("tensor count", 2**63, 8),
    ("key count", 2**64 - 1, 8),
    ("a.weight dims", 2**62, 8),
    ("b.weight offset", 2**64 - 1, 8),
    ("c.weight dims", 0, 8),
    ("c.weight type", 2**31, 4),
    ("test.name value", 2**32 - 1, 8),
]


def regression_offset(anatomy: Anatomy, name: str) -> int:
    if name == "tensor count":
        return 8
    if name == "key count":
        return 16
    target, field = name.rsplit(" ", 1)
    layout = anatomy.tensor_infos.get(target) or anatomy.keys[target]
    return getattr(layout, field)


@pytest.mark.parametrize(("name", "value", "width"), REGRESSIONS)
def test_regression_corpus(name, value, width, anatomy: Anatomy, tmp_path: Path):
    edits = [("overwrite", regression_offset(anatomy, name), value, width)]
    path = tmp_path / "case.gguf"
    assert_clean_outcome(path, apply(anatomy.content, edits))
    with pytest.raises(GGUFError):  # each of these must be refused, not loaded
        load_all(path)
