"""Ranking metrics computed by ir-measures (trec_eval conventions), never hand-rolled.

nDCG uses trec_eval's linear gain of the graded label. Binary metrics (Recall, MRR) count a
document as relevant when its label ≥ ``rel`` (1 for SciFact/HotpotQA, 2 for TREC DL as in
the official evaluation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from math import comb

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
