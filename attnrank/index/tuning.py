"""Tune the convex-fusion weight on labelled queries (grid search, as ranx's optimize_fusion)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..eval import evaluate, results_to_run
from .bm25 import check_k
from .retriever import HybridRetriever
from .settings import check_fusion

logger = logging.getLogger(__name__)


@dataclass
class TuneResult:
    alpha: float
    norm: str
    score: float
    metric: str
    table: list[dict] = field(default_factory=list)  # one row per (norm, alpha) tried


def tune_alpha(
    retriever: HybridRetriever,
    queries: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    alphas: Sequence[float] = tuple(np.round(np.linspace(0, 1, 21), 2)),
    norms: Sequence[str] = ("minmax", "zscore"),
    metric: str = "nDCG@10",
    k: int = 100,
    rel: int = 1,
    apply: bool = True,
) -> TuneResult:
    """Grid-search ``alpha`` (weight of dense) and the normalisation for convex fusion.

    Candidates are retrieved once and re-fused per setting. Ties go to the smaller alpha.
    With ``apply=True`` the retriever is switched to the best convex setting; otherwise (and
    when the search fails) its fusion settings are left as they were.
    """
    check_k(k)
    alphas, norms = list(alphas), list(norms)
    if not alphas or not norms:
        raise InputError(f"alphas {alphas} and norms {norms} must each hold a value to try")
    for norm in norms:  # (a bad value was found after every labelled query had been searched)
        for alpha in alphas:
            check_fusion("convex", alpha, norm)
    labelled = {q: t for q, t in queries.items() if q in qrels}
    if not labelled:
        raise InputError("none of the given queries has relevance judgments; tuning needs labelled queries")
    # a search's own checks (documents indexed, every query a text): candidates() makes none
    retriever._check_search(list(labelled.values()), k)
    before = (retriever.fusion, retriever.alpha, retriever.norm)
    try:
        best = _grid(retriever, labelled, qrels, alphas, norms, metric, min(k, retriever.num_docs), rel)
    finally:  # the grid switched the retriever through every setting it tried
        retriever.set_fusion(before[0], alpha=before[1], norm=before[2])
    logger.info("best convex fusion: alpha=%.2f norm=%s %s=%.4f", best.alpha, best.norm, metric, best.score)
    if apply:
        retriever.set_fusion("convex", alpha=best.alpha, norm=best.norm)
    return best


def _grid(
    retriever: HybridRetriever,
    labelled: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    alphas: Sequence[float],
    norms: Sequence[str],
    metric: str,
    k: int,
    rel: int,
) -> TuneResult:
    """The best (alpha, norm) of the grid, with the table of every setting tried."""
    qids, texts = list(labelled), list(labelled.values())
    cands = retriever.candidates(texts, k, "hybrid")
    judged = {q: qrels[q] for q in qids}
    table, best = [], None
    for norm in norms:
        for a in alphas:
            retriever.set_fusion("convex", alpha=float(a), norm=norm)
            res = retriever.fuse(texts, cands, k, query_ids=qids)
            value = evaluate(results_to_run(res), judged, [metric], rel=rel, warn=False)[metric]
            table.append({"norm": norm, "alpha": float(a), metric: value})
            tie = best is not None and abs(value - best.score) <= 1e-12
            if best is None or value > best.score + 1e-12 or (tie and float(a) < best.alpha):
                best = TuneResult(float(a), norm, value, metric)
    if best is None:
        raise InputError("tune_alpha needs at least one alpha and one norm to try")
    best.table = table
    return best
