"""The engine thread's queue driven directly with scripted generations (no model): arrival
order, admission up to ``max_sessions``, batched decode steps and their rows, cancellation of
queued, running and parked jobs, failures before and after output, closing, keep-alives and
the counters. ``feed_batch`` is replaced by a recorder that answers each session with its own
row, so a job given another job's row shows."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ds4mlx.engine.chat import TextDelta
from ds4mlx.generation import DecodeStep, Finished, GenerationCancelled
from ds4mlx.server import queue as queue_module
from ds4mlx.server.errors import APIError
from ds4mlx.server.queue import KEEP_ALIVE, GenerationQueue, Job, QueueStats

import pytest

TIMEOUT = 30.0  # seconds: the bound on every wait


def finished(tokens: int) -> Finished:
    return Finished("stop", prompt_tokens=2, completion_tokens=tokens, cached_tokens=0)


class Recorder:
    """What happened on the engine thread, in order: starts, replies, batched passes, ends."""

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.batches: list[tuple[list[str], list[int]]] = []

    def feed_batch(self, sessions: list[str], tokens: list[int]) -> list[str]:
        self.batches.append((list(sessions), list(tokens)))
        self.log.append(("batch", tuple(sessions)))
        return [f"row of {session}" for session in sessions]

    def decoding(self, name: str, steps: int) -> Callable[[], Any]:
        """A generation that writes ``steps`` tokens, each after a decode step, and records the
        reply each step got."""

        def start() -> Iterator[Any]:
            self.log.append(("start", name))
            try:
                for step in range(steps):
                    reply = yield DecodeStep(name, step)  # type: ignore[arg-type]
                    self.log.append(("reply", name, reply))
                    yield TextDelta(f"{name}{step}")
                yield finished(steps)
            finally:
                self.log.append(("end", name))

        return start


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(queue_module, "feed_batch", recorder.feed_batch)
    return recorder


@pytest.fixture
def engine() -> Iterator[GenerationQueue]:
    engine = GenerationQueue()
    yield engine
    engine.close()


async def outcome(job: Job, keepalive: float = TIMEOUT) -> list[Any]:
    """The job's items, ending with the APIError it raised if it raised one."""
    items: list[Any] = []
    try:
        async for item in job.events(keepalive):
            items.append(item)
    except APIError as error:
        items.append(error)
    return items


@contextmanager
def held(engine: GenerationQueue) -> Iterator[None]:
    """The engine thread busy in a call until the block ends, so that the jobs submitted in
    the block are all waiting when it next admits."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(TIMEOUT)

    caller = threading.Thread(target=engine.run, args=(hold,))
    caller.start()
    assert entered.wait(TIMEOUT)
    try:
        yield
    finally:
        release.set()
        caller.join(TIMEOUT)


def serve_together(
    engine: GenerationQueue, *starts: Callable[[], Any], cancelled: tuple[int, ...] = ()
) -> list[list[Any]]:
    """Submit ``starts`` while the engine is held (cancelling the jobs at ``cancelled`` before
    it admits any) and read every job's items."""

    async def main() -> list[list[Any]]:
        with held(engine):
            jobs = [engine.submit(start) for start in starts]
            for index in cancelled:
                jobs[index].cancel()
        return await asyncio.wait_for(asyncio.gather(*map(outcome, jobs)), TIMEOUT)

    return asyncio.run(main())


def settled(engine: GenerationQueue) -> QueueStats:
    """The counters once the engine thread has finished its turn (a job's reader may see the
    job's last item before the worker counts its outcome)."""
    return engine.run(engine.stats)


def cancelled_at_first_item(
    engine: GenerationQueue,
    start: Callable[[], Any],
    release: threading.Event,
    on_cancelled: Callable[[Finished], None] | None = None,
) -> list[Any]:
    """Submit ``start``, cancel its job as soon as its first item is read, then set
    ``release`` (which the generation waits on before its next item); the items read."""

    async def main() -> list[Any]:
        job = engine.submit(start, on_cancelled=on_cancelled)
        items = []
        async for item in job.events(TIMEOUT):
            items.append(item)
            job.cancel()
            release.set()
        return items

    return asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def texts(items: list[Any]) -> list[str]:
    return [item.text for item in items if isinstance(item, TextDelta)]


