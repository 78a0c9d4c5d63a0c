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
  ``rel(i) > rel(j)`` of one query, ``P(i ≻ j) = σ(w · (z_i − z_j))``, no intercept (``b = 0``).

:class:`LearnedHeadWeights` is stored per model in the head registry (artifact
``"head-weights"``); ``AttentionReranker(scorer="learned")`` loads it.
"""

from __future__ import annotations

import datetime as _dt
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from ..errors import InputError, require
from ..eval.crossval import group_splits, kfold_splits
from ..eval.metrics import evaluate
from ..llm.headspec import format_heads, parse_heads
from ..llm.rows import window_features
from ..registry import RegistryArtifact

logger = logging.getLogger(__name__)

Scores = Sequence[float] | np.ndarray  # one value per candidate
ARTIFACT = "head-weights"
MODELS = ("pointwise", "pairwise")


@dataclass
class QueryFeatures:
    """One query's training/evaluation material: ``features[d, f]`` raw per-head scores of its
    candidates, graded ``labels[d]`` (0 = unjudged), optional first-stage scores, ``group``
    (e.g. the dataset name, for leave-one-dataset-out)."""

    qid: str
    doc_ids: list[str]
    features: np.ndarray
    labels: np.ndarray
    heads: list[tuple[int, int]]
    first_stage: np.ndarray | None = None
    group: str = ""
    rel: int | None = None  # this query's minimum relevant label (overrides the helpers' ``rel``)
    stages: dict[str, np.ndarray] = field(default_factory=dict)  # earlier stages' scores by name (NaN: none)


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
    keep = [i for i, (l, _) in enumerate(head_list) if max_layer is None or l <= max_layer]
    if not keep:
        raise InputError(f"no head of layer <= max_layer={max_layer}; raise max_layer")
    f = window_features(windows, len(doc_ids), calibrate=calibrate, use_filter=use_filter)[keep].T
    labels = np.array([(qrels or {}).get(qid, {}).get(d, 0) for d in doc_ids], dtype=np.int64)
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
    return np.where(ok, s, s[ok].min() if ok.any() else 0.0)


def standardise(x: np.ndarray) -> np.ndarray:
    """Per-query z-score of each column of ``x [D, F]`` (population std; constant → 0)."""
    x = np.asarray(x, dtype=np.float64)
    sd = x.std(axis=0)
    return np.where(sd > 0, (x - x.mean(axis=0)) / np.where(sd > 0, sd, 1.0), 0.0)


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


@dataclass
class FeatureConfig:
    """How features were built: the heads (``"l-h"``, feature order), calibration, filter,
    layer limit, whether the first-stage score is a feature, and the standardisation."""

    heads: list[str]
    calibrate: bool = True
    use_filter: bool = True
    max_layer: int | None = None
    first_stage: bool = False
    standardise: str = "per-query z-score"
    stages: list[str] = field(default_factory=list)


@dataclass
class LearnedHeadWeights(RegistryArtifact):
    """A linear head weighting: ``score(d) = Σ_h w_h z_h(d) (+ w_fs z_fs(d)) (+ Σ_s w_s z_s(d)) + bias``
    (``s``: the ``config.stages`` scores, weights ``stage_weights``); stored
    with :meth:`save` / :meth:`load` in the head registry."""

    KIND: ClassVar[str] = ARTIFACT
    LABEL: ClassVar[str] = "learned head weights"
    HINT: ClassVar[str] = (
        "train them with train_head_weights(...) and .save(model_id, fingerprint), or use scorer='sum'"
    )

    weights: np.ndarray
    bias: float
    config: FeatureConfig
    model: str = "pointwise"
    first_stage_weight: float = 0.0
    l2: float = 1.0
    trained_on: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    stage_weights: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Checked on load: weights that do not match their heads/stages would fail deep in scoring.
        self.weights = np.asarray(self.weights, dtype=np.float64)
        heads, stages = list(self.config.heads or []), list(self.config.stages)
        if not heads or self.weights.shape != (len(heads),) or len(self.stage_weights) != len(stages):
            raise InputError(
                f"learned head weights hold {self.weights.size} weights for {len(heads)} heads {heads[:8]} and "
                f"{len(self.stage_weights)} for the stages {stages}; need one per head and stage; retrain them"
            )
        if not np.isfinite([*self.weights, self.bias, self.first_stage_weight, *self.stage_weights]).all():
            raise InputError("learned head weights hold non-finite values (NaN or inf); retrain and save them")

    @property
    def heads(self) -> list[tuple[int, int]]:
        return [(int(p[0]), int(p[1])) for p in (parse_heads(self.config.heads) or [])] if self.config.heads else []

    def score_features(
        self, features: np.ndarray, first_stage: Scores | None = None, stages: Mapping[str, Scores] | None = None
    ) -> np.ndarray:
        """Scores of one query's candidates from raw ``features [D, H]`` (config head order),
        the first-stage scores and the earlier stages' scores by name (if the config uses them)."""
        x = feature_matrix(
            features, first_stage, stages, use_first_stage=self.config.first_stage, use_stages=self.config.stages
        )
        w = np.concatenate(
            [self.weights, [self.first_stage_weight] if self.config.first_stage else [], self.stage_weights]
        )
        return x @ w + self.bias

    def score_windows(
        self,
        windows: Sequence[Any],
        n_docs: int,
        head_list: Sequence[tuple[int, int]],
        first_stage: Scores | None = None,
        stages: Mapping[str, Scores] | None = None,
    ) -> np.ndarray:
        """Scores from a reranker's windows (rows in ``head_list`` order)."""
        order = [tuple(h) for h in head_list]
        missing = [h for h in self.heads if h not in order]
        if missing:
            raise InputError(
                f"the windows lack heads {format_heads(missing)} of the learned weights; "
                "capture them (AttentionReranker(scorer='learned') does)"
            )
        f = window_features(windows, n_docs, calibrate=self.config.calibrate, use_filter=self.config.use_filter)
        return self.score_features(f[[order.index(h) for h in self.heads]].T, first_stage, stages)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LearnedHeadWeights:
        try:
            kw = dict(data)
            kw["weights"] = np.asarray(kw["weights"], dtype=np.float64)
            kw["config"] = FeatureConfig(**kw["config"])
            return cls(**kw)
        except (KeyError, TypeError) as e:
            raise InputError(f"stored head weights are malformed ({e}); retrain and save them") from None


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


