"""The fused scorer: attention combined with the first stage's signals, trained across datasets.

An attention score from a small model is a noisy relevance signal: on some data it adds to the
first stage, on other data it ranks below plain BM25 (docs/benchmarks.md). The fused scorer
therefore never scores with attention alone. For each query it z-scores, over that query's
candidates, the features

- ``attention``: the reranker's own attention score (the selected heads' calibrated ICR score);
- ``bm25``, ``dense``, ``rank``: the first-stage signals of :mod:`attnrank.rerank.signals`,
  computed over the candidate texts, so a bare TREC run or plain list gets them too;

and scores ``s(d) = w · z(d)`` with ``w >= 0`` (every feature is a relevance estimate; a negative
weight only fits one training set's collinearity, e.g. one BM25 against another). ``w`` is learned
on the labelled queries of several datasets, pooled (``balance``: each dataset given equal say):

- ``pointwise`` (default): L2-regularised logistic regression, relevant vs not;
- ``pairwise``: RankNet with a linear scorer (logistic regression on feature differences);
- ``listwise``: the grid point of the simplex (steps of 1/10) with the best mean nDCG@10, averaged
  per dataset and then over datasets — a direct optimisation of the metric;
- ``equal``: weight 1 on every feature, nothing fitted (only the gate, if any, is chosen on the
  labelled queries).

**Fallback** (``gate``, on by default: it measured best held out). The same model is also trained without the attention
feature (``base_weights``); a query whose attention is not confident — its ``confidence``
(:func:`attention_confidence`) below ``gate`` — is scored by the base model alone, i.e. by the
first-stage signals. ``gate`` is the threshold that scores best on the training queries.

**Untrained** (:func:`equal_weights`): weight 1 on z(BM25) and z(dense). The default preset
``signals`` uses it unless a user has registered weights for the model (:func:`signals_only`):
left out of training and tested on each dataset in turn, it transferred better than weights
trained on the others. Which model, features and fallback each preset uses was chosen by
leave-one-dataset-out evaluation (``scripts/bench_fusion.py``, docs/benchmarks.md).
"""

from __future__ import annotations

import datetime as _dt
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from ..config import DEFAULT_LLM
from ..errors import InputError, require
from ..eval.metrics import evaluate
from ..llm.headspec import format_heads, parse_heads
from ..registry import RegistryArtifact, load_artifact, shipped_artifact
from ..types import Document
from .learned.features import standardise
from .signals import SIGNALS, SIGNALS_VERSION, SignalComputer

logger = logging.getLogger(__name__)

ATTENTION = "attention"
FUSED_STAGE = "fused"  # the stage name of fused results (their attention score stays under ATTENTION)
FEATURES = (ATTENTION, *SIGNALS)
MODELS = ("pointwise", "pairwise", "listwise", "equal")
GRID_STEPS = 10  # listwise: weights on the simplex in steps of 1/GRID_STEPS
SIGNALS_AUTO = "auto"  # RerankConfig.signals: the registered (else shipped) weights, with attention
SIGNALS_ONLY = "only"  # ... the signals alone: signals_only


def attention_confidence(attention: np.ndarray) -> float:
    """How sharply a query's attention singles out its best candidates: the z-score of the
    highest attention score among the candidates (population std; 0 if all are equal)."""
    a = np.asarray(attention, dtype=np.float64)
    sd = a.std()
    return float((a.max() - a.mean()) / sd) if sd > 0 else 0.0


@dataclass
class FusionExample:
    """One labelled query for training or evaluating the fused scorer: ``signals[name]`` has one
    value per candidate (input order), graded ``labels`` (0 = unjudged), ``rel`` the minimum
    relevant label, ``group`` the dataset (for leave-one-dataset-out); ``qrels``: all of the query's
    judgements (also of passages outside the candidates) for evaluation, None = ``labels``."""

    qid: str
    doc_ids: list[str]
    signals: dict[str, np.ndarray]
    labels: np.ndarray
    rel: int = 1
    group: str = ""
    qrels: dict[str, int] | None = None
    embedder: str | None = None  # the sentence embedder of the ``dense`` signal (None: the packaged MiniLM)

    def judged(self) -> dict[str, int]:
        """The judgements to evaluate against."""
        return dict(self.qrels) if self.qrels is not None else dict(zip(self.doc_ids, map(int, self.labels)))


