"""The bounded job queue in front of the one loaded model.

Model work runs on one worker thread, one job at a time (the attention capture and generation
use the model's own intra-op threads; two jobs at once would only contend for the same cores).
At most ``max_queued`` jobs wait behind the running one; a job submitted beyond that is refused
at once (:class:`QueueFull`, answered 503 with ``Retry-After``), so a request never hangs on a
full queue. A job whose client went away is cancelled: skipped if it has not started (and it
gives its place back at once: abandoned jobs never make live requests wait or fail), and told
to stop (:meth:`Job.check`, called between its steps and while streaming) if it has.
No micro-batching: attention reranking puts one query and its candidates in one prompt, so
requests do not share a forward pass.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The queue holds ``max_queued`` jobs already; ``retry_after`` is a wait estimate in seconds."""

    def __init__(self, queued: int, retry_after: int):
        super().__init__(f"the model queue is full ({queued} requests waiting); retry in {retry_after} s")
        self.queued, self.retry_after = queued, retry_after


class Cancelled(Exception):
    """Raised inside a job whose client disconnected, to stop its work early."""


@dataclass
class Job:
    """One unit of model work: ``fn(job)`` runs on the worker thread; ``future`` gets its result."""

    fn: Callable[[Job], Any]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.perf_counter)
    started: float | None = None
    finished: float | None = None
    waiting: bool = False  # holds one of the queue's ``max_queued`` places
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        """Stop here (raise :class:`Cancelled`) if the client has gone."""
        if self._cancelled.is_set():
            raise Cancelled()

    @property
    def queue_wait(self) -> float:
        """Seconds between submission and start (so far, if not started)."""
        return (self.started or time.perf_counter()) - self.enqueued


def _gone(job: Job) -> Any:
    """The work of a job cancelled before it started (its own is dropped with the request's data)."""
    raise Cancelled()


def _resolve(job: Job, result: Any = None, error: BaseException | None = None) -> None:
    fut = job.future
    if fut.done():
        return
    if error is None:
        fut.set_result(result)
        return
    fut.set_exception(error)
    if job.cancelled:  # nobody waits for a cancelled job: mark its exception as seen
        fut.exception()


def _post(job: Job, result: Any, error: BaseException | None = None) -> None:
    """Resolve ``job``'s future on its event loop; a loop closed since (the server that submitted
    it has shut down) has no one waiting, and must not stop the worker."""
    try:
        job.loop.call_soon_threadsafe(_resolve, job, result, error)
    except RuntimeError:  # "Event loop is closed"
        logger.debug("job finished after its event loop closed; result dropped")


