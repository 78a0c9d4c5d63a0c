"""The ``/v1/ask`` answer as server-sent events: the tokens as they come, then the result or the
error (:func:`event_stream`); its job is cancelled when the client leaves, or when the stream is
dropped before it began."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..errors import AttnrankError
from .jobs import Job
from .server import Server  # (it names the serve extra if fastapi is missing)

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # (only annotated here: fastapi is imported by .server, after its check)
    from fastapi import Request


def event_stream(
    request: Request, server: Server, job: Job, pieces: asyncio.Queue[str], info: dict[str, Any]
) -> AsyncIterator[str]:
    """:func:`_events`, and the job cancelled if the stream is dropped unstarted. Why: a stream
    the server never began (its client left before the response started) never runs its
    ``finally``, so its job would rerank, prune and answer for nobody."""
    events = _events(request, server, job, pieces, info)
    weakref.finalize(events, _abandon, server, job).atexit = False
    return events


def _abandon(server: Server, job: Job) -> None:
    """Cancel ``job`` unless done, from the event loop: a finalizer runs inside whatever code
    the garbage collector interrupts, which may hold the job queue's lock."""
    with contextlib.suppress(RuntimeError):  # (a closed loop: nothing left to answer)
        job.loop.call_soon_threadsafe(_cancel_unless_done, server, job)


def _cancel_unless_done(server: Server, job: Job) -> None:
    if not job.future.done():
        server.jobs.cancel(job)


async def _events(
    request: Request, server: Server, job: Job, pieces: asyncio.Queue[str], info: dict[str, Any]
) -> AsyncIterator[str]:
    """The ``/v1/ask`` stream: tokens as they come, then the result; cancels the job if the client
    leaves. Why it polls: until the first token is written, nothing else notices a client that has
    gone (the write would fail), so the job would rerank, prune and start answering for nobody."""
    get: asyncio.Future[str] | None = None
    try:
        while True:
            get = asyncio.ensure_future(pieces.get())
            done: set[Any] = set()
            while not done:
                done, _ = await asyncio.wait({get, job.future}, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
                if not done and await request.is_disconnected():
                    return  # (the finally below cancels the read and the job)
            if get in done:
                yield _sse("token", {"text": get.result()})
                continue
            get.cancel()
            while not pieces.empty():
                yield _sse("token", {"text": pieces.get_nowait()})
            break
        info["queue_wait"] = job.queue_wait
        err = job.future.exception()
        if err is not None:
            if isinstance(err, AttnrankError):  # (its one line names the value and the fix)
                message = str(err)
            else:  # (as every other route answers it: no exception text, which may hold paths, to the client)
                logger.error("/v1/ask failed mid-stream", exc_info=err)
                message = "internal error; see the server log"
            yield _sse("error", {"message": message})
            return
        res = job.future.result()
        timings = {k: round(v, 4) for k, v in res.timings.items()}
        answer = res.answer
        yield _sse(
            "done", {"answer": answer.text, "truncated": answer.truncated, "sources": res.sources, "timings": timings}
        )
    finally:
        if get is not None:
            get.cancel()  # (a no-op once it has its piece)
        if not job.future.done():  # the client went away mid-stream
            server.jobs.cancel(job)
            info["cancelled"] = True
            info["queue_wait"] = job.queue_wait


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"
