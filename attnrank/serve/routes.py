"""The routes of ``attnrank serve`` (one :class:`fastapi.APIRouter`): each checks its request
against the limits, queues its model work on the app's :class:`~attnrank.serve.server.Server`
and shapes the answer (``/v1/ask`` streams it: :mod:`attnrank.serve.streaming`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from ..errors import InputError, PromptTooLong, require

require("fastapi", "serve", "attnrank serve")

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..config import DEFAULT_BUDGET_TOKENS
from ..explain import check_explainable, explain_results
from ..llm.states import StateCache
from ..llm.statestore import PassageStateStore, ids_by_position
from ..pipeline import Pipeline
from ..prune.context import PrunedContext, check_budget
from ..rerank.inputs import check_unique_ids
from ..types import Document, RankedResults, check_unicode
from .jobs import Job
from .schemas import (
    AskRequest,
    CohereRerankRequest,
    PruneDocument,
    PruneRequest,
    SearchRequest,
    TEIRerankRequest,
    texts_of,
)
from .server import Server, request_info
from .streaming import event_stream
from .strict import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute)


def _server(request: Request) -> Server:
    return request.app.state.server


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    server = _server(request)
    idx = server.engine.index
    return {
        "status": "ok",
        "model": server.engine.model_name,
        "index_documents": None if idx is None else idx.num_docs,
        "queue": server.jobs.stats(),
        "limits": server.limits.as_dict(),
        "passage_states": _state_stats(server),
    }


def _state_stats(server: Server) -> dict[str, Any]:
    """The reranker's and the pruner's reusable passage states (what ``--state-cache-mb`` sizes),
    and the index's stored ones the reranker reads (``stored``: passages served, and ``stale``:
    lookups of a passage whose text changed since the store was built, encoded afresh)."""
    out: dict[str, Any] = {}
    for name, stage in (("reranker", server.engine.reranker), ("pruner", server.engine.pruner)):
        states = getattr(stage, "states", None)
        if isinstance(states, StateCache):
            out[name] = states.stats()
    store = getattr(server.engine.reranker, "store", None)
    if isinstance(store, PassageStateStore):
        out["stored"] = store.stats()
    return out


async def _rank(
    request: Request, query: str, texts: list[str], top_n: int | None, explain: bool, cut: str | None = None
) -> tuple[RankedResults, list[dict[str, Any]] | None]:
    """Rerank ``texts`` (ids are their positions) and, if asked, explain each result; ``cut``: the
    request's field that cuts its documents, named where one is too long for any prompt."""
    server = _server(request)
    reranker = server.engine.reranker
    if explain:  # refused now, not after the ranking (or a full queue's 503)
        check_explainable(reranker)
    server.jobs.check_room()  # a full queue answers 503 before the documents are tokenized
    await asyncio.to_thread(server.check, query, texts)  # tokenizing them: off the event loop
    docs = [Document(str(i), t) for i, t in enumerate(texts)]

    def work(job: Job) -> tuple[RankedResults, list[dict[str, Any]] | None]:
        job.check()
        try:
            with ids_by_position():  # ("0", "1", ...: not the index's passages of those ids)
                res = reranker.rank(query, docs, k=top_n, return_evidence=explain)
        except PromptTooLong as e:  # (its fix names the server's settings, which no request changes)
            raise _client_fix(e, cut) from None
        job.check()  # the client left while the model ran: drop the rest
        return res, ([e.as_dict() for e in explain_results(reranker, res)] if explain else None)

    return await server.run(request, work, len(texts))


def _client_fix(e: PromptTooLong, cut: str | None) -> InputError:
    """``e``'s fault with a fix the client can apply: a document no prompt holds is sent shorter, or
    cut by the request's ``cut`` field (a text of one long "word", emoji or CJK, passes the server's
    word cut)."""
    fix = "send shorter documents" + (f", or cut every document with {cut}" if cut else "")
    return InputError(
        f"{e.fault}; {fix} (the server's own cut is set when it starts: attnrank serve --max-doc-tokens N)"
    )


@router.post("/v1/rerank")
@router.post("/v2/rerank")  # the path Cohere's own v2 clients post to (cohere.ClientV2(base_url=...))
async def rerank_cohere(body: CohereRerankRequest, request: Request) -> dict[str, Any]:
    server = _server(request)
    given = texts_of(body.documents)
    server.check_count("documents", len(given))
    server.check_texts(body.query, given)  # the documents as sent: before tokenizing them all to truncate
    server.jobs.check_room()  # a full queue answers 503 before the documents are tokenized to cut them
    texts = await asyncio.to_thread(server.truncate, given, body.max_tokens_per_doc)
    res, expl = await _rank(request, body.query, texts, body.top_n, body.explain, "max_tokens_per_doc")
    results = []
    for j, r in enumerate(res):
        item: dict[str, Any] = {"index": int(r.id), "relevance_score": r.score}
        if body.return_documents:  # the document as sent, not as cut to max_tokens_per_doc
            item["document"] = {"text": given[int(r.id)]}
        if expl is not None:
            item["explanation"] = expl[j]
        results.append(item)
    return {
        "id": str(uuid.uuid4()),
        "results": results,
        "meta": {"api_version": {"version": "2"}, "model": server.engine.model_name},
    }