def _design(signals: Mapping[str, Any], features: Sequence[str]) -> np.ndarray:
    missing = [f for f in features if f not in signals]
    if missing:
        raise InputError(f"the candidates lack the feature(s) {missing}; the fused weights use {list(features)}")
    cols = [np.asarray(signals[f], dtype=np.float64).reshape(-1) for f in features]
    if len({c.size for c in cols}) > 1:
        sizes = {f: c.size for f, c in zip(features, cols)}
        raise InputError(f"the features have different numbers of values {sizes}; give one per candidate for each")
    for f, c in zip(features, cols):  # NaN once became 0 and inf wiped its column: a plausible, wrong order
        bad = np.flatnonzero(~np.isfinite(c))
        if bad.size:
            raise InputError(
                f"feature {f!r} of candidate #{bad[0]} is {c[bad[0]]}; the fused scorer needs finite values "
                "(give a candidate without that signal the query's lowest value)"
            )
    return standardise(np.column_stack(cols))


@dataclass
class FusedWeights(RegistryArtifact):
    """Linear weights over per-query z-scored ``features`` (and ``base_weights`` over the same
    features without ``attention``, used when the attention confidence is below ``gate``)."""

    KIND: ClassVar[str] = "fused-weights"
    LABEL: ClassVar[str] = "fused scorer weights"
    HINT: ClassVar[str] = "train them with `attnrank train`, or use signals=None (--signals none)"

    features: list[str]
    weights: list[float]
    base_weights: list[float] = field(default_factory=list)
    gate: float | None = None
    model: str = "pointwise"
    l2: float = 1.0
    trained_on: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    embedder: str | None = None  # whose cosines the dense weight was fitted to (None: the packaged MiniLM)
    signals_version: int | None = None  # the signals' SIGNALS_VERSION they were fitted to (None: not recorded)
    heads: list[str] | str | None = None  # the attention feature's heads ("l-h" or "all"; None: not recorded)
    capture: str | None = None  # how that attention was captured (llm.blocks.capture_name; None: not recorded)

    def __post_init__(self) -> None:
        unknown = [f for f in self.features if f not in FEATURES]
        if unknown or len(set(self.features)) != len(self.features) or len(self.weights) != len(self.features):
            raise InputError(
                f"fused weights over {self.features} with {len(self.weights)} weights; the features must be "
                f"among {FEATURES}, each once, one weight each; retrain them with `attnrank train`"
            )
        # Checked here, not when a query falls below the gate: a wrong base model would otherwise
        # fail (or score NaN) only on the rare low-confidence query.
        if self.base_weights and len(self.base_weights) != len(self.base_features):
            raise InputError(
                f"fused base_weights has {len(self.base_weights)} weights for the {len(self.base_features)} "
                f"features {self.base_features}; give one each (or none); retrain them with `attnrank train`"
            )
        values = [*self.weights, *self.base_weights, *([] if self.gate is None else [self.gate])]
        if not np.isfinite(np.asarray(values, dtype=np.float64)).all():
            raise InputError(
                f"fused weights {self.weights}, base_weights {self.base_weights} or gate {self.gate} are not "
                "all finite; retrain them with `attnrank train`"
            )
        if self.heads is not None:
            if not self.uses_attention:
                raise InputError(
                    f"fused weights over {self.features} record heads {self.heads!r}, but only the attention "
                    "feature reads heads; drop them, or retrain the weights with `attnrank train`"
                )
            pairs = parse_heads(self.heads)  # checked on load, not at the first query
            self.heads = "all" if pairs is None else format_heads(pairs).split(",")
        if self.gate is not None and not (self.uses_attention and self.base_weights):
            raise InputError(
                f"fused gate={self.gate} falls back to base_weights, which these weights over {self.features} "
                "lack; give base_weights over the features without attention, or gate=None"
            )

    @property
    def uses_attention(self) -> bool:
        return ATTENTION in self.features

    @property
    def base_features(self) -> list[str]:
        return [f for f in self.features if f != ATTENTION]

    def confident(self, signals: Mapping[str, Any]) -> bool | None:
        """Whether attention is used for this query (None: no gate, always)."""
        if not (self.uses_attention and self.gate is not None and self.base_weights):
            return None
        return attention_confidence(signals[ATTENTION]) >= self.gate

    def without_attention(self) -> FusedWeights:
        """The model the gate falls back to, on its own: ``base_weights`` over the first-stage
        signals, no gate (these weights themselves if they do not use attention)."""
        if not self.uses_attention:
            return self
        if not self.base_weights:
            raise InputError(
                f"these fused weights over {self.features} hold no model without attention (base_weights); "
                "retrain them with `attnrank train` (it fits one alongside)"
            )
        return FusedWeights(
            self.base_features,
            list(self.base_weights),
            model=self.model,
            l2=self.l2,
            trained_on=self.trained_on,
            date=self.date,
            embedder=self.embedder,
            signals_version=self.signals_version,
        )

    def warn_if_stale(self, source: str) -> None:
        """Log a warning when these weights were fitted to signals computed otherwise than this
        attnrank computes them (:data:`~attnrank.rerank.signals.SIGNALS_VERSION`), or when that
        was not recorded: they still score (every feature is z-scored per query), but not as
        they measured. ``source``: what they are, for the message."""
        if self.model == "equal" or not self.base_features or self.signals_version == SIGNALS_VERSION:
            return  # nothing fitted to the signals' values, or fitted to these
        fitted = (
            "signals computed before their versions were recorded"
            if self.signals_version is None
            else f"version {self.signals_version} of the signals"
        )
        logger.warning(
            "%s were fitted to %s; this attnrank computes version %d (rerank.signals.SIGNALS_VERSION), so they "
            "do not score as they measured; retrain them with `attnrank train`",
            source,
            fitted,
            SIGNALS_VERSION,
        )

    def warn_if_applied_otherwise(self, heads: Any, capture: str) -> None:
        """Log a warning when these weights' attention feature is read from other ``heads`` (None:
        all) than they record, or captured otherwise than ``capture``
        (:func:`~attnrank.llm.blocks.capture_name`) captures it: e.g. weights fitted to block
        attention at shared positions, applied to full-prompt attention, whose scores follow the
        candidates' slots (docs/benchmarks.md). They still score, but not as they measured. Weights
        that record no capture were fitted before it was recorded, to full attention."""
        if not self.uses_attention or self.model == "equal":  # nothing fitted to attention's values
            return
        fitted = self.capture or "full"
        if fitted != capture:
            logger.warning(
                "the fused weights were fitted to attention captured as %r; this reranker captures it as %r, "
                "so they do not score as they measured; use the attention options they record, or retrain "
                "them with `attnrank train`",
                fitted,
                capture,
            )
        if self.heads is not None and parse_heads(self.heads) != parse_heads(heads):
            logger.warning(
                "the fused weights were fitted to the attention of heads %s; this reranker reads %s, so they do "
                "not score as they measured; leave heads at their default to read theirs",
                _shown(self.heads),
                _shown(heads),
            )

    def score(self, signals: Mapping[str, Any]) -> np.ndarray:
        """Scores of one query's candidates from ``{feature: values}`` (input order)."""
        if self.confident(signals) is False:
            return _design(signals, self.base_features) @ np.asarray(self.base_weights)
        return _design(signals, self.features) @ np.asarray(self.weights)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FusedWeights:
        try:
            return cls(**data)
        except TypeError as e:
            raise InputError(f"stored fused weights are malformed ({e}); retrain them with `attnrank train`") from None


