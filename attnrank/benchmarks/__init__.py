"""The benchmarks' candidate sets and scorers over cached rows (used by ``scripts/bench_*.py``).

This package sits with the entry points: it drives the first stage (:mod:`attnrank.index`), the
reranker's scoring and head detection over data and rows that :mod:`attnrank.eval` loads and caches.

- :mod:`.sets`: the candidate sets (DL19, SciFact, HotpotQA, LoCoMo);
- :mod:`.signals`: their first-stage, candidate and likelihood signals, cached;
- :mod:`.scoring`: scores from cached attention rows, head selections, the fused scorer's examples.
"""

from .scoring import (
    AGGREGATES,
    complementary_heads,
    fusion_examples_from_rows,
    head_quality,
    icr_scores,
    order_agreement,
    within_query_ranks,
)
from .sets import (
    CandidateSet,
    dl19_sets,
    hotpot_set,
    locomo_set,
    scifact_bm25_set,
    scifact_retriever,
    scifact_set,
)
from .signals import TOKEN_LIKELIHOOD, TOKEN_PRIOR, cached_likelihoods, candidate_signals, rrf_order, stage_signals

__all__ = [
    "AGGREGATES",
    "TOKEN_LIKELIHOOD",
    "TOKEN_PRIOR",
    "CandidateSet",
    "cached_likelihoods",
    "candidate_signals",
    "complementary_heads",
    "dl19_sets",
    "fusion_examples_from_rows",
    "head_quality",
    "hotpot_set",
    "icr_scores",
    "locomo_set",
    "order_agreement",
    "rrf_order",
    "scifact_bm25_set",
    "scifact_retriever",
    "scifact_set",
    "stage_signals",
    "within_query_ranks",
]
