"""A model's fingerprint, which keys its cached states on disk: what of the file it reads (the
size, the first and last MiB, each tensor's layout and first 4 KiB, the network's source) and
what it leaves unread, on a fake model over a file of a known layout (no weights are loaded)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

from ds4mlx.engine.kvcache import model_fingerprint

import pytest

MIB = 1 << 20
FILE_BYTES = 3 * MIB
# A tensor larger than the 4 KiB sample, and one smaller, both between the file's edges.
LARGE = dict(name="blk.0.ffn_up.weight", qtype=8, ggml_dims=(64, 1024), nbytes=64 * 1024)
SMALL = dict(name="blk.0.attn_norm.weight", qtype=0, ggml_dims=(25,), nbytes=100)
LARGE_AT = MIB + MIB // 4
SMALL_AT = MIB + MIB // 2


def network_module(folder: Path, name: str, source: str) -> ModuleType:
    """A module of its own folder (the fingerprint reads the sources beside the network's)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def network(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fingerprinted_net", None)
    module = network_module(tmp_path / "net", "fingerprinted_net", "class Net:\n    pass\n")
    return module.Net()


def model_file(path: Path, edits: dict[int, int] | None = None, extra: int = 0) -> Path:
    """Zeros but for each tensor's bytes; ``edits`` set single bytes; ``extra`` zero bytes go
    between the tensors and the file's last MiB."""
    data = bytearray(FILE_BYTES)
    data[LARGE_AT : LARGE_AT + LARGE["nbytes"]] = bytes([7]) * LARGE["nbytes"]
    data[SMALL_AT : SMALL_AT + SMALL["nbytes"]] = bytes([9]) * SMALL["nbytes"]
    for offset, value in (edits or {}).items():
        data[offset] = value
    data[2 * MIB : 2 * MIB] = bytes(extra)
    path.write_bytes(bytes(data))
    return path


def fake_model(path: Path, network, *, arch="deepseek4", dtype="native", large=None, small=None):
    tensors = {
        info["name"]: SimpleNamespace(**info, file_offset=offset)
        for info, offset in ((large or LARGE, LARGE_AT), (small or SMALL, SMALL_AT))
    }
    gguf = SimpleNamespace(arch=arch, layout=SimpleNamespace(tensors=tensors))
    return SimpleNamespace(network=network, gguf=gguf, weights_dtype=dtype, path=str(path))


def fingerprint_of(tmp_path: Path, network, **kwargs) -> str:
    edits, extra = kwargs.pop("edits", None), kwargs.pop("extra", 0)
    path = model_file(tmp_path / f"model-{len(list(tmp_path.glob('model-*')))}.gguf", edits, extra)
    return model_fingerprint(fake_model(path, network, **kwargs))


def test_the_same_file_and_code_give_the_same_fingerprint(tmp_path, network):
    first = fingerprint_of(tmp_path, network)
    assert len(first) == 64 and first == fingerprint_of(tmp_path, network)


@pytest.mark.parametrize(
    "offset",
    [10, MIB - 1, LARGE_AT, LARGE_AT + 4095, SMALL_AT + 99, FILE_BYTES - MIB, FILE_BYTES - 1],
    ids=["head", "head-end", "large", "large-sample-end", "small-end", "tail-start", "tail-end"],
)
def test_a_byte_changed_where_the_fingerprint_reads_changes_it(tmp_path, network, offset):
    assert fingerprint_of(tmp_path, network, edits={offset: 1}) != fingerprint_of(tmp_path, network)


@pytest.mark.parametrize(
    "offset",
    [LARGE_AT + 4096, LARGE_AT + 50_000, SMALL_AT + 100, SMALL_AT + 4000, MIB, 2 * MIB - 1],
    ids=["large-past-sample", "large-middle", "after-small", "gap", "head-past", "tail-before"],
)
def test_bytes_past_the_samples_and_edges_are_not_read(tmp_path, network, offset):
    # Reading samples, not tensors: a 150 GB file is fingerprinted in a moment.
    assert fingerprint_of(tmp_path, network, edits={offset: 1}) == fingerprint_of(tmp_path, network)


def test_a_longer_file_with_the_same_samples_has_another_fingerprint(tmp_path, network):
    assert fingerprint_of(tmp_path, network, extra=1) != fingerprint_of(tmp_path, network)


@pytest.mark.parametrize(
    "change",
    [
        {"large": {**LARGE, "name": "blk.1.ffn_up.weight"}},
        {"large": {**LARGE, "qtype": 2}},
        {"large": {**LARGE, "ggml_dims": (1024, 64)}},
        {"small": {**SMALL, "nbytes": 200}},
        {"arch": "glm5"},
        {"dtype": "f32"},
    ],
    ids=["name", "type", "dims", "nbytes", "arch", "weights-dtype"],
)
def test_the_layout_architecture_and_weights_dtype_change_it(tmp_path, network, change):
    assert fingerprint_of(tmp_path, network, **change) != fingerprint_of(tmp_path, network)


def test_the_networks_source_and_name_change_it(tmp_path, network, monkeypatch):
    before = fingerprint_of(tmp_path, network)
    # Another class of the same module: its name is part of the identity.
    other = type("Other", (), {"__module__": "fingerprinted_net"})
    assert fingerprint_of(tmp_path, other()) != before
    # The same class and sources under another module name.
    monkeypatch.setitem(sys.modules, "aliased_net", sys.modules["fingerprinted_net"])
    aliased = type("Net", (), {"__module__": "aliased_net"})
    assert fingerprint_of(tmp_path, aliased()) != before
    # A sibling module of the network's package added, then changed.
    sibling = tmp_path / "net" / "layers.py"
    sibling.write_text("WIDTH = 1\n")
    with_sibling = fingerprint_of(tmp_path, network)
    sibling.write_text("WIDTH = 2\n")
    assert len({before, with_sibling, fingerprint_of(tmp_path, network)}) == 3