EQUAL_FEATURES = ("bm25", "dense")


def equal_weights(features: Sequence[str] = EQUAL_FEATURES) -> FusedWeights:
    """Weight 1 on each of ``features``' per-query z-scores (CombSUM over z-scored scores, Fox and
    Shaw TREC-2 1993, with z-score normalisation): nothing trained, so nothing learned on other
    data can fail to transfer. With BM25 and dense it is the ``signals`` preset's model where no
    fused weights are registered for the model (:func:`signals_only`).

    Why: left out of training and tested on each of four datasets in turn, it scored at or above the
    trained weights' model without attention on all four (58 queries won, 34 lost, sign test p 0.016;
    ``docs/results/fusion_fixed-weights.md``)."""
    return FusedWeights(
        list(features),
        [1.0] * len(features),
        model="equal",
        trained_on="nothing: equal weights",
        signals_version=SIGNALS_VERSION,
    )


def signals_only(model_id: str, fingerprint: str) -> FusedWeights:
    """The model of ``signals="only"``: the model without attention of the fused weights a user
    registered for this model (``attnrank train``), else :func:`equal_weights` (the shipped weights'
    base model is not used: trained on other datasets, it transferred worse than equal weights)."""
    registered = load_artifact(FusedWeights.KIND, model_id, fingerprint, user_only=True)
    if registered is None:
        return equal_weights()
    fused = _stored(registered, f"the fused weights registered for {model_id}")
    if fused.uses_attention and not fused.base_weights:  # e.g. saved from Python without a fallback
        logger.warning(
            "the fused weights registered for %s hold no model without attention (base_weights): the "
            "preset signals uses equal weights; retrain them with `attnrank train`, or use --preset fused",
            model_id,
        )
        return equal_weights()
    return fused.without_attention()


