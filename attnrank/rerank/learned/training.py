"""Training and evaluation of learned head weights: fitting :class:`LearnedHeadWeights` on
labelled :class:`QueryFeatures` (pointwise or pairwise logistic regression) and scoring them by
cross-validation against the sum-of-heads and first-stage baselines (the method:
:mod:`attnrank.rerank.learned`)."""

from __future__ import annotations

import datetime as _dt
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...config import DEFAULT_HEAD_L2, check_l2
from ...errors import InputError, require
from ...eval.crossval import check_unique_queries, group_splits, labelled_splits, relevant_links
from ...eval.metrics import evaluate, evaluate_per_query, judged_queries
from ...eval.rows import scores_by_id
from ...llm.headspec import format_heads
from ...types import is_count
from ..versions import SCORING_VERSION
from .features import QueryFeatures, design
from .weights import FeatureConfig, LearnedHeadWeights

LEARNERS = ("pointwise", "pairwise")


def _check(examples: Sequence[QueryFeatures]) -> list[tuple[int, int]]:
    if not examples:
        raise InputError("no training queries; pass at least one QueryFeatures")
    heads = examples[0].heads
    for q in examples:
        if q.heads != heads or q.features.shape != (len(q.doc_ids), len(heads)):
            raise InputError(
                f"query {q.qid!r}: features {q.features.shape} over heads {format_heads(q.heads)[:60]} "
                f"do not match the first query's {len(heads)} heads; build all with the same heads"
            )
    return heads


def _pairs(q: QueryFeatures, x: np.ndarray, cap: int, rng: random.Random, rel: int) -> np.ndarray:
    """Feature differences of candidate pairs whose first is graded above the second and counts as
    relevant (label >= ``rel``): two candidates below ``rel`` are alike non-relevant, never ordered
    (with --rel 2 a label-1 passage was trained above a label-0 one, as pointwise never reads it)."""
    labels = q.labels
    pairs = [
        (i, j) for i in range(len(labels)) for j in range(len(labels)) if labels[i] > labels[j] and labels[i] >= rel
    ]
    if len(pairs) > cap:
        pairs = rng.sample(pairs, cap)
    return np.array([x[i] - x[j] for i, j in pairs]).reshape(len(pairs), x.shape[1])


