"""The state ``attnrank serve``'s routes share: limits checked before any model work, the job
queue in front of the one loaded model, and the engine (:class:`Server`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..errors import InputError, require
from ..llm.texts import holds_special, tokenize
from ..types import check_unicode, is_blank

require("fastapi", "serve", "attnrank serve")

from fastapi import Request

from .engine import Engine
from .jobs import Job, JobQueue
from .schemas import LimitExceeded, Limits, count_limit

CLIENT_CLOSED = 499  # nginx's "client closed request": never seen by the client, shown in the log


class ClientGone(Exception):
    """The client disconnected while its job waited or ran."""


class NotAvailable(Exception):
    """A route that needs a part the server was started without (an index, a generator)."""


def request_info(request: Request) -> dict[str, Any]:
    """What the access log records for ``request`` (see :mod:`attnrank.serve.middleware`)."""
    return request.scope.setdefault("state", {}).setdefault("attnrank", {})


def model_tokenizer(engine: Engine) -> Any:
    """The tokenizer of the model the engine runs, which the token limits count in: the reranker's,
    else the pruner's or the generator's (preset ``signals`` runs none, and reading its ``llm``
    would load the model it avoids; its pruner's model still reads every request it prunes); None
    where no stage runs a model."""
    rr = engine.reranker
    llm = getattr(rr, "llm", None) if rr is not None and getattr(rr, "uses_llm", True) else None
    if llm is not None:  # (any object with rank() is a reranker: one without an llm has no tokenizer)
        return llm.tokenizer
    for stage in (engine.pruner, engine.generator):
        llm = getattr(stage, "llm", None)
        if llm is not None:
            return llm.tokenizer
    return None


class Server:
    """Limits, the job queue and the engine, shared by the routes."""

    def __init__(self, engine: Engine, limits: Limits, max_queued: int):
        self.engine, self.limits = engine, limits
        self.jobs = JobQueue(max_queued)
        self.tokenizer = model_tokenizer(engine)

    # -- checks before any model work ----------------------------------------------------------
    def check(self, query: str, texts: list[str]) -> None:
        """Every limit: :meth:`check_texts`, then the model tokens (:meth:`check_tokens`)."""
        self.check_texts(query, texts)
        self.check_tokens(query, texts)

    def check_texts(self, query: str, texts: list[str]) -> None:
        """The limits that need no tokenizer: the query, the number of documents, their characters."""
        lim = self.limits
        if not isinstance(query, str) or is_blank(query):
            raise InputError("query is empty; send a non-empty query text")
        check_unicode([query], "query")  # a lone surrogate made the tokenizer fail: a bare 500
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
        check_unicode(texts, "document")

    def check_tokens(self, query: str, texts: list[str], fix: str = "send fewer or shorter documents") -> None:
        """Model tokens of ``query`` and ``texts`` within ``max_total_tokens``, counted as the model
        reads them (special-token text such as ``<|im_end|>`` is several tokens there,
        :func:`~attnrank.llm.texts.tokenize`)."""
        lim = self.limits
        if self.tokenizer is not None and texts:
            every = [query, *texts]
            ids = self.tokenizer(every, add_special_tokens=False)["input_ids"]
            n = sum(
                len(tokenize(self.tokenizer, t)["input_ids"]) if holds_special(self.tokenizer, t) else len(i)
                for t, i in zip(every, ids)
            )
            if n > lim.max_total_tokens:
                raise LimitExceeded(
                    f"query and documents have {n} tokens > max_total_tokens={lim.max_total_tokens}; {fix}"
                )

    def check_count(self, name: str, n: int) -> None:
        """``n`` index hits asked for (``top_k``/``depth``) within ``max_documents``."""
        count_limit(name, n, self.limits.max_documents)

    def truncate(self, texts: list[str], max_tokens: int | None) -> list[str]:
        """Cut each text after ``max_tokens`` model tokens (at a token boundary)."""
        if max_tokens is None:
            return texts
        if self.tokenizer is None:
            raise InputError(
                f"max_tokens_per_doc={max_tokens} counts the model's tokens, and this server runs no model "
                "(preset signals, no pruner); cut the documents before sending them, or drop max_tokens_per_doc"
            )
        out = []
        for i, t in enumerate(texts):
            offsets = tokenize(self.tokenizer, t, offsets=True)["offset_mapping"]  # (as the model will read it)
            cut = t if len(offsets) <= max_tokens else t[: _token_cut(offsets, max_tokens)]
            if t.strip() and not cut.strip():  # (else refused as a document without text, which it is not)
                raise InputError(
                    f"max_tokens_per_doc={max_tokens} leaves document #{i} no text (only the whitespace it begins "
                    "with, or part of one character); raise max_tokens_per_doc, or strip the documents' leading whitespace"
                )
            out.append(cut)
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
        request_info(request)["candidates"] = candidates
        job = self.jobs.submit(fn)
        await self.wait(request, job, job.future)
        return job.future.result()

    async def wait(self, request: Request, job: Job, until: asyncio.Future[Any]) -> None:
        """Wait until ``until`` (the job's result, or a signal it gives on the way) or the job's
        end, polling for the client; cancel the job if the client disconnects meanwhile."""
        info = request_info(request)
        try:
            while not (until.done() or job.future.done()):
                done, _ = await asyncio.wait({until, job.future}, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
                if not done and await request.is_disconnected():
                    self.jobs.cancel(job)
                    info["cancelled"] = True
                    raise ClientGone()
        except asyncio.CancelledError:
            self.jobs.cancel(job)
            info["cancelled"] = True
            raise
        finally:
            info["queue_wait"] = job.queue_wait


def _token_cut(offsets: list[tuple[int, int]], n: int) -> int:
    """The character where a text of these token ``offsets`` is cut after ``n`` tokens: the end of
    token ``n``, or where a character is split across tokens ``n`` and ``n + 1`` (byte-level BPE:
    both span the whole character), the start of that character, which then is left out."""
    return min(offsets[n - 1][1], offsets[n][0])
