"""Training the fused scorer (:mod:`attnrank.rerank.fused`): weights fitted on labelled queries.

:func:`fusion_examples` turns labelled queries into :class:`~attnrank.rerank.fused_features.FusionExample`
(attention plus the first-stage signals of each candidate); :func:`train_fused` fits
:class:`~attnrank.rerank.fused.FusedWeights` on them with one of :data:`LEARNERS` (pointwise
logistic regression, pairwise RankNet, a listwise grid over the simplex, or equal weights), the
same model without attention as the fallback, and the confidence gate between the two. Which of
these the presets use was chosen held out (``scripts/bench_fusion.py``, docs/benchmarks.md).
"""

from __future__ import annotations

import datetime as _dt
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..config import check_l2
from ..errors import InputError, require
from ..eval.crossval import check_unique_queries
from ..eval.metrics import check_labels, check_rel, evaluate_per_query
from ..eval.rows import scores_by_id
from ..types import Document, RankedResults, ScoredDocument, as_documents
from .fused import ATTENTION, FEATURES, KNOWN_FEATURES, LLM_FEATURES, FusedWeights
from .fused_features import FusionExample, attention_confidence, feature_matrix
from .inputs import check_unique_ids
from .signals import SIGNALS_VERSION, SignalComputer, candidate_terms
from .versions import SCORING_VERSION

logger = logging.getLogger(__name__)

LEARNERS = ("pointwise", "pairwise", "listwise", "equal")
GRID_STEPS = 10  # listwise: weights on the simplex in steps of 1/GRID_STEPS


def _fit(
    examples: Sequence[FusionExample], features: Sequence[str], learner: str, l2: float, signed: bool = False
) -> np.ndarray:
    if learner == "equal":
        return np.ones(len(features))
    if learner == "listwise":
        return _fit_listwise(examples, features)
    if signed:
        return _fit_logistic(examples, features, learner, l2)
    return _fit_linear(examples, features, learner, l2)


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
        x, judged = feature_matrix(e.signals, features), e.judged()
        gains = np.array([judged.get(d, 0) for d in e.doc_ids], dtype=np.float64)
        by_group.setdefault(e.group, []).append(ndcg10(x @ grid.T, gains, judged))
    value = np.mean([np.mean(v, axis=0) for v in by_group.values()], axis=0)
    return grid[int(np.argmax(value))]


def _fit_linear(examples: Sequence[FusionExample], features: Sequence[str], learner: str, l2: float) -> np.ndarray:
    """Weights over ``features`` that are all >= 0: every signal is a relevance estimate (higher =
    more relevant), so a negative weight only fits the training data's collinearity (e.g. one
    BM25 against another) and does not transfer. A feature whose weight comes out negative is
    dropped (weight 0) and the rest refitted. When the last one left is negative too, no feature
    ranks the training queries' relevant candidates higher and every weight is 0: such weights rank
    every candidate alike, which is what a held-out report scores of that fit (so equal weights win
    it), and they are never registered (:meth:`FusedWeights.save`)."""
    keep = list(range(len(features)))
    while True:
        w = _fit_logistic(examples, [features[i] for i in keep], learner, l2)
        if (w >= 0).all() or len(keep) == 1:
            out = np.zeros(len(features))
            out[keep] = np.maximum(w, 0.0)
            return out
        del keep[int(np.argmin(w))]


def _fit_logistic(examples: Sequence[FusionExample], features: Sequence[str], learner: str, l2: float) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    xs = [feature_matrix(e.signals, features) for e in examples]
    if learner == "pointwise":
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
    """Mean nDCG@``k`` of ``scorer(example) -> scores`` over ``examples`` (ir-measures), an
    example without judgments counting 0, as in the k-fold reports (:func:`~attnrank.rerank.fusion_eval.compare`)."""
    metric = f"nDCG@{k}"
    per = per_query_metrics(examples, scorer, [metric])
    return sum(row[metric] for row in per.values()) / len(examples)


def per_query_metrics(examples: Sequence[FusionExample], scorer: Any, metrics: Sequence[str]) -> dict[str, dict]:
    """``{qid: {metric: value}}`` of ``scorer(example) -> scores`` over ``examples`` (ir-measures,
    each example at its own relevance threshold); a query without judgments scores 0."""
    check_unique_queries(examples)
    by_rel: dict[int, list[FusionExample]] = {}
    for e in examples:
        by_rel.setdefault(e.rel, []).append(e)
    out: dict[str, dict] = {}
    for rel, exs in by_rel.items():
        run = {e.qid: scores_by_id(e.qid, e.doc_ids, scorer(e)) for e in exs}
        qrels = {e.qid: e.judged() for e in exs}
        got = evaluate_per_query(run, qrels, metrics, rel=rel)
        for e in exs:  # (a metric name is always there: no default)
            row = got.get(e.qid)
            out[e.qid] = {m: float(row[m]) if row is not None else 0.0 for m in metrics}
    return out


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
    sizes = [len(e.doc_ids) for e in examples]
    fused.gate_candidates = None if best_gate is None else [min(sizes), max(sizes)]
    return best_gate


