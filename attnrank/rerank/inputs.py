"""Checks of a reranking call's inputs, shared by every ranker (attention and generative)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InputError
from ..types import Document, ScoredDocument, check_id_type, check_texts, check_unicode, is_blank, is_count


def check_query(query: Any) -> None:
    """A query text with some non-space character: an empty one would still rank the candidates
    (by their BM25 and dense scores against nothing), a meaningless order."""
    if not isinstance(query, str):
        raise InputError(f"query {query!r} is a {type(query).__name__}, not a text; give the query as a string")
    if is_blank(query):
        raise InputError(f"query {query!r} is empty; give a non-empty query text")
    check_unicode([query], "query")


def check_k(k: Any) -> None:
    """``k`` results: None (all) or a positive integer."""
    if k is not None and not is_count(k):
        raise InputError(f"k={k!r} must be None (all documents) or a positive integer (documents returned)")


def check_documents(documents: list[Document]) -> None:
    """Unique ids (a ranking), and :func:`check_texts`."""
    check_unique_ids(documents)
    check_texts(documents)


def check_unique_ids(documents: list[Document], noun: str = "document") -> None:
    """Every id a string, and no id twice among ``documents`` (``noun`` names them in the message).
    Why strings, as an index requires (:func:`~attnrank.types.check_ids`): ids 1 and "1" were two
    documents of one ranking, and None an id of the results."""
    check_id_types(documents, noun)
    seen: set[str] = set()
    for i, d in enumerate(documents):
        if d.id in seen:
            raise InputError(f"{noun} #{i} repeats the id {d.id!r}; {noun} ids must be unique within a ranking")
        seen.add(d.id)


def check_id_types(documents: list[Document], noun: str = "document") -> None:
    """Every id of ``documents`` a string (``noun`` names them in the message)."""
    for i, d in enumerate(documents):
        check_id_type(i, d, noun)


def check_query_list(queries: Any, query_ids: Any = None) -> None:
    """``queries`` of a batch: a list of query texts, not one text (whose characters became the
    queries: with as many document lists, wrong rankings without an error) nor a ``{id: text}``
    dict (whose keys were read as the queries, or a KeyError)."""
    if isinstance(queries, str):
        raise InputError("queries is one str, not a list of queries; pass a list (e.g. [query]), or call rank()")
    if isinstance(queries, Mapping):
        raise InputError(
            "queries is a dict; pass list(queries.values()) with query_ids=list(queries), and the document "
            "lists in that order"
        )
    if isinstance(query_ids, (str, Mapping)):
        raise InputError(f"query_ids is a {type(query_ids).__name__}, not a list of ids; pass one id per query")


def check_document_lists(queries: Any, docs_per_query: Any) -> None:
    """``docs_per_query`` of a batch: one list of candidates per query, as many as ``queries``. One
    flat list of candidates was named as "3 document lists" (its texts), or, as many as the
    queries, refused query by query as one passage each."""
    flat = (
        isinstance(docs_per_query, (list, tuple))
        and bool(docs_per_query)
        and all(isinstance(d, (str, Document, ScoredDocument)) for d in docs_per_query)
    )
    if flat:
        raise InputError(
            f"docs_per_query is one list of {len(docs_per_query)} candidates, not one list per query; to rank the "
            f"same candidates for each of the {len(queries)} queries pass [candidates] * {len(queries)}, or "
            "call rank() for one query"
        )
    if len(queries) != len(docs_per_query):
        raise InputError(f"{len(queries)} queries but {len(docs_per_query)} document lists; give one list per query")
