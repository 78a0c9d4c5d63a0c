"""The server's parts without an app: the model worker's job queue closed and started again (an
app served a second time) while its old worker still finishes a job, and the background server's
socket when it cannot bind."""

from __future__ import annotations

import asyncio
import threading

import pytest

from attnrank.serve.jobs import Cancelled, JobQueue


def test_a_queue_started_again_while_its_old_worker_finishes_a_long_job_runs_new_jobs():
    """close() waits only so long: the old worker, still in its job, left the stop marker in the
    shared queue, start() saw it alive and started none, and the marker then stopped it, so every
    later job was refused (and resolving the old job on its closed event loop killed the thread)."""
    jobs, gate, entered = JobQueue(), threading.Event(), threading.Event()

    def long_job(job):
        entered.set()
        gate.wait(10)
        return "old"

    async def submit_long():
        return jobs.submit(long_job)

    asyncio.run(submit_long())  # its event loop closes while the job still runs
    assert entered.wait(10)
    jobs.close(timeout=0.1)
    jobs.start()  # as the app's lifespan does when it is served again

    order: list[str] = []

    def new_job(job):
        order.append("new" if gate.is_set() else "new, while the old job ran")
        return "new"

    async def submit_new(release: bool):
        job = jobs.submit(new_job)
        if release:  # the old job ends after the new one was queued: the new one waits for it
            await asyncio.sleep(0.2)
            gate.set()
        return await asyncio.wait_for(job.future, 10)

    assert asyncio.run(submit_new(True)) == "new"
    assert asyncio.run(submit_new(False)) == "new"  # the old worker's end left the new one running
    assert order == ["new", "new"]  # one job at a time: never beside the old worker's
    jobs.close()


def test_jobs_cancelled_while_waiting_do_not_keep_their_requests_data():
    """Cancelled jobs wait in the queue until the worker reaches them; each held its closure (the
    request's documents, megabytes), so clients that gave up and retried behind one long job grew
    memory without bound while the queue's places stayed free."""
    import gc
    import weakref

    jobs, gate, entered = JobQueue(max_queued=2), threading.Event(), threading.Event()

    class Payload:  # stands in for a request's documents
        pass

    held: list[weakref.ref] = []

    async def pile_up():
        jobs.submit(lambda job: entered.set() or gate.wait(10))
        assert await asyncio.to_thread(entered.wait, 10)
        waiting = []
        for _ in range(50):
            data = Payload()
            held.append(weakref.ref(data))
            job = jobs.submit(lambda job, data=data: data)
            jobs.cancel(job)
            waiting.append(job)
        del data
        gc.collect()
        alive = sum(ref() is not None for ref in held)
        gate.set()
        for job in waiting:
            with pytest.raises(Cancelled):
                await asyncio.wait_for(job.future, 10)
        return alive

    assert asyncio.run(pile_up()) == 0
    assert jobs.stats()["cancelled"] == 50
    jobs.close()


def test_a_server_that_cannot_bind_closes_its_socket():
    import gc
    import socket
    import warnings

    import pytest

    pytest.importorskip("uvicorn")
    from attnrank.serve.background import background_server

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    gc.collect()  # (earlier tests' unclosed client sockets are theirs: collected before this one records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(OSError), background_server(object(), port=taken.getsockname()[1]):
                pass
            gc.collect()
        assert not [
            str(w.message) for w in caught if issubclass(w.category, ResourceWarning)
        ]  # was: an unclosed socket
    finally:
        taken.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # (uvicorn's own exit)
def test_a_server_that_fails_to_start_says_so_at_once():
    """A lifespan startup that raised ended uvicorn's thread at once, and the error read "did not
    start within 30 s"."""
    import contextlib

    import pytest
    from fastapi import FastAPI

    from attnrank.serve.background import background_server

    @contextlib.asynccontextmanager
    async def broken(app):
        raise RuntimeError("startup failed")
        yield

    with (
        pytest.raises(RuntimeError, match="uvicorn stopped while starting"),
        background_server(FastAPI(lifespan=broken), log_level="critical"),
    ):
        pass


def test_a_job_queued_while_the_queue_closes_is_answered_not_lost():
    """submit checked the queue open under its lock but queued the job after releasing it: a
    close() in between drained the queue first, and the job landed after the stop marker, never
    answered (its client hung until the shutdown's grace ran out) and its place held for good."""
    jobs, gate, entered = JobQueue(), threading.Event(), threading.Event()
    jobs.start()  # (as a served app's lifespan does: the queue below is then the worker's)
    real_put = jobs._queue.put_nowait

    def put_while_closing(job):  # a close() from another thread, as uvicorn's shutdown calls it
        if job is not None and not entered.is_set():
            return real_put(job)
        closer = threading.Thread(target=jobs.close, kwargs={"timeout": 0.1})
        closer.start()
        closer.join(0.3)  # (with the job queued under the lock, the close waits for it)
        return real_put(job)

    async def race():
        jobs.submit(lambda job: entered.set() or gate.wait(10))  # the worker busy
        assert await asyncio.to_thread(entered.wait, 10)
        jobs._queue.put_nowait = put_while_closing
        job = jobs.submit(lambda job: "answered")
        try:
            await asyncio.wait_for(asyncio.shield(job.future), 3)
        except Cancelled:
            return "cancelled"
        except asyncio.TimeoutError:
            return "lost"
        finally:
            gate.set()
        return job.future.result()

    assert asyncio.run(race()) == "cancelled"
    assert jobs.waiting == 0


def test_a_queue_starts_no_worker_until_it_is_started_or_given_a_job():
    """Every JobQueue started its worker when made, so each app built and dropped unserved (tests,
    notebooks) left a thread behind; the first job of a queue never started still runs."""
    before = {t for t in threading.enumerate() if t.name == "attnrank-model"}
    idle = [JobQueue() for _ in range(5)]
    assert {t for t in threading.enumerate() if t.name == "attnrank-model"} == before
    jobs = idle[0]

    async def run_one():
        return await asyncio.wait_for(jobs.submit(lambda job: "done").future, 10)

    assert asyncio.run(run_one()) == "done"
    jobs.close()
    closed = JobQueue()
    closed.close()  # closed before it ever ran: refused, not started by the job
    with pytest.raises(Cancelled):
        closed.check_room()