def train_head_weights(
    examples: Sequence[QueryFeatures],
    *,
    learner: str = "pointwise",
    l2: float = DEFAULT_HEAD_L2,
    rel: int = 1,
    first_stage: bool = False,
    stages: Sequence[str] = (),
    max_pairs_per_query: int = 500,
    seed: int = 0,
    calibrate: bool | None = None,
    use_filter: bool | None = None,
    max_layer: int | None = None,
    trained_on: str = "",
    capture: str = "full",
    adapter: str = "",
    prompt: dict[str, Any] | None = None,
) -> LearnedHeadWeights:
    """Fit head weights on standardised per-query features (see the module doc for the learners;
    ``l2``: the penalty λ, :data:`DEFAULT_HEAD_L2` as `attnrank heads train` uses);
    ``first_stage``: add the first-stage rank; ``stages``: add these earlier stages' scores;
    ``calibrate``/``use_filter``: how the features were read, recorded with the weights (None: as
    the features record it, :func:`query_features`; True where they do not; given otherwise than
    they record, refused);
    ``capture``: how the features' attention was captured (recorded, so that a reranker that
    captures it otherwise warns); ``adapter``: the head adapter of the model they came from
    (``LLM.adapter``; recorded, so that a reranker on another model refuses them); ``prompt``: the
    prompt settings the features' attention was read with (``RerankConfig.prompt_settings()``;
    recorded, so that a reranker that builds its prompt otherwise warns)."""
    require("sklearn", "train", "Training learned head weights")
    from sklearn.linear_model import LogisticRegression

    if learner not in LEARNERS:
        raise InputError(f"learner={learner!r} is not one of {LEARNERS}")
    check_l2(l2)
    if not is_count(max_pairs_per_query):
        raise InputError(
            f"max_pairs_per_query={max_pairs_per_query!r} must be an integer >= 1 (pairs sampled per query); e.g. 500"
        )
    heads = _check(examples)
    calibrate = _read_as(examples, "calibrate", calibrate)
    use_filter = _read_as(examples, "use_filter", use_filter)
    if max_layer is not None and max(l for l, _ in heads) > max_layer:
        raise InputError(
            f"the features include heads above max_layer={max_layer}; build them with "
            f"query_features(..., max_layer={max_layer})"
        )
    xs = [design(q, first_stage, stages) for q in examples]
    if learner == "pointwise":
        x = np.vstack(xs)
        y = np.concatenate([q.labels >= (rel if q.rel is None else q.rel) for q in examples]).astype(int)
        if y.min() == y.max():
            raise InputError(
                f"all {len(y)} training candidates have the same label (rel >= {rel}: {bool(y[0])}); "
                "pointwise training needs relevant and non-relevant candidates"
            )
        clf = LogisticRegression(C=1.0 / l2, max_iter=2000).fit(x, y)
        w, b = clf.coef_[0], float(clf.intercept_[0])
    else:
        rng = random.Random(seed)
        d = np.vstack(
            [_pairs(q, x, max_pairs_per_query, rng, rel if q.rel is None else q.rel) for q, x in zip(examples, xs)]
        )
        if len(d) == 0:
            raise InputError(
                "no query has a relevant candidate (label >= rel) graded above another; pairwise training needs them"
            )
        clf = LogisticRegression(C=1.0 / l2, fit_intercept=False, max_iter=2000)
        clf.fit(np.vstack([d, -d]), np.r_[np.ones(len(d)), np.zeros(len(d))])
        w, b = clf.coef_[0], 0.0
    cfg = FeatureConfig(
        format_heads(heads).split(","),
        calibrate,
        use_filter,
        max_layer,
        first_stage,
        stages=list(stages),
        capture=capture,
        adapter=adapter,
        prompt=dict(prompt or {}),
        scoring_version=SCORING_VERSION,
    )
    n = len(heads) + int(first_stage)
    return LearnedHeadWeights(
        w[: len(heads)].copy(),
        b,
        cfg,
        learner,
        float(w[len(heads)]) if first_stage else 0.0,
        l2,
        trained_on or f"{len(examples)} queries",
        {},
        _dt.datetime.now().isoformat(timespec="seconds"),
        w[n:].tolist(),
    )


# ----------------------------------------------------------------- evaluation helpers
def evaluate_scores(
    examples: Sequence[QueryFeatures],
    scorer: Callable[[QueryFeatures], np.ndarray],
    metrics: Sequence[str] = ("nDCG@10",),
    rel: int = 1,
) -> dict[str, float]:
    """ir-measures metrics of ``scorer(query) -> scores [D]`` over ``examples``, against each
    query's ``qrels`` (all its judgments) where it has them, else its candidates' labels; the mean
    over the judged queries (one with judgments but no candidates counts 0, as trec_eval -c)."""
    return evaluate(*_run_and_qrels(examples, scorer), metrics, rel=rel, warn=False)  # (folds: no run file to fix)


def _run_and_qrels(
    examples: Sequence[QueryFeatures], scorer: Callable[[QueryFeatures], np.ndarray]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]:
    check_unique_queries(examples)
    run = {q.qid: scores_by_id(q.qid, q.doc_ids, np.asarray(scorer(q), dtype=float)) for q in examples if q.doc_ids}
    qrels = {q.qid: dict(q.qrels) or {d: int(l) for d, l in zip(q.doc_ids, q.labels)} for q in examples}
    return run, qrels


def _baselines(first_stage: bool) -> dict[str, Callable[[QueryFeatures], np.ndarray]]:
    """The untrained baselines: ``sum-of-heads`` adds the heads' per-head passage scores (each
    head's μ − 2σ filter on its own when the features were filtered; the reranker's ``sum`` scorer
    filters the heads' summed scores once, so the two differ with the filter on), and the first
    stage's own score."""
    out = {"sum-of-heads": lambda q: q.features.sum(axis=1)}
    if first_stage:
        out["first-stage"] = lambda q: q.first_stage
    return out


