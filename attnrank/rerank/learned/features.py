"""Features of learned head weighting: per-head passage scores of a query's candidates, the
first-stage and earlier-stage features, and the per-query standardisation that turns them into
a design matrix (the method: :mod:`attnrank.rerank.learned`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...errors import InputError
from ...llm.headspec import format_heads
from ...llm.rows import window_features

Scores = Sequence[float] | np.ndarray  # one value per candidate


@dataclass
class QueryFeatures:
    """One query's training/evaluation material: ``features[d, f]`` raw per-head scores of its
    candidates, graded ``labels[d]`` (0 = unjudged), optional first-stage scores, ``group``
    (e.g. the dataset name, for leave-one-dataset-out), and ``qrels``: all of the query's
    judgments, candidates or not, which evaluation reads (a relevant document the first stage
    missed counts in recall's denominator and nDCG's ideal); empty: the candidates' labels."""

    qid: str
    doc_ids: list[str]
    features: np.ndarray
    labels: np.ndarray
    heads: list[tuple[int, int]]
    first_stage: np.ndarray | None = None
    group: str = ""
    rel: int | None = None  # this query's minimum relevant label (overrides the helpers' ``rel``)
    stages: dict[str, np.ndarray] = field(default_factory=dict)  # earlier stages' scores by name (NaN: none)
    qrels: dict[str, int] = field(default_factory=dict)
    calibrate: bool | None = None  # whether the features are calibrated scores (None: not recorded)
    use_filter: bool | None = None  # whether ICR's μ − 2σ filter counted their tokens (None: not recorded)


def query_features(
    qid: str,
    windows: Sequence[Any],
    doc_ids: Sequence[str],
    head_list: Sequence[tuple[int, int]],
    qrels: dict[str, dict[str, int]] | None = None,
    *,
    max_layer: int | None = None,
    first_stage: Scores | None = None,
    group: str = "",
    rel: int | None = None,
    calibrate: bool = True,
    use_filter: bool = True,
    stages: Mapping[str, Scores] | None = None,
) -> QueryFeatures:
    """:class:`QueryFeatures` from a query's window rows (heads limited to layers ≤ ``max_layer``)."""
    repeated = [d for d, n in Counter(doc_ids).items() if n > 1]
    if repeated:  # (its label would count twice, and scores_by_id keeps only one of its scores)
        raise InputError(f"query {qid!r} lists the candidates {repeated} more than once; give each candidate once")
    keep = [i for i, (l, _) in enumerate(head_list) if max_layer is None or l <= max_layer]
    if not keep:
        raise InputError(f"no head of layer <= max_layer={max_layer}; raise max_layer")
    f = window_features(windows, len(doc_ids), calibrate=calibrate, use_filter=use_filter)[keep].T
    judged = {str(d): int(v) for d, v in (qrels or {}).get(qid, (qrels or {}).get(str(qid), {})).items()}
    # ids as stored (strings): an integer id read from a run looked up no label in string-keyed qrels
    labels = np.array([judged.get(str(d), 0) for d in doc_ids], dtype=np.int64)
    fs = None if first_stage is None else np.asarray(first_stage, dtype=np.float64)
    st = {k: np.asarray(v, dtype=np.float64) for k, v in (stages or {}).items()}
    return QueryFeatures(
        qid,
        [str(d) for d in doc_ids],
        f,
        labels,
        [(int(head_list[i][0]), int(head_list[i][1])) for i in keep],
        fs,
        group,
        rel,
        st,
        judged,
        calibrate,
        use_filter,
    )


def restrict_heads(q: QueryFeatures, heads: Sequence[tuple[int, int]]) -> QueryFeatures:
    """``q`` with only the feature columns of ``heads`` (in that order): to train weights over a
    selected head set (e.g. the top-N of :func:`~attnrank.heads.queryfocused.query_focused_scores`),
    which needs fewer training queries than all heads and lets the pass stop earlier."""
    col = {tuple(h): i for i, h in enumerate(q.heads)}
    missing = [h for h in heads if tuple(h) not in col]
    if missing:
        raise InputError(f"query {q.qid!r} has no features for heads {format_heads(missing)}")
    idx = [col[tuple(h)] for h in heads]
    return replace(q, features=q.features[:, idx], heads=[(int(h[0]), int(h[1])) for h in heads])


def first_stage_feature(scores: Scores) -> np.ndarray:
    """``−rank`` of each candidate by first-stage score (0 = best; ties keep input order)."""
    s = np.asarray(scores, dtype=np.float64)
    rank = np.empty(s.shape[0])
    rank[np.argsort(-s, kind="stable")] = np.arange(s.shape[0])
    return -rank


