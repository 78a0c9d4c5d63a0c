"""The FastAPI app of ``attnrank serve``: one loaded model behind a bounded queue.

Routes (:mod:`attnrank.serve.routes`): ``POST /v1/rerank`` (Cohere v2 shape), ``POST /rerank``
(text-embeddings-inference shape), ``POST /v1/search``, ``/v1/prune`` (over a loaded index),
``POST /v1/ask`` (server-sent events), ``GET /health``. Statuses: 413 when a request exceeds a
limit (:class:`~attnrank.serve.schemas.Limits`, the message names it), 422 for invalid input, 404
for index routes without an index, 503 with ``Retry-After`` when the queue is full
(:mod:`attnrank.serve.jobs`). A client that disconnects cancels its queued or running work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..errors import AttnrankError, InputError, MissingExtraError, require
from ..llm.statestore import StoreDamagedError, StoreSetupError

require("fastapi", "serve", "attnrank serve")

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.trustedhost import TrustedHostMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine import Engine
from .jobs import Cancelled, QueueFull
from .middleware import AccessLogMiddleware, BodyLimitMiddleware
from .routes import router
from .schemas import Limits, PruneDocument, TextDocument
from .server import CLIENT_CLOSED, ClientGone, LimitExceeded, NotAvailable, Server

logger = logging.getLogger(__name__)


def create_app(
    engine: Engine,
    *,
    limits: Limits | None = None,
    max_queued: int = 16,
    allowed_hosts: Sequence[str] | None = None,
) -> FastAPI:
    """The app over ``engine`` with ``limits`` and at most ``max_queued`` waiting model jobs.
    ``allowed_hosts``: the Host headers it answers (others: 400; e.g.
    :data:`~attnrank.serve.background.LOOPBACK_HOSTS` for a
    server bound to loopback, as ``attnrank serve`` gives them: a web page the user opens could
    otherwise reach it through a name that resolves to 127.0.0.1, DNS rebinding); None: any."""
    server = Server(engine, limits or Limits(), max_queued)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.jobs.start()  # (again, when the app is served after an earlier shutdown closed it)
        yield
        await asyncio.to_thread(server.jobs.close)  # stop the worker after its running job

    app = FastAPI(
        title="attnrank",
        description="Attention reranking, retrieval, pruning and answering.",
        lifespan=lifespan,
    )  # (no max_body_size: FastAPI puts its own limit before every middleware, answered in plain text)
    app.state.server = server
    app.add_middleware(
        BodyLimitMiddleware,
        limits=server.limits,
        max_body_bytes=server.limits.max_body_bytes,
        by_path={
            "/v1/prune": (
                server.limits.max_prune_body_bytes,
                "max_prune_body_bytes",
                "send fewer or shorter documents",
            ),
            **{
                path: (server.limits.max_query_body_bytes, "max_query_body_bytes", "send a shorter query")
                for path in ("/v1/search", "/v1/ask")
            },
        },
    )
    if allowed_hosts is not None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    app.add_middleware(AccessLogMiddleware)
    _install_errors(app)
    app.include_router(router)
    return app


def _message(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status, headers=headers or None)


# Each error class answered with its one line as JSON ({"message"}) under its status; a class not
# named here by a subclass falls to its base: attnrank's others (a model's non-finite attention, an
# index's damaged scores) are a 500 with the line the CLI prints, not a bare "Internal Server Error".
_STATUSES: tuple[tuple[type[Exception], int], ...] = (
    (LimitExceeded, 413),
    (InputError, 422),
    (NotAvailable, 404),
    (MissingExtraError, 503),
    (AttnrankError, 500),
)


def _answer(status: int) -> Any:
    async def handler(request: Request, e: Exception) -> Response:
        return _message(status, str(e))

    return handler


def _install_errors(app: FastAPI) -> None:
    for kind, status in _STATUSES:
        app.add_exception_handler(kind, _answer(status))

    async def _store(request: Request, e: Exception) -> Response:
        # the server's own passage-state store, damaged or built for another setup: not the client's input
        # (a 422 it would not retry), and its paths and rebuild advice are for the operator's log
        logger.error("the passage-state store failed a request: %s", e)
        return _message(500, "the server's passage-state store cannot be used; see the server log")

    for kind in (StoreDamagedError, StoreSetupError):
        app.add_exception_handler(kind, _store)

    @app.exception_handler(QueueFull)
    async def _full(request: Request, e: QueueFull) -> Response:
        return _message(503, str(e), **{"Retry-After": str(e.retry_after)})

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> Response:
        # the inputs are left out of the detail: one may be bytes or NaN (no JSON), or the whole body
        detail = [{k: err[k] for k in ("type", "loc", "msg") if k in err} for err in e.errors()]
        return JSONResponse({"message": _invalid_message(request, e.errors()), "detail": detail}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> Response:
        if e.status_code == 400 and isinstance(e.__cause__, InputError):  # a key given twice (strict.unique_keys)
            return _message(422, str(e.__cause__))
        if e.status_code == 400:  # FastAPI's "error parsing the body": bytes not UTF-8, JSON nested past Python's limit
            return _message(
                422,
                "the body could not be read as JSON (it is not UTF-8, or nests too deeply); send one JSON object "
                "in UTF-8",
            )
        return await http_exception_handler(request, e)  # (a 404 or 405 as FastAPI answers it)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, e: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Cancelled)
    async def _cancelled(request: Request, e: Cancelled) -> Response:
        return _message(503, "the server is shutting down; retry", **{"Retry-After": "5"})


def _invalid_message(request: Request, errors: Any) -> str:
    """The first validation error in one line: the field and what is wrong, or what is wrong with the body."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        at, why = first.get("loc", ("body", "?"))[-1], (first.get("ctx") or {}).get("error", "")
        return f"the body is not valid JSON (at character {at}: {why}); send one JSON object"
    if isinstance(first.get("input"), (bytes, bytearray)):  # FastAPI passes a body not declared JSON as bytes
        kind = request.headers.get("content-type") or "none"
        return (
            f"the body was sent with content-type {kind!r}, so it was not read as JSON; "
            "send a JSON object with the header 'content-type: application/json'"
        )
    first = _union_member_error(errors) or first
    where = _where(tuple(first.get("loc", ())))
    if first.get("type") == "extra_forbidden":
        return f"{where}: not a field of this request (or a second name of one given); remove or rename it"
    if tuple(first.get("loc", ()))[-1:] == ("str",) and any(e.get("type") in _NOT_AN_OBJECT for e in errors):
        return f"{where}: give a string or a JSON object with the document's fields"  # (neither: a number, a list)
    return f"{where}: {first.get('msg', 'invalid')}"


