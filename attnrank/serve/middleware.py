"""ASGI middleware of the server: a body-size limit that names itself, and the access log.

:class:`BodyLimitMiddleware` answers 413 (JSON message naming ``max_body_bytes``) before reading
a body whose ``Content-Length`` is too large, and for a body without a length (chunked) as soon
as the bytes read pass the limit (the only body limit: FastAPI's own ``max_body_size`` ran before it and
answered in plain text). It also lends the app's limits to the request models (``schemas.REQUEST_LIMITS``).
:class:`AccessLogMiddleware` writes one log line per request, when its last byte is sent
(streams included).

Fields: method, path, status, latency (s, submission to last byte), queue wait (s, time the
request's model job waited for the worker) and candidates (documents scored), taken from
``scope["state"]["attnrank"]`` where the routes record them.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import quote

from .schemas import REQUEST_LIMITS, Limits

logger = logging.getLogger("attnrank.serve.access")


class AccessLogMiddleware:
    """Pure ASGI middleware (it sees the end of streaming responses, unlike ``@app.middleware``)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        info: dict[str, Any] = {}
        scope.setdefault("state", {})["attnrank"] = info
        status = {"code": 0, "logged": False}

        def log() -> None:
            if status["logged"]:
                return
            status["logged"] = True
            wait = info.get("queue_wait")
            logger.info(
                "%s %s %s latency=%.3fs queue_wait=%s candidates=%s%s",
                scope["method"],
                quote(scope["path"]),  # (decoded: a %0A in the URL wrote a second, forged line)
                status["code"] or 499,
                time.perf_counter() - start,
                "-" if wait is None else f"{wait:.3f}s",
                info.get("candidates", "-"),
                " cancelled" if info.get("cancelled") else "",
            )

        async def send_logged(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                log()

        try:
            await self.app(scope, receive, send_logged)
        except Exception:
            status["code"] = status["code"] or 500
            raise
        finally:
            log()


class BodyLimitMiddleware:
    """413 for a body above ``max_body_bytes`` (``by_path``: other limits for some paths, each as
    (bytes, the limit's name, the fix the refusal gives)): at once for a declared
    ``Content-Length`` without a ``Transfer-Encoding``, else once the bytes read exceed it (the
    body read so far is then handed on to the app). Why not trust a length beside an encoding: the
    server reads the chunked body then, whatever length was declared, and a small declared length
    let any body past the limit."""

    def __init__(
        self,
        app: Any,
        max_body_bytes: int,
        by_path: dict[str, tuple[int, str, str]] | None = None,
        limits: Limits | None = None,
    ):
        self.app, self.max_body_bytes, self.by_path = app, max_body_bytes, dict(by_path or {})
        self.limits = limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = REQUEST_LIMITS.set(self.limits)  # (the request models count their lists against them)
        try:
            await self._limited(scope, receive, send)
        finally:
            REQUEST_LIMITS.reset(token)

    async def _limited(self, scope: dict, receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        root = str(scope.get("root_path", ""))
        if root and path.startswith(root):  # (behind a proxy's prefix: uvicorn --root-path)
            path = path[len(root) :]
        limit, name, fix = self.by_path.get(
            path.rstrip("/") or "/", (self.max_body_bytes, "max_body_bytes", "send fewer or shorter documents")
        )
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and b"transfer-encoding" not in headers:
            if int(length) > limit:  # (the server never passes more than declared)
                await self._refuse(send, f"request body of {int(length)} bytes > {name}={limit}; {fix}")
                return
            await self.app(scope, receive, send)
            return
        messages = await self._read(receive, limit)
        if messages is None:
            await self._refuse(send, f"request body of more than {limit} bytes > {name}={limit}; {fix}")
            return
        await self.app(scope, _replay(messages, receive), send)

    async def _read(self, receive: Any, limit: int) -> list[dict] | None:
        """The request's body messages, or None as soon as they exceed ``limit``."""
        messages: list[dict] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > limit:
                return None
            if message["type"] != "http.request" or not message.get("more_body", False):
                return messages

    async def _refuse(self, send: Any, message: str) -> None:
        body = json.dumps({"message": message}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[dict], receive: Any) -> Any:
    """A ``receive`` that returns ``messages`` first, then reads on (disconnects)."""
    pending = list(messages)

    async def replayed() -> dict:
        return pending.pop(0) if pending else await receive()

    return replayed
