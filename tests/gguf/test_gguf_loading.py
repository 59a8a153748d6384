"""What ``GGUFFile`` does around a tensor's conversion: the load counts ``ds4 -v`` reports, the
progress callback, the file pages it unmaps, and the word when the CPU's blocks cannot be mapped;
and metadata shapes the valid fixture lacks (arrays of arrays), and failures past validation."""

from __future__ import annotations

import importlib.metadata
import itertools
import mmap
from pathlib import Path
from types import SimpleNamespace

from ds4mlx.gguf import GGUFError, MetaValue, open_gguf, quants, write_gguf
from ds4mlx.gguf import reader as reader_module

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

C_WEIGHT_BYTES = 4 * 2 * 34  # the fixture's c.weight: Q8_0 [4, 64]


class LoadLog:
    def __init__(self) -> None:
        self.loaded: list[tuple[str, int]] = []

    def __call__(self, name: str, nbytes: int) -> None:
        self.loaded.append((name, nbytes))


def test_a_converted_tensor_is_counted_timed_and_reported(valid_gguf: Path, monkeypatch):
    clock = itertools.count(start=10, step=1.5)  # each conversion takes 1.5 "seconds"
    monkeypatch.setattr(reader_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    gguf_file = open_gguf(valid_gguf)
    log = LoadLog()
    gguf_file.on_tensor_loaded = log
    gguf_file.load_weight("c.weight", "f32")
    assert (gguf_file.converted_tensors, gguf_file.mapped_tensors) == (1, 0)
    assert gguf_file.conversion_seconds == 1.5
    gguf_file.load_weight("a.weight", "f32")
    assert (gguf_file.converted_tensors, gguf_file.conversion_seconds) == (2, 3.0)
    assert log.loaded == [("c.weight", C_WEIGHT_BYTES), ("a.weight", 2 * 32 * 4)]


def test_dequantize_and_shards_report_their_bytes(valid_gguf: Path):
    gguf_file = open_gguf(valid_gguf)
    log = LoadLog()
    gguf_file.on_tensor_loaded = log
    gguf_file.dequantize("b.weight")
    gguf_file.mark_loaded("c.weight", 17)  # a shard of it
    assert log.loaded == [("b.weight", 4 * 32 * 2), ("c.weight", 17)]
    assert (gguf_file.converted_tensors, gguf_file.mapped_tensors) == (0, 0)
    gguf_file.on_tensor_loaded = None
    gguf_file.mark_loaded("c.weight")  # no callback: nothing to report to


@pytest.mark.skipif(not quants.cpu_keeps_blocks(), reason="the CPU's block kernels are not built")
@pytest.mark.parametrize("maps", [True, False])
def test_native_blocks_are_mapped_or_else_copied(valid_gguf: Path, monkeypatch, maps: bool):
    monkeypatch.setattr(reader_module, "maps_blocks", lambda: maps)
    gguf_file = open_gguf(valid_gguf)
    log = LoadLog()
    gguf_file.on_tensor_loaded = log
    weight = gguf_file.load_weight("c.weight", "native")
    assert weight.qtype == quants.T.Q8_0
    assert (gguf_file.mapped_tensors, gguf_file.converted_tensors) == (int(maps), int(not maps))
    assert log.loaded == [("c.weight", C_WEIGHT_BYTES)]


def test_an_unexpected_mlx_buffer_layout_copies_blocks_with_a_word(monkeypatch, capsys):
    monkeypatch.setattr(
        reader_module, "native_ops", lambda: SimpleNamespace(mapping_supported=lambda: False)
    )
    assert reader_module.maps_blocks.__wrapped__() is False
    version = importlib.metadata.version("mlx")
    assert capsys.readouterr().err == (
        f"ds4mlx: MLX {version} lays out its CPU buffers differently from what the mapping "
        "loader expects; GGUF blocks are copied from the file instead (a slower load, the same "
        "results)\n"
    )
    monkeypatch.setattr(
        reader_module, "native_ops", lambda: SimpleNamespace(mapping_supported=lambda: True)
    )
    assert reader_module.maps_blocks.__wrapped__() is True
    assert capsys.readouterr().err == ""


class RecordingMapping:
    """The file's map with its ``madvise`` calls recorded instead of made."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self.mapping = mapping
        self.advice: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self.mapping)

    def madvise(self, option: int, start: int, length: int) -> None:
        self.advice.append((option, start, length))


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED"), reason="no madvise here")
def test_a_loaded_tensor_unmaps_the_pages_it_lies_on(tmp_path: Path):
    # The last tensor's 256 bytes end at the file's end (no padding after a multiple of the
    # alignment): its pages are still inside the map.
    path = tmp_path / "pages.gguf"
    writer = GGUFWriter(path, "deepseek4")
    writer.add_tensor("first", np.ones(3, np.float32))
    writer.add_tensor("last", np.ones((2, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_file = open_gguf(path)
    recording = RecordingMapping(gguf_file.mapping)
    gguf_file.mapping = recording
    expected = []
    for name in ("first", "last"):
        gguf_file.mark_loaded(name)
        info = gguf_file.layout.tensors[name]
        start = info.file_offset // mmap.PAGESIZE * mmap.PAGESIZE
        expected.append((mmap.MADV_DONTNEED, start, info.file_offset + info.nbytes - start))
    assert recording.advice == expected
    assert expected[-1][1] + expected[-1][2] == len(recording) == path.stat().st_size


def test_without_madvise_nothing_is_unmapped(valid_gguf: Path, monkeypatch):
    gguf_file = open_gguf(valid_gguf)
    recording = RecordingMapping(gguf_file.mapping)
    gguf_file.mapping = recording
    monkeypatch.delattr(mmap, "MADV_DONTNEED", raising=False)
    log = LoadLog()
    gguf_file.on_tensor_loaded = log
    gguf_file.mark_loaded("c.weight")
    assert recording.advice == []
    assert log.loaded == [("c.weight", C_WEIGHT_BYTES)]


def test_arrays_of_arrays_are_read_nested(tmp_path: Path):
    path = tmp_path / "nested.gguf"
    writer = GGUFWriter(path, "deepseek4")
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_array("test.nested_strings", [["a"], ["bc", "d"]])
    writer.add_uint32("test.after", 9)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gguf_file = open_gguf(path)
    assert gguf_file.get("test.nested") == [[1, 2], [3]]
    assert gguf_file.get("test.nested_strings") == [["a"], ["bc", "d"]]
    assert gguf_file.get("test.after") == 9


def test_a_file_that_cannot_be_mapped_is_a_gguf_error(valid_gguf: Path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    # Validation maps the file too: only the reader's own map fails (a file replaced between).
    monkeypatch.setattr(
        reader_module, "mmap", SimpleNamespace(mmap=refuse, ACCESS_READ=mmap.ACCESS_READ)
    )
    with pytest.raises(GGUFError) as caught:
        open_gguf(valid_gguf)
    assert str(caught.value) == f"{valid_gguf}: cannot read file: Cannot allocate memory"


def test_gguf_readers_own_refusal_is_a_gguf_error(valid_gguf: Path, monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("odd field")

    gguf_file = open_gguf(valid_gguf)
    monkeypatch.setattr(reader_module, "_Reader", refuse)
    with pytest.raises(GGUFError) as caught:
        gguf_file.reader  # noqa: B018  (the property parses the file)
    assert str(caught.value) == f"{valid_gguf}: gguf.GGUFReader rejected the file: odd field"
    assert np.asarray(gguf_file.raw("a.weight")).shape == (2, 32)


INTEGER_VALUE_TYPES = [
    GGUFValueType.UINT8,
    GGUFValueType.INT8,
    GGUFValueType.UINT16,
    GGUFValueType.INT16,
    GGUFValueType.UINT32,
    GGUFValueType.INT32,
    GGUFValueType.UINT64,
    GGUFValueType.INT64,
]


@pytest.mark.parametrize("value_type", INTEGER_VALUE_TYPES, ids=lambda t: t.name)
def test_integer_metadata_reads_back_at_both_ends_of_its_type(tmp_path: Path, value_type):
    """Each scalar type is decoded with its own width and sign: its least and greatest values
    come back exactly, alone and as array items."""
    limits = np.iinfo(GGUFReader.gguf_scalar_to_np[value_type])
    ends = [int(limits.min), int(limits.max)]
    path = tmp_path / "ends.gguf"
    metadata = {
        "test.low": MetaValue(ends[0], value_type),
        "test.high": MetaValue(ends[1], value_type),
        "test.both": MetaValue(ends, value_type),
    }
    write_gguf(path, "deepseek4", metadata, [])
    gguf_file = open_gguf(path)
    assert [gguf_file.get("test.low"), gguf_file.get("test.high")] == ends
    assert gguf_file.get("test.both") == ends


def test_float_metadata_keeps_its_width(tmp_path: Path):
    path = tmp_path / "floats.gguf"
    metadata = {
        "test.single": MetaValue(0.1, GGUFValueType.FLOAT32),
        "test.double": MetaValue(0.1, GGUFValueType.FLOAT64),
        "test.doubles": MetaValue([0.1, -2.5], GGUFValueType.FLOAT64),
    }
    write_gguf(path, "deepseek4", metadata, [])
    gguf_file = open_gguf(path)
    assert gguf_file.get("test.single") == float(np.float32(0.1))
    assert gguf_file.get("test.double") == 0.1
    assert gguf_file.get("test.doubles") == [0.1, -2.5]


@pytest.mark.parametrize(
    "dtype", [np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]
)
def test_element_tensors_are_typed_views(tmp_path: Path, dtype):
    """Tensors of element types are mapped as typed numpy values in their shape, not bytes."""
    path = tmp_path / "typed.gguf"
    values = (np.arange(24).reshape(2, 3, 4) - 12).astype(dtype)
    writer = GGUFWriter(path, "deepseek4")
    writer.add_tensor("t", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    raw = open_gguf(path).raw("t")
    assert raw.dtype == dtype and raw.shape == (2, 3, 4)
    np.testing.assert_array_equal(raw, values)
