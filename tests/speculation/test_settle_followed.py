"""Rows a drafter followed while drafting paused (or the prompt's) are settled before the first
drafted cycle after them, outside that cycle's clock: the cost rule judges steady cycles, not
the catch-up of a pause (issue 36, item 9)."""

from __future__ import annotations

from ds4mlx.generation import generate
from ds4mlx.speculation import dspark, dspark_layout
from ds4mlx.speculation.dspark import rows_to_settle
from ds4mlx.speculation.lookup import LookupDrafter, LookupExtension
from ds4mlx.speculation.loop import DrafterLease
from ds4mlx.speculation.probe import rows_between
from ds4mlx.speculation.scheduler import CostMeter

import numpy as np
import pytest

from .conftest import ScriptedDrafter, TickingClock
from .test_dspark import PROMPT, files, observed  # noqa: F401  (files: a fixture)
from .test_loop import PROMPTS, run


def keyed_rows(drafter, monkeypatch) -> list[int]:
    """The rows of each computation of context keys ``drafter`` makes from now on."""
    keyed: list[int] = []
    keys, tile = drafter.net.context_keys, drafter._context_tiles.get
    monkeypatch.setattr(
        drafter.net, "context_keys", lambda t, p: keyed.append(len(t)) or keys(t, p)
    )
    monkeypatch.setattr(drafter._context_tiles, "get", lambda n: keyed.append(n) or tile(n))
    return keyed


def test_settling_keys_the_followed_rows_but_the_last_advances(files, monkeypatch):  # noqa: F811
    """After a prompt and plain advances of four tokens, settling keys the rows inside the
    window (16) but the last advance's four, which the next block keys as it keys a drafted
    cycle's rows; the draft is that of a drafter that keyed every row at once."""
    target, _, paths, _ = files
    path, long_prompt = paths[dspark_layout.ARCH_DS4], PROMPT * 2
    settling = dspark.load_dspark(path, target)
    keyed = keyed_rows(settling, monkeypatch)
    out = target.new_session().feed_hidden(long_prompt, settling.capture_layers)
    settling.observe(long_prompt[:20], long_prompt[20], rows_between(out, 0, 20))
    for start in range(20, len(long_prompt), 4):
        stop = start + 4
        following = long_prompt[stop] if stop < len(long_prompt) else 7
        settling.observe(long_prompt[start:stop], following, rows_between(out, start, stop))
    settling.settle_followed()
    assert keyed == [12]
    settling.settle_followed()  # nothing more to settle: the last advance's rows stay
    assert keyed == [12]
    draft = settling.propose(5)
    assert keyed == [12, 4]
    whole = observed(dspark.load_dspark(path, target), target, long_prompt)
    expected = whole.propose(5)
    assert draft.tokens == expected.tokens
    np.testing.assert_allclose(draft.confidences, expected.confidences, rtol=1e-4, atol=1e-5)


def test_settling_after_the_prompt_leaves_one_cycles_rows(files, monkeypatch):  # noqa: F811
    """After the prompt alone (one observation of 20 rows), settling leaves the block a
    drafted cycle's most rows (``max_draft + 1``)."""
    target, _, paths, _ = files
    settling = observed(dspark.load_dspark(paths[dspark_layout.ARCH_DS4], target), target)
    keyed = keyed_rows(settling, monkeypatch)
    settling.settle_followed()
    assert keyed == [20 - (settling.max_draft + 1)]
    expected = observed(dspark.load_dspark(paths[dspark_layout.ARCH_DS4], target), target)
    assert settling.propose(5).tokens == expected.propose(5).tokens
    assert keyed == [20 - (settling.max_draft + 1), settling.max_draft + 1]


def test_the_first_drafted_cycle_after_a_pause_is_timed_without_the_settling(ds4_model):
    """The loop settles the drafter once, before the first draft after the prompt and a cost
    pause of two plain advances, and the hundred seconds that takes are no drafted cycle's
    cost: drafting (one tick a cycle of up to six tokens, against a tick per plain advance of
    four) goes on without another pause."""
    prompt, n = PROMPTS[1], 40
    plain, _ = run(generate(ds4_model.new_session(), prompt, n))
    drafter = ScriptedDrafter(prompt, plain, ds4_model.args.vocab_size, error_rate=0.0)
    clock = TickingClock()
    costs = CostMeter(clock=clock)
    costs.plain.add(1.0, 4)
    costs.warmed_lengths.update(range(drafter.max_draft + 2))  # every cycle is timed
    costs.pause_left = 2
    calls: list[str] = []
    observe, propose = drafter.observe, drafter.propose

    def settle_followed():
        calls.append("settle")
        clock.now += 100.0

    def observing(tokens, next_token, rows):
        calls.append("observe")
        observe(tokens, next_token, rows)

    def proposing(max_tokens):
        calls.append("propose")
        return propose(max_tokens)

    drafter.settle_followed, drafter.observe, drafter.propose = (
        settle_followed,
        observing,
        proposing,
    )
    spec, stats = run(
        generate(ds4_model.new_session(), prompt, n, drafter=drafter, lease=DrafterLease(costs))
    )
    assert spec == plain
    # The prompt's rows, the pause's two plain advances, then the settling and the first draft.
    assert calls[:5] == ["observe", "observe", "observe", "settle", "propose"]
    assert calls.count("settle") == 1
    assert stats.scheduler.plain_advances == 2 and stats.drafted_passes > 3


def test_lookup_with_a_learned_drafter_settles_the_learned_one():
    """The lookup reads tokens alone; the drafter it extends settles its rows (and one that
    has nothing to settle is left alone)."""
    settled: list[str] = []

    class Learned:
        name, max_draft, capture_layers = "learned", 5, (0,)

        def settle_followed(self) -> None:
            settled.append("learned")

    LookupExtension(Learned(), LookupDrafter(3)).settle_followed()
    assert settled == ["learned"]
    del Learned.settle_followed
    LookupExtension(Learned(), LookupDrafter(3)).settle_followed()
    assert settled == ["learned"]


@pytest.mark.parametrize(
    ("observed_rows", "max_draft", "settled"),
    [
        ([], 5, 0),
        ([20], 5, 14),  # the prompt alone: a cycle's most rows (6) left
        ([3], 5, 0),
        ([20, 4, 4], 5, 24),  # the last plain advance's four left
        ([20, 4, 4], 1, 26),  # a one-token drafter's cycle commits two rows at most
        ([4, 2], 5, 4),
    ],
)
def test_rows_to_settle_leave_the_last_cycles_worth(observed_rows, max_draft, settled):
    assert rows_to_settle(observed_rows, max_draft) == settled
