"""SlotPolicy's arithmetic at its edges: sizes, exact half-lives, how many victims fit."""

from __future__ import annotations

from ds4mlx.experts import SlotPolicy

import numpy as np
import pytest

NONE = np.array([], np.int64)


def test_one_slot_and_any_positive_half_life_are_enough():
    policy = SlotPolicy(n_keys=4, capacity=1, half_life=1e-9)
    assert policy.victims(1, NONE).tolist() == [0]


@pytest.mark.parametrize("capacity, half_life, message", [(0, 1.0, "slot"), (1, 0.0, "half-life")])
def test_no_slot_or_no_half_life_is_refused(capacity, half_life, message):
    with pytest.raises(ValueError, match=message):
        SlotPolicy(n_keys=4, capacity=capacity, half_life=half_life)


def test_hotness_halves_after_exactly_one_half_life():
    policy = SlotPolicy(n_keys=4, capacity=2, half_life=4.0)
    policy.record_use(np.array([1]), 8)
    policy.tick(4.0)
    assert policy.hotness(np.array([1])).tolist() == [4.0]
    policy.record_use(np.array([1]))
    assert policy.hotness(np.array([1])).tolist() == [5.0]


def test_all_unprotected_slots_may_be_taken_but_not_one_more():
    policy = SlotPolicy(n_keys=8, capacity=3, half_life=1.0)
    for slot, key in enumerate([4, 5, 6]):
        assert policy.assign(slot, key) == -1
    assert sorted(policy.victims(2, np.array([5])).tolist()) == [0, 2]
    with pytest.raises(RuntimeError, match="2 slots needed but only 1 of 3"):
        policy.victims(2, np.array([4, 5]))


def test_a_protected_key_that_is_not_cached_protects_nothing():
    policy = SlotPolicy(n_keys=8, capacity=2, half_life=1.0)
    policy.assign(0, 1)
    policy.assign(1, 2)
    assert sorted(policy.victims(2, np.array([7])).tolist()) == [0, 1]


def test_reassigning_a_slot_frees_the_old_key():
    policy = SlotPolicy(n_keys=8, capacity=1, half_life=1.0)
    policy.assign(0, 0)
    assert policy.assign(0, 6) == 0
    assert policy.lookup(np.array([0, 6])).tolist() == [-1, 0]


def test_the_least_recently_used_goes_first_among_equally_hot():
    policy = SlotPolicy(n_keys=8, capacity=3, half_life=1e12)
    for slot, key in enumerate([1, 2, 3]):
        policy.assign(slot, key)
    for key in (3, 1, 2):
        policy.record_use(np.array([key]))
    assert policy.victims(2, NONE).tolist() == [2, 0]


def test_equal_slots_go_in_slot_order():
    policy = SlotPolicy(n_keys=8, capacity=3, half_life=1.0)
    assert policy.victims(3, NONE).tolist() == [0, 1, 2]


def test_the_hot_list_is_hottest_first_cut_at_the_limit_and_skips_cold_keys():
    policy = SlotPolicy(n_keys=8, capacity=1, half_life=1e12)
    policy.record_use(np.array([2]), 1)
    policy.record_use(np.array([5]), 3)
    policy.record_use(np.array([6]), 2)
    keys, hot = policy.hottest()
    assert keys.tolist() == [5, 6, 2] and hot.tolist() == [3.0, 2.0, 1.0]
    assert policy.hottest(2)[0].tolist() == [5, 6]


def test_expert_key_zero_is_a_cached_expert_not_an_empty_slot():
    policy = SlotPolicy(n_keys=8, capacity=2, half_life=1e12)
    policy.assign(0, 0)
    policy.assign(1, 1)
    policy.record_use(np.array([0]), 5)
    assert policy.victims(1, NONE).tolist() == [1]