def _fold(
    name: str,
    train: list[QueryFeatures],
    test: list[QueryFeatures],
    metrics: Sequence[str],
    rel: int,
    train_kw: dict[str, Any],
) -> dict[str, Any]:
    model = train_head_weights(train, rel=rel, **train_kw)
    row: dict[str, Any] = {"fold": name, "n_train": len(train), "n_test": len(test)}
    row["learned"] = _evaluate_by_rel(
        test, lambda q: model.score_features(q.features, q.first_stage, q.stages), metrics, rel
    )
    for base, fn in _baselines(train_kw.get("first_stage", False)).items():
        row[base] = _evaluate_by_rel(test, fn, metrics, rel)
    return row


def _evaluate_by_rel(
    test: Sequence[QueryFeatures], scorer: Callable[[QueryFeatures], np.ndarray], metrics: Sequence[str], rel: int
) -> dict[str, float]:
    """:func:`evaluate_scores` with each query's own ``rel`` (a fold may mix datasets): the mean of
    the per-query metrics over every judged query of the fold, whatever its ``rel``."""
    check_unique_queries(test)  # (each rel's queries are checked apart below: per would merge them)
    by_rel: dict[int, list[QueryFeatures]] = {}
    for q in test:
        by_rel.setdefault(rel if q.rel is None else q.rel, []).append(q)
    per: dict[str, dict[str, float]] = {}
    for r, qs in by_rel.items():
        run, qrels = _run_and_qrels(qs, scorer)
        judged = judged_queries(qrels)
        per.update(evaluate_per_query({q: run.get(q, {}) for q in judged}, judged, metrics, rel=r))
    names = list(next(iter(per.values()))) if per else list(metrics)
    return {n: (sum(v[n] for v in per.values()) / len(per) if per else 0.0) for n in names}


def kfold_evaluate(
    examples: Sequence[QueryFeatures],
    folds: int = 5,
    *,
    seed: int = 0,
    metrics: Sequence[str] = ("nDCG@10",),
    rel: int = 1,
    **train_kw: Any,
) -> list[dict[str, Any]]:
    """``folds``-fold cross-validation over queries (:func:`attnrank.eval.crossval.labelled_splits`, shuffled
    with ``seed``): per fold, the test metrics of the learned weights and of the baselines
    (``sum-of-heads``, ``first-stage``)."""
    check_unique_queries(examples)  # two with one id: one would replace the other in a fold's run
    return [
        _fold(s.name, s.train, s.test, metrics, rel, train_kw)
        for s in labelled_splits(examples, folds, seed=seed, links=relevant_links(rel))
    ]


def leave_one_group_out(
    examples: Sequence[QueryFeatures], *, metrics: Sequence[str] = ("nDCG@10",), rel: int = 1, **train_kw: Any
) -> list[dict[str, Any]]:
    """Train on all groups (datasets) but one, test on it; one row per held-out group
    (:func:`attnrank.eval.crossval.group_splits` over ``QueryFeatures.group``)."""
    check_unique_queries(examples)
    return [_fold(s.name, s.train, s.test, metrics, rel, train_kw) for s in group_splits(examples, lambda q: q.group)]


def _read_as(examples: Sequence[QueryFeatures], name: str, given: bool | None) -> bool:
    """How the features were read (``calibrate`` or ``use_filter``): as they record it, or
    ``given`` (True where neither says); refused where they disagree with each other or with it
    (weights marked otherwise would be applied to features read otherwise)."""
    recorded = {getattr(q, name) for q in examples} - {None}
    if len(recorded) > 1:
        raise InputError(f"the features were read with {name}=True and {name}=False; build them alike")
    if given is not None and recorded and given not in recorded:
        raise InputError(f"{name}={given} but the features were read with {name}={recorded.pop()}; drop {name}=")
    return given if given is not None else (recorded.pop() if recorded else True)
