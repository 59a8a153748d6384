"""Bounded expert reads: corrupt placements and truncated files give clear GGUFErrors."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace

from ds4mlx.experts import ExpertReader, ExpertTensor
from ds4mlx.gguf import GGUFError, open_gguf

import numpy as np
import pytest
from expert_helpers import TINY
from gguf import GGMLQuantizationType as T

NAME = "blk.1.ffn_down_exps.weight"


def tensor_and_reader(path=TINY):
    gguf = open_gguf(path)
    reader = ExpertReader(path, "native")
    return gguf, ExpertTensor.from_info(path, gguf.layout.tensors[NAME], reader.file_size), reader


def test_expert_bytes_match_the_memory_map():
    gguf, tensor, reader = tensor_and_reader()
    for expert in (0, tensor.n_experts - 1):
        assert np.array_equal(
            reader.read_bytes(tensor, expert), np.asarray(gguf.raw(NAME)[expert]).reshape(-1)
        )
    assert reader.bytes_read == 2 * tensor.expert_nbytes
    reader.close()


def test_expert_out_of_range():
    _, tensor, reader = tensor_and_reader()
    with pytest.raises(GGUFError, match="out of range"):
        reader.read_bytes(tensor, tensor.n_experts)
    reader.close()


def test_corrupt_offset_or_size_is_refused_before_reading():
    gguf, _, reader = tensor_and_reader()
    info = gguf.layout.tensors[NAME]
    with pytest.raises(GGUFError, match="past the end of the file"):
        ExpertTensor.from_info(
            TINY, replace(info, file_offset=reader.file_size - 10), reader.file_size
        )
    with pytest.raises(GGUFError, match="holds .* bytes, expected"):
        ExpertTensor.from_info(TINY, replace(info, nbytes=info.nbytes - 1), reader.file_size)
    tensor = ExpertTensor.from_info(TINY, info, reader.file_size)
    with pytest.raises(GGUFError, match="outside the file"):
        reader.read_bytes(replace(tensor, file_offset=reader.file_size), 0)
    reader.close()


def test_a_tensor_ending_exactly_at_the_end_of_the_file_is_accepted():
    """The last byte of the file may be the tensor's last (fresh6's
    reader_expert_tensor_ending_at_eof_refused); one byte further is refused."""
    gguf, _, reader = tensor_and_reader()
    info = gguf.layout.tensors[NAME]
    at_end = replace(info, file_offset=reader.file_size - info.nbytes)
    assert ExpertTensor.from_info(TINY, at_end, reader.file_size).file_offset == at_end.file_offset
    with pytest.raises(GGUFError, match="past the end of the file"):
        ExpertTensor.from_info(
            TINY, replace(at_end, file_offset=at_end.file_offset + 1), reader.file_size
        )
    reader.close()


@pytest.mark.parametrize(("qtype", "dtype"), [(T.F32, np.float32), (T.F16, np.float16)])
def test_dense_experts_are_viewed_as_their_floats(qtype, dtype):
    """F32 and F16 experts come back typed, in their [out, in] shape, as GGUFReader maps them
    (fresh6's reader_f16_experts_as_raw_bytes); quantized ones as rows of block bytes."""
    values = np.arange(12, dtype=dtype).reshape(3, 4)
    tensor = ExpertTensor("x", qtype, 1, (3, 4), 0, values.nbytes)
    view = tensor.raw_view(np.frombuffer(values.tobytes(), dtype=np.uint8).copy())
    assert view.dtype == dtype and view.shape == (3, 4) and np.array_equal(view, values)


def test_truncated_file_is_a_short_read(tmp_path):
    path = tmp_path / "tiny.gguf"
    shutil.copy(TINY, path)
    _, tensor, reader = tensor_and_reader(path)
    end = tensor.file_offset + tensor.expert_nbytes // 2
    os.truncate(path, end)  # shrunk after opening: the checks above passed
    with pytest.raises(GGUFError, match="short read"):
        reader.read_bytes(tensor, 0)
    reader.close()


def test_drop_page_cache_is_supported_on_linux():
    _, _, reader = tensor_and_reader()
    assert reader.drop_page_cache() == hasattr(os, "posix_fadvise")
    reader.close()


def test_a_two_dimensional_expert_tensor_is_a_stack_of_one():
    """Writers drop a trailing ne of 1: [out, in] is one expert of that shape."""
    gguf, tensor, reader = tensor_and_reader()
    info = gguf.layout.tensors[NAME]
    single = replace(info, ggml_dims=info.ggml_dims[:2], nbytes=tensor.expert_nbytes)
    one = ExpertTensor.from_info(TINY, single, reader.file_size)
    assert (one.n_experts, one.expert_shape, one.expert_nbytes) == (
        1,
        tensor.expert_shape,
        tensor.expert_nbytes,
    )
    reader.close()


@pytest.mark.parametrize("dims", [(256, 256, 0), (256, 0, 8), (256,), (256, 256, 8, 1)])
def test_a_tensor_that_is_not_a_stack_of_experts_is_refused(dims):
    gguf, _, reader = tensor_and_reader()
    info = replace(gguf.layout.tensors[NAME], ggml_dims=dims)
    with pytest.raises(GGUFError, match=r"expected \[experts, out, in\]"):
        ExpertTensor.from_info(TINY, info, reader.file_size)
    reader.close()


def test_an_unsupported_type_or_partial_blocks_are_refused():
    gguf, _, reader = tensor_and_reader()
    info = gguf.layout.tensors[NAME]
    with pytest.raises(GGUFError, match=f"unsupported tensor type I8 in tensor '{NAME}'"):
        ExpertTensor.from_info(TINY, replace(info, qtype=T.I8), reader.file_size)
    with pytest.raises(GGUFError, match="rows of 255 values are not whole Q4_K blocks of 256"):
        ExpertTensor.from_info(TINY, replace(info, ggml_dims=(255, 256, 8)), reader.file_size)
    reader.close()


def test_an_expert_before_the_start_of_the_file_is_refused():
    _, tensor, reader = tensor_and_reader()
    with pytest.raises(GGUFError, match="outside the file"):
        reader.read_bytes(replace(tensor, file_offset=-tensor.expert_nbytes), 0)
    assert reader.reads == 0
    reader.close()


def test_read_counters_add_up_over_reads(monkeypatch):
    """Bytes, reads and seconds accumulate (each read here takes one fake second)."""
    from ds4mlx.experts import reader as reader_module

    clock = iter(range(100))
    monkeypatch.setattr(reader_module.time, "perf_counter", lambda: float(next(clock)))
    _, tensor, reader = tensor_and_reader()
    for expert in (0, 1, 2):
        reader.read_bytes(tensor, expert)
    assert (reader.bytes_read, reader.reads, reader.read_seconds) == (
        3 * tensor.expert_nbytes,
        3,
        3.0,
    )
    reader.close()


def test_closing_twice_is_harmless():
    _, _, reader = tensor_and_reader()
    reader.close()
    reader.close()
    assert reader._fd == -1


def test_drop_page_cache_says_no_where_the_platform_cannot(monkeypatch):
    _, _, reader = tensor_and_reader()
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    assert reader.drop_page_cache() is False
    reader.close()
