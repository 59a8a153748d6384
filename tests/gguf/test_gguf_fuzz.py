"""Random corruption or truncation of a valid file: it opens (and its tensors load) or it fails
with GGUFError; nothing else may escape."""

from __future__ import annotations

from pathlib import Path

from ds4mlx.gguf import GGUFError, open_gguf

import pytest
from gguf_anatomy import Anatomy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def corruptions(size: int, header_size: int) -> st.SearchStrategy:
    # Mostly hit the header, metadata and tensor infos, where bytes steer the parser.
    position = st.one_of(st.integers(0, header_size - 1), st.integers(0, size - 1))
    edits = st.lists(st.tuples(position, st.integers(0, 255)), min_size=1, max_size=6)
    truncation = st.one_of(st.none(), st.integers(0, size))
    return st.tuples(edits, truncation)


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "fuzzed.gguf"


@settings(
    max_examples=150,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the checkout
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_corrupted_file_opens_or_raises_gguf_error(data, anatomy: Anatomy, fuzz_path: Path):
    edits, truncation = data.draw(corruptions(len(anatomy.content), anatomy.data_offset))
    content = bytearray(anatomy.content)
    for position, value in edits:
        content[position] = value
    fuzz_path.write_bytes(bytes(content[:truncation]))
    try:
        gguf_file = open_gguf(fuzz_path)
        gguf_file.arch  # noqa: B018 - decoding a string value must not escape as UnicodeDecodeError
        for name in gguf_file.tensor_names():
            for mode in ("f32", "native"):
                gguf_file.load_weight(name, mode)
    except GGUFError as exc:
        assert str(fuzz_path) in str(exc)
