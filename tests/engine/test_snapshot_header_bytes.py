"""A snapshot file's header that is not text: refused as a snapshot error, like any other file
that is not a snapshot, never a bare decoding error out of the cache."""

from __future__ import annotations

from ds4mlx.engine.kvcache.snapshot_file import SnapshotFileError, read_header

import pytest


def test_a_header_of_invalid_utf8_is_a_snapshot_error(tmp_path):
    header = b'{"k": "\xff\xfe"}'
    path = tmp_path / "kv.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    with pytest.raises(SnapshotFileError, match="cannot be read"):
        read_header(path)