def _pairs(q: QueryFeatures, x: np.ndarray, cap: int, rng: random.Random) -> np.ndarray:
    pairs = [(i, j) for i in range(len(q.labels)) for j in range(len(q.labels)) if q.labels[i] > q.labels[j]]
    if len(pairs) > cap:
        pairs = rng.sample(pairs, cap)
    return np.array([x[i] - x[j] for i, j in pairs]).reshape(len(pairs), x.shape[1])


def train_head_weights(
    examples: Sequence[QueryFeatures],
    *,
    model: str = "pointwise",
    l2: float = 1.0,
    rel: int = 1,
    first_stage: bool = False,
    stages: Sequence[str] = (),
    max_pairs_per_query: int = 500,
    seed: int = 0,
    calibrate: bool = True,
    use_filter: bool = True,
    max_layer: int | None = None,
    trained_on: str = "",
) -> LearnedHeadWeights:
    """Fit head weights on standardised per-query features (see the module doc for the models);
    ``first_stage``: add the first-stage rank; ``stages``: add these earlier stages' scores."""
    require("sklearn", "train", "Training learned head weights")
    from sklearn.linear_model import LogisticRegression

    if model not in MODELS:
        raise InputError(f"model={model!r} is not one of {MODELS}")
    if l2 <= 0:
        raise InputError(f"l2={l2} must be > 0 (the L2 penalty λ; sklearn's C = 1/λ)")
    heads = _check(examples)
    if max_layer is not None and max(l for l, _ in heads) > max_layer:
        raise InputError(
            f"the features include heads above max_layer={max_layer}; build them with "
            f"query_features(..., max_layer={max_layer})"
        )
    xs = [design(q, first_stage, stages) for q in examples]
    if model == "pointwise":
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
        d = np.vstack([_pairs(q, x, max_pairs_per_query, rng) for q, x in zip(examples, xs)])
        if len(d) == 0:
            raise InputError("no query has candidates with different labels; pairwise training needs them")
        clf = LogisticRegression(C=1.0 / l2, fit_intercept=False, max_iter=2000)
        clf.fit(np.vstack([d, -d]), np.r_[np.ones(len(d)), np.zeros(len(d))])
        w, b = clf.coef_[0], 0.0
    cfg = FeatureConfig(
        format_heads(heads).split(","), calibrate, use_filter, max_layer, first_stage, stages=list(stages)
    )
    n = len(heads) + int(first_stage)
    return LearnedHeadWeights(
        w[: len(heads)].copy(),
        b,
        cfg,
        model,
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
    """ir-measures metrics of ``scorer(query) -> scores [D]`` over ``examples`` (their labels)."""
    run = {q.qid: dict(zip(q.doc_ids, np.asarray(scorer(q), dtype=float).tolist())) for q in examples}
    qrels = {q.qid: {d: int(l) for d, l in zip(q.doc_ids, q.labels)} for q in examples}
    return evaluate(run, qrels, metrics, rel=rel)


def _baselines(first_stage: bool) -> dict[str, Callable[[QueryFeatures], np.ndarray]]:
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
    rel = (test[0].rel or rel) if len({q.rel for q in test}) == 1 else rel
    row: dict[str, Any] = {"fold": name, "n_train": len(train), "n_test": len(test)}
    row["learned"] = evaluate_scores(
        test, lambda q: model.score_features(q.features, q.first_stage, q.stages), metrics, rel
    )
    for base, fn in _baselines(train_kw.get("first_stage", False)).items():
        row[base] = evaluate_scores(test, fn, metrics, rel)
    return row


def kfold_evaluate(
    examples: Sequence[QueryFeatures],
    k: int = 5,
    *,
    seed: int = 0,
    metrics: Sequence[str] = ("nDCG@10",),
    rel: int = 1,
    **train_kw: Any,
) -> list[dict[str, Any]]:
    """k-fold cross-validation over queries (:func:`attnrank.eval.crossval.kfold_splits`, shuffled
    with ``seed``): per fold, the test metrics of the learned weights and of the baselines
    (``sum-of-heads``, ``first-stage``)."""
    return [_fold(s.name, s.train, s.test, metrics, rel, train_kw) for s in kfold_splits(examples, k, seed=seed)]


def leave_one_group_out(
    examples: Sequence[QueryFeatures], *, metrics: Sequence[str] = ("nDCG@10",), rel: int = 1, **train_kw: Any
) -> list[dict[str, Any]]:
    """Train on all groups (datasets) but one, test on it; one row per held-out group
    (:func:`attnrank.eval.crossval.group_splits` over ``QueryFeatures.group``)."""
    return [_fold(s.name, s.train, s.test, metrics, rel, train_kw) for s in group_splits(examples, lambda q: q.group)]
