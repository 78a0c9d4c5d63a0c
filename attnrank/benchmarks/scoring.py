"""Scores the benchmarks compute from cached attention rows: ICR passage scores, within-query
ranks, attention's agreement with the first-stage order, head selections, and the fused scorer's
examples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import rankdata, spearmanr
from sklearn.linear_model import LogisticRegression

from ..errors import InputError
from ..eval.datasets import Dataset
from ..eval.rows import Signals
from ..heads.queryfocused import query_focused_scores
from ..llm.rows import check_finite, check_spans, document_scores, keep_mask, token_scores
from ..rerank.fused import ATTENTION
from ..rerank.fused_features import FusionExample
from ..rerank.learned.features import standardise
from ..types import Document

AGGREGATES = ("sum", "mean", "max")  # how icr_scores turns a passage's token scores into one


def icr_scores(
    windows: Sequence[Any],
    n_docs: int,
    head_idx: Any = None,
    calibrate: bool = True,
    use_filter: bool = True,
    aggregate: str = "sum",
) -> np.ndarray:
    """ICR document scores (input order) from cached windows, optionally for a subset of heads;
    ``aggregate`` over a passage's token scores: ``"sum"`` (ICR, after its μ − 2σ filter),
    ``"mean"`` (of the tokens the filter keeps: no advantage for a long passage) or ``"max"``
    (its single most attended token)."""

    if aggregate not in AGGREGATES:
        raise InputError(f"aggregate={aggregate!r} is not one of {AGGREGATES}")
    s = np.zeros(n_docs)
    for w in windows:
        rows = w.rows if calibrate else w.real.astype(np.float64)
        tokens = token_scores(rows if head_idx is None else rows[head_idx])
        if aggregate == "sum":
            s[w.doc_index] = document_scores(tokens, w.spans, use_filter=use_filter)
            continue
        check_finite(tokens)
        check_spans(w.spans, tokens.shape[0])
        for i, (a, b) in zip(w.doc_index, w.spans):
            seg = tokens[a:b]
            s[i] = seg.max() if aggregate == "max" else seg[keep_mask(seg, use_filter)].mean()
    return s


def within_query_ranks(values: np.ndarray) -> np.ndarray:
    """Each candidate's rank among the query's candidates (0 = lowest value; ties share their
    mean rank): a feature scale that one outlying score cannot stretch, as it stretches a z-score."""

    return rankdata(np.asarray(values, dtype=np.float64)) - 1.0


def order_agreement(
    captured: dict[str, dict[str, Any]], signals: Signals, cands: dict[str, list[Document]]
) -> dict[str, float]:
    """Mean within-query Spearman correlation of each score with the candidates' first-stage
    order (1: the same order) — attention (every head's calibrated ICR score), ``bm25`` and
    ``dense`` — and of attention with ``bm25`` and with ``dense``. Why: in the prompt the first
    stage's best candidate sits next to the query (reverse order), so an attention score that
    follows the order more closely than the signals the order was made from echoes the slot, not
    the text (docs/benchmarks.md)."""

    pairs: dict[str, list[float]] = {}
    for q, docs in cands.items():
        order = -np.arange(len(docs), dtype=np.float64)
        att = icr_scores(captured[q]["windows"], len(docs))
        bm25, dense = (np.asarray(signals[q][k], dtype=np.float64) for k in ("bm25", "dense"))
        for name, a, b in (
            ("attention vs order", att, order),
            ("bm25 vs order", bm25, order),
            ("dense vs order", dense, order),
            ("attention vs bm25", att, bm25),
            ("attention vs dense", att, dense),
        ):
            if np.ptp(a) > 0 and np.ptp(b) > 0:  # a constant score has no rank correlation
                pairs.setdefault(name, []).append(float(spearmanr(a, b)[0]))
    return {name: float(np.mean(v)) for name, v in pairs.items()}


def _ndcg10_of_candidates(scores: np.ndarray, labels: np.ndarray, rel: int) -> float:
    """nDCG@10 of ``scores`` over the candidates' own labels (gain ``2^label − 1`` for labels of at
    least ``rel``, else 0; the ideal from the candidates): a fast proxy for selection only, the
    reported figures use ir-measures over every judgement."""
    gains = np.where(labels >= rel, labels, 0).astype(np.float64)
    if not gains.any():
        return 0.0
    disc = 1.0 / np.log2(np.arange(2, 12))
    top = np.argsort(-scores, kind="stable")[:10]
    ideal = np.sort(gains)[::-1][:10]
    return float(((2 ** gains[top] - 1) * disc[: len(top)]).sum() / ((2**ideal - 1) * disc[: len(ideal)]).sum())


def complementary_heads(
    per_head: dict[str, dict[str, np.ndarray]], examples: dict[str, Sequence[Any]], n: int, l2: float = 1.0
) -> list[int]:
    """The ``n`` heads whose own passage scores add most to the first-stage signals, a selection
    for the fused scorer rather than for ranking alone (QRHead's criterion, :func:`head_quality`).

    For each head: a pointwise logistic fusion (the fused scorer's model, its negative weights
    set to 0 rather than dropped and refitted) of the
    per-query z-scored ``bm25``, ``dense``, ``rank`` and that head's score (``per_head[group][qid]``,
    ``[heads, candidates]``), fitted on every query of ``examples`` (``{group: FusionExamples}``)
    pooled; its gain in nDCG@10 (:func:`_ndcg10_of_candidates`) over the same fusion without the
    head, in-sample, averaged per group and then over groups."""

    base = {
        g: [standardise(np.column_stack([e.signals[k] for k in ("bm25", "dense", "rank")])) for e in ex]
        for g, ex in examples.items()
    }
    y = np.concatenate([e.labels >= e.rel for ex in examples.values() for e in ex]).astype(int)

    def gain_of(cols: dict[str, list[np.ndarray]]) -> dict[str, float]:
        x = np.vstack([c for g in examples for c in cols[g]])
        w = np.maximum(LogisticRegression(C=1.0 / l2, max_iter=2000).fit(x, y).coef_[0], 0.0)
        return {
            g: float(np.mean([_ndcg10_of_candidates(c @ w, e.labels, e.rel) for c, e in zip(cols[g], ex)]))
            for g, ex in examples.items()
        }

    without = gain_of(base)
    n_heads = next(iter(next(iter(per_head.values())).values())).shape[0]
    gains = np.zeros(n_heads)
    for h in range(n_heads):
        cols = {
            g: [np.column_stack([b, standardise(per_head[g][e.qid][h][:, None])]) for b, e in zip(base[g], ex)]
            for g, ex in examples.items()
        }
        got = gain_of(cols)
        gains[h] = np.mean([got[g] - without[g] for g in examples])
    return [int(i) for i in np.argsort(-gains, kind="stable")[:n]]


def head_quality(
    captured: dict[str, dict[str, Any]],
    cands: dict[str, list[Document]],
    qrels: dict[str, dict[str, int]],
    rel: int,
    reranker: Any,
) -> np.ndarray:
    """nDCG@10 of every captured head used alone (QRHead's BEIR selection, :func:`query_focused_scores`),
    averaged over the queries, in ``reranker.head_list`` order.

    Over the benchmark's captured rows, whose candidates stand in first-stage order (unlike
    :func:`~attnrank.heads.queryfocused.detect_query_focused`, which shuffles them as QRHead does):
    a head that attends to the slot the first stage's best candidate holds scores here as the
    first stage does, and may be chosen for it. The benchmark head sets are chosen so."""

    items = [(q, c["windows"], [d.id for d in cands[q]]) for q, c in captured.items()]
    llm = reranker.llm
    hs = query_focused_scores(items, qrels, reranker.head_list, llm.num_layers, llm.num_heads, rel=rel)["qr-ndcg"]
    return np.array([hs.scores[l, h] for l, h in reranker.head_list])


def fusion_examples_from_rows(
    group: str,
    ds: Dataset,
    cands: dict[str, list[Document]],
    captured: dict[str, dict[str, Any]],
    head_idx: Sequence[int] | None,
    signals: Signals,
    extra: Signals | None = None,
    *,
    calibrate: bool = True,
    use_filter: bool = True,
    aggregate: str = "sum",
    ranks: bool = False,
) -> list[Any]:
    """:class:`~attnrank.rerank.fused_features.FusionExample` per query from cached all-head rows: attention
    = the ICR score of the heads ``head_idx`` (None: all), the candidate ``signals``, and ``extra``
    signals carried for comparison only (e.g. the first stage's own BM25 and dense scores);
    ``calibrate``/``use_filter``: ICR's N/A calibration and μ − 2σ token filter; ``aggregate``: how
    a passage's token scores become its attention score (:func:`icr_scores`); ``ranks``: attention,
    ``bm25`` and ``dense`` as :func:`within_query_ranks`."""

    out = []
    for q, docs in cands.items():
        sig = {k: np.asarray(v, dtype=np.float64) for k, v in signals[q].items()}
        sig[ATTENTION] = icr_scores(captured[q]["windows"], len(docs), head_idx, calibrate, use_filter, aggregate)
        if ranks:
            sig.update({k: within_query_ranks(sig[k]) for k in (ATTENTION, "bm25", "dense")})
        for k, v in (extra or {}).get(q, {}).items():
            sig[k] = np.asarray(v, dtype=np.float64)
        labels = np.array([ds.qrels.get(q, {}).get(d.id, 0) for d in docs], dtype=np.int64)
        out.append(FusionExample(q, [d.id for d in docs], sig, labels, ds.rel, group, dict(ds.qrels.get(q, {}))))
    return out
