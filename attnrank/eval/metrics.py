"""Ranking metrics computed by ir-measures (trec_eval conventions), never hand-rolled.

nDCG uses trec_eval's linear gain of the graded label. Binary metrics (every metric with a
relevance threshold: Recall, MRR, P, AP, Rprec, bpref, ...) count a document as relevant when its
label ≥ ``rel`` (1 for SciFact/HotpotQA, 2 for TREC DL as in the official evaluation). Equal
scores rank as trec_eval ranks them, by document id descending, for every metric.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InputError, require
from ..types import RankedResults, is_count, is_real
from .data import as_run, check_relevance_level, highest_label, trec_order

logger = logging.getLogger(__name__)

DEFAULT_METRICS = ("nDCG@10", "R@20", "R@100", "RR@10")


def _parse(metrics: Sequence[str], rel: int) -> dict[str, Any]:
    """``{name as given (without rel): measure with rel applied}`` for the names in ``metrics``;
    two names may share one measure (``R@5`` and ``R(rel=2)@5`` with ``rel=2``)."""
    irm = require("ir_measures", "eval", "Evaluation metrics")
    check_rel(rel)
    out = {}
    for m in metrics:
        try:
            measure = irm.parse_measure(m)
        except (NameError, ValueError, TypeError, SyntaxError) as e:
            raise InputError(
                f"metric {m!r} is not an ir-measures name ({e}); use e.g. nDCG@10, R@100, RR@10, P@5 or AP"
            ) from None
        cutoff = measure.params.get("cutoff")
        if cutoff is not None and not is_count(cutoff):
            # trec_eval aborts the whole process (not an exception) on a cutoff below 1
            raise InputError(f"metric {m!r} has cutoff {cutoff!r}; a cutoff is a whole number >= 1 (e.g. R@100)")
        if rel != 1 and _takes_rel(m, measure):
            if measure.NAME == "NumRel":  # (no ir-measures provider computes it: a ValueError deep inside)
                raise InputError(f"metric {m!r} at rel={rel} is not computed by ir-measures; give it at rel 1")
            measure = measure(rel=rel)
        try:  # (ir-measures checks a measure's parameters only deep inside its calculation)
            measure.validate_params()
        except AssertionError as e:
            raise InputError(
                f"metric {m!r} is not computed by ir-measures ({e}); e.g. NumRet takes no @cutoff"
            ) from None
        # keyed as given: ir-measures' own spelling (NDCG@10 -> nDCG@10, MRR@10 -> RR@10) is not
        # the name a caller looks its figure up by
        out[m] = measure
    return out


def check_metric_list(metrics: Any) -> list[str]:
    """``metrics`` as a list of names: not one str (whose characters were read as names, "metric 'n'
    is not an ir-measures name") and not empty."""
    if isinstance(metrics, str):
        raise InputError(f"metrics={metrics!r} is one str; pass a list of names, e.g. [{metrics!r}]")
    names = list(metrics)
    if not names:
        raise InputError("metrics is empty; pass at least one name, e.g. ['nDCG@10']")
    return names


def _trec_order(docs: Mapping[str, float]) -> dict[str, float]:
    """The scores replaced by n, n-1, ..., 1 in trec_eval's order (:func:`~attnrank.eval.data.trec_order`:
    score descending as a 32-bit float, ties by doc id descending). ir-measures hands some metrics
    (RR@k) to providers that break ties the other way."""
    ranked = trec_order(docs)
    return {did: float(len(ranked) - i) for i, (did, _) in enumerate(ranked)}


def _check_input(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]) -> None:
    """One line naming the first id that is not a string (ir-measures fails deep inside on it) or
    NaN score (it sorts anywhere: its metric would be a plausible made-up number)."""
    for kind, table in (("qrels", qrels), ("run", run)):
        for q, docs in table.items():
            bad = q if not isinstance(q, str) else next((d for d in docs if not isinstance(d, str)), None)
            if bad is not None:
                raise InputError(
                    f"{kind} id {bad!r} is a {type(bad).__name__}, not a string; ids are matched as strings, "
                    "as in TREC files: convert them with str()"
                )
    for q, docs in run.items():
        for d, score in docs.items():
            if not is_real(score):  # (None or "2" failed in the sort, a TypeError)
                raise InputError(
                    f"query {q!r}, document {d!r} has score {score!r}, a {type(score).__name__}; a run's scores are numbers"
                )
            if score != score:
                raise InputError(
                    f"query {q!r}, document {d!r} has score nan; a run needs numbers to rank by "
                    "(check the model's dtype and weights, or give unscored documents a low finite score)"
                )
    check_labels(qrels)  # (a label "1" or 1.7 failed inside ir-measures, blamed on a metric)