def test_one_session_runs_jobs_in_arrival_order_each_decoding_alone(engine, recorder):
    first, second = serve_together(engine, recorder.decoding("a", 2), recorder.decoding("b", 1))
    assert (texts(first), texts(second)) == (["a0", "a1"], ["b0"])
    assert first[-1] == finished(2) and second[-1] == finished(1)
    assert recorder.log == [
        ("start", "a"),
        ("reply", "a", None),
        ("reply", "a", None),
        ("end", "a"),
        ("start", "b"),
        ("reply", "b", None),
        ("end", "b"),
    ]
    assert recorder.batches == []
    stats = settled(engine)
    assert (stats.submitted, stats.completed, stats.queued, stats.running) == (2, 2, 0, 0)
    assert (stats.batched_steps, stats.max_batch, stats.cancelled, stats.failed) == (0, 0, 0, 0)


def test_two_sessions_decode_in_one_pass_each_with_its_own_row(engine, recorder):
    engine.max_sessions = 2
    first, second = serve_together(engine, recorder.decoding("a", 2), recorder.decoding("b", 2))
    assert (texts(first), texts(second)) == (["a0", "a1"], ["b0", "b1"])
    assert recorder.batches == [(["a", "b"], [0, 0]), (["a", "b"], [1, 1])]
    replies = [entry for entry in recorder.log if entry[0] == "reply"]
    assert replies == [("reply", name, f"row of {name}") for name in "abab"]
    stats = settled(engine)
    assert (stats.batched_steps, stats.max_batch, stats.completed) == (2, 2, 2)


def test_a_job_past_the_sessions_waits_for_a_free_one_then_decodes_alone(engine, recorder):
    engine.max_sessions = 2
    outcomes = serve_together(
        engine, recorder.decoding("a", 1), recorder.decoding("b", 1), recorder.decoding("c", 1)
    )
    assert [texts(items) for items in outcomes] == [["a0"], ["b0"], ["c0"]]
    assert recorder.log == [
        ("start", "a"),
        ("start", "b"),
        ("batch", ("a", "b")),
        ("reply", "a", "row of a"),
        ("end", "a"),
        ("reply", "b", "row of b"),
        ("end", "b"),
        ("start", "c"),
        ("reply", "c", None),
        ("end", "c"),
    ]
    assert settled(engine).max_batch == 2


def test_waiting_jobs_are_counted_as_queued_until_admitted(engine, recorder):
    async def main() -> tuple[Any, Any]:
        with held(engine):
            jobs = [engine.submit(recorder.decoding(name, 1)) for name in "ab"]
            waiting = engine.stats()
        await asyncio.wait_for(asyncio.gather(*map(outcome, jobs)), TIMEOUT)
        return waiting, settled(engine)

    waiting, done = asyncio.run(main())
    assert (waiting.submitted, waiting.queued, waiting.running) == (2, 2, 0)
    assert (done.submitted, done.queued, done.running, done.completed) == (2, 0, 0, 2)


def test_a_job_cancelled_while_queued_never_starts(engine, recorder):
    first, second = serve_together(
        engine, recorder.decoding("a", 1), recorder.decoding("b", 1), cancelled=(1,)
    )
    assert (texts(first), second) == (["a0"], [])
    assert ("start", "b") not in recorder.log
    stats = settled(engine)
    assert (stats.completed, stats.cancelled, stats.queued) == (1, 1, 0)


class Cancellable:
    """A generation that answers ``GenerationCancelled`` with what it generated, and that can
    cancel another job (``victim``) when its first step's reply comes."""

    def __init__(self, recorder: Recorder, name: str, steps: int) -> None:
        self.recorder, self.name, self.steps = recorder, name, steps
        self.victim: Job | None = None
        self.stopped: list[Finished] = []

    def start(self) -> Iterator[Any]:
        written = 0
        try:
            for step in range(self.steps):
                reply = yield DecodeStep(self.name, step)  # type: ignore[arg-type]
                self.recorder.log.append(("reply", self.name, reply))
                if self.victim is not None:
                    self.victim.cancel()
                written += 1
                yield TextDelta(f"{self.name}{step}")
            yield finished(written)
        except GenerationCancelled:
            self.recorder.log.append(("stopped", self.name))
            yield finished(written)
        finally:
            self.recorder.log.append(("end", self.name))


