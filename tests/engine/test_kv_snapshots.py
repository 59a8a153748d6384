"""KV snapshot files: exact restore for both architectures, refusal of files that cannot be used
(another model, another format version, truncated, corrupt, classes that changed), and the
generic state walk."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import ds4mlx
from ds4mlx.engine.kvcache import (
    DiskTier,
    PromptCache,
    SnapshotFileError,
    StateFormatError,
    model_fingerprint,
    read_snapshot,
    write_snapshot,
)
from ds4mlx.engine.kvcache.state_codec import decode_state, encode_state
from ds4mlx.engine.session import Snapshot

import mlx.core as mx
import numpy as np
import pytest

ASSETS = Path(__file__).resolve().parents[2] / "assets"
PREFIX = [(7 * i + 3) % 200 + 5 for i in range(37)]  # 37: a partial compression block
SUFFIX = [11, 42, 9, 100]


def _model(name: str):
    path = ASSETS / name
    if not path.is_file():
        pytest.skip(f"{path} is not built")
    return ds4mlx.load_model(path)


@pytest.fixture(scope="module", params=["ds4-tiny.gguf", "glm-tiny.gguf"])
def model(request):
    return _model(request.param)


@pytest.fixture(scope="module")
def fingerprint(model) -> str:
    return model_fingerprint(model)


@pytest.fixture
def saved(model, fingerprint, tmp_path) -> tuple[Path, Snapshot]:
    previous = os.umask(0o022)  # the usual umask, under which open() makes world-readable files
    try:
        return _saved(model, fingerprint, tmp_path)
    finally:
        os.umask(previous)


def _saved(model, fingerprint, tmp_path) -> tuple[Path, Snapshot]:
    session = model.new_session()
    session.feed(PREFIX)
    snapshot = session.snapshot()
    path = tmp_path / "state.safetensors"
    write_snapshot(path, snapshot, fingerprint)
    return path, snapshot


def test_restored_state_continues_exactly_like_a_fresh_prefill(model, fingerprint, saved):
    path, _ = saved
    fresh = model.new_session()
    fresh.feed(PREFIX)
    expected = fresh.feed(SUFFIX)
    restored = model.new_session()
    restored.restore(read_snapshot(path, fingerprint))
    assert restored.tokens == PREFIX
    assert np.array_equal(restored.feed(SUFFIX), expected)
    # Decode steps after it too (one token at a time: another code path than the prefill).
    for token in (5, 6, 7):
        assert np.array_equal(restored.feed([token]), fresh.feed([token]))


def test_a_file_of_another_model_is_refused(saved):
    path, _ = saved
    with pytest.raises(SnapshotFileError, match="another model"):
        read_snapshot(path, "0" * 64)


def test_the_fingerprint_tells_models_and_quantizations_apart():
    ds4, glm = _model("ds4-tiny.gguf"), _model("glm-tiny.gguf")
    assert model_fingerprint(ds4) != model_fingerprint(glm)
    # The default holds the file's blocks (native) with Metal or the CPU's block kernels.
    other = "native" if ds4.weights_dtype == "f32" else "f32"
    held_otherwise = ds4mlx.load_model(ds4.path, weights_dtype=other)
    assert model_fingerprint(held_otherwise) != model_fingerprint(ds4)
    assert model_fingerprint(ds4) == model_fingerprint(ds4mlx.load_model(ds4.path))


def test_a_truncated_file_is_refused(saved, fingerprint):
    path, _ = saved
    data = path.read_bytes()
    for size in (0, 5, len(data) // 3, len(data) - 1):
        path.write_bytes(data[:size])
        with pytest.raises(SnapshotFileError, match="truncated|cannot be read|not a"):
            read_snapshot(path, fingerprint)


def test_a_file_with_bytes_past_its_arrays_is_refused(saved, fingerprint):
    # A file longer than its header describes was not written whole by us (or was appended to).
    path, _ = saved
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(SnapshotFileError, match="the header describes"):
        read_snapshot(path, fingerprint)


def test_a_corrupt_file_is_refused(saved, fingerprint):
    path, _ = saved
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40  # a bit of an array
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotFileError, match="checksum"):
        read_snapshot(path, fingerprint)


def _rewrite_metadata(path: Path, change) -> None:
    """Rewrite a snapshot's header (keeping its arrays' bytes)."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    change(header["__metadata__"])
    encoded = json.dumps(header).encode()
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + length :])


def test_another_format_version_and_edited_headers_are_refused(saved, fingerprint):
    path, _ = saved
    original = path.read_bytes()
    _rewrite_metadata(path, lambda meta: meta.update(version="999"))
    with pytest.raises(SnapshotFileError, match="format version 999, this version reads"):
        read_snapshot(path, fingerprint)
    path.write_bytes(original)
    _rewrite_metadata(path, lambda meta: meta.pop("version"))  # a file from before versions
    with pytest.raises(SnapshotFileError, match="format version None, this version reads"):
        read_snapshot(path, fingerprint)
    path.write_bytes(original)
    # Tokens edited in the header: the checksum covers them.
    _rewrite_metadata(path, lambda meta: meta.update(tokens=json.dumps(PREFIX[:-1] + [1])))
    with pytest.raises(SnapshotFileError, match="checksum"):
        read_snapshot(path, fingerprint)


