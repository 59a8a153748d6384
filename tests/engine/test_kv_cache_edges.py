"""The KV cache's disk files at the edges the fourth fresh mutation run found untested (issue
37, ``scripts/mutation_sets/fresh4.py``): a disk budget filled to its exact byte, and token
lists in a snapshot header that are not lists of integers.

Each test was checked against the mutation it is named after in that set.
"""

from __future__ import annotations

import json
from pathlib import Path

from ds4mlx.engine.kvcache import DiskTier
from ds4mlx.engine.kvcache.snapshot_file import SnapshotFileError, header_tokens

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_prompt_cache_order import ENTRY_BYTES, FINGERPRINT, A, B, C, state


def test_a_disk_budget_filled_to_its_exact_byte_evicts_nothing(tmp_path: Path):
    probe = DiskTier(tmp_path / "probe", 1 << 30, FINGERPRINT)
    probe.save(state(A))
    written = probe.usage()
    estimate = ENTRY_BYTES + 16 * len(A) + 65536  # what a save reserves before it writes
    assert written <= estimate
    # Two files and one save's reservation fill the budget exactly: the third save fits.
    tier = DiskTier(tmp_path / "cache", estimate + 2 * written, FINGERPRINT)
    for tokens in (A, B, C):
        assert tier.save(state(tokens))
    assert sorted(tier.keys()) == [A, B, C]
    # One byte less, and the least recently used file makes room.
    tight = DiskTier(tmp_path / "tight", estimate + 2 * written - 1, FINGERPRINT)
    for tokens in (A, B, C):
        tight.save(state(tokens))
        tight.path_for(tokens).touch()
    assert sorted(tight.keys()) in ([B, C], [A, C])


NOT_INTEGERS = st.one_of(
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(0, 9), max_size=2),
)


@given(st.lists(st.integers(0, 2**31), max_size=4), NOT_INTEGERS, st.integers(0, 4))
def test_a_token_list_holding_anything_but_integers_is_refused(tokens, intruder, where):
    tokens = list(tokens)
    tokens.insert(min(where, len(tokens)), intruder)
    with pytest.raises(SnapshotFileError, match="malformed token list"):
        header_tokens(Path("x.safetensors"), {"tokens": json.dumps(tokens)})


def test_a_token_list_of_integers_is_read_back():
    assert header_tokens(Path("x.safetensors"), {"tokens": "[0, 7, 4096]"}) == (0, 7, 4096)