def test_a_job_cancelled_at_its_decode_step_leaves_the_batch_and_reports_its_tokens(
    engine, recorder
):
    """``b`` cancels ``a`` after ``a`` took its step and waits on the next one: ``a`` is
    stopped before the next pass (its Finished goes to ``on_cancelled``) and ``b`` goes on
    alone."""
    engine.max_sessions = 2
    a, b = Cancellable(recorder, "a", 3), Cancellable(recorder, "b", 3)
    reported: list[Finished] = []

    async def main() -> list[list[Any]]:
        with held(engine):
            jobs = [engine.submit(a.start, on_cancelled=reported.append), engine.submit(b.start)]
            b.victim = jobs[0]
        return await asyncio.wait_for(asyncio.gather(*map(outcome, jobs)), TIMEOUT)

    first, second = asyncio.run(main())
    assert recorder.batches == [(["a", "b"], [0, 0])]
    assert (texts(first), texts(second)) == (["a0"], ["b0", "b1", "b2"])
    assert not any(isinstance(item, Finished) for item in first)
    assert reported == [finished(1)]
    assert recorder.log[recorder.log.index(("reply", "b", "row of b")) + 1 :] == [
        ("stopped", "a"),
        ("end", "a"),
        ("reply", "b", None),
        ("reply", "b", None),
        ("end", "b"),
    ]
    stats = settled(engine)
    assert (stats.cancelled, stats.completed, stats.running) == (1, 1, 0)


def test_a_running_job_cancelled_between_events_delivers_nothing_more(engine, recorder):
    release = threading.Event()

    def start() -> Iterator[Any]:
        try:
            yield TextDelta("first")
            assert release.wait(TIMEOUT)
            yield TextDelta("second")
            yield finished(2)
        finally:
            recorder.log.append(("end", "a"))

    assert texts(cancelled_at_first_item(engine, start, release)) == ["first"]
    assert recorder.log == [("end", "a")]
    assert settled(engine).cancelled == 1


def test_a_started_job_is_counted_as_running_until_it_ends(engine):
    release = threading.Event()

    def start() -> Iterator[Any]:
        yield TextDelta("x")
        assert release.wait(TIMEOUT)
        yield finished(1)

    async def main() -> tuple[Any, list[Any]]:
        job = engine.submit(start)
        items = []
        async for item in job.events(TIMEOUT):
            if not items:
                during = engine.stats()
                release.set()
            items.append(item)
        return during, items

    during, items = asyncio.run(asyncio.wait_for(main(), TIMEOUT))
    assert items == [TextDelta("x"), finished(1)]
    assert (during.running, during.queued, during.submitted) == (1, 0, 1)
    assert (settled(engine).running, settled(engine).completed) == (0, 1)


def test_a_cancelled_generation_without_a_finished_reports_nothing(engine, recorder):
    """A stand-in that just ends when stopped: nothing goes to ``on_cancelled``."""
    reported: list[Finished] = []
    release = threading.Event()

    def start() -> Iterator[Any]:
        yield TextDelta("x")
        assert release.wait(TIMEOUT)
        yield DecodeStep("a", 0)  # type: ignore[arg-type]
        yield finished(1)

    items = cancelled_at_first_item(engine, start, release, on_cancelled=reported.append)
    assert texts(items) == ["x"]
    assert reported == []
    assert settled(engine).cancelled == 1


def failing_start(exc: Exception) -> Callable[[], Any]:
    def start() -> Any:
        raise exc

    return start


def failing_after_output(exc: Exception) -> Callable[[], Any]:
    def start() -> Iterator[Any]:
        yield TextDelta("partial")
        raise exc

    return start


@pytest.mark.parametrize(
    ("start", "status", "message"),
    [
        (failing_start(ValueError("too long")), 400, "too long"),
        (failing_start(TypeError("bad message")), 400, "bad message"),
        (failing_start(RuntimeError("broken")), 500, "generation failed: broken"),
        (failing_after_output(ValueError("late")), 500, "generation failed: late"),
    ],
)
def test_failures_are_the_requests_fault_only_before_output(
    engine, recorder, start, status, message
):
    (items,) = serve_together(engine, start)
    error = items[-1]
    assert isinstance(error, APIError)
    assert (error.status, error.message) == (status, message)
    stats = settled(engine)
    assert (stats.failed, stats.completed, stats.running) == (1, 0, 0)
    # The engine thread lives on: the next job is served.
    (after,) = serve_together(engine, recorder.decoding("next", 1))
    assert texts(after) == ["next0"]


