"""One session snapshot in one file: safetensors arrays, with a header that says what they are.

The header (safetensors metadata) carries the format name and version, the fingerprint of the
model file the state was computed with, the token prefix the state encodes, the state's tree
(``state_codec``) and a SHA-256 checksum over all of it and the arrays' bytes. Writing is
atomic: a temporary file in the same folder, flushed to the disk, then renamed over the target,
so a crash or a full disk never leaves a half-written snapshot under a snapshot's name. Reading
refuses a file of another model, quantization or format version, a truncated one or one whose
checksum does not match, with a ``SnapshotFileError`` that says which.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import uuid
from pathlib import Path
from typing import Any

from ds4mlx.engine.kvcache.state_codec import StateFormatError, decode_state, encode_state
from ds4mlx.engine.session import Snapshot

import mlx.core as mx

FORMAT = "ds4mlx-kv"
FORMAT_VERSION = 1
SUFFIX = ".safetensors"
# Bytes of each tensor's data, and of the file's start and end, folded into a model's
# fingerprint: two files with the same tensor layout but other weights must not share caches.
_SAMPLE_BYTES = 4096
_EDGE_BYTES = 1 << 20
_MAX_HEADER_BYTES = 1 << 30


class SnapshotFileError(Exception):
    """A snapshot file that cannot be used here; the message says why."""


def model_fingerprint(model: Any) -> str:
    """The identity of a loaded model (``api.LoadedModel``) as far as its states go: the
    architecture, how its weights are held (``weights_dtype``), the tensors' names, types and
    shapes, samples of the file's bytes, and the source of the network's package (a change to
    how the model computes invalidates what an older version cached)."""
    digest = hashlib.sha256()
    network = type(model.network)
    digest.update(
        f"{FORMAT} {FORMAT_VERSION} {model.gguf.arch} {model.weights_dtype} "
        f"{network.__module__}.{network.__qualname__}\n".encode()
    )
    source = inspect.getsourcefile(network)
    if source is not None:
        for module in sorted(Path(source).parent.glob("*.py")):
            digest.update(module.name.encode() + b"\0" + module.read_bytes())
    path = Path(model.path)
    size = path.stat().st_size
    digest.update(str(size).encode())
    with open(path, "rb") as file:
        digest.update(file.read(_EDGE_BYTES))
        file.seek(max(0, size - _EDGE_BYTES))
        digest.update(file.read(_EDGE_BYTES))
        for info in model.gguf.layout.tensors.values():
            digest.update(
                f"{info.name} {int(info.qtype)} {info.ggml_dims} {info.nbytes}\n".encode()
            )
            file.seek(info.file_offset)
            digest.update(file.read(min(info.nbytes, _SAMPLE_BYTES)))
    return digest.hexdigest()


def snapshot_nbytes(snapshot: Snapshot) -> int:
    """The bytes of the arrays a snapshot holds (about its size in memory and on disk)."""
    _, arrays = encode_state(snapshot.state)
    return sum(array.nbytes for array in arrays.values())


def write_snapshot(path: Path, snapshot: Snapshot, fingerprint: str) -> int:
    """Write ``snapshot`` to ``path`` atomically, readable by its owner only (0600); returns the
    file's size. OSError (a full disk included) leaves no file behind; StateFormatError for a
    state it cannot describe."""
    if not path.name.endswith(SUFFIX):
        raise ValueError(f"a snapshot file's name ends with {SUFFIX}: {path}")
    tree, arrays = encode_state(snapshot.state)
    mx.eval(*arrays.values())
    metadata = {
        "format": FORMAT,
        "version": str(FORMAT_VERSION),
        "fingerprint": fingerprint,
        "tokens": json.dumps(list(snapshot.tokens)),
        "state": json.dumps(tree),
    }
    metadata["checksum"] = _checksum(metadata, arrays)
    # MLX appends the suffix to a name without it: the temporary name keeps it at the end.
    temporary = path.with_name(f".{path.name[: -len(SUFFIX)]}.{uuid.uuid4().hex}.tmp{SUFFIX}")
    try:
        # The tokens are the conversation's text: readable by its owner only. Created so before
        # MLX writes into it (MLX keeps the mode of a file it truncates), not chmod-ed after.
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            mx.save_safetensors(str(temporary), arrays, metadata)
        except RuntimeError as exc:  # MLX reports a failed write (a full disk) this way
            raise OSError(f"cannot write {temporary}: {exc}") from exc
        with open(temporary, "rb") as file:
            os.fsync(file.fileno())
        os.replace(temporary, path)
        _fsync_folder(path.parent)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def read_header(path: Path) -> dict[str, str]:
    """A snapshot file's metadata, read without its arrays; SnapshotFileError for a file that
    is not a whole snapshot of this format version (the arrays' bytes are checked on load)."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            prefix = file.read(8)
            if len(prefix) < 8:
                raise SnapshotFileError(f"{path}: truncated ({size} bytes)")
            length = int.from_bytes(prefix, "little")
            if length > min(size - 8, _MAX_HEADER_BYTES):
                raise SnapshotFileError(
                    f"{path}: truncated or not a snapshot (header of "
                    f"{length} bytes in a file of {size})"
                )
            header = json.loads(file.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotFileError(f"{path}: cannot be read: {exc}") from exc
    if not isinstance(header, dict):
        raise SnapshotFileError(f"{path}: not a snapshot file")
    metadata = header.pop("__metadata__", None)
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise SnapshotFileError(f"{path}: not a {FORMAT} snapshot")
    if metadata.get("version") != str(FORMAT_VERSION):
        raise SnapshotFileError(
            f"{path}: format version {metadata.get('version')}, this version reads {FORMAT_VERSION}"
        )
    try:
        end = max((int(entry["data_offsets"][1]) for entry in header.values()), default=0)
    except (TypeError, KeyError, IndexError, ValueError) as exc:
        raise SnapshotFileError(f"{path}: malformed header: {exc}") from exc
    if 8 + length + end != size:
        raise SnapshotFileError(
            f"{path}: truncated ({size} bytes, the header describes {8 + length + end})"
        )
    return metadata


def header_tokens(path: Path, metadata: dict[str, str]) -> tuple[int, ...]:
    try:
        tokens = json.loads(metadata["tokens"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise SnapshotFileError(f"{path}: malformed token list: {exc}") from exc
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise SnapshotFileError(f"{path}: malformed token list")
    return tuple(tokens)


def read_snapshot(path: Path, fingerprint: str) -> Snapshot:
    """The snapshot in ``path``, checked whole; SnapshotFileError when it cannot be used with
    the model of ``fingerprint``."""
    metadata = read_header(path)
    if metadata.get("fingerprint") != fingerprint:
        raise SnapshotFileError(f"{path}: written for another model file or quantization")
    tokens = header_tokens(path, metadata)
    try:
        arrays = mx.load(str(path))
    except (RuntimeError, ValueError, OSError) as exc:
        raise SnapshotFileError(f"{path}: cannot be read: {exc}") from exc
    assert isinstance(arrays, dict)
    try:
        matches = metadata.get("checksum") == _checksum(metadata, arrays)
    except (RuntimeError, ValueError, TypeError) as exc:  # arrays MLX cannot read back
        raise SnapshotFileError(f"{path}: cannot be read: {exc}") from exc
    if not matches:
        raise SnapshotFileError(f"{path}: checksum mismatch (the file is corrupt)")
    try:
        state = decode_state(json.loads(metadata["state"]), arrays)
    except (StateFormatError, KeyError, TypeError, ValueError) as exc:
        raise SnapshotFileError(f"{path}: {exc}") from exc
    if getattr(state, "pos", len(tokens)) != len(tokens):
        raise SnapshotFileError(
            f"{path}: the state is at position {state.pos}, the file names {len(tokens)} tokens"
        )
    return Snapshot(state, tokens)


def _checksum(metadata: dict[str, str], arrays: dict[str, mx.array]) -> str:
    digest = hashlib.sha256()
    digest.update(
        json.dumps({k: v for k, v in metadata.items() if k != "checksum"}, sort_keys=True).encode()
    )
    for name in sorted(arrays):
        array = arrays[name]
        digest.update(f"{name} {array.dtype} {array.shape}\n".encode())
        digest.update(bytes(memoryview(array)))
    return digest.hexdigest()


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform allows opening a folder)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
