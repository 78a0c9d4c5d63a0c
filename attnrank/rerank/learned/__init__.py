"""Learned head weighting: a linear reranker over per-head attention scores.

Features of a (query, passage) pair: each selected head's calibrated passage score ``S_h(d)``
(:func:`~attnrank.llm.rows.per_head_document_scores`: ICR's Δ = a(q) − a(N/A) rows,
QRHead's per-head μ−2σ token filter, summed over the passage's tokens; units: shares of the query
span's attention), for heads of layers ≤ ``max_layer`` (so the forward pass can stop early);
optionally the first-stage *rank* as one more feature (:func:`first_stage_feature`: ``−rank``
by first-stage score, so weights transfer between retrievers whose scores have different
shapes — BM25, RRF, cosine), and optionally named earlier-stage scores (``stages``, e.g.
``["dense"]``: the ``ScoredDocument.stage_scores`` a :class:`~attnrank.index.HybridRetriever`
leaves, :func:`stage_feature`) — a learned fusion of the attention heads with the retrievers.

**Per-query standardisation.** Attention scores are shares of one prompt's attention budget, so
their scale changes with the number and length of candidates; only their order within a query
matters for ranking. Every feature column is therefore z-scored *within each query* over its
candidates: ``z = (x − mean_q(x)) / std_q(x)`` (population std; a constant column becomes 0).
The score is ``s(d) = w · z(d) + b``.

Models (scikit-learn's L2-regularised logistic regression, minimising
``Σ log-loss + (λ/2)·||w||²``, i.e. ``C = 1/λ``):

- ``pointwise``: label ``1[rel(d) ≥ rel]`` from ``z(d)``, with intercept ``b``;
- ``pairwise`` (RankNet with a linear scorer = logistic regression on differences): for pairs
  ``rel(i) > rel(j)`` of one query whose first counts as relevant (``rel(i) ≥ rel``), ``P(i ≻ j) = σ(w · (z_i − z_j))``, no intercept (``b = 0``).
  Each pair is fitted in both orders (``d`` labelled 1 and ``−d`` labelled 0, so that the
  classes balance), which counts its log-loss twice: against one count per pair the penalty is
  ``(λ/4)·||w||²``.

:class:`LearnedHeadWeights` is stored per model in the head registry (artifact
``"head-weights"``); ``AttentionReranker(scorer="learned")`` loads it.

The code, re-exported here: :mod:`~attnrank.rerank.learned.features` (the features and their
standardisation), :mod:`~attnrank.rerank.learned.weights` (:class:`LearnedHeadWeights`, the saved
weights and their scoring) and :mod:`~attnrank.rerank.learned.training` (training and
cross-validated evaluation).
"""

from __future__ import annotations

from .features import (
    QueryFeatures,
    Scores,
    design,
    feature_matrix,
    first_stage_feature,
    query_features,
    restrict_heads,
    stage_feature,
    standardise,
)
from .training import LEARNERS, evaluate_scores, kfold_evaluate, leave_one_group_out, train_head_weights
from .weights import ARTIFACT, FeatureConfig, LearnedHeadWeights

__all__ = [
    "ARTIFACT",
    "LEARNERS",
    "FeatureConfig",
    "LearnedHeadWeights",
    "QueryFeatures",
    "Scores",
    "design",
    "evaluate_scores",
    "feature_matrix",
    "first_stage_feature",
    "kfold_evaluate",
    "leave_one_group_out",
    "query_features",
    "restrict_heads",
    "stage_feature",
    "standardise",
    "train_head_weights",
]