# pydantic's error types for a value that is no JSON object where a model was a member of the union
_NOT_AN_OBJECT = ("model_type", "model_attributes_type")


# The members of the request's unions (a document given as a text or an object), whose names
# pydantic puts in an error's location after the list index: not fields of the request.
_MEMBER_TAGS = frozenset({"str", PruneDocument.__name__, TextDocument.__name__})


def _where(loc: tuple[Any, ...]) -> str:
    """An error's location as the request writes it (``documents.0.extra``): without ``body`` and
    without a union member's name after a list index (a field of another name, ``TopK``, stays)."""
    parts = [
        p
        for i, p in enumerate(loc)
        if p != "body" and not (p in _MEMBER_TAGS and i > 0 and isinstance(loc[i - 1], int))
    ]
    return ".".join(map(str, parts)) or "body"


def _union_member_error(errors: Any) -> dict[str, Any] | None:
    """For a document given as a JSON object where a text or an object is accepted
    (``str | PruneDocument``), the object's own error: pydantic lists the string member's first
    ("Input should be a valid string"), which named the wrong fault."""
    first = errors[0] if errors else {}
    loc = tuple(first.get("loc", ()))
    if not loc or loc[-1] != "str" or not isinstance(first.get("input"), dict):
        return None
    prefix = loc[:-1]
    return next(
        (
            e
            for e in errors[1:]
            if tuple(e.get("loc", ()))[: len(prefix)] == prefix and e.get("type") not in _NOT_AN_OBJECT
        ),
        None,
    )