def train_fused(
    examples: Sequence[FusionExample],
    features: Sequence[str] = FEATURES,
    *,
    learner: str = "pointwise",
    l2: float = 1.0,
    gate: bool = True,
    balance: bool = False,
    trained_on: str = "",
    signed: bool = False,
    heads: Any = None,
    capture: str | None = None,
    adapter: str = "",
    prompt: dict[str, Any] | None = None,
) -> FusedWeights:
    """Fit fused weights on labelled queries (see the module doc), and the same model without
    attention (``base_weights``) where there is attention; ``gate``: choose the fallback threshold;
    ``balance``: equal say for every group (dataset) (off by default: pooling every query measured
    better held out, docs/benchmarks.md); ``signed``: pointwise or pairwise weights may be negative
    (an ablation: a negative rank weight can take out attention's echo of the candidate's slot; it
    did not beat the non-negative weights held out, docs/benchmarks.md); ``heads`` / ``capture``: the
    heads the examples' attention was read from and how it was captured
    (:func:`~attnrank.llm.blocks.capture_name`), recorded so that a reranker applies the weights
    to the attention they were fitted to; ``adapter``: the head adapter of the model the LLM
    features came from (``LLM.adapter``; recorded: a reranker on another model refuses them, and
    the registry refuses them); ``prompt``: the prompt settings the attention was read from
    (``RerankConfig.prompt_settings()``; recorded, so that a reranker that builds its prompt
    otherwise warns)."""
    require("sklearn", "train", "Training the fused scorer")
    if learner not in LEARNERS:
        raise InputError(f"learner={learner!r} is not one of {LEARNERS}")
    check_l2(l2)
    features = list(features)
    if not features or len(set(features)) < len(features) or not set(features) <= set(KNOWN_FEATURES):
        # (checked by the weights only after the fit: an empty list failed inside NumPy, a traceback)
        raise InputError(f"features={features} must be among {KNOWN_FEATURES}, each once, at least one")
    if not examples:
        raise InputError("no training queries; give labelled queries with candidates")
    empty = next((e.qid for e in examples if not len(e.doc_ids)), None)
    if empty is not None:  # (the gate's choice failed on it after the fit, a ValueError traceback)
        raise InputError(f"training query {empty!r} has no candidates; leave it out")
    embedders = {e.embedder for e in examples}
    if len(embedders) > 1:
        raise InputError(
            f"the training queries' dense signals come from different embedders {sorted(map(str, embedders))}; "
            "compute every example's signals with one SignalComputer"
        )
    train = _balanced(examples) if balance else list(examples)
    fused = FusedWeights(
        list(features),
        _fit(train, features, learner, l2, signed).tolist(),
        learner=learner,
        l2=l2,
        trained_on=trained_on or f"{len(examples)} queries",
        date=_dt.datetime.now().isoformat(timespec="seconds"),
        embedder=embedders.pop(),
        signals_version=SIGNALS_VERSION,
        bm25_stemmer=candidate_terms().stemmer if "bm25" in features else None,
        heads=heads if ATTENTION in features else None,
        capture=capture if ATTENTION in features else None,
        adapter=adapter if any(f in LLM_FEATURES for f in features) else "",
        prompt=dict(prompt) if prompt is not None and ATTENTION in features else None,
        # the passage cut their LLM features were read with, where the prompt settings record it
        # (only the CLI set it: weights fitted at one cut and applied at another were not warned of)
        max_doc_words=(prompt or {}).get("max_doc_words") if any(f in LLM_FEATURES for f in features) else None,
        max_doc_tokens=(prompt or {}).get("max_doc_tokens") if any(f in LLM_FEATURES for f in features) else None,
        scoring_version=SCORING_VERSION if any(f in LLM_FEATURES for f in features) else None,
    )
    # the gate's fallback, and the `signals` preset's model once registered (signals_only), unless
    # the user registered SignalsWeights
    if fused.uses_attention and fused.base_features:
        base = _fit(train, fused.base_features, learner, l2, signed)
        if not base.any():  # all 0 would rank every candidate alike wherever the fallback is used
            logger.warning(
                "the model without attention over %s came out all 0 (every feature negative); none is kept: "
                "the preset signals uses equal weights, and there is no gate",
                fused.base_features,
            )
            return fused
        fused.base_weights = base.tolist()
        if gate:
            _choose_gate(train, fused)
    return fused