@router.post("/rerank")
async def rerank_tei(body: TEIRerankRequest, request: Request) -> list[dict[str, Any]]:
    res, _ = await _rank(request, body.query, body.texts, None, False)
    return [{"index": int(r.id), "score": r.score, **({"text": r.text} if body.return_text else {})} for r in res]


@router.post("/v1/search")
async def search(body: SearchRequest, request: Request) -> dict[str, Any]:
    server = _server(request)
    index = server.need("index")
    server.check(body.query, [])
    if not body.rerank and "depth" in body.model_fields_set:  # (it was dropped without a word)
        raise InputError(
            f"depth={body.depth} sizes the first-stage candidates reranked, but rerank is false "
            f"(the index's top_k={body.top_k} hits come back as they are); drop depth or set rerank true"
        )
    top_k, depth = _counts(body, server)
    if top_k > depth and body.rerank:
        raise InputError(f"top_k={top_k} exceeds depth={depth}; lower top_k or raise depth")
    server.check_count("top_k", top_k)
    if body.rerank:
        server.check_count("depth", depth)

    def work(job: Job) -> RankedResults:
        first = index.search(body.query, max(top_k, depth) if body.rerank else top_k)
        if not body.rerank:
            return first
        server.check_tokens(body.query, [d.document.full_text for d in first], "ask for fewer (lower depth)")
        job.check()
        return server.engine.reranker.rank(body.query, first, k=top_k)

    res = await server.run(request, work, depth if body.rerank else top_k)
    fields = ("id", "title", "text", "score", "rank", "stage_scores", "metadata")  # the corpus's metadata too
    return {"query": body.query, "results": [{f: getattr(r, f) for f in fields} for r in res]}


@router.post("/v1/prune")
async def prune(body: PruneRequest, request: Request) -> dict[str, Any]:
    server = _server(request)
    pruner = server.need("pruner")
    given: list[Document] | None = None
    texts: list[str] | None = None
    sentences: list[list[str] | None] | None = None
    if body.documents is not None:
        given = [
            PruneDocument(text=d).document(i) if isinstance(d, str) else d.document(i)
            for i, d in enumerate(body.documents)
        ]
        texts = [d.full_text for d in given]
        _check_prune_ids(body.documents, given)  # the answer names each sentence's document by id alone
        if any(not isinstance(d, str) and d.sentences is not None for d in body.documents):
            sentences = [None if isinstance(d, str) else d.sentences for d in body.documents]
    if texts is not None and "top_k" in body.model_fields_set:  # (it was dropped without a word)
        raise InputError(
            f"top_k={body.top_k} applies to index hits, but all {len(texts)} documents given are pruned; "
            "drop top_k (or drop documents to prune the index's top_k hits)"
        )
    index = server.need("index") if texts is None else None
    top_k = _counts(body, server)[0]
    if body.budget_tokens is not None or body.keep_ratio is not None:  # (both: refused after the queue and search)
        check_budget(body.budget_tokens, body.keep_ratio)
    server.jobs.check_room()  # a full queue answers 503 before the documents are tokenized
    await asyncio.to_thread(server.check, body.query, texts or [])  # tokenizing them: off the event loop
    if texts is None:
        server.check_count("top_k", top_k)
    budget = (
        body.budget_tokens if body.budget_tokens is not None or body.keep_ratio is not None else DEFAULT_BUDGET_TOKENS
    )

    def work(job: Job) -> PrunedContext:
        if index is not None:
            docs = index.search(body.query, top_k).documents()
            server.check_tokens(body.query, [d.full_text for d in docs], "ask for fewer (lower top_k)")
        else:
            docs = given or []
        job.check()
        pruned = pruner.prune(
            body.query,
            docs,
            budget_tokens=budget,
            keep_ratio=body.keep_ratio,
            neighbours=body.neighbours,
            sentences=sentences,
        )
        pruned.check_kept()  # (an empty context answered 200, read as a pruned one: a 422, as /v1/ask answers)
        return pruned

    return _pruned(body.query, await server.run(request, work, len(texts) if texts is not None else top_k))


def _counts(body: SearchRequest | PruneRequest | AskRequest, server: Server) -> tuple[int, int]:
    """``(top_k, depth)`` of ``body`` (``depth`` 0 where it has none), each as sent, or where the
    client sent none its default within the server's ``max_documents`` (depth at least top_k): a
    default is no request, and was refused (a server run with --max-documents 10 answered a bare
    query with 413 "depth=20 > max_documents=10", and top_k=25 with "exceeds depth=20")."""
    lim, sent = server.limits.max_documents, body.model_fields_set
    depth = getattr(body, "depth", 0)
    given_depth = depth if depth and "depth" in sent else lim  # (a top_k not sent never exceeds a depth sent)
    top_k = body.top_k if "top_k" in sent else min(body.top_k, lim, given_depth)
    if depth and "depth" not in sent:
        depth = max(top_k, min(depth, lim))
    return top_k, depth


