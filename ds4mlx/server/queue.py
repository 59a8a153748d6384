"""The engine thread: one worker runs every generation, in arrival order.

MLX work never runs on the event loop. Each request becomes a :class:`Job` that the worker runs
when its turn comes; the worker hands every event to the job's event loop as it is produced, and
the request's coroutine reads them with a timeout so that it can send keep-alives while the job
waits in the queue or prefills. Cancelling a job (the client went away) skips it if it has not
started and otherwise closes its generator before its next step, freeing its session.

With ``max_sessions`` > 1 (``--batched-session N``) up to that many jobs run together: the
worker prefills each new job on its own, then decodes the next token of every running job in
one batched pass (``feed_batch``) per step; jobs join and leave between steps, and each samples
its own token from its row. A job running alone decodes on its own, speculatively if it can.
Generations tell the worker where their steps are by yielding ``DecodeStep`` (see
``ds4mlx.engine.generate``); one that never does runs to its end in one go.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ds4mlx.generation import (
    ChatEvent,
    DecodeStep,
    Finished,
    GenerationCancelled,
    ScheduledEvent,
    feed_batch,
)
from ds4mlx.server.errors import APIError

import mlx.core as mx

log = logging.getLogger("ds4mlx.server")

T = TypeVar("T")

Generation = Generator[ScheduledEvent, mx.array | None, None]


class KeepAlive:
    """Yielded instead of an event when none came within the keep-alive interval."""


KEEP_ALIVE = KeepAlive()


class _End:
    """Marks the end of a job's events."""


_END = _End()

JobItem = ChatEvent | Finished | APIError | _End


