"""Sparse BM25 index: rank-bm25 statistics, stored as a CSC matrix of precomputed term weights.

rank-bm25 (``BM25Okapi``) computes the corpus statistics (document frequencies, IDF with its
epsilon floor for very common terms, document lengths). Scoring every document in Python per
query, as rank-bm25 does, is slow; following bm25s (Lù, 2024) the per-(term, document) BM25
weights are computed once at index time and stored column-wise, so a query is a sum of a few
array slices. Rankings are identical to ``BM25Okapi.get_scores`` (tested), except that its idf
floor is kept at 0 or above (:func:`nonnegative_idf`: it is negative only in a small corpus whose
documents share most terms, where it inverted the ranking).

Methods:

- ``okapi`` (default): rank-bm25's BM25Okapi — idf = log((N − df + 0.5)/(df + 0.5)), floored at
  ε·mean(idf) for terms in more than half of the documents.
- ``lucene``: Lucene/Pyserini's idf = log(1 + (N − df + 0.5)/(df + 0.5)), same tf saturation.

Defaults k1 = 0.9, b = 0.4 are Pyserini's (rank-bm25's own defaults are 1.5 / 0.75).
On disk (a folder): ``data.npy`` (float32 weights), ``indices.npy`` (int32 doc positions),
``indptr.npy`` (int64, one column per term), ``vocab.json``, ``params.json``; loaded
memory-mapped.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import IndexFormatError, InputError
from ..files import check_new_folder
from ..types import is_count
from .tokenize import TokenizerConfig, make_tokenizer, tokenize_all

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BM25Params:
    k1: float = 0.9
    b: float = 0.4
    epsilon: float = 0.25
    method: str = "okapi"

    def __post_init__(self) -> None:
        if self.method not in ("okapi", "lucene"):
            raise InputError(f"BM25 method {self.method!r} is not one of 'okapi', 'lucene'")
        values = (self.k1, self.b, self.epsilon)
        if not all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise InputError(f"BM25 k1, b and epsilon must be finite numbers, got {values}")
        if self.epsilon < 0:  # (a negative floor would turn the most common terms' weights negative)
            raise InputError(f"BM25 epsilon {self.epsilon} must be >= 0 (the floor of a common term's idf)")
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise InputError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")
        for name in ("k1", "b", "epsilon"):  # (a NumPy float failed the save's JSON, after the whole build)
            object.__setattr__(self, name, float(getattr(self, name)))


def check_k(k: object) -> None:
    """Raise :class:`InputError` unless ``k`` is a positive integer (results per query)."""
    if not is_count(k):
        raise InputError(f"k={k!r} must be a positive integer (the number of results per query)")


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and scores of the ``k`` highest scores, best first; ties by lower index."""
    n = scores.shape[0]
    k = min(k, n)
    if k < n:
        # the partition boundary may split ties arbitrarily: keep every score above the k-th
        # and, of those equal to it, the lowest indexes (so any split of the corpus agrees)
        neg = -scores
        kth = np.partition(neg, k - 1)[k - 1]
        above = np.flatnonzero(neg < kth)
        cand = np.concatenate([above, np.flatnonzero(neg == kth)[: k - len(above)]])
    else:
        cand = np.arange(n)
    order = np.lexsort((cand, -scores[cand]))
    idx = cand[order]
    return idx, scores[idx]


def nonnegative_idf(idf: Mapping[str, float]) -> dict[str, float]:
    """rank-bm25's Okapi idf with its floor kept at 0 or above. It replaces a negative idf (a term
    in more than half the documents) by ``epsilon`` times the mean idf, which is itself negative
    in a small corpus whose terms most documents share (any corpus of 2): matching more query
    terms then lowered a score, and the ranking inverted. Unchanged wherever the mean is positive."""
    return {t: max(v, 0.0) for t, v in idf.items()}


