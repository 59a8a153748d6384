"""Generations decoded in turns (``bench.turns``): the order of the turns, and each run timed
by its own decode steps alone."""

from __future__ import annotations

from ds4mlx.bench.turns import decode_in_turns
from ds4mlx.engine.generate import DecodeStep, DoneEvent, GenerationStats, TokenEvent


class ScriptedClock:
    """Moves only when a generation's step says so: the seconds each step takes."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scripted(name, steps, clock, log, cpu_clock=None):
    """A stepped generation: a prefill token, then per entry of ``steps`` (seconds, tokens) a
    decode step that lasts that long on ``clock`` (and a quarter of it on ``cpu_clock``: the
    rest waits for a core) and yields that many tokens."""
    clock.now += 100.0  # the prefill: never timed
    yield TokenEvent(0)
    for seconds, tokens in steps:
        answer = yield DecodeStep(None, 0)
        assert answer is None  # every step decodes on its own
        log.append(name)
        clock.now += seconds
        if cpu_clock is not None:
            cpu_clock.now += seconds / 4
        for token in range(tokens):
            yield TokenEvent(token + 1)
    yield DoneEvent(GenerationStats(generated_tokens=1 + sum(n for _, n in steps)))


def test_generations_take_turns_forward_then_backward_each_timed_by_its_own_steps():
    clock, cpu_clock, log = ScriptedClock(), ScriptedClock(), []
    runs = decode_in_turns(
        [
            scripted("plain", [(1.0, 4), (1.0, 4)], clock, log, cpu_clock),
            scripted("a", [(0.5, 2), (0.5, 2), (0.5, 2), (0.5, 2)], clock, log, cpu_clock),
            scripted("b", [(3.0, 8)], clock, log, cpu_clock),
        ],
        clock,
        cpu_clock,
    )
    # Sweeps alternate their direction; an ended generation drops out of the turns.
    assert log == ["plain", "a", "b", "a", "plain", "a", "a"]
    assert [run.seconds for run in runs] == [2.0, 2.0, 3.0]
    assert [len(run.tokens) for run in runs] == [9, 9, 9]
    assert [run.decode_tps for run in runs] == [4.0, 4.0, 8 / 3]
    assert [run.cpu_seconds for run in runs] == [0.5, 0.5, 0.75]
    assert [run.cpu_tps for run in runs] == [16.0, 16.0, 32 / 3]
    assert all(run.done is not None for run in runs)
    assert runs[1].done.stats.generated_tokens == 9


def test_a_generation_that_ends_at_its_first_token_has_no_steps():
    clock, log = ScriptedClock(), []
    only, other = decode_in_turns(
        [scripted("only", [], clock, log), scripted("other", [(1.0, 1)], clock, log)],
        clock,
        clock,
    )
    assert only.tokens == [0] and only.seconds == 0.0 and only.decode_tps == 0.0
    assert log == ["other"] and other.seconds == 1.0