def fitted_heads(model_id: str, fingerprint: str) -> list[str] | str | None:
    """The heads that the fused weights registered (or shipped) for exactly this model read, or
    None (none registered, none recorded, or no attention feature): what preset ``fused`` reads
    under its default heads."""
    stored = load_artifact(FusedWeights.KIND, model_id, fingerprint)
    if stored is None:
        return None
    fused = FusedWeights.from_json(stored)
    return fused.heads if fused.uses_attention else None


def resolve_fused(signals: Any, model_id: str, fingerprint: str) -> FusedWeights | None:
    """``signals``: None (attention alone), a :class:`FusedWeights`, ``"only"`` (:func:`signals_only`)
    or ``"auto"``: the weights registered for this model, else the ones shipped for the packaged
    model (logged: features are z-scored per query, so they transfer, but they were not trained
    on this model's attention)."""
    if signals is None or isinstance(signals, FusedWeights):
        return signals
    if signals == SIGNALS_ONLY:
        return signals_only(model_id, fingerprint)
    registered = load_artifact(FusedWeights.KIND, model_id, fingerprint)
    if registered is not None:
        # Registered ones that do not load (malformed, other features) are an error, not a reason
        # to score with another model's weights in their place.
        return _stored(registered, f"the fused weights registered for {model_id}")
    payload = shipped_artifact(FusedWeights.KIND, DEFAULT_LLM)
    if payload is None:
        return FusedWeights.load(model_id, fingerprint)  # raises: none registered, none shipped
    logger.warning(
        "no fused weights are registered for %s: using those trained for the packaged %s (over the "
        "reranker's own heads, not theirs); train your own with `attnrank train`",
        model_id,
        DEFAULT_LLM,
    )
    shipped = _stored(payload, f"the fused weights shipped for {DEFAULT_LLM}")
    return replace(shipped, heads=None)  # another model's heads need not exist in this one


def _shown(heads: Any) -> str:
    pairs = parse_heads(heads)
    return "all" if pairs is None else f"{len(pairs)} ({format_heads(pairs[:4])}{', ...' if len(pairs) > 4 else ''})"


def _stored(payload: dict[str, Any], source: str) -> FusedWeights:
    """Stored fused weights (registered or shipped), with a warning if fitted to other signals."""
    fused = FusedWeights.from_json(payload)
    fused.warn_if_stale(source)
    return fused


# -- training -------------------------------------------------------------------------------------
def _fit(
    examples: Sequence[FusionExample], features: Sequence[str], model: str, l2: float, signed: bool = False
) -> np.ndarray:
    if model == "equal":
        return np.ones(len(features))
    if model == "listwise":
        return _fit_listwise(examples, features)
    if signed:
        return _fit_logistic(examples, features, model, l2)
    return _fit_linear(examples, features, model, l2)


def ndcg10(scores: np.ndarray, gains: np.ndarray, judged: Mapping[str, int]) -> np.ndarray:
    """nDCG@10 of one query's candidates under each column of ``scores [D, G]`` (trec_eval's linear
    gains; the ideal from all of ``judged``), for training (evaluation uses ir-measures)."""
    ideal = np.sort(np.fromiter(judged.values(), dtype=np.float64))[::-1][:10]
    idcg = float((ideal / np.log2(np.arange(2, ideal.size + 2))).sum())
    if idcg <= 0:
        return np.zeros(scores.shape[1])
    top = np.argsort(-scores, axis=0, kind="stable")[:10]
    return (gains[top] / np.log2(np.arange(2, top.shape[0] + 2))[:, None]).sum(axis=0) / idcg


def simplex_grid(n: int, steps: int = GRID_STEPS) -> np.ndarray:
    """Every weight vector of ``n`` non-negative multiples of 1/``steps`` that sum to 1."""
    pts = [c for c in itertools.product(range(steps + 1), repeat=n - 1) if sum(c) <= steps]
    return np.array([[*c, steps - sum(c)] for c in pts], dtype=np.float64) / steps


