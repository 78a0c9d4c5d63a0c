"""Ranking metrics computed by ir-measures (trec_eval conventions), never hand-rolled.

nDCG uses trec_eval's linear gain of the graded label. Binary metrics (Recall, MRR) count a
document as relevant when its label ≥ ``rel`` (1 for SciFact/HotpotQA, 2 for TREC DL as in
the official evaluation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from math import comb
from typing import Any

from ..errors import require

DEFAULT_METRICS = ("nDCG@10", "R@20", "R@100", "RR@10")


def _parse(metrics: Sequence[str], rel: int):
    irm = require("ir_measures", "eval", "Evaluation metrics")
    out = []
    for m in metrics:
        measure = irm.parse_measure(m)
        if rel > 1 and measure.NAME in ("R", "RR", "P", "AP", "Success"):
            measure = measure(rel=rel)
        out.append(measure)
    return out


def _name(m) -> str:
    return str(m).replace("(rel=2)", "").replace("(rel=3)", "")


def evaluate(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    rel: int = 1,
) -> dict[str, float]:
    """Mean of each metric over the queries that have judgments (missing runs count as 0)."""
    measures = _parse(metrics, rel)
    judged = {q: dict(v) for q, v in qrels.items()}
    # queries with judgments but no run score 0, as trec_eval -c does
    full_run = {q: dict(run.get(q, {})) for q in judged}
    per = evaluate_per_query(full_run, judged, metrics, rel=rel)
    return {_name(m): (sum(v[_name(m)] for v in per.values()) / len(per) if per else 0.0) for m in measures}


def evaluate_per_query(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    rel: int = 1,
) -> dict[str, dict[str, float]]:
    """``{query_id: {metric: value}}`` for every judged query (0 where the run has nothing)."""
    irm = require("ir_measures", "eval", "Evaluation metrics")
    measures = _parse(metrics, rel)
    per: dict[str, dict[str, float]] = {q: {_name(m): 0.0 for m in measures} for q in qrels}
    run_d = {q: dict(d) for q, d in run.items() if d}
    for metric in irm.iter_calc(measures, dict(qrels), run_d):
        if metric.query_id in per:
            per[metric.query_id][_name(metric.measure)] = float(metric.value)
    return per


def wins_losses(deltas: Iterable[float], eps: float = 1e-9) -> tuple[int, int]:
    """How many per-query differences rose / fell by more than ``eps`` (ties not counted)."""
    values = list(deltas)
    return sum(d > eps for d in values), sum(d < -eps for d in values)


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial sign test p-value of ``wins`` against ``losses`` (ties dropped)."""
    n = wins + losses
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(comb(n, i) for i in range(min(wins, losses) + 1)) / 2**n)


def per_query_ndcg_of_each(
    scores: Mapping[str, Any],
    doc_ids: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    rel: int = 1,
    k: int = 10,
    chunk: int = 64,
) -> dict[str, Any]:
    """``{qid: nDCG@k of each scorer used alone [S]}`` from ``scores[qid] [S, D]`` (e.g. every
    head's passage scores) over the candidates ``doc_ids[qid]``: one ir-measures call per
    ``chunk`` scorers."""
    import numpy as np

    out = {q: np.zeros(len(s)) for q, s in scores.items()}
    n = len(next(iter(scores.values())))
    for lo in range(0, n, chunk):
        run = {
            f"{q}::{h}": dict(zip(doc_ids[q], map(float, s[h])))
            for q, s in scores.items()
            for h in range(lo, min(n, lo + chunk))
        }
        per = evaluate_per_query(run, {key: qrels[key.rsplit("::", 1)[0]] for key in run}, [f"nDCG@{k}"], rel=rel)
        for key, v in per.items():
            q, h = key.rsplit("::", 1)
            out[q][int(h)] = v[f"nDCG@{k}"]
    return out
