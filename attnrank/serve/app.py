"""The FastAPI app of ``attnrank serve``: one loaded model behind a bounded queue.

Routes: ``POST /v1/rerank`` (Cohere v2 shape), ``POST /rerank`` (text-embeddings-inference
shape), ``POST /v1/search``, ``/v1/prune`` (over a loaded index), ``POST /v1/ask`` (server-sent
events), ``GET /health``. Statuses: 413 when a request exceeds a limit
(:class:`~attnrank.serve.schemas.Limits`, the message names it), 422 for invalid input, 404 for
index routes without an index, 503 with ``Retry-After`` when the queue is full
(:mod:`attnrank.serve.jobs`). A client that disconnects cancels its queued or running work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import AttnrankError, InputError, require

require("fastapi", "serve", "attnrank serve")

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..types import Document, RankedResults
from .engine import Engine
from .jobs import Cancelled, Job, JobQueue, QueueFull
from .middleware import AccessLogMiddleware, BodyLimitMiddleware
from .schemas import (
    AskRequest,
    CohereRerankRequest,
    Limits,
    PruneRequest,
    SearchRequest,
    TEIRerankRequest,
    texts_of,
)

CLIENT_CLOSED = 499  # nginx's "client closed request": never seen by the client, shown in the log


class LimitExceeded(AttnrankError):
    """A request over one of the server's limits (answered 413)."""


class ClientGone(Exception):
    """The client disconnected while its job waited or ran."""


class NotAvailable(Exception):
    """A route that needs a part the server was started without (an index, a generator)."""


def _info(request: Request) -> dict[str, Any]:
    return request.scope.setdefault("state", {}).setdefault("attnrank", {})