def _fit_listwise(examples: Sequence[FusionExample], features: Sequence[str]) -> np.ndarray:
    """The simplex grid point with the best nDCG@10, mean per group then over groups."""
    grid = simplex_grid(len(features))
    by_group: dict[str, list[np.ndarray]] = {}
    for e in examples:
        x, judged = _design(e.signals, features), e.judged()
        gains = np.array([judged.get(d, 0) for d in e.doc_ids], dtype=np.float64)
        by_group.setdefault(e.group, []).append(ndcg10(x @ grid.T, gains, judged))
    value = np.mean([np.mean(v, axis=0) for v in by_group.values()], axis=0)
    return grid[int(np.argmax(value))]


def _fit_linear(examples: Sequence[FusionExample], features: Sequence[str], model: str, l2: float) -> np.ndarray:
    """Weights over ``features`` that are all >= 0: every signal is a relevance estimate (higher =
    more relevant), so a negative weight only fits the training data's collinearity (e.g. one
    BM25 against another) and does not transfer. A feature whose weight comes out negative is
    dropped (weight 0) and the rest refitted."""
    keep = list(range(len(features)))
    while True:
        w = _fit_logistic(examples, [features[i] for i in keep], model, l2)
        if (w >= 0).all() or len(keep) == 1:
            out = np.zeros(len(features))
            out[keep] = np.maximum(w, 0.0)
            return out
        del keep[int(np.argmin(w))]


def _fit_logistic(examples: Sequence[FusionExample], features: Sequence[str], model: str, l2: float) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    xs = [_design(e.signals, features) for e in examples]
    if model == "pointwise":
        y = np.concatenate([e.labels >= e.rel for e in examples]).astype(int)
        if y.min() == y.max():
            raise InputError(f"all {len(y)} training candidates have the same label; give relevant and other ones")
        clf = LogisticRegression(C=1.0 / l2, max_iter=2000).fit(np.vstack(xs), y)
        return clf.coef_[0]
    diffs = [
        x[i] - x[j]
        for e, x in zip(examples, xs)
        for i in np.flatnonzero(e.labels >= e.rel)
        for j in np.flatnonzero(e.labels < e.rel)
    ]
    if not diffs:
        raise InputError("no training query has both relevant and other candidates; pairwise training needs them")
    d = np.vstack(diffs)
    clf = LogisticRegression(C=1.0 / l2, fit_intercept=False, max_iter=2000)
    return clf.fit(np.vstack([d, -d]), np.r_[np.ones(len(d)), np.zeros(len(d))]).coef_[0]


def _balanced(examples: Sequence[FusionExample]) -> list[FusionExample]:
    """Every group (dataset) equally represented: the larger groups' queries are subsampled
    (seeded) to the smallest group's size times two, so no single dataset sets the weights."""
    groups: dict[str, list[FusionExample]] = {}
    for e in examples:
        groups.setdefault(e.group, []).append(e)
    if len(groups) < 2:
        return list(examples)
    cap = 2 * min(len(g) for g in groups.values())
    rng = np.random.default_rng(0)
    out: list[FusionExample] = []
    for g in groups.values():
        out += [g[i] for i in sorted(rng.choice(len(g), size=min(cap, len(g)), replace=False))]
    return out


def mean_ndcg(examples: Sequence[FusionExample], scorer: Any, k: int = 10) -> float:
    """Mean nDCG@``k`` of ``scorer(example) -> scores`` over ``examples`` (ir-measures)."""
    by_rel: dict[int, list[FusionExample]] = {}
    for e in examples:
        by_rel.setdefault(e.rel, []).append(e)
    total = 0.0
    for rel, exs in by_rel.items():
        run = {e.qid: dict(zip(e.doc_ids, map(float, scorer(e)))) for e in exs}
        qrels = {e.qid: e.judged() for e in exs}
        total += evaluate(run, qrels, [f"nDCG@{k}"], rel=rel)[f"nDCG@{k}"] * len(exs)
    return total / len(examples)


