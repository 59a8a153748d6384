"""The engine thread: one worker runs generations one at a time, in arrival order.

MLX work never runs on the event loop. Each request becomes a :class:`Job` that the worker runs
when its turn comes; the worker hands every event to the job's event loop as it is produced, and
the request's coroutine reads them with a timeout so that it can send keep-alives while the job
waits in the queue or prefills. Cancelling a job (the client went away) skips it if it has not
started and otherwise closes its generator after the current token, freeing the engine.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ds4mlx.engine.chat import ChatEvent
from ds4mlx.server.errors import APIError
from ds4mlx.speculation.service import Finished, ServiceEvent

import mlx.core as mx

log = logging.getLogger("ds4mlx.server")

T = TypeVar("T")


class KeepAlive:
    """Yielded instead of an event when none came within the keep-alive interval."""


KEEP_ALIVE = KeepAlive()


class _End:
    """Marks the end of a job's events."""


_END = _End()

JobItem = ChatEvent | Finished | APIError | _End


class Job:
    """One request's generation: started on the worker thread, read on the event loop."""

    def __init__(self, start: Callable[[], Generator[ServiceEvent, None, None]],
                 loop: asyncio.AbstractEventLoop):
        self.start = start
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

    async def events(self, keepalive_seconds: float
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


@dataclass
class _Call:
    """Any work for the engine thread, with the future its caller waits on."""

    function: Callable[[], Any]
    result: Future[Any] = field(default_factory=Future)


class GenerationQueue:
    """The engine thread: one worker that runs all MLX work, generations in FIFO order.

    Loading the model must happen here too (:meth:`run`): MLX arrays belong to the thread
    that created them, and a model loaded on one thread fails to generate on another.
    """

    def __init__(self) -> None:
        self._items: queue.Queue[Job | _Call | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stats = QueueStats()
        self._current: Job | None = None
        self._closing = False
        self._worker = threading.Thread(target=self._work, name="ds4-engine", daemon=True)
        self._worker.start()

    def run(self, function: Callable[[], T]) -> T:
        """Run ``function`` on the engine thread and return its result (or raise its error);
        blocks, so never call it on the event loop."""
        call = _Call(function)
        with self._lock:
            if self._closing:
                raise RuntimeError("the engine thread has stopped")
            self._items.put(call)
        return call.result.result()

    def submit(self, start: Callable[[], Generator[ServiceEvent, None, None]]) -> Job:
        """Queue a generation; must be called on the event loop that will read the job."""
        job = Job(start, asyncio.get_running_loop())
        with self._lock:
            if self._closing:
                raise APIError(503, "the server is shutting down")
            self._stats.submitted += 1
            self._stats.queued += 1
            self._items.put(job)
        return job

    def stats(self) -> QueueStats:
        with self._lock:
            return replace(self._stats)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the running job, refuse the queued ones and wait for the worker to exit."""
        with self._lock:
            self._closing = True
            if self._current is not None:
                self._current.cancel()
            self._items.put(None)
        self._worker.join(timeout)

    # ------------------------------------------------------------------ engine thread

    def _work(self) -> None:
        try:
            while (item := self._items.get()) is not None:
                if isinstance(item, _Call):
                    self._call(item)
                    continue
                with self._lock:
                    self._stats.queued -= 1
                    self._current = item
                    if self._closing:
                        item.cancel()
                outcome = self._run(item)
                with self._lock:
                    self._current = None
                    setattr(self._stats, outcome, getattr(self._stats, outcome) + 1)
        finally:
            # MLX requires each thread to destroy its streams before the interpreter exits,
            # or the process aborts at exit.
            mx.clear_streams()

    @staticmethod
    def _call(call: _Call) -> None:
        try:
            call.result.set_result(call.function())
        except BaseException as exc:  # handed to the caller, who re-raises it
            call.result.set_exception(exc)

    def _run(self, job: Job) -> str:
        """Run one job to its end; returns the QueueStats counter it adds to."""
        if job.cancelled:
            if self._closing:
                job.deliver(APIError(503, "the server is shutting down"))
            job.deliver(_END)
            return "cancelled"
        events: Generator[ServiceEvent, None, None] | None = None
        started = False
        with self._lock:
            self._stats.running = 1
        try:
            events = job.start()
            for event in events:
                started = True
                if job.cancelled:
                    return "cancelled"
                job.deliver(event)
            return "completed"
        except Exception as exc:  # a failure ends this request, never the engine thread
            if isinstance(exc, (ValueError, TypeError)) and not started:
                # The service raises these for requests it cannot serve (a prompt over the
                # context, a malformed message) before it generates anything.
                job.deliver(APIError(400, str(exc)))
            else:
                log.exception("generation failed")
                job.deliver(APIError(500, f"generation failed: {exc}"))
            return "failed"
        finally:
            if events is not None:
                events.close()
            with self._lock:
                self._stats.running = 0
            job.deliver(_END)
