"""Result and input types shared by every stage (first stage, reranking, pruning, answering)."""

from __future__ import annotations

import json
import logging
import math
import numbers
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import InputError

logger = logging.getLogger(__name__)


def metadata_json(value: Any) -> Any:
    """``json.dumps``'s ``default`` for metadata: numpy's numbers and arrays as JSON numbers and
    lists (written as their text, ``np.int64(211)`` read back as ``"211"``), any other value that
    has no JSON form as its text."""
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def kind_of(value: Any) -> str:
    """``value``'s type as a message names it: with its module where it is another library's class
    of one of attnrank's names (a LangChain or Haystack ``Document``: "a Document, not a Document")."""
    kind = type(value)
    own = kind.__module__.split(".")[0] == "attnrank"
    return (
        kind.__name__
        if own or kind.__name__ not in ("Document", "ScoredDocument")
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _metadata(doc_id: Any, metadata: Any) -> Any:
    """A document's metadata: None (a framework's "no metadata") as ``{}``; a value that is no
    mapping refused, where a TypeError deep in an index or a ranking named nothing."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InputError(
            f"document {doc_id!r}: metadata {metadata!r} is a {type(metadata).__name__}; give a dict "
            "(e.g. {'source': 'x.md'}), or None"
        )
    return metadata


@dataclass(frozen=True)
class Document:
    """One passage of a corpus.

    ``id`` is the stable key used everywhere (runs, qrels, fusion); ``title`` may be empty.
    """

    id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "metadata", _metadata(self.id, self.metadata))

    @property
    def full_text(self) -> str:
        """Title and text joined the way the indexes see them (BEIR convention)."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass
class ScoredDocument:
    """A document with the score and 1-based rank given by the last stage that ranked it.

    ``stage_scores`` keeps every stage's score by name (the retriever's ``bm25``, ``dense``,
    ``hybrid``; the reranker's ``attention``, ``likelihood``, ``fused``, ...); the BM25 and cosine a
    fused reranker computes over the candidates are not kept (they are not the retriever's).
    ``evidence`` holds optional bulkier per-stage data (e.g. per-token attention scores).
    """

    id: str
    score: float
    rank: int
    text: str = ""
    title: str = ""
    stage_scores: dict[str, float] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)  # carried over from the Document

    def __post_init__(self) -> None:
        self.metadata = _metadata(self.id, self.metadata)

    @property
    def document(self) -> Document:
        # (a copy of the metadata: an edit of the document reached this result, and the results after it)
        return Document(id=self.id, text=self.text, title=self.title, metadata=dict(self.metadata))


@dataclass
class RankedResults:
    """The ranked list for one query, best first (``results[0].rank == 1``)."""

    query: str
    results: list[ScoredDocument]
    query_id: str | None = None
    stage: str = ""

    def __post_init__(self) -> None:
        # Sorting here keeps the invariant in one place: every stage returns sorted lists. The
        # caller's list and entries are left as they were: the results are new, re-ranked copies.
        # A NaN score ranks last: compared as a number it breaks the sort and leaves better ones behind it.
        seen: set[Any] = set()
        for r in self.results:  # (the reranker and write_run refused such a list; a ranking kept it)
            if r.id in seen:
                raise InputError(f"the results repeat the id {r.id!r}; ids must be unique within a ranking")
            seen.add(r.id)
        bad = next((r for r in self.results if not is_real(r.score)), None)
        if bad is not None:  # ("0.5" or None failed as a bare TypeError inside the sort)
            raise InputError(
                f"result {bad.id!r} has the score {bad.score!r}, a {type(bad.score).__name__}; give each a number"
            )
        ordered = sorted(
            self.results, key=lambda r: (math.isnan(r.score), 0.0 if math.isnan(r.score) else -r.score, r.rank)
        )
        self.results = [r if r.rank == i else replace(r, rank=i) for i, r in enumerate(ordered, start=1)]

    def __iter__(self) -> Iterator[ScoredDocument]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> ScoredDocument:
        return self.results[i]

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.results]

    @property
    def scores(self) -> list[float]:
        return [r.score for r in self.results]

    def top_k(self, k: int) -> RankedResults:
        # a negative k would drop the last results; numpy integers are integers too
        if not is_count(k, 0):
            raise InputError(f"top_k(k={k!r}): k must be an integer >= 0 (how many results to keep), e.g. 10")
        return RankedResults(self.query, self.results[:k], self.query_id, self.stage)

    def documents(self) -> list[Document]:
        return [r.document for r in self.results]