def check_rel(rel: Any) -> None:
    """``rel``, the lowest label that counts as relevant: a whole number >= 1 (rel=-1 counted a
    label 0 as relevant for RR but not for R or AP)."""
    if not is_count(rel):
        raise InputError(f"rel={rel!r} must be a whole number >= 1: the lowest label that counts as relevant")


def check_labels(qrels: Mapping[str, Mapping[str, Any]]) -> None:
    """Every relevance label of ``qrels`` a whole number (:func:`is_label`)."""
    for q, docs in qrels.items():
        bad = next((d for d, label in docs.items() if not is_label(label)), None)
        if bad is not None:
            raise InputError(
                f"qrels of query {q!r}, document {bad!r}: label {docs[bad]!r} is not a whole number; "
                "relevance labels are integers (0 = not relevant)"
            )


def is_label(value: Any) -> bool:
    """A relevance label: an integer (numpy's too; not a bool, not a float)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def coverage_notes(run: Mapping[str, Mapping[str, Any]], qrels: Mapping[str, Mapping[str, int]]) -> list[str]:
    """What a mean over ``qrels``' judged queries reads otherwise than a reader of ``run`` may
    expect, one line each: judged queries the run lacks (0 in every mean, as trec_eval -c), the
    run's queries that have no judgment (left out of every mean), and a run none of whose ranked
    documents is judged (every metric 0: ids of another corpus, or spelled otherwise). Why: an
    evaluation said nothing of either, and returned plausible means."""
    judged = judged_queries(qrels)
    notes = []
    unranked = [q for q in judged if not run.get(q)]
    if unranked:
        notes.append(
            f"{len(unranked)} of the {len(judged)} judged queries (first: {unranked[0]!r}) have no ranking in the run; "
            "they score 0 in every mean (as trec_eval -c); give qrels of the run's queries only to leave them out"
        )
    unjudged = [q for q in run if q not in judged]
    if unjudged and len(unjudged) < len(run):  # (none judged at all: refused by the callers)
        notes.append(
            f"{len(unjudged)} of the run's {len(run)} queries (first: {unjudged[0]!r}) have no judgments in the qrels; "
            "they are left out of every mean (as trec_eval leaves them)"
        )
    run_queries = _by_spelling(run)
    alike_q = [(q, run_queries[_spelling(q)]) for q in unranked if _spelling(q) in run_queries]
    if alike_q:
        (q, r), n = alike_q[0], len(alike_q)
        verb = "query the run lacks matches" if n == 1 else "queries the run lacks match"
        notes.append(
            f"{n} judged {verb} one of its query ids but for leading zeros, case or spaces (the qrels' {q!r}, "
            f"the run's {r!r}); give both files the same ids"
        )
    misspelt = [(q, d, r) for q in judged if run.get(q) for d, r in _ranked_otherwise(judged[q], run[q])]
    if misspelt:
        q, d, r = misspelt[0]
        notes.append(
            f"{len(misspelt)} judged document(s) are ranked under another spelling of their id, leading zeros, case "
            f"or spaces (for {q!r} the run ranks {r!r}, the qrels judge {d!r}): they count as not retrieved, so the "
            "metrics read low; give both files the same ids"
        )
    ranked = [(q, d) for q, docs in run.items() for d in docs]
    example = next(((q, next(iter(v))) for q, v in judged.items() if v), None)
    if ranked and example and not any(d in judged.get(q, {}) for q, d in ranked):
        (q, d), (jq, jd) = ranked[0], example
        notes.append(
            f"no document the run ranks is judged (the run ranks {d!r} for {q!r}; the qrels judge {jd!r} for "
            f"{jq!r}), so every metric reads 0; if the ids are another corpus's or spelled otherwise, give the "
            "qrels of the run's corpus"
        )
    return notes


def _spelling(id_: str) -> str:
    """An id as two tools may spell it otherwise: without surrounding spaces, leading zeros or case."""
    return id_.strip().lower().lstrip("0") or "0"


def _by_spelling(ids: Mapping[str, Any]) -> dict[str, str]:
    """``{spelling: id}`` of a mapping's keys (:func:`_spelling`)."""
    return {_spelling(i): i for i in ids}


