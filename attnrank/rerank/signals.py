"""First-stage signals of a candidate list, computed over the candidates themselves.

The fused scorer (:mod:`attnrank.rerank.fused`) combines attention with the first stage's
signals. A TREC run or a plain list of passages brings at most one score, of unknown shape, so
the signals are computed here, the same way at training and at reranking time, from nothing but
the query and the candidate texts:

- ``bm25``: BM25 over the candidate texts (Lucene idf ``log(1 + (N − df + 0.5)/(df + 0.5))``,
  which stays positive when every candidate holds a query term; k1 = 0.9, b = 0.4 as Pyserini;
  Porter stems), without scikit-learn's 318 English stopwords. Why that list and not Lucene's 33
  words, as an index uses: idf from a score of candidates is high for any word only some of them
  hold, so a question's function words ("what", "does", "which") outweighed its content words.
  On the fused scorer's benchmark candidates BM25 alone gained 1.5 to 5.1 nDCG@10 points (DL19
  0.430 -> 0.480, SciFact 0.681 -> 0.697, HotpotQA 0.856 -> 0.879, LoCoMo 0.461 -> 0.494;
  ``docs/results/fusion.md``, "bm25 alone", against its 2026-12-01 version);
- ``dense``: cosine of the query and the passage with the packaged sentence embedder
  (all-MiniLM-L6-v2, the index's default, :func:`attnrank.index.embed.load_embedder`);
- ``rank``: ``−position`` in the first-stage order (0 = best), so a retriever's order counts
  whatever its score scale.

Each is one value per candidate, in input order; the fused scorer z-scores them per query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..index.bm25 import BM25Index, BM25Params
from ..index.embed import encode, load_embedder
from ..index.tokenize import TokenizerConfig

SIGNALS = ("bm25", "dense", "rank")
_LUCENE = BM25Params(method="lucene")
_CANDIDATE_TERMS = TokenizerConfig(stopwords="sklearn")  # (see the module docstring)


def candidate_bm25(query: str, texts: Sequence[str]) -> np.ndarray:
    """BM25 of ``query`` against each text, with statistics of ``texts`` alone (0 for all if
    every text is empty after tokenization)."""
    try:
        return np.asarray(BM25Index(_LUCENE, _CANDIDATE_TERMS).index(list(texts)).get_scores(query), dtype=np.float64)
    except InputError:  # nothing to index (all stopwords/punctuation): no lexical signal
        return np.zeros(len(texts))


def candidate_cosine(query: str, texts: Sequence[str], embedder: Any) -> np.ndarray:
    """Cosine of ``query`` and each text with a sentence-transformers ``embedder``."""
    vecs = encode(embedder, [query, *texts])
    return np.asarray(vecs[1:] @ vecs[0], dtype=np.float64)


def rank_signal(n: int) -> np.ndarray:
    """``−position`` of each of ``n`` candidates in first-stage order (0 = best)."""
    return -np.arange(n, dtype=np.float64)


class SignalComputer:
    """Computes :data:`SIGNALS` for candidate lists; the embedder (``embedder``: a model name or
    folder, None = the packaged MiniLM) is loaded on first use."""

    def __init__(self, embedder: str | None = None, device: str = "cpu"):
        self.embedder_name, self.device = embedder, device
        self._embedder: Any = None

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            self._embedder = load_embedder(self.embedder_name, device=self.device)
        return self._embedder

    def __call__(self, query: str, texts: Sequence[str], names: Sequence[str] = SIGNALS) -> dict[str, np.ndarray]:
        """``{name: values in input order}`` for each of ``names``."""
        unknown = [n for n in names if n not in SIGNALS]
        if unknown:
            raise InputError(f"signal(s) {unknown} are not among {SIGNALS}")
        out: dict[str, np.ndarray] = {}
        if "bm25" in names:
            out["bm25"] = candidate_bm25(query, texts)
        if "dense" in names:
            out["dense"] = candidate_cosine(query, texts, self.embedder)
        if "rank" in names:
            out["rank"] = rank_signal(len(texts))
        return out
