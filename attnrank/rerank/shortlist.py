"""The query likelihood on a shortlist: only the candidates the other signals rank highest are
given to the LLM (``RerankConfig.likelihood_depth``).

Coarse to fine, as multi-stage rankers re-score a cheaper stage's top (and as CAFE's coarse
filter drops documents before the fine step, REFERENCES.md): the fused weights without the
likelihood (for the default preset, z(BM25) + z(dense)) score every candidate; the ``depth`` best
of them get the likelihood and are ranked by the full weights, the likelihood's z-score taken over
the shortlist; the rest follow, in the order of the signals alone. The LLM's cost, one prompt per
scored candidate, then stops growing with the number of candidates.

An option, not the default (``likelihood_depth=None``): the depth best on the four datasets of
``scripts/bench_likelihood.py`` (12 of 20 candidates, +0.09 nDCG@10 points on their mean) did not
keep the default's quality on candidates no choice looked at: −1.0 points on new SciFact queries,
−0.2 on new LoCoMo ones, −1.0 on DL19's BM25 top 100. There a shortlist of 30 scored +0.6 (15
queries won, 5 lost) at 30 % of the prompts, a figure read on those same 43 queries
(docs/results/likelihood_depth.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import InputError
from .fused import LIKELIHOOD, FusedWeights
from .fused_features import feature_matrix
from .learned.features import standardise


def signals_alone(weights: FusedWeights, signals: Mapping[str, Any]) -> np.ndarray:
    """Every candidate's score by ``weights`` less the likelihood's term: its other features,
    each z-scored over all the candidates (``signals``: ``{feature: values}``, input order)."""
    if weights.uses_attention or LIKELIHOOD not in weights.features:
        raise InputError(
            f"a likelihood shortlist needs weights that read the likelihood and no attention; these read {weights.features}"
        )
    rest = [(f, w) for f, w in zip(weights.features, weights.weights) if f != LIKELIHOOD]
    if not rest:  # (the likelihood alone: nothing to shortlist by, the first-stage order)
        n = len(next(iter(signals.values())))
        return -np.arange(n, dtype=np.float64)
    return feature_matrix(signals, [f for f, _ in rest]) @ np.asarray([w for _, w in rest])


def shortlist(base: np.ndarray, depth: int) -> np.ndarray:
    """The indices of the ``depth`` highest of ``base``, best first (ties: the earlier candidate)."""
    return np.argsort(-np.asarray(base, dtype=np.float64), kind="stable")[:depth]


def fuse_shortlist(weights: FusedWeights, base: np.ndarray, top: np.ndarray, likelihood: np.ndarray) -> np.ndarray:
    """The final score of every candidate: on the shortlist ``top`` (:func:`shortlist` of
    ``base``, :func:`signals_alone`), ``base`` plus the likelihood's weight times its z-score over
    the shortlist (``likelihood``: the shortlist's scores, in the order of ``top``); the others
    below all of those, one unit under the lowest, keeping their differences in ``base``."""
    base = np.asarray(base, dtype=np.float64)
    weight = weights.weights[weights.features.index(LIKELIHOOD)]
    out = base.copy()
    out[top] = base[top] + weight * standardise(np.asarray(likelihood, dtype=np.float64)[:, None])[:, 0]
    rest = np.setdiff1d(np.arange(len(base)), top)
    if rest.size:
        out[rest] = base[rest] - base[rest].max() + out[top].min() - 1.0
    return out


def fused_on_shortlist(
    weights: FusedWeights, signals: Mapping[str, Any], depth: int, likelihood: Callable[[np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate's score by ``weights`` with the likelihood read for the ``depth`` candidates
    the other ``signals`` rank highest (:func:`signals_alone`, :func:`shortlist`,
    :func:`fuse_shortlist`): ``likelihood(top)`` gives theirs (``top``: their indices, best first).
    Returns the scores (input order), ``top`` and the likelihoods read. The reranker and the
    benchmark both score through it (scripts/bench_likelihood_depth.py, from cached likelihoods)."""
    base = signals_alone(weights, signals)
    top = shortlist(base, depth)
    read = np.asarray(likelihood(top), dtype=np.float64)
    return fuse_shortlist(weights, base, top, read), top, read
