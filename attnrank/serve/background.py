"""Run the app under uvicorn: :func:`uvicorn_server` (what ``attnrank serve`` runs), and
:func:`background_server`, in a background thread (benchmarks, tests, notebooks): it binds
127.0.0.1 on a free port (or the one given), waits until uvicorn accepts connections, yields the
base URL, and stops the server on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..errors import require

logger = logging.getLogger(__name__)

# The Host headers of a loopback server's own clients: a server bound to loopback answers these
# only, so that a web page cannot reach it through a name of its own that resolves to 127.0.0.1
# (DNS rebinding). ("[::1]" is read as such by Starlette since 2026-08; an IPv6 bind is not restricted.)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def uvicorn_server(app: Any, **config: Any) -> Any:
    """uvicorn's server for ``app`` (``config``: :class:`uvicorn.Config`'s keywords) that closes
    the app's job queue (:meth:`~attnrank.serve.jobs.JobQueue.close`) as its shutdown begins. Why:
    uvicorn waits for every open connection before the app's own shutdown, and a request waiting
    in the queue holds one, so a shutdown ran every queued job first (minutes of answers for
    clients told nothing); now they are answered 503 "shutting down" and the running job finishes."""
    uvicorn = require("uvicorn", "serve", "attnrank serve")
    base: Any = uvicorn.Server  # (an optional extra: imported here, after the check that names it)
    jobs = _jobs_of(app)

    class Server(base):
        async def shutdown(self, sockets: Any = None) -> None:
            if jobs is not None:
                await asyncio.to_thread(jobs.close)
            await super().shutdown(sockets)

    return Server(uvicorn.Config(app, **config))


def _jobs_of(app: Any) -> Any:
    """The job queue of an attnrank app (:func:`~attnrank.serve.app.create_app`), found through
    middleware wrapped around it (each holds the next as ``.app``); None for another app."""
    while app is not None:
        jobs = getattr(getattr(getattr(app, "state", None), "server", None), "jobs", None)
        if jobs is not None:
            return jobs
        app = getattr(app, "app", None)
    return None


@contextlib.contextmanager
def background_server(
    app: Any, *, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 30.0, log_level: str = "warning"
) -> Iterator[str]:
    """Serve ``app`` on ``host``:``port`` (0 = a free port) while the ``with`` block runs."""
    require("uvicorn", "serve", "attnrank serve")  # (before the socket)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:  # (a bind or a config that fails must not leave the socket open)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        bound = sock.getsockname()[1]
        served = app
        if host in ("127.0.0.1", "localhost"):  # (as `attnrank serve` on loopback: its own host names only)
            from starlette.middleware.trustedhost import TrustedHostMiddleware

            served = TrustedHostMiddleware(app, allowed_hosts=list(LOOPBACK_HOSTS))
        server = uvicorn_server(served, log_level=log_level, lifespan="on", access_log=False)
    except BaseException:
        sock.close()
        raise
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="attnrank-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    try:
        while not server.started:
            if not thread.is_alive():  # (it said "did not start within 30 s" at once: the cause is in its log)
                raise RuntimeError(f"uvicorn stopped while starting on {host}:{bound}; its log above says why")
            if time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {host}:{bound} within {start_timeout} s")
            time.sleep(0.02)
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(10)
        if thread.is_alive():  # (the socket is closed under it all the same: the process is leaving it)
            logger.warning("the server on %s:%s did not stop within 10 s", host, bound)
        sock.close()