class Server:
    """Limits, the job queue and the engine, shared by the routes."""

    def __init__(self, engine: Engine, limits: Limits, max_queued: int):
        self.engine, self.limits = engine, limits
        self.jobs = JobQueue(max_queued)
        tok = getattr(getattr(engine.reranker, "llm", None), "tokenizer", None)
        self.tokenizer = tok

    # -- checks before any model work ----------------------------------------------------------
    def check(self, query: str, texts: list[str]) -> None:
        lim = self.limits
        if not isinstance(query, str) or not query.strip():
            raise InputError("query is empty; send a non-empty query text")
        if len(query) > lim.max_query_chars:
            raise LimitExceeded(
                f"query has {len(query)} characters > max_query_chars={lim.max_query_chars}; send a shorter query"
            )
        if len(texts) > lim.max_documents:
            raise LimitExceeded(
                f"{len(texts)} documents > max_documents={lim.max_documents}; send at most "
                f"{lim.max_documents} documents per request"
            )
        for i, t in enumerate(texts):
            if len(t) > lim.max_document_chars:
                raise LimitExceeded(
                    f"document {i} has {len(t)} characters > max_document_chars="
                    f"{lim.max_document_chars}; split or truncate it"
                )
        self.check_tokens(query, texts)

    def check_tokens(self, query: str, texts: list[str], fix: str = "send fewer or shorter documents") -> None:
        """Model tokens of ``query`` and ``texts`` within ``max_total_tokens``."""
        lim = self.limits
        if self.tokenizer is not None and texts:
            n = sum(len(ids) for ids in self.tokenizer([query, *texts], add_special_tokens=False)["input_ids"])
            if n > lim.max_total_tokens:
                raise LimitExceeded(
                    f"query and documents have {n} tokens > max_total_tokens={lim.max_total_tokens}; {fix}"
                )

    def check_count(self, name: str, n: int) -> None:
        """``n`` index hits asked for (``top_k``/``depth``) within ``max_documents``."""
        lim = self.limits.max_documents
        if n > lim:
            raise LimitExceeded(f"{name}={n} > max_documents={lim}; ask for at most {lim} documents")

    def truncate(self, texts: list[str], max_tokens: int | None) -> list[str]:
        """Cut each text after ``max_tokens`` model tokens (at a token boundary)."""
        if max_tokens is None or self.tokenizer is None:
            return texts
        out = []
        for t in texts:
            offsets = self.tokenizer(t, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            out.append(t if len(offsets) <= max_tokens else t[: offsets[max_tokens - 1][1]])
        return out

    def need(self, what: str) -> Any:
        value = getattr(self.engine, what)
        if value is None:
            flag = "--index NAME or --index-dir DIR" if what == "index" else f"a {what}"
            raise NotAvailable(f"this server has no {what}; start it with {flag}")
        return value

    # -- running a job -------------------------------------------------------------------------
    async def run(self, request: Request, fn: Callable[[Job], Any], candidates: int) -> Any:
        """Queue ``fn`` and wait for it; cancel it if the client disconnects meanwhile."""
        info = _info(request)
        info["candidates"] = candidates
        job = self.jobs.submit(fn)
        try:
            while not job.future.done():
                done, _ = await asyncio.wait({job.future}, timeout=0.05)
                if not done and await request.is_disconnected():
                    self.jobs.cancel(job)
                    info["cancelled"] = True
                    raise ClientGone()
            return job.future.result()
        except asyncio.CancelledError:
            self.jobs.cancel(job)
            info["cancelled"] = True
            raise
        finally:
            info["queue_wait"] = job.queue_wait


def _message(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status, headers=headers or None)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(QueueFull)
    async def _full(request: Request, e: QueueFull) -> Response:
        return _message(503, str(e), **{"Retry-After": str(e.retry_after)})

    @app.exception_handler(LimitExceeded)
    async def _limit(request: Request, e: LimitExceeded) -> Response:
        return _message(413, str(e))

    @app.exception_handler(InputError)
    async def _input(request: Request, e: InputError) -> Response:
        return _message(422, str(e))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> Response:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse(
            {"message": f"{where}: {first.get('msg', 'invalid')}", "detail": e.errors()}, status_code=422
        )

    @app.exception_handler(NotAvailable)
    async def _missing(request: Request, e: NotAvailable) -> Response:
        return _message(404, str(e))

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, e: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(Cancelled)
    async def _cancelled(request: Request, e: Cancelled) -> Response:
        return _message(503, "the server is shutting down; retry", **{"Retry-After": "5"})


def _explanations(server: Server, res: RankedResults) -> list[dict[str, Any]]:
    from ..explain import explain_results

    return [e.as_dict() for e in explain_results(server.engine.reranker, res)]


def create_app(engine: Engine, *, limits: Limits | None = None, max_queued: int = 16) -> FastAPI:
    """The app over ``engine`` with ``limits`` and at most ``max_queued`` waiting model jobs."""
    server = Server(engine, limits or Limits(), max_queued)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(server.jobs.close)  # stop the worker after its running job

    app = FastAPI(
        title="attnrank",
        description="Attention reranking, retrieval, pruning and answering.",
        lifespan=lifespan,
        max_body_size=2 * server.limits.max_body_bytes,
    )  # backstop (no Content-Length)
    app.state.server = server
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=server.limits.max_body_bytes)
    app.add_middleware(AccessLogMiddleware)
    _install_errors(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        idx = engine.index
        return {
            "status": "ok",
            "model": engine.model_name,
            "index_documents": None if idx is None else idx.num_docs,
            "queue": server.jobs.stats(),
            "limits": server.limits.as_dict(),
        }

    async def rank(request: Request, query: str, texts: list[str], top_n: int | None, explain: bool):
        server.check(query, texts)
        docs = [Document(str(i), t) for i, t in enumerate(texts)]

        def work(job: Job) -> tuple[RankedResults, list | None]:
            job.check()
            res = engine.reranker.rank(query, docs, k=top_n, return_evidence=explain)
            job.check()  # the client left while the model ran: drop the rest
            return res, (_explanations(server, res) if explain else None)

        return await server.run(request, work, len(texts))

    @app.post("/v1/rerank")
    async def rerank_cohere(body: CohereRerankRequest, request: Request) -> dict[str, Any]:
        texts = texts_of(body.documents)
        server.check_count("documents", len(texts))  # before tokenizing them all to truncate
        texts = server.truncate(texts, body.max_tokens_per_doc)
        res, expl = await rank(request, body.query, texts, body.top_n, body.explain)
        results = []
        for j, r in enumerate(res):
            item: dict[str, Any] = {"index": int(r.id), "relevance_score": r.score}
            if body.return_documents:
                item["document"] = {"text": texts[int(r.id)]}
            if expl is not None:
                item["explanation"] = expl[j]
            results.append(item)
        return {
            "id": str(uuid.uuid4()),
            "results": results,
            "meta": {"api_version": {"version": "2"}, "model": engine.model_name},
        }

    @app.post("/rerank")
    async def rerank_tei(body: TEIRerankRequest, request: Request) -> list[dict[str, Any]]:
        res, _ = await rank(request, body.query, body.texts, None, False)
        return [{"index": int(r.id), "score": r.score, **({"text": r.text} if body.return_text else {})} for r in res]

    @app.post("/v1/search")
    async def search(body: SearchRequest, request: Request) -> dict[str, Any]:
        index = server.need("index")
        server.check(body.query, [])
        if body.top_k > body.depth and body.rerank:
            raise InputError(f"top_k={body.top_k} exceeds depth={body.depth}; lower top_k or raise depth")
        server.check_count("top_k", body.top_k)
        if body.rerank:
            server.check_count("depth", body.depth)

        def work(job: Job) -> RankedResults:
            first = index.search(body.query, max(body.top_k, body.depth) if body.rerank else body.top_k)
            if not body.rerank:
                return first
            job.check()
            return engine.reranker.rank(body.query, first, k=body.top_k)

        res = await server.run(request, work, body.depth if body.rerank else body.top_k)
        return {
            "query": body.query,
            "results": [
                {
                    "id": r.id,
                    "title": r.title,
                    "text": r.text,
                    "score": r.score,
                    "rank": r.rank,
                    "stage_scores": r.stage_scores,
                }
                for r in res
            ],
        }

    @app.post("/v1/prune")
    async def prune(body: PruneRequest, request: Request) -> dict[str, Any]:
        pruner = server.need("pruner")
        texts = None if body.documents is None else texts_of(body.documents)
        index = server.need("index") if texts is None else None
        server.check(body.query, texts or [])
        if texts is None:
            server.check_count("top_k", body.top_k)
        budget = body.budget_tokens if body.budget_tokens is not None or body.keep_ratio is not None else 300

        def work(job: Job):
            if texts is None:
                assert index is not None  # need("index") raised otherwise
                docs = index.search(body.query, body.top_k).documents()
                server.check_tokens(body.query, [d.text for d in docs], "ask for fewer (lower top_k)")
            else:
                docs = [Document(str(i), t) for i, t in enumerate(texts)]
            job.check()
            return pruner.prune(
                body.query, docs, budget_tokens=budget, keep_ratio=body.keep_ratio, neighbours=body.neighbours
            )

        p = await server.run(request, work, len(texts) if texts is not None else body.top_k)
        return {
            "query": body.query,
            "kept_tokens": p.kept_tokens,
            "original_tokens": p.original_tokens,
            "budget_tokens": p.budget_tokens,
            "notes": p.notes,
            "documents": [
                {"id": d.id, "title": d.title, "text": d.text, "kept_sentences": d.metadata["kept_sentences"]}
                for d in p.documents()
            ],
            "sentences": [
                {
                    "doc_id": s.doc_id,
                    "sentence_index": s.sentence_index,
                    "text": s.text,
                    "tokens": s.tokens,
                    "score": None if s.score != s.score else s.score,
                    "kept": s.kept,
                }
                for s in p.sentences
            ],
        }

    @app.post("/v1/ask")
    async def ask(body: AskRequest, request: Request) -> StreamingResponse:
        return await _ask(server, body, request)

    return app


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


async def _ask(server: Server, body: AskRequest, request: Request) -> StreamingResponse:
    """Answer over the index, streamed as server-sent events: ``token`` (``{"text"}``) while
    generating, then ``done`` (answer, sources, timings) or ``error`` (``{"message"}``)."""
    from ..generate import Generator
    from ..pipeline import DEFAULT_BUDGET_TOKENS, Pipeline

    index, generator = server.need("index"), server.need("generator")
    server.check(body.query, [])
    server.check_count("depth", body.depth)
    server.check_count("top_k", body.top_k)
    budget = body.budget_tokens
    if budget is None and body.keep_ratio is None:
        budget = DEFAULT_BUDGET_TOKENS
    pipe = Pipeline(
        index,
        server.engine.reranker,
        server.engine.pruner,
        Generator(generator.llm, body.max_new_tokens),
        depth=body.depth,
        top_k=body.top_k,
        budget_tokens=budget,
    )
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[str] = asyncio.Queue()
    info = _info(request)
    info["candidates"] = body.depth

    def work(job: Job):
        def on_piece(text: str) -> None:
            job.check()  # stops generation once the client has gone
            loop.call_soon_threadsafe(pieces.put_nowait, text)

        return pipe.run(body.query, budget_tokens=budget, keep_ratio=body.keep_ratio, stream=on_piece)

    job = server.jobs.submit(work)  # a full queue answers 503 before the stream starts

    async def events() -> AsyncIterator[str]:
        try:
            while True:
                get = asyncio.ensure_future(pieces.get())
                done, _ = await asyncio.wait({get, job.future}, return_when=asyncio.FIRST_COMPLETED)
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
                yield _sse("error", {"message": str(err) if isinstance(err, AttnrankError) else repr(err)})
                return
            res = job.future.result()
            yield _sse(
                "done",
                {
                    "answer": res.answer.text,
                    "sources": res.sources,
                    "timings": {k: round(v, 4) for k, v in res.timings.items()},
                },
            )
        finally:
            if not job.future.done():  # the client went away mid-stream
                server.jobs.cancel(job)
                info["cancelled"] = True
                info["queue_wait"] = job.queue_wait

    return StreamingResponse(events(), media_type="text/event-stream")