class Job:
    """One request's generation: started on the worker thread, read on the event loop."""

    def __init__(
        self,
        start: Callable[[], Generation],
        loop: asyncio.AbstractEventLoop,
        on_cancelled: Callable[[Finished], None] | None = None,
    ):
        self.start = start
        #: Called on the worker thread with what a generation stopped early had generated
        #: (its reader, gone, never sees that ``Finished``).
        self.on_cancelled = on_cancelled
        self._loop = loop
        self._items: deque[JobItem] = deque()
        self._ready = asyncio.Event()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop the generation (or skip it if it has not started); safe from any thread."""
        self._cancelled.set()

    def deliver(self, item: JobItem) -> None:
        """Worker side: pass one item to the reading coroutine."""
        try:
            self._loop.call_soon_threadsafe(self._push, item)
        except RuntimeError:  # the event loop is gone: nobody will read this job
            self.cancel()

    def _push(self, item: JobItem) -> None:
        self._items.append(item)
        self._ready.set()

    async def events(
        self, keepalive_seconds: float
    ) -> AsyncIterator[ChatEvent | Finished | KeepAlive]:
        """The job's events, KEEP_ALIVE whenever ``keepalive_seconds`` pass without one; a
        failed generation raises its APIError."""
        while True:
            if not self._items:
                try:
                    # The items live in the deque, so a wait cut short by the timeout loses none.
                    await asyncio.wait_for(self._ready.wait(), keepalive_seconds)
                except asyncio.TimeoutError:
                    yield KEEP_ALIVE
                    continue
            item = self._items.popleft()
            if not self._items:
                self._ready.clear()
            if isinstance(item, _End):
                return
            if isinstance(item, APIError):
                raise item
            yield item


@dataclass
class QueueStats:
    submitted: int = 0
    completed: int = 0
    cancelled: int = 0  # the client went away before the generation finished
    failed: int = 0
    queued: int = 0
    running: int = 0
    batched_steps: int = 0  # decode steps that advanced more than one job in one pass
    max_batch: int = 0  # the most jobs one batched step advanced


@dataclass
class _Call:
    """Any work for the engine thread, with the future its caller waits on."""

    function: Callable[[], Any]
    result: Future[Any] = field(default_factory=Future)


@dataclass
class _Running:
    """A started job: its generation, and the decode step it waits on (None while it runs)."""

    job: Job
    events: Generation
    step: DecodeStep | None = None
    started: bool = False  # it has delivered an event


class GenerationQueue:
    """The engine thread: one worker that runs all MLX work, generations in FIFO order, up to
    ``max_sessions`` of them at once (see the module notes).

    Loading the model must happen here too (:meth:`run`): MLX arrays belong to the thread
    that created them, and a model loaded on one thread fails to generate on another.
    ``max_sessions`` may be changed between requests; the service must have that many sessions.
    """

    def __init__(self, max_sessions: int = 1) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._wake = threading.Condition()
        self._calls: deque[_Call] = deque()
        self._waiting: deque[Job] = deque()
        self._running: list[_Running] = []
        self._stats = QueueStats()
        self._closing = False
        self._worker = threading.Thread(target=self._work, name="ds4-engine", daemon=True)
        self._worker.start()

    def run(self, function: Callable[[], T]) -> T:
        """Run ``function`` on the engine thread and return its result (or raise its error);
        blocks, so never call it on the event loop."""
        call = _Call(function)
        with self._wake:
            if self._closing:
                raise RuntimeError("the engine thread has stopped")
            self._calls.append(call)
            self._wake.notify()
        return call.result.result()

    def submit(
        self,
        start: Callable[[], Generation],
        on_cancelled: Callable[[Finished], None] | None = None,
    ) -> Job:
        """Queue a generation; must be called on the event loop that will read the job.
        ``on_cancelled`` receives the ``Finished`` of a generation the job's cancelling stopped
        (see ``Job.on_cancelled``)."""
        job = Job(start, asyncio.get_running_loop(), on_cancelled)
        with self._wake:
            if self._closing:
                raise APIError(503, "the server is shutting down")
            self._stats.submitted += 1
            self._stats.queued += 1
            self._waiting.append(job)
            self._wake.notify()
        return job

    def stats(self) -> QueueStats:
        with self._wake:
            return replace(self._stats)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the running jobs, refuse the queued ones and wait for the worker to exit."""
        with self._wake:
            self._closing = True
            for run in self._running:
                run.job.cancel()
            self._wake.notify()
        self._worker.join(timeout)

    # ------------------------------------------------------------------ engine thread

    def _work(self) -> None:
        try:
            while self._turn():
                pass
        finally:
            # MLX requires each thread to destroy its streams before the interpreter exits,
            # or the process aborts at exit.
            mx.clear_streams()

    def _turn(self) -> bool:
        """Run the calls that came in, admit waiting jobs while there is room, then advance the
        running jobs by one step; False once the queue is closed."""
        with self._wake:
            while not (self._calls or self._waiting or self._running or self._closing):
                self._wake.wait()
            calls = list(self._calls)
            self._calls.clear()
            closing = self._closing
            admitted: list[Job] = []
            room = 0 if closing else self.max_sessions - len(self._running)
            while self._waiting and len(admitted) < room:
                admitted.append(self._waiting.popleft())
            refused = list(self._waiting) if closing else []
            if closing:
                self._waiting.clear()
            self._stats.queued -= len(admitted) + len(refused)
        for call in calls:
            self._call(call)
        if closing:
            for job in refused:
                job.deliver(APIError(503, "the server is shutting down"))
                self._end(job, "cancelled")
            for run in list(self._running):
                self._finish(run, "cancelled")
            return False
        for job in admitted:
            self._start(job)
        self._step()
        return True

    @staticmethod
    def _call(call: _Call) -> None:
        try:
            call.result.set_result(call.function())
        except BaseException as exc:  # handed to the caller, who re-raises it
            call.result.set_exception(exc)

    def _start(self, job: Job) -> None:
        if job.cancelled:
            self._end(job, "cancelled")
            return
        try:
            events = job.start()
        except Exception as exc:
            self._fail(job, exc, started=False)
            self._end(job, "failed")
            return
        run = _Running(job, events)
        with self._wake:
            self._running.append(run)
            self._stats.running = len(self._running)
        self._advance(run, None)  # the prefill, up to the first decode step

    def _step(self) -> None:
        """One decode step for every running job: alone, a job decodes on its own (and may
        speculate); together, the steps run as one batched pass."""
        for run in [r for r in self._running if r.job.cancelled]:
            self._finish(run, "cancelled")
        waiting = [run for run in self._running if run.step is not None]
        if not waiting:
            return
        if len(self._running) == 1:
            self._resume(waiting[0], None)
            return
        steps = [run.step for run in waiting if run.step is not None]
        try:
            logits = feed_batch([step.session for step in steps], [step.token for step in steps])
        except Exception as exc:  # a failed pass fails its jobs, never the engine thread
            for run in waiting:
                self._fail(run.job, exc, started=True)
                self._finish(run, "failed")
            return
        with self._wake:
            self._stats.batched_steps += 1
            self._stats.max_batch = max(self._stats.max_batch, len(steps))
        for row, run in enumerate(waiting):
            self._resume(run, logits[row])

    def _resume(self, run: _Running, reply: mx.array | None) -> None:
        run.step = None
        self._advance(run, reply)

    def _advance(self, run: _Running, reply: mx.array | None) -> None:
        """Run ``run``'s generation, delivering its events, up to its next decode step or its
        end; ``reply`` answers the step it waited on."""
        job = run.job
        try:
            item = run.events.send(reply)
            while True:
                if job.cancelled:
                    self._finish(run, "cancelled")
                    return
                if isinstance(item, DecodeStep):
                    run.step = item
                    return
                run.started = True
                job.deliver(item)
                item = next(run.events)
        except StopIteration:
            self._finish(run, "completed")
        except Exception as exc:  # a failure ends this request, never the engine thread
            self._fail(job, exc, run.started)
            self._finish(run, "failed")

    @staticmethod
    def _fail(job: Job, exc: Exception, started: bool) -> None:
        if isinstance(exc, (ValueError, TypeError)) and not started:
            # The service raises these for requests it cannot serve (a prompt over the
            # context, a malformed message) before it generates anything.
            job.deliver(APIError(400, str(exc)))
        else:
            log.error("generation failed", exc_info=exc)
            job.deliver(APIError(500, f"generation failed: {exc}"))

    def _finish(self, run: _Running, outcome: str) -> None:
        """End a started job: close its generation (which frees its session); a cancelled one
        is first asked what it generated."""
        try:
            if outcome == "cancelled":
                self._stop(run)
            run.events.close()
        except Exception:  # closing runs the generation's cleanup; it must not stop the worker
            log.exception("closing a generation failed")
        with self._wake:
            self._running.remove(run)
            self._stats.running = len(self._running)
        self._end(run.job, outcome)

    @staticmethod
    def _stop(run: _Running) -> None:
        """Stop ``run``'s generation with ``GenerationCancelled``: the ``Finished`` it ends
        with goes to the job's ``on_cancelled``. A generation that does not answer with one (a
        stand-in service) just ends."""
        try:
            item = run.events.throw(GenerationCancelled())
        except (GenerationCancelled, StopIteration):
            return
        if isinstance(item, Finished) and run.job.on_cancelled is not None:
            run.job.on_cancelled(item)

    def _end(self, job: Job, outcome: str) -> None:
        """Count ``job`` under ``outcome`` (a QueueStats counter) and end its events."""
        with self._wake:
            setattr(self._stats, outcome, getattr(self._stats, outcome) + 1)
        job.deliver(_END)