# -- examples ------------------------------------------------------------------------------------
def _candidate_documents(qid: str, given: Any) -> list[Document]:
    """One query's candidates as documents: :class:`Document` objects, search results
    (:class:`RankedResults` or :class:`ScoredDocument` objects, an AttributeError on ``full_text``
    before) in their order; texts are refused, their labels having no ids to be read by."""
    texts = (
        [] if isinstance(given, str) or not isinstance(given, Sequence) else [d for d in given if isinstance(d, str)]
    )
    if texts:
        raise InputError(
            f"candidates of query {qid!r} hold texts ({texts[0][:40]!r}); training reads each candidate's label by "
            "its id: give Document(id, text) objects, or search results"
        )
    try:
        return as_documents(given)[0]
    except InputError as e:
        raise InputError(f"candidates of query {qid!r}: {e}") from None


def fusion_examples(
    llm_scores: Mapping[str, Callable[[str, list[Document]], np.ndarray]],
    queries: Mapping[str, str],
    candidates: Mapping[str, Sequence[Document | ScoredDocument] | RankedResults],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    rel: int = 1,
    group: str = "",
    signals: SignalComputer | None = None,
    progress: bool = False,
) -> list[FusionExample]:
    """Labelled :class:`FusionExample` per query of ``queries`` that has a label >= ``rel`` in
    ``qrels`` (the others are left out, with a warning, as ``attnrank train`` leaves them): the
    first-stage signals of its ``candidates`` (first-stage order: :class:`Document` objects, or
    search results as they come) and, for each ``{feature: score(query, docs)}`` of
    ``llm_scores``, that feature (e.g. ``{"attention": reranker.score}`` of an
    :class:`~attnrank.rerank.attention.AttentionReranker` without fusion, or
    ``{"likelihood": reranker.likelihood}``)."""
    from tqdm.auto import tqdm

    if not isinstance(llm_scores, Mapping):  # it was one attention callable until 2026-12-04
        raise InputError(
            f"llm_scores is a {type(llm_scores).__name__}; give {{feature: score(query, docs)}}, "
            'e.g. {"attention": reranker.score}'
        )
    check_rel(rel)
    check_labels(qrels)  # (a grade 1.5 was cut to 1 in the labels, kept as 1.5 in the qrels)
    # a query without a relevant label trained as all negatives and scored 0 in every row of the report
    # (attnrank train and evaluate leave it out)
    unlabelled = [q for q in queries if not any(v >= rel for v in qrels.get(q, {}).values())]
    if unlabelled:
        logger.warning(
            "%d of the %d queries have no label >= %d in the qrels (e.g. %r): left out, as attnrank train leaves them",
            len(unlabelled),
            len(queries),
            rel,
            unlabelled[0],
        )
        queries = {q: t for q, t in queries.items() if q not in set(unlabelled)}
        if not queries:
            raise InputError(
                f"no query has a label >= {rel} in the qrels (e.g. {unlabelled[0]!r}); pass the qrels of these "
                "queries, or a lower rel"
            )
    missing = [q for q in queries if q not in candidates]
    if missing:
        raise InputError(
            f"{len(missing)} queries have no candidate list (first: {missing[0]!r}); give candidates for every query"
        )
    given = {qid: _candidate_documents(qid, candidates[qid]) for qid in queries}
    for qid in queries:  # (a repeated candidate's label counted twice, and one of its scores was lost)
        check_unique_ids(given[qid], f"candidate of query {qid!r}")
    compute = signals or SignalComputer()
    out = []
    desc = f"{', '.join(llm_scores) or 'no LLM score'} and signals"
    for qid in tqdm(list(queries), desc=desc, unit="query", disable=not progress):
        docs = given[qid]
        sig = compute(queries[qid], [d.full_text for d in docs])
        for name, score in llm_scores.items():
            sig[name] = np.asarray(score(queries[qid], docs), dtype=np.float64)
        labels = np.array([qrels.get(qid, {}).get(d.id, 0) for d in docs], dtype=np.int64)
        judged = dict(qrels.get(qid, {}))
        out.append(FusionExample(qid, [d.id for d in docs], sig, labels, rel, group, judged, compute.embedder_name))
    return out