class BM25Index:
    """BM25 over a list of texts. Four verbs: :meth:`index`, :meth:`retrieve`, :meth:`save`, :meth:`load`."""

    def __init__(self, params: BM25Params | None = None, tokenizer: TokenizerConfig | None = None):
        self.params = params or BM25Params()
        self.tokenizer_config = tokenizer or TokenizerConfig()
        self._tokenize = make_tokenizer(self.tokenizer_config)
        self.vocab: dict[str, int] = {}
        self.data: Any = None
        self.indices: Any = None
        self.indptr: Any = None
        self.num_docs = 0

    # -- build -----------------------------------------------------------------------------
    def index(self, texts: Sequence[str]) -> BM25Index:
        from rank_bm25 import BM25Okapi

        if len(texts) == 0:
            raise InputError("cannot build a BM25 index over 0 documents; give a non-empty corpus")
        tokens = tokenize_all(texts, self.tokenizer_config)
        # rank-bm25 divides by the average length; an all-stopword corpus would make it 0
        if not any(tokens):
            raise InputError("every document is empty after tokenization (only stopwords/punctuation?)")
        p = self.params
        stats = BM25Okapi(tokens, k1=p.k1, b=p.b, epsilon=p.epsilon)
        idf = (
            nonnegative_idf(stats.idf)
            if p.method == "okapi"
            else {t: math.log(1.0 + (stats.corpus_size - df + 0.5) / (df + 0.5)) for t, df in _doc_freq(stats).items()}
        )
        self.vocab = {t: i for i, t in enumerate(sorted(idf))}
        self._build_matrix(stats.doc_freqs, np.asarray(stats.doc_len, dtype=np.float64), stats.avgdl, idf)
        self.num_docs = len(texts)
        return self

    def index_tokens(self, tokens: Sequence[Sequence[str]], idf: Mapping[str, float], avgdl: float) -> BM25Index:
        """Build from tokenized documents with statistics given from outside (a sharded build).

        ``idf`` (per term) and ``avgdl`` (average length in terms) describe the whole corpus, not
        these documents, so a shard's weights equal the single index's; the vocabulary is the
        terms these documents contain.
        """
        if len(tokens) == 0:
            raise InputError("cannot build a BM25 index over 0 documents; give a non-empty shard")
        doc_freqs = [Counter(t) for t in tokens]
        terms = sorted(set().union(*doc_freqs))
        missing = next((t for t in terms if t not in idf), None)
        if missing is not None:
            raise InputError(f"term {missing!r} has no global idf; the statistics do not cover these documents")
        self.vocab = {t: i for i, t in enumerate(terms)}
        doc_len = np.array([len(t) for t in tokens], dtype=np.float64)
        self._build_matrix(doc_freqs, doc_len, avgdl, {t: idf[t] for t in terms})
        self.num_docs = len(tokens)
        return self

    def _build_matrix(
        self, doc_freqs: Sequence[Mapping[str, int]], doc_len: np.ndarray, avgdl: float, idf: dict
    ) -> None:
        rows: list[Any] = []
        cols: list[Any] = []
        tfs: list[Any] = []
        for d, freqs in enumerate(doc_freqs):
            rows.extend([d] * len(freqs))
            cols.extend(self.vocab[t] for t in freqs)
            tfs.extend(freqs.values())
        rows_a, cols_a = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        tf = np.asarray(tfs, dtype=np.float64)
        k1, b = self.params.k1, self.params.b
        norm = k1 * (1 - b + b * doc_len[rows_a] / max(avgdl, 1e-9))
        idf_a = np.array([idf[t] for t in sorted(idf)], dtype=np.float64)[cols_a]
        weights = idf_a * tf * (k1 + 1) / (tf + norm)
        order = np.lexsort((rows_a, cols_a))  # column-major: one contiguous slice per term
        self.indices = rows_a[order].astype(np.int32)
        self.data = weights[order].astype(np.float32)
        self.indptr = np.zeros(len(self.vocab) + 1, dtype=np.int64)
        np.add.at(self.indptr, cols_a + 1, 1)
        self.indptr = np.cumsum(self.indptr)

    # -- query -----------------------------------------------------------------------------
    def get_scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (float32, one per document)."""
        return self._scores(query, False)[0]

    def matches(self, query: str) -> np.ndarray:
        """Which documents hold at least one of ``query``'s terms (bool, one per document)."""
        return self._scores(query, True)[1]

    def _scores(self, query: str, hits: bool) -> tuple[np.ndarray, np.ndarray]:
        """(scores, which documents hold a query term: with ``hits``, else all False), in one pass
        over the query terms' postings."""
        self._check_built()
        scores = np.zeros(self.num_docs, dtype=np.float32)
        hit = np.zeros(self.num_docs, dtype=bool)
        for term in self._tokenize(query):
            t = self.vocab.get(term)
            if t is not None:  # repeated query terms count once per occurrence, as in rank-bm25
                s, e = self.indptr[t], self.indptr[t + 1]
                scores[self.indices[s:e]] += self.data[s:e]
                if hits:
                    hit[self.indices[s:e]] = True
        return scores, hit

    def retrieve(
        self, queries: Sequence[str], k: int = 10, *, matched_only: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` document positions and scores per query, arrays of shape (n_queries, k').

        ``k`` larger than the corpus returns the whole corpus (k' = number of documents). With
        ``matched_only``, a document that holds none of the query's terms is no hit: its place
        is ``-1`` with score ``-inf``, after the hits (the retrievers' convention for "no hit";
        otherwise such documents fill the list in corpus order, and rank fusion credits them).
        """
        check_k(k)
        k = min(k, self.num_docs)
        out_i = np.empty((len(queries), k), dtype=np.int64)
        out_s = np.empty((len(queries), k), dtype=np.float32)
        for qi, q in enumerate(queries):
            scores, hit = self._scores(q, matched_only)
            if matched_only:
                scores = np.where(hit, scores, np.float32(-np.inf))
            out_i[qi], out_s[qi] = top_k(scores, k)
            if matched_only:
                out_i[qi][~np.isfinite(out_s[qi])] = -1
        return out_i, out_s

    def _check_built(self) -> None:
        if self.data is None:
            raise InputError("the BM25 index is empty; call index(texts) or BM25Index.load(path) first")

    # -- persistence -----------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the index into ``path``, a new or empty folder (:func:`attnrank.files.check_new_folder`)."""
        self._check_built()
        path = Path(path)
        check_new_folder(path, "BM25Index.save")
        path.mkdir(parents=True, exist_ok=True)
        np.save(path / "data.npy", self.data)
        np.save(path / "indices.npy", self.indices)
        np.save(path / "indptr.npy", self.indptr)
        (path / "vocab.json").write_text(json.dumps(list(self.vocab)), encoding="utf-8")
        params = {"bm25": self.params.__dict__, "tokenizer": self.tokenizer_config.to_dict(), "num_docs": self.num_docs}
        (path / "params.json").write_text(json.dumps(params, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path, mmap: bool = True, *, corpus_docs: int | None = None) -> BM25Index:
        """``corpus_docs``: the documents the idf was computed over when more than this index
        holds (a shard of a sharded index, whose weights use the whole corpus's idf)."""
        path = Path(path)
        try:
            params = json.loads((path / "params.json").read_text(encoding="utf-8"))
            self = cls(BM25Params(**params["bm25"]), TokenizerConfig(**params["tokenizer"]))
            mode: Literal["r"] | None = "r" if mmap else None
            self.data = np.load(path / "data.npy", mmap_mode=mode)
            self.indices = np.load(path / "indices.npy", mmap_mode=mode)
            self.indptr = np.load(path / "indptr.npy", mmap_mode=mode)
            terms = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
            if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
                raise ValueError("vocab.json is not a list of terms")
            self.vocab = {t: i for i, t in enumerate(terms)}
            if len(self.vocab) != len(terms):
                raise ValueError("vocab.json repeats a term")
            self.num_docs = params["num_docs"]
        except PermissionError:  # (a chmod fixes it: "rebuild" cost hours of a large corpus)
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise IndexFormatError(
                f"BM25 index at {path} cannot be read ({e}); rebuild it with `attnrank index`"
            ) from None
        self._check_structure(path, corpus_docs)
        if len(self.data) and float(self.data.min()) < 0:
            self.data = _floored(path, self.data)
        return self

    def _check_structure(self, path: Path, corpus_docs: int | None = None) -> None:
        """Cheap checks run on every load: a flipped byte must not give garbage scores.

        CSC layout (``indptr`` starts at 0, never decreases, ends at ``len(data)``), document
        positions inside ``[0, num_docs)``, weights finite and within the BM25 bound
        ``(k1 + 1) * max |idf|`` with ``|idf| <= log(2N + 2)`` (N: the documents of the idf,
        ``corpus_docs`` for a shard), vocabulary sorted and unique.
        """

        def bad(what: str) -> IndexFormatError:
            return IndexFormatError(f"BM25 index at {path} is corrupted ({what}); rebuild it with `attnrank index`")

        n, data, ind, ptr = self.num_docs, self.data, self.indices, self.indptr
        if not is_count(n):
            raise bad(f"num_docs={n!r}")
        if (
            data.dtype != np.float32
            or ind.dtype != np.int32
            or ptr.dtype != np.int64
            or data.ndim != 1
            or ind.ndim != 1
            or ptr.ndim != 1
        ):
            raise bad("array types or shapes")
        if len(ind) != len(data) or len(ptr) != len(self.vocab) + 1 or ptr[0] != 0 or ptr[-1] != len(data):
            raise bad("array lengths disagree with the vocabulary")
        if np.any(ptr[1:] < ptr[:-1]):
            raise bad("indptr is not monotone")
        if len(ind) and (int(ind.min()) < 0 or int(ind.max()) >= n):
            raise bad(f"document positions outside [0, {n})")
        # okapi floors a negative idf at epsilon * mean(idf), beyond max |idf| when epsilon > 1
        bound = (self.params.k1 + 1) * max(1.0, abs(self.params.epsilon)) * math.log(2 * max(n, corpus_docs or 0) + 2)
        bound += 1e-3
        if len(data) and not (np.isfinite(data).all() and float(np.abs(data).max()) <= bound):
            raise bad(f"weights not finite or beyond the BM25 bound {bound:.2f}")
        terms = list(self.vocab)
        if len(terms) != len(self.vocab) or any(a >= b for a, b in zip(terms, terms[1:])):
            raise bad("vocabulary not sorted and unique")


def _floored(path: Path, data: np.ndarray) -> np.ndarray:
    """The weights of an index built before :func:`nonnegative_idf`, with the floor applied: a
    negative weight comes only from a negative idf (the rest of a weight is positive), and a term
    whose idf the floor raises to 0 weighs 0 in every document, so this equals a rebuild."""
    logger.warning(
        "BM25 index at %s has negative term weights (built before attnrank floored rank-bm25's idf at 0, "
        "which inverted rankings in small corpora); reading them floored at 0, as a rebuild would",
        path,
    )
    return np.maximum(data, np.float32(0))


def _doc_freq(stats) -> dict[str, int]:
    df: dict[str, int] = {}
    for freqs in stats.doc_freqs:
        for t in freqs:
            df[t] = df.get(t, 0) + 1
    return df