class JobQueue:
    """A single worker thread and a queue of at most ``max_queued`` waiting jobs."""

    def __init__(self, max_queued: int = 16):
        if max_queued < 1:
            raise ValueError(f"max_queued={max_queued} must be >= 1")
        self.max_queued = max_queued
        # unbounded: the bound is on ``waiting`` (live jobs), so cancelled ones never fill it
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.waiting = 0
        # done/failed/cancelled: jobs finished so; rejected: refused (queue full);
        # disconnected: cancellations requested because the client went away
        self.counts = {"done": 0, "failed": 0, "cancelled": 0, "rejected": 0, "disconnected": 0}
        self.running = 0
        self._mean_seconds = 1.0  # running mean of job durations, for Retry-After
        # no worker until the app is served (:meth:`start`) or its first job comes: one started
        # here outlived every app built and dropped unserved (a thread per create_app)
        self._thread: threading.Thread | None = None
        self._closing = False

    def start(self) -> None:
        """Start the worker unless it runs (an app served again after its shutdown closed it). A
        worker still finishing a job after :meth:`close` keeps its own queue, whose stop marker it
        reads next: the new worker gets a new queue, so it never reads that marker, and waits for the
        old one to finish before it runs a job (one job at a time: they share the stages' caches)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        """(with the lock held) :meth:`start`."""
        if self._closing or self._thread is None or not self._thread.is_alive():
            self._queue = queue.Queue()
            self._thread = threading.Thread(
                target=self._work, args=(self._queue, self._thread), name="attnrank-model", daemon=True
            )
            self._closing = False
            self._thread.start()

    @property
    def queued(self) -> int:
        """Jobs waiting for the worker, not counting those cancelled meanwhile."""
        return self.waiting

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "queued": self.queued,
                "running": self.running,
                "max_queued": self.max_queued,
                "mean_job_seconds": round(self._mean_seconds, 3),
                **self.counts,
            }

    def submit(self, fn: Callable[[Job], Any]) -> Job:
        """Queue ``fn`` (call from the event loop); raises :class:`QueueFull` when full."""
        loop = asyncio.get_running_loop()
        job = Job(fn, loop.create_future(), loop)
        with self._lock:  # (queued under the lock: a close() between the check and the put drained the
            # queue first, and the job landed after its stop marker, never answered, its place held)
            self._refuse_when_full()
            self.waiting += 1
            job.waiting = True
            self._queue.put_nowait(job)
        return job

    def check_room(self) -> None:
        """Raise :class:`QueueFull` (or :class:`Cancelled`, closed) now if a job would be refused:
        a route calls it before its own preparation (tokenizing every document), so that a full
        queue sheds that work too, not only the model's."""
        with self._lock:
            self._refuse_when_full()

    def _refuse_when_full(self) -> None:
        """(with the lock held) The refusal of a job that would find the queue full or closed; the
        worker started by the first job of a queue never started nor closed."""
        if self._thread is None and not self._closing:
            self._start()
        if self._closing or self._thread is None or not self._thread.is_alive():  # closed: nothing would run it
            raise Cancelled("the model worker is stopped (the server is shutting down)")
        if self.waiting >= self.max_queued:
            self.counts["rejected"] += 1
            raise QueueFull(self.max_queued, max(1, math.ceil((self.max_queued + 1) * self._mean_seconds)))

    def _leave(self, job: Job) -> None:
        """Give back ``job``'s queue place (call with the lock held)."""
        if job.waiting:
            job.waiting = False
            self.waiting -= 1

    def cancel(self, job: Job) -> None:
        """Cancel ``job`` because its client has gone (skipped if queued, stopped at its next check if running)."""
        with self._lock:
            if job.cancelled:
                return
            job.cancel()
            self.counts["disconnected"] += 1
            self._leave(job)
            # a cancelled job stays in the queue until the worker reaches it: without its work (whose
            # closure holds the request's documents) it holds bytes, not megabytes, however many pile up
            job.fn = _gone

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker after the running job (queued jobs are cancelled); waits ``timeout``
        seconds for it (a longer job finishes after, and its worker then stops)."""
        with self._lock:
            self._closing = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                with self._lock:
                    self._leave(job)
                _post(job, None, Cancelled())
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _count(self, key: str, seconds: float | None = None) -> None:
        with self._lock:
            self.counts[key] += 1
            if seconds is not None:
                self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * seconds

    def _work(self, jobs: queue.Queue[Job | None], previous: threading.Thread | None = None) -> None:
        if previous is not None:
            previous.join()  # the job it still runs, then its stop marker
        while True:
            job = jobs.get()
            if job is None:
                return
            with self._lock:
                self._leave(job)
                self.running = int(not job.cancelled)
            if job.cancelled:
                self._count("cancelled")
                _post(job, None, Cancelled())
                continue
            job.started = time.perf_counter()
            try:
                result = job.fn(job)
            except Cancelled as e:
                self._count("cancelled")
                _post(job, None, e)
            except BaseException as e:
                self._count("failed")
                _post(job, None, e)
            else:
                job.finished = time.perf_counter()
                self._count("done", job.finished - job.started)
                _post(job, result)
            finally:
                with self._lock:
                    self.running = 0
