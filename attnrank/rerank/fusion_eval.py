"""Held-out evaluation of the fused scorer: k-fold over queries or leave-one-dataset-out.

:func:`heldout_scores` trains on each split's training queries and scores its test queries with
every method (the signals alone, the untrained equal weights, the fused scorer without attention,
with attention);
:func:`compare` turns those scores into one row per method: the metrics, the difference to the
best first-stage signal in points, per-query wins/losses against it and a two-sided sign test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..eval.crossval import Split
from ..eval.metrics import evaluate_per_query, sign_test, wins_losses
from .fused import ATTENTION, FEATURES, FusionExample, equal_weights
from .fused_training import train_fused
from .signals import SIGNALS

Scores = dict[str, np.ndarray]  # qid -> scores over its candidates
FIRST_STAGE = tuple(f"{s} alone" for s in SIGNALS)
NO_ATTENTION = "fused without attention"
WITH_ATTENTION = "fused with attention"
EQUAL = "equal weights, no attention (untrained)"  # the preset signals where no weights are registered


def heldout_scores(
    splits: Sequence[Split[FusionExample]],
    *,
    model: str = "pointwise",
    l2: float = 1.0,
    gate: bool = True,
    balance: bool = False,
    variants: Mapping[str, Sequence[str]] | None = None,
    extra_signals: Sequence[str] = (),
) -> dict[str, Scores]:
    """``{method: {qid: scores}}`` over the test queries of ``splits`` (each trained on its own
    training queries): ``<signal> alone`` for each first-stage signal, attention and
    ``extra_signals`` (e.g. a corpus-level BM25 the examples carry), :func:`~attnrank.rerank.fused.equal_weights`
    (``EQUAL``: nothing trained), the fused scorer without and with attention, and the named
    feature lists of ``variants``."""
    methods: dict[str, Sequence[str]] = {NO_ATTENTION: SIGNALS, WITH_ATTENTION: FEATURES, **(variants or {})}
    out: dict[str, Scores] = {}
    for split in splits:
        for name in (*SIGNALS, ATTENTION, *extra_signals):
            for e in split.test:
                out.setdefault(f"{name} alone", {})[e.qid] = np.asarray(e.signals[name], dtype=np.float64)
        equal = equal_weights()
        for e in split.test:
            out.setdefault(EQUAL, {})[e.qid] = equal.score(e.signals)
        for label, feats in methods.items():
            fused = train_fused(split.train, feats, model=model, l2=l2, gate=gate, balance=balance)
            for e in split.test:
                out.setdefault(label, {})[e.qid] = fused.score(e.signals)
    return out


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
    by_rel: dict[int, list[FusionExample]] = {}
    for e in examples:
        by_rel.setdefault(e.rel, []).append(e)
    out: dict[str, dict] = {}
    for rel, exs in by_rel.items():
        run = {e.qid: dict(zip(e.doc_ids, map(float, scores[e.qid]))) for e in exs}
        qrels = {e.qid: e.judged() for e in exs}
        got = evaluate_per_query(run, qrels, metrics, rel=rel)
        for e in exs:  # a query ir-measures drops (no relevant candidate) scores 0
            out[e.qid] = {m: float(got.get(e.qid, {}).get(m, 0.0)) for m in metrics}
    return out