def _check_prune_ids(sent: list[Any], given: list[Document]) -> None:
    """Refuse two documents under one id: two the client gave, or a document without one (named
    by its position) whose position is another's id."""
    named = [not isinstance(s, str) and s.id is not None for s in sent]
    # (a lone surrogate passed, the pruner ran, and writing the answer failed: a 500)
    check_unicode([d.id for d in given], "document id")
    check_unique_ids([d for d, n in zip(given, named) if n])
    claimed = {d.id: i for i, (d, n) in enumerate(zip(given, named)) if n}
    for i, (d, n) in enumerate(zip(given, named)):
        if not n and d.id in claimed:
            raise InputError(
                f"document #{i} has no id, and its position {d.id!r}, which names it, is the id of document "
                f"#{claimed[d.id]}; give every document an id, or none"
            )


PRUNER_KEYS = ("pruned", "kept_sentences")  # what the pruner adds to a document's metadata


def _pruned(query: str, p: PrunedContext) -> dict[str, Any]:
    """The ``/v1/prune`` answer: what was kept, per document and per sentence (NaN scores as null)."""
    return {
        "query": query,
        "kept_tokens": p.kept_tokens,
        "original_tokens": p.original_tokens,
        "budget_tokens": p.budget_tokens,
        "notes": p.notes,
        "documents": [
            {
                "id": d.id,
                "title": d.title,
                "text": d.text,
                "kept_sentences": d.metadata["kept_sentences"],
                "metadata": {
                    k: v for k, v in d.metadata.items() if k not in PRUNER_KEYS
                },  # the corpus's, as /v1/search
            }
            for d in p.documents()
        ],
        "sentences": [
            {
                "doc_id": s.doc_id,
                "sentence_index": s.source_index,
                "text": s.text,
                "tokens": s.tokens,
                "score": None if s.score != s.score else s.score,
                "kept": s.kept,
            }
            for s in p.sentences
        ],
    }


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    """``fn(*args)`` and the seconds it took."""
    start = time.perf_counter()
    return fn(*args), time.perf_counter() - start


@router.post("/v1/ask")
async def ask(body: AskRequest, request: Request) -> StreamingResponse:
    """Answer over the index, streamed as server-sent events: ``token`` (``{"text"}``) while
    generating, then ``done`` (answer, sources, timings) or ``error`` (``{"message"}``)."""
    server = _server(request)
    index, generator = server.need("index"), server.need("generator")
    server.check(body.query, [])
    top_k, depth = _counts(body, server)
    server.check_count("top_k", top_k)  # (first: a depth not sent follows top_k, which then is named)
    server.check_count("depth", depth)
    budget = body.budget_tokens
    if server.engine.pruner is None and (budget is not None or body.keep_ratio is not None):
        raise InputError("budget_tokens/keep_ratio size the pruned context, but this server runs without a pruner")
    if budget is not None or body.keep_ratio is not None:  # (both: keep_ratio was dropped without a word)
        check_budget(budget, body.keep_ratio)
    if budget is None and body.keep_ratio is None:
        budget = DEFAULT_BUDGET_TOKENS
    pipe = Pipeline(
        index,
        server.engine.reranker,
        server.engine.pruner,
        generator.with_max_new_tokens(body.max_new_tokens),
        depth=depth,
        top_k=top_k,
        budget_tokens=budget,
    )
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[str] = asyncio.Queue()
    ready: asyncio.Future[None] = loop.create_future()  # set at the answer's first token
    info = request_info(request)
    info["candidates"] = depth

    def work(job: Job):
        def on_piece(text: str) -> None:
            job.check()  # stops generation once the client has gone
            loop.call_soon_threadsafe(_settle, ready)  # (the first token starts the stream)
            loop.call_soon_threadsafe(pieces.put_nowait, text)

        first, searched = _timed(index.search, body.query, depth)
        # the model stages read these passages (whole, or as the reranker truncates them)
        read = first.top_k(depth if pipe.reranker is not None else top_k)
        server.check_tokens(body.query, [d.document.full_text for d in read], "ask for fewer (lower depth or top_k)")

        def stop(stage: str) -> None:  # a client gone stops the next stage
            job.check()

        sized = pipe.pruner is not None  # (without a pruner there is nothing to size)
        res = pipe.run(
            body.query,
            first,
            budget_tokens=budget if sized else None,
            keep_ratio=body.keep_ratio if sized else None,
            stream=on_piece,
            checkpoint=stop,
        )
        res.timings = {"retrieve": searched, **res.timings}  # (the pipeline was handed the search's result)
        res.timings["total"] += searched
        return res

    job = server.jobs.submit(work)  # a full queue answers 503 before the stream starts
    # The stream starts with the answer's first token (or the job's end): an error before it (a
    # 413 of the search, a budget no sentence fits, an answer prompt over the model's context) is
    # then an HTTP status, not an event of a stream already answered 200. Nothing is streamed
    # before the first token, so waiting for it delays nothing.
    await server.wait(request, job, ready)
    if not ready.done():
        job.future.result()  # (raises what the job failed with)
    return StreamingResponse(event_stream(request, server, job, pieces, info), media_type="text/event-stream")
