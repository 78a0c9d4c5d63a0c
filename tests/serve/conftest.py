"""A live server for the HTTP tests: uvicorn on 127.0.0.1 at a free port, in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="needs the 'serve' extra")
pytest.importorskip("uvicorn", reason="needs the 'serve' extra")
pytest.importorskip("httpx", reason="needs httpx (test of the 'serve' extra)")

from _tiny import tiny_llm  # noqa: E402


@contextlib.contextmanager
def live_server(app):
    """Run ``app`` under uvicorn on 127.0.0.1:<free port>; yields the base URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="session")
def llm():
    return tiny_llm(layers=2, max_positions=8192)
