"""Run the app under uvicorn: :func:`uvicorn_server` (what ``attnrank serve`` runs), and
:func:`background_server`, in a background thread (benchmarks, tests, notebooks): it binds
127.0.0.1 on a free port (or the one given), waits until uvicorn accepts connections, yields the
base URL, and stops the server on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
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
# (DNS rebinding). (Starlette reads "[::1]:8000" as the host "[::1]" since 1.7, which the extra
# requires; before, as "[", and an IPv6 loopback server answered nobody.)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or a name such as ``localhost``) is this machine's loopback
    interface alone, read as :func:`bound_socket` binds it: through the system's resolver, so that
    ``127.1``, ``2130706433`` or a name of 127.0.1.1 count (they bind loopback, and were served with
    the warning of an exposed server and without the Host check), and ``::ffff:127.0.0.1`` too."""
    if host.strip().lower() == "localhost":
        return True
    address = _resolved(host)
    if address is None:  # (unresolvable: binding it fails as well)
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _resolved(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address the system's resolver gives ``host`` in the family :func:`bound_socket` binds."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host.strip(), None, family, socket.SOCK_STREAM)
        return ipaddress.ip_address(str(infos[0][4][0]).split("%")[0])  # (an IPv6 scope: not an address part)
    except (OSError, UnicodeError, ValueError, IndexError):
        return None


def allowed_hosts(host: str) -> tuple[str, ...] | None:
    """The Host headers a server bound to ``host`` answers: on loopback (:func:`is_loopback`),
    :data:`LOOPBACK_HOSTS`, the host as its URL writes it (127.0.0.2, [0:0:0:0:0:0:0:1]: the
    server's own URL was refused) and the address it resolves to (a name of 127.0.1.1: its
    clients may call the address); any (None) on another address, which other machines reach by
    names of their own."""
    if not is_loopback(host):
        return None
    address = _resolved(host)
    own = [url_host(host.strip()).lower(), *([] if address is None else [url_host(str(address))])]
    return (*LOOPBACK_HOSTS, *dict.fromkeys(h for h in own if h not in LOOPBACK_HOSTS))


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (IPv6 where the address has a colon) and listening;
    closed again where either fails. Listening at once: bound alone, a second server on the port
    bound it too (SO_REUSEADDR) and failed only when it served, after its model load."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()
    except BaseException:
        sock.close()
        raise
    return sock


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
    sock = bound_socket(host, port)
    try:  # (a config that fails must not leave the socket open)
        bound = sock.getsockname()[1]
        served = app
        hosts = allowed_hosts(host)
        if hosts is not None:  # (as `attnrank serve` on loopback: its own host names only)
            from starlette.middleware.trustedhost import TrustedHostMiddleware

            served = TrustedHostMiddleware(app, allowed_hosts=list(hosts))
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
        yield f"http://{url_host(host)}:{bound}"
    finally:
        server.should_exit = True
        thread.join(10)
        if thread.is_alive():  # (the socket is closed under it all the same: the process is leaving it)
            logger.warning("the server on %s:%s did not stop within 10 s", host, bound)
        sock.close()