def test_a_state_that_is_not_at_the_last_token_is_refused(model, fingerprint, tmp_path):
    """A state behind or ahead of its token list (a lazy feed not yet confirmed, an edit of
    either) would continue from the wrong place: the file is refused when read, and the prompt
    cache never keeps such a snapshot (fresh6's snapshot_state_behind_its_tokens_read and
    prompt_cache_state_behind_its_tokens_cached)."""
    session = model.new_session()
    session.feed(PREFIX)
    state = session.snapshot().state
    for tokens in (tuple(PREFIX) + (SUFFIX[0],), tuple(PREFIX[:-1])):
        path = tmp_path / f"state-{len(tokens)}.safetensors"
        write_snapshot(path, Snapshot(state, tokens), fingerprint)
        with pytest.raises(SnapshotFileError, match=f"position {len(PREFIX)}, the file names"):
            read_snapshot(path, fingerprint)
        cache = PromptCache(
            1 << 30, DiskTier(tmp_path / f"disk-{len(tokens)}", 1 << 30, fingerprint)
        )
        cache.remember(Snapshot(state, tokens))
        cache.persist(Snapshot(state, tokens))
        assert cache.candidates(list(tokens) + [1], longer_than=0) == []
    cache.remember(Snapshot(state, tuple(PREFIX)))  # at its last token: kept
    assert [c.tokens for c in cache.candidates(PREFIX + [1], longer_than=0)] == [tuple(PREFIX)]


def test_no_file_is_left_when_the_write_fails(model, fingerprint, tmp_path):
    session = model.new_session()
    session.feed(PREFIX[:9])
    missing = tmp_path / "gone" / "state.safetensors"  # its folder does not exist
    with pytest.raises(OSError):
        write_snapshot(missing, session.snapshot(), fingerprint)
    assert not any(tmp_path.rglob("*.safetensors"))


@dataclass(frozen=True)
class _Ring:
    """A cache class as a refactoring might make it: a fixed-shape buffer and counters."""

    buffer: mx.array
    head: int
    filled: tuple[int, ...]
    extra: dict | None = None


@dataclass(frozen=True)
class _Changed:
    buffer: mx.array
    head: int


def test_the_state_walk_is_generic_and_refuses_changed_classes(monkeypatch):
    ring = _Ring(
        mx.arange(12, dtype=mx.float32).reshape(3, 4),
        2,
        (1, 2),
        {"scale": np.float32(0.5), "rows": np.arange(3, dtype=np.int32)},
    )
    tree, arrays = encode_state([ring, None, 7])
    # This test module is not under ds4mlx: let the codec trust it for the round trip.
    monkeypatch.setattr("ds4mlx.engine.kvcache.state_codec._TRUSTED_PREFIX", "")
    back = decode_state(json.loads(json.dumps(tree)), arrays)
    assert back[1:] == [None, 7]
    assert isinstance(back[0], _Ring) and back[0].head == 2 and back[0].filled == (1, 2)
    assert np.array_equal(np.array(back[0].buffer), np.array(ring.buffer))
    assert back[0].extra["scale"] == np.float32(0.5)
    assert np.array_equal(back[0].extra["rows"], np.arange(3))
    # Each array comes back as the kind it was (fresh6's state_codec_ndarray_comes_back_as_mlx).
    assert isinstance(back[0].extra["rows"], np.ndarray) and back[0].extra["rows"].dtype == np.int32
    assert isinstance(back[0].buffer, mx.array)
    # The class lost a field since the file was written: refused by name.
    node = tree["list"][0]
    node["class"] = node["class"].replace("_Ring", "_Changed")
    with pytest.raises(StateFormatError, match="fields of .*_Changed changed"):
        decode_state(tree, arrays)
    node["class"] = f"{__name__}:_Gone"
    with pytest.raises(StateFormatError, match="no longer exists"):
        decode_state(tree, arrays)


def test_classes_outside_ds4mlx_are_never_imported():
    tree = {"class": "os:system", "fields": {}}
    with pytest.raises(StateFormatError, match="outside ds4mlx"):
        decode_state(tree, {})
    with pytest.raises(StateFormatError, match="cannot be saved"):
        encode_state(object())


def test_a_state_dict_keyed_by_numbers_is_refused_not_saved_changed():
    """JSON would write the key 3 as "3": such a state would come back keyed differently, so
    it is refused when saved (the prompt cache then turns itself off), never written."""
    by_name = {"rows": 3}
    tree, arrays = encode_state(by_name)
    assert decode_state(json.loads(json.dumps(tree)), arrays) == by_name
    for keys in ({3: "row"}, {"rows": 1, 2: "two"}):
        with pytest.raises(StateFormatError, match="non-string keys"):
            encode_state([keys])


def test_a_saved_state_is_readable_by_its_owner_only(saved):
    # A conversation's saved state (``chat-*.kv.safetensors``) holds its token ids: its text.
    path, _ = saved
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