def stage_feature(scores: Scores) -> np.ndarray:
    """An earlier stage's scores as a feature; a candidate without one (NaN: that retriever did not
    return it) gets the query's lowest score, since it ranked below everything that retriever returned."""
    s = np.asarray(scores, dtype=np.float64)
    ok = np.isfinite(s)
    low, high = (s[ok].min(), s[ok].max()) if ok.any() else (0.0, 0.0)
    # +inf ranked above everything (it took the lowest score before; the highest finite one tied
    # with the best), -inf and NaN below
    return np.where(ok, s, np.where(s == np.inf, high + max(1.0, high - low), low))


# A column whose values differ by less than this fraction of their magnitude is constant up to
# rounding: the signals come from float32 (dense cosines) or bfloat16/float32 models, whose rounding
# is about 1e-7 relative and more once summed (an absolute 1e-12 below magnitude 1 let float32 jitter
# of a constant 0.0123 through as z-scores of ±1.75).
ROUNDING = 1e-6


def varies(x: np.ndarray) -> np.ndarray:
    """Per column of ``x [D, F]`` (or for a vector), whether its values differ by more than rounding
    (:data:`ROUNDING` of their largest magnitude)."""
    return np.ptp(x, axis=0) > ROUNDING * np.abs(x).max(axis=0)


def standardise(x: np.ndarray) -> np.ndarray:
    """Per-query z-score of each column of ``x [D, F]`` (population std; constant → 0, constant up
    to rounding too (:func:`varies`): its std is not 0, and z-scores of rounding noise would be ±1
    like a real signal's; the rule of :func:`~attnrank.rerank.fused_features.attention_confidence`)."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x.copy()
    sd = x.std(axis=0)
    moves = varies(x)
    return np.where(moves, (x - x.mean(axis=0)) / np.where(moves, sd, 1.0), 0.0)


def feature_matrix(
    features: np.ndarray,
    first_stage: Scores | None = None,
    stages: Mapping[str, Any] | None = None,
    *,
    use_first_stage: bool = False,
    use_stages: Sequence[str] = (),
    who: str = "the candidates",
) -> np.ndarray:
    """The standardised design matrix ``[D, F (+1 rank) (+ stages)]`` of one query: the raw head
    scores, the first-stage rank if ``use_first_stage``, and the ``use_stages`` scores by name."""
    cols = [np.asarray(features, dtype=np.float64)]
    bad = np.argwhere(~np.isfinite(cols[0]))
    if bad.size:  # (standardise made its column 0: a plausible, wrong order, as the fused scorer's once)
        d, h = (int(i) for i in bad[0][-2:]) if cols[0].ndim > 1 else (int(bad[0][0]), 0)
        value = cols[0][d, h] if cols[0].ndim > 1 else cols[0][d]
        raise InputError(
            f"{who}: head feature {h} of candidate #{d} is {value}; learned weights need finite values "
            "(attention that overflowed: load the model in bfloat16 or float32)"
        )
    if use_first_stage:
        if first_stage is None:
            raise InputError(
                f"{who} have no first-stage scores but the weights use them; pass ScoredDocument/"
                "RankedResults candidates (or first_stage=), or train with first_stage=False"
            )
        cols.append(first_stage_feature(first_stage)[:, None])
    missing = [n for n in use_stages if n not in (stages or {})]
    if missing:
        raise InputError(
            f"{who} have no {missing} stage scores but the weights use them; rerank the "
            "HybridRetriever's results (they carry bm25/dense stage_scores) or use weights without stages"
        )
    cols += [stage_feature(stages[n])[:, None] for n in use_stages]  # type: ignore[index]
    names = ["features", *(["first_stage"] if use_first_stage else []), *use_stages]
    sizes = {n: c.shape[0] for n, c in zip(names, cols)}
    if len(set(sizes.values())) > 1:
        raise InputError(f"{who} have different numbers of values {sizes}; give one per candidate for each")
    return standardise(np.hstack(cols))


def design(q: QueryFeatures, first_stage: bool, stages: Sequence[str] = ()) -> np.ndarray:
    """:func:`feature_matrix` of a training/evaluation query."""
    return feature_matrix(
        q.features,
        q.first_stage,
        q.stages,
        use_first_stage=first_stage,
        use_stages=stages,
        who=f"query {q.qid!r}'s candidates",
    )
