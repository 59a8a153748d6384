"""The hot-list file the streamed store writes and reads back: its text, and each way a file
that is not a hot-list of this model is refused with a message naming the file (never a raw
exception of the JSON or the file system)."""

from __future__ import annotations

import json
import re

from ds4mlx.experts.streamed import HOTLIST_FORMAT

import mlx.core as mx
import pytest
from expert_helpers import make_store


@pytest.fixture
def store():
    store = make_store(slots=40)
    yield store
    store.close()


def test_a_saved_hotlist_is_one_json_document_ending_in_a_newline(store, tmp_path):
    list(store.layers[3].batches(mx.array([[2, 5]])))
    path = tmp_path / "hot.json"
    assert store.save_hotlist(path) == 2
    text = path.read_text()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert [e["expert"] for e in json.loads(text)["experts"]] == [2, 5]


def test_a_folder_or_a_binary_file_cannot_be_read_as_a_hotlist(store, tmp_path):
    binary = tmp_path / "hot.json"
    binary.write_bytes(b"\xff\xfe{}")
    for path in (tmp_path, binary):
        with pytest.raises(ValueError, match=f"hot-list {re.escape(str(path))}: cannot read it"):
            store.load_hotlist(path)


@pytest.mark.parametrize("document", [[], "ds4mlx-expert-hotlist", 7, None])
def test_a_json_document_that_is_not_an_object_is_not_a_hotlist(store, tmp_path, document):
    path = tmp_path / "hot.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=f"not a {HOTLIST_FORMAT} file"):
        store.load_hotlist(path)


@pytest.mark.parametrize(
    "entry",
    [
        {"layer": "blk.0", "expert": 1},  # no hotness
        {"expert": 1, "hotness": 1.0},  # no layer
        "blk.0",  # not an object
        ["blk.0", 1, 1.0],
        {"layer": "blk.0", "expert": 1, "hotness": "hot"},  # not a number
        {"layer": "blk.0", "expert": 1, "hotness": None},
        {"layer": ["blk.0"], "expert": 1, "hotness": 1.0},  # a layer name that cannot be one
    ],
)
def test_an_entry_without_a_layer_expert_and_hotness_is_refused(store, tmp_path, entry):
    path = tmp_path / "hot.json"
    path.write_text(json.dumps({"format": HOTLIST_FORMAT, "experts": [entry]}))
    with pytest.raises(ValueError, match=r"entry 0 \(.*\) does not name a routed-expert layer"):
        store.load_hotlist(path)


@pytest.mark.parametrize("hotness", ["Infinity", "-Infinity", "NaN", "-1"])
def test_a_hotness_that_is_not_a_finite_non_negative_number_is_refused(store, tmp_path, hotness):
    path = tmp_path / "hot.json"
    entry = f'{{"layer": "blk.0", "expert": 1, "hotness": {hotness}}}'
    path.write_text(f'{{"format": "{HOTLIST_FORMAT}", "experts": [{entry}]}}')
    with pytest.raises(ValueError, match=r"out of range \(8 experts, hotness >= 0\)"):
        store.load_hotlist(path)


def test_warm_starting_twice_reads_nothing_the_second_time(store, tmp_path):
    """The expert warm-started into slot 0 counts as cached like the others."""
    path = tmp_path / "hot.json"
    experts = [{"layer": "blk.0", "expert": e, "hotness": 3.0 - e} for e in (0, 1, 2)]
    path.write_text(json.dumps({"format": HOTLIST_FORMAT, "experts": experts}))
    assert store.load_hotlist(path) == 3
    assert store.pools[0].policy.lookup([0, 1, 2]).tolist() == [0, 1, 2]
    assert store.load_hotlist(path) == 0
    assert store.stats().warm_loaded == 3
