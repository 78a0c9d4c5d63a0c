"""Checks of a reranking call's inputs, shared by every ranker (attention and generative)."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..types import Document, check_texts, check_unicode, is_blank, is_count


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
    """No id twice among ``documents`` (``noun`` names them in the message)."""
    seen: set[str] = set()
    for i, d in enumerate(documents):
        if d.id in seen:
            raise InputError(f"{noun} #{i} repeats the id {d.id!r}; {noun} ids must be unique within a ranking")
        seen.add(d.id)