def is_count(value: Any, minimum: int = 1) -> bool:
    """Whether ``value`` is a whole number (a Python or NumPy integer, not a bool) of at least
    ``minimum``: the check of every count and size option; each caller names its own limit."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= minimum


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (a Python or NumPy one; not a bool, not a string): the
    type check before any range check of a numeric option (``None < 0`` is a TypeError)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_unicode(texts: Iterable[str], what: str = "text") -> None:
    """Refuse a text holding a lone surrogate (from a ``\\ud800`` JSON escape or undecodable bytes
    in a command-line argument): tokenizers fail on it with a TypeError, hashing with a
    UnicodeEncodeError. ``what`` names the texts in the message ("text", "query", "document")."""
    for i, t in enumerate(texts):
        if not encodable(t):
            raise InputError(
                f"{what} #{i} ({t[:60]!r}) is not valid Unicode (it holds a lone surrogate, such as a "
                "\\ud800 escape or bytes that are not UTF-8); fix or re-encode it as UTF-8"
            )


def encodable(*texts: str) -> bool:
    """Whether every text is valid Unicode: no lone surrogate, which UTF-8 cannot hold."""
    try:
        for t in texts:
            t.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def refuse_one_passage(docs: Any, subject: str, noun: str) -> None:
    """Raise :class:`InputError` if ``docs``, meant as a list of passages, is one passage (a str,
    Document or ScoredDocument): a str would become one passage per character."""
    if isinstance(docs, (str, Document, ScoredDocument)):
        raise InputError(f"{subject} one {type(docs).__name__}, not a list of {noun}; pass a list (e.g. [passage])")


def check_query_id(query_id: Any) -> None:
    """None, or a query's id as a run file holds it: a non-empty string (an int was kept as one,
    and "" passed, for ``write_run`` to refuse after the work)."""
    if query_id is not None and (not isinstance(query_id, str) or not query_id.strip()):
        raise InputError(f"query_id={query_id!r} is not a non-empty string; give the query's id as text, or None")


def as_documents(docs: Any) -> tuple[list[Document], list[ScoredDocument] | None]:
    """Candidates as :class:`Document` objects, plus the earlier stage's :class:`ScoredDocument`
    entries when every candidate is one (their scores feed learned and fused scorers).

    ``docs``: a :class:`RankedResults`, or a sequence of ``Document``, ``ScoredDocument`` or ``str``
    (a string becomes a document whose id is its position).
    """
    if isinstance(docs, RankedResults):
        docs = docs.results
    refuse_one_passage(docs, "the candidates are", "them")
    if not isinstance(docs, Iterable):  # (list() of a number was a TypeError)
        raise InputError(
            f"the candidates are {docs!r}, a {type(docs).__name__}; pass a list of documents, texts or "
            "scored documents, or a RankedResults"
        )
    if isinstance(docs, (Mapping, AbstractSet)):  # (a dict's keys were ranked as the texts; a set has no order)
        raise InputError(
            f"the candidates are a {type(docs).__name__}; pass a list, e.g. [Document(i, t) for i, t in d.items()]"
        )
    docs = list(docs)
    if docs and all(isinstance(d, ScoredDocument) for d in docs):
        return [d.document for d in docs], docs
    scored = next((d for d in docs if isinstance(d, ScoredDocument)), None)
    if scored is not None:  # (every candidate's earlier scores were dropped for one plain one beside them)
        plain = next(i for i, d in enumerate(docs) if not isinstance(d, ScoredDocument))
        raise InputError(
            f"the candidates mix scored documents (e.g. {scored.id!r}) with unscored ones (e.g. #{plain}, a "
            f"{type(docs[plain]).__name__}), whose scores would all be dropped; give every candidate as a "
            "ScoredDocument, or none (ScoredDocument.document is its plain Document)"
        )
    out = []
    claimed = {d.id: i for i, d in enumerate(docs) if isinstance(d, Document)}  # (scored ones: refused above)
    for i, d in enumerate(docs):
        if isinstance(d, Document):
            out.append(d)
        elif isinstance(d, str):
            if str(i) in claimed:  # ("document #1 repeats the id '1'", of ids the caller never gave twice)
                raise InputError(
                    f"document #{i} is a text, named by its position {str(i)!r}, which is the id of document "
                    f"#{claimed[str(i)]}; give every candidate as a Document with its id, or every one as a text"
                )
            out.append(Document(str(i), d))
        elif isinstance(d, ScoredDocument):
            out.append(d.document)
        else:
            raise InputError(f"document #{i} is a {kind_of(d)}; pass attnrank's Document, ScoredDocument or str")
    return out, None


def rank_documents(
    query: str,
    docs: Sequence[Document],
    scores: Sequence[float] | Any,  # a sequence or a 1-d numpy array
    *,
    stage: str,
    query_id: str | None = None,
    previous: Sequence[ScoredDocument] | None = None,
    evidence: Sequence[dict[str, Any]] | None = None,
) -> RankedResults:
    """Build sorted results from parallel ``docs``/``scores``; keeps earlier stages' scores.

    Ties keep the input order (stable sort on the previous rank).
    """
    counts = {"scores": len(scores)}
    counts |= {name: len(v) for name, v in (("previous", previous), ("evidence", evidence)) if v is not None}
    bad = next(((name, n) for name, n in counts.items() if n != len(docs)), None)
    if bad is not None:  # zip would silently drop the unmatched documents
        raise InputError(f"{len(docs)} documents but {bad[1]} {bad[0]}; give one per document, in the same order")
    out = []
    for i, (d, s) in enumerate(zip(docs, scores)):
        prev = previous[i].stage_scores if previous is not None else {}
        ev = dict(previous[i].evidence) if previous is not None else {}
        if evidence is not None:
            ev.update(evidence[i])
        out.append(
            ScoredDocument(
                id=d.id,
                score=float(s),
                rank=i + 1,
                text=d.text,
                title=d.title,
                stage_scores={**prev, stage: float(s)},
                evidence=ev,
                metadata=dict(d.metadata),  # (the caller's dict: an edit of a result reached their documents)
            )
        )
    return RankedResults(query=query, results=out, query_id=query_id, stage=stage)


def stage_score_lists(previous: list[ScoredDocument] | None) -> dict[str, Sequence[float]] | None:
    """Each earlier stage's scores over the candidates (NaN where a candidate has none); a stage
    that scored none of them is left out, so weights that need it fail with a clear error."""
    if previous is None:
        return None
    names = dict.fromkeys(n for d in previous for n in d.stage_scores)
    return {n: [d.stage_scores.get(n, float("nan")) for d in previous] for n in names}


def with_stage(
    docs: list[Document], previous: list[ScoredDocument] | None, stage: str, scores: Iterable[float]
) -> list[ScoredDocument]:
    """``docs`` (input order) as scored documents carrying ``stage``'s score beside the earlier ones
    (a NaN score: the stage did not score the document, and none is recorded for it)."""
    out = []
    for i, (d, s) in enumerate(zip(docs, scores)):
        prev = previous[i] if previous is not None else None
        own = {} if math.isnan(s) else {stage: float(s)}
        out.append(
            ScoredDocument(
                d.id,
                float(s),
                i + 1,
                d.text,
                d.title,
                {**(prev.stage_scores if prev else {}), **own},
                dict(prev.evidence) if prev else {},
                d.metadata,
            )
        )
    return out


def check_ids(documents: Sequence[Document]) -> None:
    """Every document's id a string with some non-space character, and no id twice, nor two that
    differ only by surrounding whitespace (the index keys its results, runs and qrels by them, which
    read ids trimmed: "" was a result without an id, " a " beside "a" two documents that a run names
    alike). Why strings: ids 1 and "1" were two documents, a run wrote "1" twice, and qrels read as
    text never matched an integer id (evaluation scored 0, without a word). An id with whitespace
    around it alone is kept (a folder corpus's file name), as one with whitespace inside is."""
    seen: set[str] = set()
    trimmed: dict[str, str] = {}
    for i, d in enumerate(documents):
        if not isinstance(d, (Document, ScoredDocument)):  # (a text: an AttributeError on .id)
            raise InputError(
                f"document #{i} is a {kind_of(d)}, not attnrank's Document; pass attnrank.Document(id, text) objects, "
                "or a corpus path"
            )
        check_id_type(i, d)
        if not d.id.strip():
            raise InputError(f"document #{i}'s id {d.id!r} is empty; give every document an id")
        if d.id in seen:
            raise InputError(f"duplicate document id {d.id!r}; document ids must be unique")
        seen.add(d.id)
        other = trimmed.setdefault(d.id.strip(), d.id)
        if other != d.id:
            raise InputError(
                f"document ids {other!r} and {d.id!r} differ only by surrounding whitespace, which runs and qrels "
                "trim (one id for two documents); give ids without surrounding whitespace (id.strip())"
            )


def check_id_type(i: int, doc: Document | ScoredDocument, noun: str = "document") -> None:
    """``doc`` (#``i`` of its list, a ``noun``) has a string id: as an index keys, and a reranker
    ranks, documents by it (ids 1 and "1" were two documents)."""
    if not isinstance(doc.id, str):
        raise InputError(
            f"{noun} #{i}'s id {doc.id!r} is a {type(doc.id).__name__}, not a string; give ids as strings (str(id))"
        )


def check_indexable(documents: Sequence[Document]) -> None:
    """What :func:`attnrank.corpus.load_corpus` refuses in a file, refused in documents given to an
    index build: ids (:func:`check_ids`), a document with no text or title (indexed, it was a dense
    hit for unrelated queries, and every reranker refused the results that held it), and text,
    title or metadata that is not valid Unicode (found after the BM25 build, by the embedder or by
    the save)."""
    check_ids(documents)
    as_text: list[tuple[str, Any]] = []  # (document id, a metadata value a save writes as its text)

    def default(value: Any) -> Any:
        out = metadata_json(value)
        if isinstance(out, str):
            as_text.append((d.id, value))
        return out

    for i, d in enumerate(documents):
        check_text_fields(i, d)
        if not has_text(d):
            raise InputError(f"document #{i} ({d.id!r}) has no text; drop empty documents before indexing")
        try:
            meta = json.dumps(d.metadata, ensure_ascii=False, default=default)
        except (TypeError, ValueError) as e:  # (keys that are not text, a circular reference)
            raise InputError(
                f"document #{i} ({d.id!r}) has metadata that cannot be written as JSON ({e}); give a dict with "
                "string keys"
            ) from None
        if not encodable(d.id, d.title or "", str(d.text), meta):
            raise InputError(
                f"document #{i} ({d.id!r}) holds a lone surrogate (a \\ud800-style escape or bytes that are not "
                "UTF-8) in its id, title, text or metadata; fix or re-encode it as UTF-8"
            )
    if as_text:  # (a filter on meta["size"] > 100 failed after a reload, without a word at the save)
        doc_id, value = as_text[0]
        logger.warning(
            "%d metadata value(s) have no JSON form (e.g. a %s of document %r): searched before a save they are "
            "what was given, and a save writes them as their text, read back as strings; give JSON values "
            "(text, numbers, booleans, lists, dicts)",
            len(as_text),
            type(value).__name__,
            doc_id,
        )


def is_blank(text: str) -> bool:
    """Whether ``text`` holds nothing to read: only whitespace and invisible format or control
    characters (a zero-width space, a byte-order mark, a soft hyphen). Why not ``str.strip()``:
    a query of U+200B alone passed it, tokenizers dropped it, and the candidates were ranked
    against nothing (by their cosine with an empty text), a confident meaningless order."""
    return all(c.isspace() or unicodedata.category(c) in ("Cf", "Cc") for c in text)


def has_text(doc: Document | ScoredDocument) -> bool:
    """Whether ``doc`` holds some text, or a title (what a reranker can score)."""
    return not is_blank(str(doc.text)) or not is_blank(doc.title or "")


def check_text_fields(i: int, d: Document) -> None:
    """Document #``i``'s text a string and its title a string or None. NaN (a data frame's missing
    value) was indexed or scored as the word "nan", None as "None"; elsewhere a traceback."""
    for part, value in (("text", d.text), ("title", d.title)):
        if not isinstance(value, str) and not (part == "title" and value is None):
            raise InputError(
                f"document #{i} ({d.id!r}) has a {part} that is not text ({value!r}, of type {type(value).__name__}); "
                f"give a string{' or None' if part == 'title' else ''}"
            )


def check_texts(documents: Sequence[Document]) -> None:
    """Some text in each document: an empty passage would be scored by the attention its bare
    slot label draws, and could outrank real ones (and text fields that are strings,
    :func:`check_text_fields`, and valid Unicode, :func:`check_unicode`)."""
    for i, d in enumerate(documents):
        check_text_fields(i, d)
    empty = [i for i, d in enumerate(documents) if not has_text(d)]
    if empty and len(empty) == len(documents) > 1:  # (ids alone: a run's; "drop empty documents" left none)
        raise InputError(
            f"none of the {len(documents)} documents has text (e.g. {documents[0].id!r}); the reranker reads each "
            "one's text: give the candidates with their texts (a run holds ids alone: look them up in the corpus)"
        )
    if empty:
        i = empty[0]
        raise InputError(f"document #{i} ({documents[i].id!r}) has no text; drop empty documents before reranking")
    check_unicode((f"{d.title or ''}\n{d.text}" for d in documents), "document")