def _ranked_otherwise(labels: Mapping[str, Any], ranked: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(judged id, ranked id)`` of each judged document not ranked as it is spelt but ranked
    under another spelling (:func:`_spelling`)."""
    spelt = _by_spelling(ranked)
    return [(d, spelt[_spelling(d)]) for d in labels if d not in ranked and _spelling(d) in spelt]


def judged_queries(qrels: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """The queries of ``qrels`` with at least one judgment: an empty judgment set is one trec_eval
    never sees, so it is not averaged."""
    return {q: dict(v) for q, v in qrels.items() if v}


def _takes_rel(name: str, measure: Any) -> bool:
    """Whether the caller's ``rel`` applies to the metric ``name`` (parsed: ``measure``): every
    measure with a threshold (Rprec, Bpref, SetP, ... too), unless the name sets its own; not
    NumRet, which counts every document retrieved (with rel it is NumRelRet, an alias that reads as
    NumRet(rel=1): its rel is the caller's where the name gives none). Graded nDCG takes none."""
    if name.strip().startswith("NumRelRet") and "rel=" not in name:
        return True
    return "rel" in measure.SUPPORTED_PARAMS and "rel" not in measure.params and measure.NAME != "NumRet"


def reads_rel(metrics: Sequence[str]) -> bool:
    """Whether ``--rel`` reaches any of ``metrics`` (as :func:`evaluate` applies it)."""
    irm = require("ir_measures", "eval", "Evaluation metrics")
    return any(_takes_rel(m, irm.parse_measure(m)) for m in metrics)


def _check_own_rels(metrics: Sequence[str], qrels: Mapping[str, Mapping[str, int]]) -> None:
    """Refuse a metric that sets its own rel (``P(rel=3)@5``) above every label of ``qrels``: it
    reads 0 with nothing said, as ``rel`` would (``attnrank eval`` takes no such name)."""
    irm = require("ir_measures", "eval", "Evaluation metrics")
    top = highest_label(qrels)
    for m in metrics:
        own = irm.parse_measure(m).params.get("rel")
        if own is not None and 1 <= top < own:
            raise InputError(
                f"metric {m!r} counts labels of {own} and above as relevant, and the highest label of the qrels "
                f"is {top}, so it reads 0; give it a rel of {top} or lower"
            )


def evaluate(
    run: Mapping[str, Mapping[str, float]] | Iterable[RankedResults],
    qrels: Mapping[str, Mapping[str, int]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    rel: int = 1,
    warn: bool = True,
) -> dict[str, float]:
    """Mean of each metric over the queries that have judgments (a query the run lacks is an empty
    ranking, as trec_eval -c: 0 for every ranking metric); refused
    where no query has one (a mean over none read as a score of 0). With ``warn``, what moves the
    means unseen is logged (:func:`coverage_notes`): judged queries the run lacks, run queries
    left out, a run none of whose documents is judged."""
    names = list(_parse(check_metric_list(metrics), rel))
    run = as_run(run)  # (a list of RankedResults, as write_run takes; another shape: one line)
    _check_input(run, qrels)  # here too: a run id 1 would not meet the qrels' "1" and score 0
    judged = judged_queries(qrels)
    if not judged:
        raise InputError(
            f"the qrels judge no query ({len(qrels)} given, none with a judgment), so there is no mean to "
            "report; pass the qrels of the run's queries"
        )
    if run and not any(q in judged for q in run):  # (a mean of 0 over the qrels' queries, as attnrank eval refuses)
        raise InputError(
            f"none of the run's {len(run)} queries has judgments in the qrels (e.g. {next(iter(run))!r}); pass "
            "the qrels of the run's queries, or check that both spell the query ids alike"
        )
    if reads_rel(names):
        check_relevance_level(judged, rel, "rel")  # (above every label: every binary metric 0, without a word)
    _check_own_rels(names, judged)
    for note in coverage_notes(run, judged) if warn else ():
        logger.warning("%s", note)
    # queries with judgments but no run score 0, as trec_eval -c does
    full_run = {q: dict(run.get(q, {})) for q in judged}
    per = evaluate_per_query(full_run, judged, metrics, rel=rel)
    return {n: sum(v[n] for v in per.values()) / len(per) for n in names}


def evaluate_per_query(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    *,
    rel: int = 1,
) -> dict[str, dict[str, float]]:
    """``{query_id: {metric: value}}`` for every judged query (a query the run lacks is evaluated
    as an empty ranking: 0 for every ranking metric, NumRel and NumQ as trec_eval -c gives them)."""
    irm = require("ir_measures", "eval", "Evaluation metrics")
    names_of: dict[Any, list[str]] = {}
    for name, measure in _parse(check_metric_list(metrics), rel).items():
        names_of.setdefault(measure, []).append(name)
    _check_input(run, qrels)
    # (labels as Python ints, checked integers above: pytrec_eval refused numpy's, blamed on a metric)
    judged = {q: {d: int(label) for d, label in v.items()} for q, v in judged_queries(qrels).items()}
    per: dict[str, dict[str, float]] = {q: {n: 0.0 for ns in names_of.values() for n in ns} for q in judged}
    run_d = {q: _trec_order(d) for q, d in run.items() if d}
    # A judged query the run lacks is ranked as one unjudged document (ir-measures reports nothing
    # for a query without one): every metric then reads as trec_eval -c gives it for an empty
    # ranking, counts of the qrels (NumRel) included, which a 0 filled in here got wrong; only
    # NumRet would count that document, and is 0.
    empty = [q for q in judged if q not in run_d]
    run_d.update({q: {_NOTHING: 1.0} for q in empty})
    try:
        for metric in irm.iter_calc(list(names_of), judged, run_d):
            if metric.query_id in per:
                value = float(metric.value)
                if metric.query_id in empty and metric.measure.NAME == "NumRet" and "rel" not in metric.measure.params:
                    value = 0.0
                for name in names_of[metric.measure]:
                    per[metric.query_id][name] = value
    except Exception as e:  # (a provider that fails, as gdeval's ERR@10 on any input: its own traceback)
        raise InputError(
            f"ir-measures could not compute {list(metrics)} ({type(e).__name__}: {e}); leave out the metric "
            "it fails on (e.g. ERR@10) or compute it with its own tool"
        ) from e
    return per


_NOTHING = "\x00attnrank: no document"  # (no qrels can judge it: an id holds no NUL in a TREC file)


def wins_losses(deltas: Iterable[float], eps: float = 1e-9) -> tuple[int, int]:
    """How many per-query differences rose / fell by more than ``eps`` (ties not counted). A
    negative ``eps`` (a tie counted as a win and a loss) and a difference that is no finite number
    (a broken per-query metric, counted as a tie) are refused."""
    if not is_real(eps) or not 0 <= eps < math.inf:
        raise InputError(f"eps={eps!r} must be a finite number >= 0 (the smallest change counted)")
    values = list(deltas)
    bad = next((d for d in values if not is_real(d) or not math.isfinite(d)), None)
    if bad is not None:
        raise InputError(f"a per-query difference is {bad!r}, not a finite number; check the per-query metrics")
    return sum(d > eps for d in values), sum(d < -eps for d in values)


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial sign test p-value of ``wins`` against ``losses`` (ties dropped),
    by SciPy's ``binomtest`` (an exact sum of big-integer binomials took seconds from 8,000 queries
    on, and gave p 0 for a negative count)."""
    from scipy.stats import binomtest  # (a dependency of sentence-transformers)

    if not (is_count(wins, 0) and is_count(losses, 0)):
        raise InputError(f"sign_test({wins!r}, {losses!r}): wins and losses are counts (whole numbers >= 0)")
    n = int(wins) + int(losses)
    return 1.0 if n == 0 else float(binomtest(int(wins), n, 0.5).pvalue)


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
    ``chunk`` scorers. Like :func:`evaluate_per_query`, only queries with judgments are in it (one
    absent from ``qrels`` or with an empty judgment set is left out)."""
    import numpy as np

    judged = {q: s for q, s in scores.items() if qrels.get(q)}
    if not judged:
        return {}
    out = {q: np.zeros(len(s)) for q, s in judged.items()}
    n = len(next(iter(judged.values())))  # scorers, the same for every query
    for q, s in judged.items():  # else the scorers a query lacks, or candidates zip drops, score 0
        if np.shape(s) != (n, len(doc_ids[q])):
            raise InputError(
                f"scores of query {q!r} have shape {np.shape(s)}, not ({n}, {len(doc_ids[q])}): give every "
                "query one row per scorer (as many as the first query's) and one column per candidate"
            )
    for lo in range(0, n, chunk):
        run = {
            f"{q}::{h}": dict(zip(doc_ids[q], map(float, s[h])))
            for q, s in judged.items()
            for h in range(lo, min(n, lo + chunk))
        }
        per = evaluate_per_query(run, {key: qrels[key.rsplit("::", 1)[0]] for key in run}, [f"nDCG@{k}"], rel=rel)
        for key, v in per.items():
            q, h = key.rsplit("::", 1)
            out[q][int(h)] = v[f"nDCG@{k}"]
    return out
