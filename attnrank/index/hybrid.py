"""Fusion of sparse and dense ranked lists.

- :func:`rrf`: reciprocal rank fusion, score(d) = Σ_i w_i / (k + rank_i(d)) with 1-based ranks
  and k = 60 (Cormack, Clarke & Büttcher, SIGIR 2009).
- :func:`convex`: α·norm(dense) + (1 − α)·norm(sparse) (Bruch, Gai & Ingber, TOIS 2023), with
  ``minmax``, ``zscore`` or no normalisation. A document missing from one list gets that list's
  lowest normalised score (Pyserini's hybrid-search policy), or one unit below its hits where
  they all score alike (one BM25 match, or several tied): being in the list is then all it says,
  and the lowest score would give a lone match no more than documents that do not match.

Lists are arrays of document positions (``-1`` = no hit) and scores, best first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import DEFAULT_ALPHA, DEFAULT_NORM, RRF_K
from ..errors import InputError

NORMS = ("minmax", "zscore", "none")


def normalize(scores: np.ndarray, method: str) -> np.ndarray:
    """Normalise one list's scores: ``minmax`` → [0, 1], ``zscore`` → mean 0 / std 1, ``none``."""
    s = np.asarray(scores, dtype=np.float64)
    if method == "none" or s.size == 0:
        return s
    if method == "minmax":  # a list whose scores all tie: 1, the best score of a list that does not
        lo, hi = s.min(), s.max()
        return np.ones_like(s) if hi - lo < 1e-12 else (s - lo) / (hi - lo)
    if method == "zscore":
        sd = s.std()
        return np.zeros_like(s) if sd < 1e-12 else (s - s.mean()) / sd
    raise InputError(f"normalisation {method!r} is not one of {NORMS}")


def _sorted(fused: dict[int, float], k: int) -> tuple[np.ndarray, np.ndarray]:
    # ties broken by document position so results are deterministic
    items = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return np.array([i for i, _ in items], dtype=np.int64), np.array([s for _, s in items], dtype=np.float64)


def rrf(
    rankings: Sequence[np.ndarray], k: int, *, rrf_k: int = RRF_K, weights: Sequence[float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion of several lists of document positions (best first)."""
    if rrf_k <= 0:
        raise InputError(f"rrf_k must be positive, got {rrf_k}")
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise InputError(f"{len(weights)} fusion weights given for {len(rankings)} lists")
    fused: dict[int, float] = {}
    for w, ranking in zip(weights, rankings):
        for r, doc in enumerate(ranking, start=1):
            if doc >= 0:
                fused[int(doc)] = fused.get(int(doc), 0.0) + w / (rrf_k + r)
    return _sorted(fused, k)


def convex(
    sparse: tuple[np.ndarray, np.ndarray],
    dense: tuple[np.ndarray, np.ndarray],
    k: int,
    *,
    alpha: float = DEFAULT_ALPHA,
    norm: str = DEFAULT_NORM,
) -> tuple[np.ndarray, np.ndarray]:
    """Convex combination α·dense + (1 − α)·sparse of normalised scores (α = weight on dense)."""
    if not 0.0 <= alpha <= 1.0:
        raise InputError(f"alpha={alpha} is outside [0, 1]; it is the weight of the dense scores")
    parts = []
    for ids, scores in (sparse, dense):
        keep = ids >= 0
        ids, s = ids[keep], normalize(scores[keep], norm)
        parts.append((dict(zip(ids.tolist(), s.tolist())), score_below(s)))
    (sp, sp_min), (de, de_min) = parts
    fused = {d: (1 - alpha) * sp.get(d, sp_min) + alpha * de.get(d, de_min) for d in set(sp) | set(de)}
    return _sorted(fused, k)


def score_below(normalized: np.ndarray) -> float:
    """A score just below every one of ``normalized`` (one below where they all tie; 0 if there
    are none). What a document missing from a list gets in convex fusion: never the lowest score
    itself, or the list's last hit would score as the documents it holds no term of, and at
    ``alpha`` 0 (BM25 alone, the first point of :func:`~attnrank.index.tuning.tune_alpha`'s grid)
    lose to them on the tie-break."""
    if not normalized.size:
        return 0.0
    lo = float(normalized.min())
    # (a millionth: below float32's resolution, 1e-9 vanished where a run is read as trec_eval reads it)
    return lo - 1.0 if float(normalized.max()) - lo < 1e-12 else lo - max(1e-6, abs(lo) * 1e-6)


Ranked = tuple[np.ndarray, np.ndarray]  # document positions (-1: no hit) and scores, best first


def fuse_at_depth(lists: Sequence[Ranked], depth: int, k: int, fusion: str, **settings: Any) -> Ranked:
    """The top ``k`` of the sparse and dense ``lists`` fused by ``fusion`` (:func:`rrf` or
    :func:`convex`, with their ``settings``): each side's top ``depth`` (the index's setting, what
    its fusion was tuned at) fused first, then, for ``k`` past those, the fusion of the longer
    lists' other documents ranked below them. Fused over the longer lists alone, the top of
    ``search -k 300`` was not ``search -k 10``'s: convex fusion's normalisation, and RRF's sums,
    read every document fetched. The order past the fused head (the union of each side's top
    ``depth``) still follows the lists' length, so ``k``: ``-k 300`` and ``-k 1000`` rank that tail
    otherwise (a known limit; the head, what reranking reads at ``--rerank`` <= depth, does not,
    but for an HNSW dense index: FAISS widens its search beam to the hits asked for, ``efSearch``
    128 or ``k`` if larger, so a larger ``k`` can find other, nearer, dense hits for the head too)."""

    def fuse(pair: Sequence[Ranked]) -> Ranked:
        (sp_ids, sp), (de_ids, de) = pair
        if fusion == "rrf":
            return rrf([sp_ids, de_ids], k, **settings)
        return convex((sp_ids, sp), (de_ids, de), k, **settings)

    ids, scores = fuse([(i[:depth], s[:depth]) for i, s in lists])
    if len(ids) >= k or all(len(i) <= depth for i, _ in lists):
        return ids, scores
    more_ids, more = fuse(lists)
    new = ~np.isin(more_ids, ids)
    more_ids, more = more_ids[new], more[new]
    if len(more) and len(scores) and more[0] >= scores[-1]:  # below the top ``depth``'s fusion
        more = more - (more[0] - scores[-1]) - max(1e-6, abs(float(scores[-1])) * 1e-9)
    return np.concatenate([ids, more_ids])[:k], np.concatenate([scores, more])[:k]
