"""Held-out evaluation of the fused scorer: k-fold over queries or leave-one-dataset-out.

:func:`heldout_scores` trains on each split's training queries and scores its test queries with
every method (the signals alone, the untrained equal weights, the fused scorer without attention,
with attention or with the query likelihood);
:func:`compare` turns those scores into one row per method: the metrics, the difference to the
best first-stage signal in points, per-query wins/losses against it and a two-sided sign test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..eval.crossval import Split, labelled_splits
from ..eval.metrics import sign_test, wins_losses
from .fused import (
    ATTENTION,
    EQUAL_FEATURES,
    EQUAL_SIGNALS,
    FEATURES,
    LIKELIHOOD,
    LIKELIHOOD_FEATURES,
    LIKELIHOOD_TRAINED,
    NO_ATTENTION,
    FusedWeights,
    LikelihoodWeights,
    SignalsWeights,
    equal_weights,
)
from .fused_features import FusionExample
from .fused_training import mean_ndcg, per_query_metrics, train_fused
from .signals import SIGNALS

Scores = dict[str, np.ndarray]  # qid -> scores over its candidates
FIRST_STAGE = tuple(f"{s} alone" for s in SIGNALS)
WITH_ATTENTION = "fused with attention"
EQUAL = EQUAL_SIGNALS
WITH_LIKELIHOOD = "fused with likelihood"
EQUAL_LIKELIHOOD = "equal weights with likelihood (untrained)"  # the default preset where none are registered
# per LLM feature: (the trained fusion's label, its features), and the untrained rows {label: features}
# None: no LLM feature (the preset signals), whose trained fusion is the one without attention
TRAINED: dict[str | None, tuple[str, tuple[str, ...]]] = {
    ATTENTION: (WITH_ATTENTION, FEATURES),
    LIKELIHOOD: (WITH_LIKELIHOOD, LIKELIHOOD_TRAINED),
    None: (NO_ATTENTION, SIGNALS),
}
UNTRAINED: dict[str | None, dict[str, tuple[str, ...]]] = {  # the preset's own untrained model last
    ATTENTION: {EQUAL: EQUAL_FEATURES},
    LIKELIHOOD: {EQUAL: EQUAL_FEATURES, EQUAL_LIKELIHOOD: LIKELIHOOD_FEATURES},
    None: {EQUAL: EQUAL_FEATURES},
}


def own_untrained(llm_feature: str | None) -> tuple[str, tuple[str, ...]]:
    """(report label, features) of the untrained equal weights of the preset fusing ``llm_feature``."""
    return list(UNTRAINED[llm_feature].items())[-1]


def kfold_rows(
    examples: Sequence[FusionExample],
    llm_feature: str | None,
    *,
    folds: int = 5,
    seed: int = 0,
    learner: str = "pointwise",
    l2: float = 1.0,
    gate: bool = True,
    metrics: Sequence[str] = ("nDCG@10",),
) -> list[dict[str, Any]]:
    """The held-out ``folds``-fold report over ``examples``: :func:`heldout_scores` on
    :func:`~attnrank.eval.crossval.labelled_splits`, as :func:`compare` rows."""
    splits = labelled_splits(list(examples), folds, seed=seed)
    scores = heldout_scores(splits, llm_feature=llm_feature, learner=learner, l2=l2, gate=gate)
    return compare(examples, scores, metrics)


def heldout_scores(
    splits: Sequence[Split[FusionExample]],
    *,
    llm_feature: str | None = ATTENTION,
    learner: str = "pointwise",
    l2: float = 1.0,
    gate: bool = True,
    balance: bool = False,
    variants: Mapping[str, Sequence[str]] | None = None,
    extra_signals: Sequence[str] = (),
) -> dict[str, Scores]:
    """``{method: {qid: scores}}`` over the test queries of ``splits`` (each trained on its own
    training queries): ``<signal> alone`` for each first-stage signal, ``llm_feature`` (attention,
    the query likelihood, or None: none) and ``extra_signals`` (e.g. a corpus-level BM25 the examples carry),
    the untrained :func:`~attnrank.rerank.fused.equal_weights` (``EQUAL``; with the likelihood also
    ``EQUAL_LIKELIHOOD``, the default preset's), the fusion trained without and with
    ``llm_feature`` (:data:`TRAINED`), and the named feature lists of ``variants``."""
    if llm_feature not in TRAINED:
        raise InputError(f"llm_feature={llm_feature!r} is not one of {list(TRAINED)}")
    with_llm, features = TRAINED[llm_feature]
    methods: dict[str, Sequence[str]] = {NO_ATTENTION: SIGNALS, with_llm: features, **(variants or {})}
    alone = (*SIGNALS, *([] if llm_feature is None else [llm_feature]), *extra_signals)
    # (a KeyError deep in the scoring: signals-only examples, llm_feature left at its default)
    first = next((s.train[0] for s in splits if s.train), None)
    lacking = (
        [] if first is None else sorted({*alone, *(f for fs in methods.values() for f in fs)} - set(first.signals))
    )
    if lacking:
        raise InputError(
            f"the examples lack the feature(s) {lacking}; compute them in fusion_examples, or pass "
            "llm_feature=None for examples of the first-stage signals alone"
        )
    untrained = {label: equal_weights(feats) for label, feats in UNTRAINED[llm_feature].items()}
    out: dict[str, Scores] = {}
    for split in splits:
        for name in alone:
            for e in split.test:
                out.setdefault(f"{name} alone", {})[e.qid] = np.asarray(e.signals[name], dtype=np.float64)
        for label, fixed in untrained.items():
            for e in split.test:
                out.setdefault(label, {})[e.qid] = fixed.score(e.signals)
        for label, feats in methods.items():
            fused = train_fused(split.train, feats, learner=learner, l2=l2, gate=gate, balance=balance)
            for e in split.test:
                out.setdefault(label, {})[e.qid] = fused.score(e.signals)
    return out


def fit_unless_worse(
    examples: Sequence[FusionExample],
    llm_feature: str | None = LIKELIHOOD,
    *,
    folds: int = 5,
    seed: int = 0,
    learner: str = "pointwise",
    l2: float = 1.0,
    trained_on: str = "",
    metrics: Sequence[str] = ("nDCG@10",),
    adapter: str = "",
) -> tuple[list[dict[str, Any]], FusedWeights | None]:
    """What ``attnrank train`` does for a preset whose untrained model is equal weights: with
    ``llm_feature`` the query likelihood, the default ``likelihood``; None, ``signals``. Returns the
    held-out ``folds``-fold report over ``examples`` (:func:`compare` rows: the signals alone, the
    untrained equal weights, the fusion trained over the preset's features and the first-stage rank)
    and the weights trained on all of them (:class:`~attnrank.rerank.fused.LikelihoodWeights` or
    :class:`~attnrank.rerank.fused.SignalsWeights`), or None where held out they scored below the
    untrained equal weights (in the first of ``metrics``; a tie keeps the trained ones): the
    preset then keeps those. The report estimates the gain on new queries of the same kind; it
    does not guarantee it (nested in-domain, ``scripts/bench_likelihood.py``). ``adapter``: the head
    adapter merged into the model the likelihood came from (``LLM.adapter``), which the weights record."""
    if llm_feature not in (LIKELIHOOD, None):  # the presets whose untrained model is equal weights
        raise InputError(f"llm_feature={llm_feature!r} is not {LIKELIHOOD!r} or None (the preset signals)")
    rows = kfold_rows(
        examples, llm_feature, folds=folds, seed=seed, learner=learner, l2=l2, gate=False, metrics=metrics
    )
    score = {r["method"]: r[metrics[0]] for r in rows}
    trained_label, features = TRAINED[llm_feature]
    if score[trained_label] < score[own_untrained(llm_feature)[0]]:
        return rows, None
    kind = SignalsWeights if llm_feature is None else LikelihoodWeights
    fitted = train_fused(examples, features, learner=learner, l2=l2, gate=False, trained_on=trained_on, adapter=adapter)
    weights = kind(**fitted.to_json())
    weights.metrics = recorded_metrics(rows, metrics, folds, seed=seed, n_queries=len(examples))
    return rows, weights


def registration_curve(
    examples: Sequence[FusionExample],
    sizes: Sequence[int] = (10, 20, 40, 80, 160, 320),
    *,
    llm_feature: str | None = LIKELIHOOD,
    seeds: int = 3,
    folds: int = 5,
) -> list[dict[str, Any]]:
    """What :func:`fit_unless_worse` registers against how many labelled queries it is given: for
    each size ``n`` (those that every outer training part holds), in each of ``folds`` outer folds
    ``n`` of the training queries are drawn (seeded) and the rule decides on them alone; the
    held-out fold is scored by its choice (the trained weights, else the preset's equal weights).
    One row per size: nDCG@10 points against the equal weights (mean and worst over ``seeds``
    fold shuffles) and how many of the outer folds kept the trained weights."""
    untrained = equal_weights(own_untrained(llm_feature)[1])
    base = mean_ndcg(examples, lambda e: untrained.score(e.signals))
    rows = []
    for n in sizes:
        deltas, kept, decided = [], 0, 0
        for seed in range(seeds):
            splits = labelled_splits(list(examples), folds, seed=seed)
            if min(len(sp.train) for sp in splits) < n:
                break
            scores: dict[str, np.ndarray] = {}
            for sp in splits:
                drawn = np.random.default_rng(seed).choice(len(sp.train), n, replace=False)
                chosen = fit_unless_worse([sp.train[i] for i in sorted(drawn)], llm_feature, folds=folds)[1]
                kept, decided = kept + (chosen is not None), decided + 1
                scores.update({e.qid: (chosen or untrained).score(e.signals) for e in sp.test})
            deltas.append(100 * (mean_ndcg(examples, lambda e, s=scores: s[e.qid]) - base))
        if deltas:
            rows.append(
                {
                    "labelled queries": n,
                    "Δ vs equal weights": float(np.mean(deltas)),
                    "worst shuffle Δ": float(np.min(deltas)),
                    "folds kept trained": f"{kept}/{decided}",
                }
            )
    return rows


def recorded_metrics(
    rows: Sequence[dict[str, Any]], metrics: Sequence[str], folds: int, *, seed: int = 0, n_queries: int | None = None
) -> dict[str, Any]:
    """What trained weights record of their k-fold report (``metrics`` of each :func:`compare` row),
    with the folds' seed and the number of queries, so that the report can be matched and run again."""
    return {
        "heldout": {r["method"]: {m: r[m] for m in metrics} for r in rows},
        "folds": folds,
        "seed": seed,
        "n_queries": n_queries,
    }


def compare(
    examples: Sequence[FusionExample],
    scores: Mapping[str, Scores],
    metrics: Sequence[str] = ("nDCG@10",),
    baselines: Sequence[str] = FIRST_STAGE,
) -> list[dict[str, Any]]:
    """One row per method: mean ``metrics`` over ``examples``; ``Δ`` (points of the first metric)
    and per-query ``wins``/``losses``/``p`` (sign test) against the best of ``baselines`` (chosen
    on these same queries, which flatters the baseline)."""
    per = {m: _per_query(examples, s, metrics) for m, s in scores.items()}
    key = metrics[0]
    mean = {m: {k: float(np.mean([v[k] for v in p.values()])) for k in metrics} for m, p in per.items()}
    present = [b for b in baselines if b in mean]
    if not present:
        raise InputError(f"none of the baselines {list(baselines)} is among the scored methods {list(mean)}")
    best = max(present, key=lambda b: mean[b][key])
    rows = []
    for m, p in per.items():
        w, l = wins_losses(p[q][key] - per[best][q][key] for q in p)
        rows.append(
            {
                "method": m,
                **mean[m],
                "best first stage": best,
                "Δ": 100 * (mean[m][key] - mean[best][key]),
                "wins": w,
                "losses": l,
                "p": sign_test(w, l),
            }
        )
    return rows


def _per_query(examples: Sequence[FusionExample], scores: Scores, metrics: Sequence[str]) -> dict[str, dict]:
    return per_query_metrics(examples, lambda e: scores[e.qid], metrics)
