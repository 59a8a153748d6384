"""Eviction policy: route hotness first, then least recently used; hot-list warm start."""

from __future__ import annotations

import json

from ds4mlx.experts import SlotPolicy

import numpy as np
import pytest
from expert_helpers import TINY, budget_gib, streamed

NO_DECAY = 1e12  # half-life: counts stay counts


def filled(capacity: int, keys: list[int], half_life: float = NO_DECAY) -> SlotPolicy:
    policy = SlotPolicy(n_keys=16, capacity=capacity, half_life=half_life)
    for slot, key in enumerate(keys):
        policy.assign(slot, key)
    return policy


def use(policy: SlotPolicy, *keys: int) -> None:
    policy.tick()
    policy.record_use(np.array(keys))


def test_empty_slots_go_first():
    policy = filled(3, [5])
    use(policy, 5)
    assert sorted(policy.victims(2, protected=np.array([], np.int64))) == [1, 2]


def test_hotness_beats_recency():
    policy = filled(2, [1, 2])
    for _ in range(3):
        use(policy, 1)  # expert 1: used often, but not lately
    use(policy, 2)  # expert 2: used once, most recently
    assert policy.victims(1, protected=np.array([], np.int64)).tolist() == [1]  # slot of 2


def test_ties_go_to_least_recently_used():
    policy = filled(3, [1, 2, 3])
    use(policy, 2)
    use(policy, 3)
    use(policy, 1)  # all used once: same hotness; 2 is the least recent
    assert policy.victims(1, protected=np.array([], np.int64)).tolist() == [1]
    assert policy.victims(2, protected=np.array([], np.int64)).tolist() == [1, 2]


def test_hotness_decays():
    policy = filled(2, [1, 2], half_life=1.0)
    for _ in range(3):
        use(policy, 1)
    for _ in range(20):
        policy.tick()
    use(policy, 2)  # 1's three old uses have decayed below 2's one recent use
    assert policy.victims(1, protected=np.array([], np.int64)).tolist() == [0]


def test_protected_keys_are_never_evicted():
    policy = filled(2, [1, 2])
    use(policy, 1)
    assert policy.victims(1, protected=np.array([2])).tolist() == [0]
    with pytest.raises(RuntimeError, match="slots needed"):
        policy.victims(1, protected=np.array([1, 2]))


def test_assign_reports_evicted_key():
    policy = filled(1, [4])
    assert policy.assign(0, 7) == 4
    assert policy.lookup(np.array([4, 7])).tolist() == [-1, 0]


def test_hotlist_warm_start(tmp_path):
    hotlist = tmp_path / "hot.json"
    gib = budget_gib(TINY, 0.25)
    tokens = list(range(3, 40))

    def run(model) -> None:  # a prefill, then one-token decode steps
        session = model.new_session()
        session.feed(tokens[:20])
        for t in tokens[20:]:
            session.feed([t])

    first = streamed(TINY, gib, hotlist=hotlist, save_hotlist=True)
    run(first)
    first.close()  # saves the hot-list
    document = json.loads(hotlist.read_text())
    assert document["format"] == "ds4mlx-expert-hotlist"
    hot = [e["hotness"] for e in document["experts"]]
    assert hot == sorted(hot, reverse=True) and hot[0] > 0

    warm = streamed(TINY, gib, hotlist=hotlist)
    stats = warm.expert_stats()
    assert stats.warm_loaded > 0 and stats.resident_bytes > 0
    hottest = document["experts"][0]
    layer = next(
        m.experts.layer
        for _, m in warm.network.named_modules()
        if getattr(m, "prefix", None) == hottest["layer"]
    )
    key = np.array([layer.key_base + hottest["expert"]])
    assert layer.pool.policy.lookup(key)[0] >= 0  # the hottest expert is cached at start
    cold = streamed(TINY, gib)
    run(warm)
    run(cold)
    assert warm.expert_stats().hits > cold.expert_stats().hits
    for model in (warm, cold):
        model.close()


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "cannot read"),
        ('{"format": "other"}', "not a ds4mlx-expert-hotlist"),
        (
            '{"format": "ds4mlx-expert-hotlist", "experts": [{"layer": "blk.99", "expert": 0, '
            '"hotness": 1}]}',
            "does not name",
        ),
        (
            '{"format": "ds4mlx-expert-hotlist", "experts": [{"layer": "blk.1", "expert": 99, '
            '"hotness": 1}]}',
            "out of range",
        ),
    ],
)
def test_bad_hotlist_is_a_clear_error(tmp_path, content, message):
    hotlist = tmp_path / "hot.json"
    hotlist.write_text(content)
    with pytest.raises(ValueError, match=message):
        streamed(TINY, budget_gib(TINY, 0.5), hotlist=hotlist)


def test_missing_hotlist_without_save_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        streamed(TINY, budget_gib(TINY, 0.5), hotlist=tmp_path / "none.json")


def test_hotness_halves_per_half_life_of_accumulated_ticks():
    policy = SlotPolicy(n_keys=4, capacity=2, half_life=2.0)
    policy.record_use(np.array([1]), 8)
    policy.tick()
    policy.tick()  # two ticks of one step: one half-life
    assert policy.clock == 2.0
    assert policy.hotness(np.array([1])).tolist() == [4.0]
    policy.tick(4.0)
    assert policy.hotness(np.array([1])).tolist() == [1.0]


def test_an_empty_slot_goes_before_a_cached_expert_that_was_never_hot():
    """A warm start may cache an expert of hotness 0 (never used since): the empty slot is
    still refilled first, whatever the slot numbers."""
    policy = SlotPolicy(n_keys=8, capacity=2, half_life=NO_DECAY)
    policy.assign(0, 3)
    policy.set_hotness(np.array([3]), np.array([0.0]))
    assert policy.victims(1, protected=np.array([], np.int64)).tolist() == [1]


def test_victims_are_slot_numbers_not_positions_among_the_candidates():
    policy = filled(3, [1, 2, 3])
    use(policy, 1)
    use(policy, 3)
    use(policy, 2)
    # Slot 0 (key 1) is protected: the candidates are slots 1 and 2; key 3 is the older.
    assert policy.victims(1, protected=np.array([1])).tolist() == [2]
    assert policy.victims(2, protected=np.array([1])).tolist() == [2, 1]


def test_assigning_an_empty_slot_evicts_nothing():
    policy = filled(2, [4])
    assert policy.assign(1, 6) == -1
    assert policy.slot_key.tolist() == [4, 6]


def test_seeded_hotness_decays_from_the_moment_it_is_seeded():
    """A warm start seeds hotness at the current clock: it is the seeded value now, and
    halves one half-life later (not as if seeded at clock 0)."""
    policy = SlotPolicy(n_keys=4, capacity=2, half_life=2.0)
    policy.tick(6.0)
    policy.set_hotness(np.array([1, 2]), np.array([8.0, 2.0]))
    assert policy.hotness(np.array([1, 2])).tolist() == [8.0, 2.0]
    policy.tick(2.0)
    assert policy.hotness(np.array([1, 2])).tolist() == [4.0, 1.0]
