"""A generation that speculates while alone switches to batched decoding when another joins,
and its output stays exactly the plain greedy output; the joining generation takes the shared
drafter over, so the first never drafts from a state that is not its own."""

from __future__ import annotations

from ds4mlx.engine.generate import DecodeStep, DoneEvent, TokenEvent
from ds4mlx.engine.session import feed_batch
from ds4mlx.generation import generate, stepped
from ds4mlx.speculation import DrafterLease, SpeculationConfig

from .conftest import ScriptedDrafter

PROMPT_A = [115, 78, 104, 2, 65, 24]
PROMPT_B = [9, 56, 25, 61, 80, 12, 12, 86, 3]
N = 30


class Driver:
    """Steps one stepped generation, collecting its tokens."""

    def __init__(self, events):
        self.events = events
        self.tokens: list[int] = []
        self.stats = None
        self.step: DecodeStep | None = None
        self.advance(None)

    def advance(self, reply) -> None:
        event = self.events.send(reply)
        while not isinstance(event, DecodeStep):
            if isinstance(event, DoneEvent):
                self.stats, self.step = event.stats, None
                return
            assert isinstance(event, TokenEvent)
            self.tokens.append(event.token)
            event = next(self.events)
        self.step = event


def plain(model, prompt):
    return [e.token for e in generate(model.new_session(), prompt, N) if isinstance(e, TokenEvent)]


def test_speculation_alone_then_batched_steps(ds4_model):
    reference_a, reference_b = plain(ds4_model, PROMPT_A), plain(ds4_model, PROMPT_B)
    # The drafter proposes A's continuation (B's drafts would all be wrong: it never gets any).
    drafter = ScriptedDrafter(PROMPT_A, reference_a, ds4_model.args.vocab_size, error_rate=0.0)
    config = SpeculationConfig()
    lease = DrafterLease()
    a = Driver(
        stepped(ds4_model.new_session(), PROMPT_A, N, drafter=drafter, config=config, lease=lease)
    )
    for _ in range(2):  # alone: A decodes on its own, drafting
        a.advance(None)
    assert len(a.tokens) > 3 and len(drafter.observed_rows) == 3  # the prefill and two cycles

    b = Driver(
        stepped(ds4_model.new_session(), PROMPT_B, N, drafter=drafter, config=config, lease=lease)
    )
    assert drafter.observed_rows == [len(PROMPT_B)]  # B's prefill took the drafter over
    while a.step is not None and b.step is not None:
        steps = [a.step, b.step]
        logits = feed_batch([s.session for s in steps], [s.token for s in steps])
        a.advance(logits[0])
        b.advance(logits[1])
    # Whichever is left runs alone again: A must not draft (the drafter follows B now).
    for driver in (a, b):
        while driver.step is not None:
            driver.advance(None)
    assert a.tokens == reference_a and b.tokens == reference_b
    assert a.stats.drafted_passes == 2
    assert drafter.observed_rows == [len(PROMPT_B)]  # nobody drafted after the join


def test_a_generation_whose_drafter_another_took_over_decodes_without_drafts(ds4_model):
    """Never batched with it, A still must not draft once B's prefill took the shared drafter
    over: the drafter's state follows B's sequence."""
    reference_a = plain(ds4_model, PROMPT_A)
    drafter = ScriptedDrafter(PROMPT_A, reference_a, ds4_model.args.vocab_size, error_rate=0.0)
    config, lease = SpeculationConfig(), DrafterLease()
    a = Driver(
        stepped(ds4_model.new_session(), PROMPT_A, N, drafter=drafter, config=config, lease=lease)
    )
    a.advance(None)  # one drafted cycle, alone
    b = Driver(
        stepped(ds4_model.new_session(), PROMPT_B, N, drafter=drafter, config=config, lease=lease)
    )
    try:
        while a.step is not None:
            a.advance(None)
    finally:
        b.events.close()
    assert a.tokens == reference_a
    assert a.stats.drafted_passes == 1
    assert drafter.observed_rows == [len(PROMPT_B)]
