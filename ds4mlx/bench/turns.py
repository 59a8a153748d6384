"""Generations decoded in turns, one decode step each, every one timed by its own steps alone.

A speed-up near 1 cannot be read from runs taken one after the other on a shared machine: two
identical 32-token runs of the tiny model, a second apart, differ by 10-20% (other processes,
the machine's own clock and caches), more than the 3% a drafter that loses by little loses. So
the benchmark decodes the target-only run and the drafted runs of a prompt together, in turns:
each generation advances by one step (``stepped``'s ``DecodeStep``: a plain pipelined advance, a
drafted cycle or a pause) while the others wait, and is timed by the seconds its own steps took.
A slow patch of the machine then falls on all of them within a few milliseconds, and the turns
go forward and backward over the generations in alternate sweeps, so that none is always the one
after a given other. The first token, which comes out of the prefill, is not timed (as
``GenerationStats.decode_tps``).

Each step is also timed by the process's CPU seconds (``TimedRun.cpu_seconds``). With MLX on
the CPU the load of other processes adds wall-clock time to a step (it waits for a core) but not
CPU time, so the ratios of CPU seconds vary far less from run to run on a shared machine (the
same 40-token runs: 0.93-1.17 against 0.55-1.28 wall-clock, at load 12). They are the work
done, not the wait: multi-threaded kernels count every thread, and work on a GPU does not count
at all, so they stand beside the wall-clock ratios, never in their place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from ds4mlx.generation import DecodeStep, Done, TokenEvent

#: ``ds4mlx.generation.stepped``'s generations: tokens, a ``DecodeStep`` before each step, the end.
Stepped = Generator[object, None, None]


@dataclass
class TimedRun:
    """One generation's tokens, the seconds of its decode steps, and its ``Done``."""

    tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0
    done: Done | None = None
    #: The process's CPU seconds over the same steps.
    cpu_seconds: float = 0.0

    @property
    def decode_tps(self) -> float:
        """Tokens after the first over the seconds of the steps that decoded them."""
        return self._per_second(self.seconds)

    @property
    def cpu_tps(self) -> float:
        """``decode_tps`` by the steps' CPU seconds."""
        return self._per_second(self.cpu_seconds)

    def _per_second(self, seconds: float) -> float:
        decoded = len(self.tokens) - 1
        return decoded / seconds if decoded > 0 and seconds else 0.0


def _until_next_step(generation: Stepped, run: TimedRun, first: bool) -> bool:
    """Drive ``generation`` through one decode step (the prefill, when ``first``) up to its next
    ``DecodeStep``, collecting its tokens; whether it has steps left."""
    event = next(generation) if first else generation.send(None)
    while True:
        if isinstance(event, DecodeStep):
            return True
        if isinstance(event, TokenEvent):
            run.tokens.append(event.token)
        else:
            run.done = Done(event.stats)
            return False
        event = next(generation)


def decode_in_turns(
    generations: Sequence[Stepped],
    clock: Callable[[], float] = time.perf_counter,
    cpu_clock: Callable[[], float] = time.process_time,
) -> list[TimedRun]:
    """Run ``generations`` (each decoding on its own: every ``DecodeStep`` is answered with None)
    to their ends in turns; their runs, in order, each step timed on ``clock`` and
    ``cpu_clock``."""
    runs = [TimedRun() for _ in generations]
    try:
        live = [i for i, g in enumerate(generations) if _until_next_step(g, runs[i], True)]
        sweep = 0
        while live:
            order = live if sweep % 2 == 0 else live[::-1]
            ended = set()
            for i in order:
                started, cpu_started = clock(), cpu_clock()
                if not _until_next_step(generations[i], runs[i], False):
                    ended.add(i)
                runs[i].seconds += clock() - started
                runs[i].cpu_seconds += cpu_clock() - cpu_started
            live = [i for i in live if i not in ended]
            sweep += 1
    finally:
        for generation in generations:
            generation.close()
    return runs
