"""KV snapshot files: exact restore for both architectures, refusal of files that cannot be used
(another model, another format version, truncated, corrupt, classes that changed), and the
generic state walk."""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass, field
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
from ds4mlx.engine.kvcache.snapshot_file import (
    _checksum,
    header_tokens,
    read_header,
    snapshot_nbytes,
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


def _rewrite_metadata(path: Path, change, entry: str = "__metadata__") -> None:
    """Rewrite one entry of a snapshot's header, its metadata by default (keeping its arrays'
    bytes)."""
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    change(header[entry])
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


def test_a_module_whose_name_only_starts_like_ds4mlx_is_never_imported(tmp_path, monkeypatch):
    """Trust is the ds4mlx package (``ds4mlx.``), not every module named ``ds4mlx...``: a
    dataclass in an importable ``ds4mlx_planted`` module is refused by name, never imported."""
    (tmp_path / "ds4mlx_planted.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass Payload:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ds4mlx_planted", raising=False)
    with pytest.raises(StateFormatError, match="outside ds4mlx: ds4mlx_planted:Payload"):
        decode_state({"class": "ds4mlx_planted:Payload", "fields": {}}, {})
    assert "ds4mlx_planted" not in sys.modules


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


# ------------------------------------------------------------ files and trees, without a model


def _small_snapshot() -> Snapshot:
    """A state the codec walks like a model's (arrays in containers), with no ``pos``."""
    return Snapshot([mx.arange(6, dtype=mx.float32), (np.arange(3, dtype=np.int64), None)], (4, 5))


def test_a_small_state_round_trips_through_a_file(tmp_path):
    path = tmp_path / "small.safetensors"
    write_snapshot(path, _small_snapshot(), "f" * 64)
    back = read_snapshot(path, "f" * 64)
    assert back.tokens == (4, 5)
    assert np.array_equal(np.array(back.state[0]), np.arange(6))
    assert back.state[1][0].tolist() == [0, 1, 2] and back.state[1][1] is None
    assert snapshot_nbytes(_small_snapshot()) == 6 * 4 + 3 * 8


def test_a_snapshot_file_name_must_end_with_the_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"^a snapshot file's name ends with \.safetensors"):
        write_snapshot(tmp_path / "state.bin", _small_snapshot(), "f" * 64)
    assert not any(tmp_path.iterdir())


def _write_header(path: Path, header_json: bytes, body: bytes = b"") -> None:
    path.write_bytes(len(header_json).to_bytes(8, "little") + header_json + body)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"[1, 2]", "not a snapshot file"),
        (b"{not json", "cannot be read"),
        (b'{"a0": {"dtype": "F32"}}', "not a ds4mlx-kv snapshot"),
        (b'{"__metadata__": {"format": "other", "version": "1"}}', "not a ds4mlx-kv snapshot"),
        (
            b'{"__metadata__": {"format": "ds4mlx-kv", "version": "1"}, "a0": {"data_offsets": 3}}',
            "malformed header",
        ),
        (
            b'{"__metadata__": {"format": "ds4mlx-kv", "version": "1"}, "a0": {}}',
            "malformed header",
        ),
    ],
)
def test_a_header_that_is_not_a_snapshot_is_refused(tmp_path, header, message):
    path = tmp_path / "x.safetensors"
    _write_header(path, header)
    with pytest.raises(SnapshotFileError, match=message):
        read_header(path)


def test_a_header_without_arrays_describes_its_whole_file(tmp_path):
    path = tmp_path / "x.safetensors"
    _write_header(path, b'{"__metadata__": {"format": "ds4mlx-kv", "version": "1"}}')
    assert read_header(path) == {"format": "ds4mlx-kv", "version": "1"}


@pytest.mark.parametrize("metadata", [{}, {"tokens": "[1,"}])
def test_a_header_without_a_readable_token_list_is_refused(metadata):
    with pytest.raises(SnapshotFileError, match="malformed token list: "):
        header_tokens(Path("x.safetensors"), metadata)


def test_a_state_tree_naming_a_missing_array_is_refused_when_read(tmp_path):
    """A well-formed file (checksum right) whose tree refers to an array it does not hold."""
    path = tmp_path / "x.safetensors"
    write_snapshot(path, _small_snapshot(), "f" * 64)
    arrays = mx.load(str(path))
    mx.eval(*arrays.values())  # read now: the file is rewritten below
    _rewrite_metadata(path, lambda meta: meta.update(state=json.dumps({"array": "a7"})))
    _rewrite_metadata(path, lambda meta: meta.update(checksum=_checksum(meta, arrays)))
    with pytest.raises(SnapshotFileError, match="missing array 'a7'"):
        read_snapshot(path, "f" * 64)


@dataclass
class _Derived:
    """A cache class with a field its constructor derives (``init=False``)."""

    size: int
    doubled: int = field(init=False)

    def __post_init__(self) -> None:
        self.doubled = 2 * self.size