def _choose_gate(examples: Sequence[FusionExample], fused: FusedWeights) -> float | None:
    """The confidence threshold (a quantile of the training queries' confidences, or None =
    always attention) with the best mean nDCG@10 on ``examples``."""
    conf = np.array([attention_confidence(e.signals[ATTENTION]) for e in examples])

    def score(e: FusionExample) -> np.ndarray:
        return fused.score(e.signals)

    best, best_gate = mean_ndcg(examples, score), None
    for q in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        fused.gate = float(np.quantile(conf, q))
        value = mean_ndcg(examples, score)
        if value > best + 1e-9:
            best, best_gate = value, fused.gate
    fused.gate = best_gate
    return best_gate


def train_fused(
    examples: Sequence[FusionExample],
    features: Sequence[str] = FEATURES,
    *,
    model: str = "pointwise",
    l2: float = 1.0,
    gate: bool = True,
    balance: bool = False,
    trained_on: str = "",
    signed: bool = False,
    heads: Any = None,
    capture: str | None = None,
) -> FusedWeights:
    """Fit fused weights on labelled queries (see the module doc), and the same model without
    attention (``base_weights``) where there is attention; ``gate``: choose the fallback threshold;
    ``balance``: equal say for every group (dataset) (off by default: pooling every query measured
    better held out, docs/benchmarks.md); ``signed``: pointwise or pairwise weights may be negative
    (an ablation: a negative rank weight can take out attention's echo of the candidate's slot; it
    did not beat the non-negative weights held out, docs/benchmarks.md); ``heads`` / ``capture``: the
    heads the examples' attention was read from and how it was captured
    (:func:`~attnrank.llm.blocks.capture_name`), recorded so that a reranker applies the weights
    to the attention they were fitted to."""
    require("sklearn", "train", "Training the fused scorer")
    if model not in MODELS:
        raise InputError(f"model={model!r} is not one of {MODELS}")
    if l2 <= 0:
        raise InputError(f"l2={l2} must be > 0 (the L2 penalty λ; sklearn's C = 1/λ)")
    if not examples:
        raise InputError("no training queries; give labelled queries with candidates")
    embedders = {e.embedder for e in examples}
    if len(embedders) > 1:
        raise InputError(
            f"the training queries' dense signals come from different embedders {sorted(map(str, embedders))}; "
            "compute every example's signals with one SignalComputer"
        )
    train = _balanced(examples) if balance else list(examples)
    fused = FusedWeights(
        list(features),
        _fit(train, features, model, l2, signed).tolist(),
        model=model,
        l2=l2,
        trained_on=trained_on or f"{len(examples)} queries",
        date=_dt.datetime.now().isoformat(timespec="seconds"),
        embedder=embedders.pop(),
        signals_version=SIGNALS_VERSION,
        heads=heads if ATTENTION in features else None,
        capture=capture if ATTENTION in features else None,
    )
    # the gate's fallback, and the `signals` preset's model once registered (signals_only)
    if fused.uses_attention and fused.base_features:
        fused.base_weights = _fit(train, fused.base_features, model, l2, signed).tolist()
        if gate:
            _choose_gate(train, fused)
    return fused


# -- examples ------------------------------------------------------------------------------------
def fusion_examples(
    attention: Callable[[str, list[Document]], np.ndarray],
    queries: Mapping[str, str],
    candidates: Mapping[str, list[Document]],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    rel: int = 1,
    group: str = "",
    signals: SignalComputer | None = None,
    progress: bool = False,
) -> list[FusionExample]:
    """Labelled :class:`FusionExample` per query of ``queries``: ``attention(query, docs)`` (e.g. an
    :class:`~attnrank.rerank.attention.AttentionReranker`'s ``score`` without fusion) and the
    first-stage signals of its ``candidates`` (first-stage order)."""
    from tqdm.auto import tqdm

    missing = [q for q in queries if q not in candidates]
    if missing:
        raise InputError(
            f"{len(missing)} queries have no candidate list (first: {missing[0]!r}); give candidates for every query"
        )
    compute = signals or SignalComputer()
    out = []
    for qid in tqdm(list(queries), desc="attention and signals", unit="query", disable=not progress):
        docs = candidates[qid]
        sig = compute(queries[qid], [d.full_text for d in docs])
        sig[ATTENTION] = np.asarray(attention(queries[qid], docs), dtype=np.float64)
        labels = np.array([qrels.get(qid, {}).get(d.id, 0) for d in docs], dtype=np.int64)
        judged = dict(qrels.get(qid, {}))
        out.append(FusionExample(qid, [d.id for d in docs], sig, labels, rel, group, judged, compute.embedder_name))
    return out
