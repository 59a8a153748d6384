"""Tensors whose data overlap by only a few bytes: aligned offsets, a tensor whose size is not a
multiple of the alignment, and the next tensor starting inside its last bytes."""

from __future__ import annotations

import struct
from pathlib import Path

from ds4mlx.gguf import GGUFError, open_gguf

import pytest
from gguf_anatomy import ALIGNMENT, Anatomy


def test_a_sixteen_byte_overlap_is_refused(anatomy: Anatomy, tmp_path: Path):
    # The file holds a (256 bytes), b (256), c (272: Q8_0 blocks of 34 bytes), in that order.
    # Put c first and a where c was: c's last 16 bytes are b's first.
    relative = {
        name: start - anatomy.data_offset for name, (start, _) in anatomy.tensor_data.items()
    }
    assert anatomy.tensor_data["c.weight"][1] % ALIGNMENT == 16
    assert relative["b.weight"] == relative["a.weight"] + 256
    content = bytearray(anatomy.content)
    struct.pack_into("<Q", content, anatomy.tensor_infos["c.weight"].offset, relative["a.weight"])
    struct.pack_into("<Q", content, anatomy.tensor_infos["a.weight"].offset, relative["c.weight"])
    path = tmp_path / "overlap.gguf"
    path.write_bytes(bytes(content))
    with pytest.raises(GGUFError, match=r"tensors 'c\.weight' .* and 'b\.weight' .* overlap"):
        open_gguf(path)