def test_a_failed_batched_pass_fails_its_jobs_and_the_engine_goes_on(engine, recorder, monkeypatch):
    def broken(sessions: list[str], tokens: list[int]) -> list[str]:
        raise ValueError("a batched step needs sessions of one model")

    monkeypatch.setattr(queue_module, "feed_batch", broken)
    engine.max_sessions = 2
    outcomes = serve_together(engine, recorder.decoding("a", 1), recorder.decoding("b", 1))
    for items in outcomes:
        assert (items[-1].status, items[-1].message) == (
            500,
            "generation failed: a batched step needs sessions of one model",
        )
    stats = settled(engine)
    assert recorder.log == [("start", "a"), ("start", "b"), ("end", "a"), ("end", "b")]
    assert (stats.failed, stats.running, stats.batched_steps) == (2, 0, 0)
    monkeypatch.setattr(queue_module, "feed_batch", recorder.feed_batch)
    (after,) = serve_together(engine, recorder.decoding("c", 1))
    assert texts(after) == ["c0"]


def test_a_generation_whose_cleanup_fails_still_ends_and_counts(engine, recorder):
    release = threading.Event()

    def start() -> Iterator[Any]:
        try:
            yield TextDelta("x")
            assert release.wait(TIMEOUT)
            yield DecodeStep("a", 0)  # type: ignore[arg-type]
        finally:
            raise RuntimeError("cleanup failed")

    assert cancelled_at_first_item(engine, start, release) == [TextDelta("x")]
    assert (settled(engine).cancelled, settled(engine).running) == (1, 0)
    (after,) = serve_together(engine, recorder.decoding("b", 1))
    assert texts(after) == ["b0"]


def test_closing_refuses_the_queued_jobs_and_every_later_one(recorder):
    engine = GenerationQueue()
    started = threading.Event()

    def start() -> Iterator[Any]:
        yield TextDelta("a")
        started.set()
        while True:
            yield DecodeStep("a", 0)  # type: ignore[arg-type]

    async def main() -> tuple[list[Any], list[Any]]:
        running = engine.submit(start)
        assert await asyncio.to_thread(started.wait, TIMEOUT)
        with held(engine):
            queued = engine.submit(recorder.decoding("b", 1))
            closing = threading.Thread(target=engine.close)
            closing.start()
        await asyncio.to_thread(closing.join, TIMEOUT)
        with pytest.raises(APIError) as refused:
            engine.submit(recorder.decoding("c", 1))
        assert (refused.value.status, refused.value.message) == (
            503,
            "the server is shutting down",
        )
        return await outcome(running), await outcome(queued)

    running, queued = asyncio.run(asyncio.wait_for(main(), TIMEOUT))
    assert texts(running) == ["a"] and not isinstance(running[-1], APIError)
    assert (queued[-1].status, queued[-1].message) == (503, "the server is shutting down")
    assert ("start", "b") not in recorder.log
    stats = engine.stats()
    assert (stats.cancelled, stats.queued, stats.running) == (2, 0, 0)
    with pytest.raises(RuntimeError, match="the engine thread has stopped"):
        engine.run(lambda: 1)


def test_run_returns_the_result_or_raises_the_error_on_the_engine_thread(engine):
    assert engine.run(lambda: threading.current_thread().name) == "ds4-engine"

    def fail() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        engine.run(fail)


def test_a_silent_job_sends_keep_alives_before_and_between_its_events(engine):
    """While the job has nothing queued, before its first event or after one, its reader
    waits and sends keep-alives (it never reads an empty queue)."""
    before, between = threading.Event(), threading.Event()

    def start() -> Iterator[Any]:
        assert before.wait(TIMEOUT)
        yield TextDelta("early")
        assert between.wait(TIMEOUT)
        yield TextDelta("late")
        yield finished(2)

    async def main() -> list[Any]:
        job = engine.submit(start)
        items = []
        async for item in job.events(0.01):
            items.append(item)
            if item is KEEP_ALIVE:
                (between if TextDelta("early") in items else before).set()
        return items

    items = asyncio.run(asyncio.wait_for(main(), TIMEOUT))
    assert items[0] is KEEP_ALIVE
    assert [item for item in items if item is not KEEP_ALIVE] == [
        TextDelta("early"),
        TextDelta("late"),
        finished(2),
    ]
    assert KEEP_ALIVE in items[items.index(TextDelta("early")) :]


def test_a_job_whose_event_loop_is_gone_is_cancelled():
    loop = asyncio.new_event_loop()
    job = Job(lambda: iter(()), loop)
    loop.close()
    job.deliver(TextDelta("nobody reads this"))
    assert job.cancelled