def test_a_derived_field_comes_back_as_it_was_saved(monkeypatch):
    state = _Derived(3)
    state.doubled = 7  # changed after construction: the saved value, not a recomputed one
    tree, arrays = encode_state(state)
    monkeypatch.setattr("ds4mlx.engine.kvcache.state_codec._TRUSTED_PREFIX", "")
    back = decode_state(json.loads(json.dumps(tree)), arrays)
    assert (back.size, back.doubled) == (3, 7)


def test_scalars_and_containers_keep_their_kinds():
    state = {
        "flags": [True, np.bool_(False)],
        "counts": (np.int64(3), np.float16(0.5), 2.5, "name"),
        "nested": [[1], (2,)],
    }
    tree, arrays = encode_state(state)
    back = decode_state(json.loads(json.dumps(tree)), arrays)
    assert back == state
    assert back["flags"][0] is True and type(back["flags"][1]) is np.bool_
    assert [type(v) for v in back["counts"]] == [np.int64, np.float16, float, str]
    assert type(back["nested"][0]) is list and type(back["nested"][1]) is tuple


@pytest.mark.parametrize(
    ("qualified", "message"),
    [
        ("ds4mlx.engine.session:supports_batched_decode", "is no longer a dataclass"),
        ("ds4mlx.engine.session:Session", "is no longer a dataclass"),
        # An instance of a dataclass is not the class: never called, whatever its fields.
        ("ds4mlx.engine.tokenizer:_GPT2", "is no longer a dataclass"),
        ("ds4mlx.engine.session:", "outside ds4mlx"),
        ("ds4mlx:", "outside ds4mlx"),
        ("ds4mlx.engine.no_such_module:Cache", "no longer exists"),
        ("ds4mlx.engine.session:Snapshot.missing", "no longer exists"),
    ],
)
def test_a_state_naming_something_that_is_not_a_ds4mlx_dataclass_is_refused(qualified, message):
    with pytest.raises(StateFormatError, match=message):
        decode_state({"class": qualified, "fields": {}}, {})


@pytest.mark.parametrize(
    "node",
    [
        {"unknown": 1},
        {"array": "a0", "dtype": "f32", "shape": [1]},  # more keys than the codec writes
        [1, 2],
        {},
        {"array": 3},
        {"array": "a1"},
    ],
)
def test_a_node_the_codec_did_not_write_is_refused(node):
    with pytest.raises(StateFormatError, match="unexpected node|missing array"):
        decode_state(node, {"a0": mx.zeros(1)})


def test_a_header_that_reshapes_an_array_fails_the_checksum(tmp_path):
    # The same bytes as 2 x 3: the checksum covers each array's shape, not only its bytes.
    path = tmp_path / "x.safetensors"
    write_snapshot(path, _small_snapshot(), "f" * 64)
    _rewrite_metadata(path, lambda entry: entry.update(shape=[2, 3]), "a0")
    assert read_header(path)["format"] == "ds4mlx-kv"  # the header itself still reads
    with pytest.raises(SnapshotFileError, match="checksum mismatch"):
        read_snapshot(path, "f" * 64)


def test_an_array_type_mlx_cannot_load_is_a_snapshot_error(tmp_path):
    path = tmp_path / "x.safetensors"
    write_snapshot(path, _small_snapshot(), "f" * 64)
    _rewrite_metadata(path, lambda entry: entry.update(dtype="Q9"), "a0")
    with pytest.raises(SnapshotFileError, match=r"x\.safetensors: cannot be read: .*Q9"):
        read_snapshot(path, "f" * 64)


@pytest.mark.parametrize("size", [0, 1, 7])
def test_a_file_shorter_than_the_header_length_is_truncated(tmp_path, size):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x01" * size)
    with pytest.raises(SnapshotFileError, match=rf"x\.safetensors: truncated \({size} bytes\)$"):
        read_header(path)


def test_eight_bytes_of_header_length_alone_name_their_missing_header(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes((2).to_bytes(8, "little"))
    with pytest.raises(SnapshotFileError, match=r"header of 2 bytes in a file of 8\)$"):
        read_header(path)


class _Outer:
    @dataclass
    class Inner:
        """A cache class nested in another: its qualified name has a dot."""

        width: int


def test_a_nested_dataclass_comes_back(monkeypatch):
    tree, arrays = encode_state([_Outer.Inner(5)])
    assert tree["list"][0]["class"].endswith(":_Outer.Inner")
    monkeypatch.setattr("ds4mlx.engine.kvcache.state_codec._TRUSTED_PREFIX", "")
    assert decode_state(json.loads(json.dumps(tree)), arrays) == [_Outer.Inner(5)]


def test_a_dataclass_itself_in_a_state_is_refused_not_walked():
    with pytest.raises(StateFormatError, match="^a session state holding type cannot be saved$"):
        encode_state({"kind": _Derived})
