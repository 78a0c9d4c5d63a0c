"""What every framework adapter does to its arguments and documents: the checks of ``top_n`` /
``depth`` and renamed keywords, framework documents read as attnrank's (titles, earlier stages'
scores), texts without words left out of the ranking, and the score fields written back."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import InputError
from ..llm.statestore import ids_by_position
from ..types import Document, RankedResults, ScoredDocument, has_text, is_count, is_real

DEPTH = 20  # first-stage candidates an adapter's retriever reranks by default (``depth``, as ``ask``'s)


def deprecated_name(old: str, new: str, where: str, stacklevel: int = 3) -> None:
    """Warn that keyword ``old`` of ``where`` is deprecated in favour of ``new`` (the warning points
    at the caller of the adapter's ``__init__``)."""
    warnings.warn(f"{where}: {old}= is deprecated, use {new}=", DeprecationWarning, stacklevel=stacklevel)


def renamed(
    kwargs: dict[str, Any], old: str, new: str, where: str, value: Any, default: Any, *, given: bool | None = None
) -> Any:
    """The value of ``new``: ``value``, or that of the deprecated keyword ``old`` popped from
    ``kwargs`` (warning that ``new`` replaces it). Both given with different values is an
    :class:`InputError`: neither silently wins. ``given``: whether ``new`` was given (where the
    caller can tell; else read as "``value`` is not its ``default``", which takes an explicit
    default for none: the old name then won)."""
    if old not in kwargs:
        return value
    deprecated_name(old, new, where, stacklevel=4)
    legacy = kwargs.pop(old)
    if (value != default if given is None else given) and value != legacy:
        raise InputError(f"{old}={legacy!r} (the old name of {new}) contradicts {new}={value!r}; give {new} only")
    return legacy


def check_depth(top: Any, depth: Any, top_name: str) -> None:
    """``top`` results kept out of ``depth`` first-stage candidates: integers, 1 <= top <= depth."""
    for name, value in ((top_name, top), ("depth", depth)):
        if not is_count(value):
            raise InputError(f"{name}={value!r} must be an integer >= 1")
    if top > depth:
        raise InputError(
            f"{top_name}={top} exceeds depth={depth}; the reranker can only keep what the first stage "
            f"found: lower {top_name} or raise depth"
        )


def check_top_n(top_n: Any, name: str = "top_n") -> None:
    """``top_n``: None (keep all) or an integer >= 1."""
    if top_n is not None and not is_count(top_n):
        raise InputError(f"{name}={top_n!r} must be None (keep all) or an integer >= 1")


def rank_text_first(
    reranker: Any, query: str, docs: Sequence[Document | ScoredDocument], k: int | None, k_name: str = "top_n"
) -> tuple[RankedResults, list[int]]:
    """``reranker.rank`` of the documents that hold some text (or a title), and the positions in
    ``docs`` of those that hold none, which a framework's list gets after the ranked ones,
    unscored, as far as ``k`` leaves room. Why: one empty chunk (a PDF loader's, an image node's)
    failed the whole rerank, naming its position; the reranker refuses to score one (its slot
    label alone would draw attention, :func:`~attnrank.types.check_texts`). The documents' ids are
    their positions in the framework's list (:func:`~attnrank.llm.statestore.ids_by_position`).
    ``k`` is checked as the adapter's field ``k_name``, which a caller may set after construction."""
    check_top_n(k, k_name)  # (else the reranker refused it as "k=0", a name the caller never used)
    empty = [i for i, d in enumerate(docs) if not has_text(d)]
    with ids_by_position():
        if not empty:
            return reranker.rank(query, docs, k=k), []
        skip = set(empty)
        scorable = [d for i, d in enumerate(docs) if i not in skip]
        res = reranker.rank(query, scorable, k=k) if scorable else RankedResults(query, [])
    room = len(empty) if k is None else max(0, k - len(res))
    return res, empty[:room]


def framework_documents(docs: Any, cls: type, what: str) -> list[Any]:
    """``docs`` as a list of the framework's documents (``cls``, named ``what``, e.g. "LangChain
    Document"), or one line saying what came instead (a text, one document alone), where a
    traceback came from deep in the conversion."""
    if isinstance(docs, (str, cls)):
        raise InputError(f"the documents are one {type(docs).__name__}, not a list of them; pass a list")
    docs = list(docs)
    bad = next((i for i, d in enumerate(docs) if not isinstance(d, cls)), None)
    if bad is not None:
        raise InputError(f"document #{bad} is a {type(docs[bad]).__name__}, not a {what}; wrap each text in a {what}")
    return docs


def meta_title(meta: Mapping[str, Any] | None) -> str:
    """A framework document's title, from its metadata's ``"title"``: none where that is missing
    or a missing value (None, a data frame's NaN, which was read as the title "nan")."""
    value = (meta or {}).get("title")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def keep_stages(docs: list[Document], metadata: list[Mapping[str, Any]]) -> list[Document] | list[ScoredDocument]:
    """``docs`` as scored documents when every one that holds text carries ``stage_scores`` in its
    framework metadata (it came from an attnrank retriever), so that the reranker keeps the earlier
    stages' scores (and a learned scorer can read them); else ``docs`` unchanged. A document
    without text (set aside unscored, :func:`rank_text_first`) does not decide it: one empty chunk
    among a retriever's hits dropped every hit's earlier scores."""
    has_stages = [isinstance(m.get("stage_scores"), dict) for m in metadata]
    texts = [h for d, h in zip(docs, has_stages) if has_text(d)]
    if not texts or not all(texts):
        return docs
    return [
        ScoredDocument(
            d.id,
            _first_stage_score(m) if h else 0.0,
            i + 1,
            d.text,
            d.title,
            dict(m["stage_scores"]) if h else {},
            metadata=d.metadata,
        )
        for i, (d, m, h) in enumerate(zip(docs, metadata, has_stages))
    ]


_FIRST_STAGES = ("hybrid", "bm25", "dense")  # the retriever's stages, the fused one first


def _first_stage_score(m: Mapping[str, Any]) -> float:
    """The first stage's score of a document from an attnrank retriever: its ``relevance_score``,
    unless a reranker has scored it since (a stage other than the retriever's): then the
    retriever's own stage score (a learned scorer's first-stage feature read the reranker's)."""
    stages = m["stage_scores"]
    score = m.get("relevance_score") or 0.0  # (None: no first-stage score was kept)
    if any(name not in _FIRST_STAGES for name in stages):
        score = next((stages[name] for name in _FIRST_STAGES if name in stages), score)
    if not is_real(score):  # (a float() ValueError from deep in the reranking)
        raise InputError(
            f"a document's first-stage score {score!r} (its metadata's relevance_score or stage_scores) is not a "
            "number; pass the documents an attnrank retriever returned, or drop their stage_scores"
        )
    return float(score)


def score_fields(d: ScoredDocument) -> dict[str, Any]:
    """The metadata an adapter attaches to a reranked document: ``relevance_score`` (the
    reranker's score: the fused score with the default preset; higher is better), ``rank``
    (1-based) and ``stage_scores`` (every stage's score by name, e.g. ``bm25``, ``dense``,
    ``hybrid``, ``likelihood``, ``attention``)."""
    return {"relevance_score": d.score, "rank": d.rank, "stage_scores": dict(d.stage_scores)}


def without_scores(metadata: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``metadata`` without the keys of :func:`score_fields`: a document returned unscored
    (no text) kept an earlier stage's ``relevance_score`` (another reranker's, on another scale),
    which a chain sorting by it put above the ranked ones."""
    return {k: v for k, v in metadata.items() if k not in ("relevance_score", "rank", "stage_scores")}
