"""Query-focused retrieval heads (QRHead, CoRe).

**Query-focused** (QRHead, Zhang et al., EMNLP 2025; CoRe, Tran et al., arXiv 2510.02219), from
the reranker's per-head window rows and labelled candidates. With ``S_h(d)`` the head's
calibrated, per-head μ−2σ-filtered document score (:func:`per_head_document_scores`):

- ``qr-score``:    mean over queries of Σ_{d∈D⁺} S_h(d)            (QRHead's QRScore)
- ``qr-ndcg``:     mean nDCG@10 of S_h used alone as the reranker   (QRHead's BEIR selection)
- ``contrastive``: mean over queries of mean_{D⁺} S_h − mean_{D⁻} S_h (CoRe-style: CoRe contrasts
  the raw attention mass to relevant and irrelevant documents; here the same calibrated, filtered
  ``S_h`` as the other two)

Every detector returns :class:`HeadScores` (an ``L×H`` matrix, NaN = not measured).
"""

from __future__ import annotations

import datetime as _dt
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from ..eval.metrics import per_query_ndcg_of_each
from ..llm.rows import window_features
from .scores import HeadScores

QR_METHODS = ("qr-score", "qr-ndcg", "contrastive")


def query_focused_scores(
    items: Iterable[tuple[str, Sequence[Any], Sequence[str]]],
    qrels: Mapping[str, Mapping[str, int]],
    head_list: Sequence[tuple[int, int]],
    n_layers: int,
    n_heads: int,
    *,
    rel: int = 1,
    k: int = 10,
    calibrate: bool = True,
    use_filter: bool = True,
    data: str = "",
    model_id: str = "",
    fingerprint: str = "",
    adapter: str = "",
    read: Mapping[str, Any] | None = None,
) -> dict[str, HeadScores]:
    """QR scores from precomputed window rows: ``items`` yields ``(qid, windows, candidate ids)``
    (``windows`` from :meth:`AttentionReranker.windows` over the candidates in that order, rows in
    ``head_list`` order); ``read``: how the rows were captured (capture mode, prompt settings),
    recorded in each result's params. Returns ``{"qr-score", "qr-ndcg", "contrastive"}`` →
    :class:`HeadScores`."""
    start = time.perf_counter()
    n = len(head_list)
    sums = {"qr-score": np.zeros(n), "contrastive": np.zeros(n)}
    used = {"qr-score": 0, "contrastive": 0}
    feats: dict[str, tuple[list[str], np.ndarray]] = {}
    seen = 0
    for qid, windows, cand in items:
        cand = [str(c) for c in cand]
        if len(set(cand)) != len(cand):
            raise InputError(f"query {qid!r} has duplicate candidate ids; give each candidate once")
        f = window_features(windows, len(cand), calibrate=calibrate, use_filter=use_filter)
        labels = np.array([qrels.get(qid, {}).get(d, 0) for d in cand])
        gold = labels >= rel
        seen += 1
        # qr-ndcg: nDCG's gains are the graded labels (rel does not cut them), so a query with any judged
        # candidate can tell heads apart (at rel 2, one of grade-1 passages alone was dropped: heads tied)
        if (labels > 0).any():
            feats[qid] = (cand, f)
        if gold.any():  # (a query without one scores 0 for every head under qr-score)
            sums["qr-score"] += f[:, gold].sum(1)
            used["qr-score"] += 1
        if gold.any() and (~gold).any():
            sums["contrastive"] += f[:, gold].mean(1) - f[:, ~gold].mean(1)
            used["contrastive"] += 1
    per_query = per_query_ndcg_of_each(
        {q: f for q, (_, f) in feats.items()}, {q: c for q, (c, _) in feats.items()}, qrels, rel=rel, k=k
    )  # queries with judgments only, as evaluate_per_query
    ndcg = np.sum(list(per_query.values()), axis=0) if per_query else np.zeros(n)
    seconds = time.perf_counter() - start
    out = {}
    for method, vec, m in (
        ("qr-score", sums["qr-score"], used["qr-score"]),
        ("qr-ndcg", ndcg, len(per_query)),
        ("contrastive", sums["contrastive"], used["contrastive"]),
    ):
        matrix = np.full((n_layers, n_heads), np.nan)
        note = "" if m else f"no usable query among {seen} (none has gold and, for contrastive, non-gold candidates)"
        if m:
            for (l, h), v in zip(head_list, vec / m):
                matrix[l, h] = v
        params = {"rel": rel, "k": k, "calibrate": calibrate, "use_filter": use_filter, **(read or {})}
        out[method] = HeadScores(
            matrix,
            method,
            params,
            f"{data}; {m}/{seen} queries used".lstrip("; "),
            seconds,
            seen,
            m,
            note,
            model_id,
            fingerprint,
            adapter=adapter,
        )
    return out


def detect_query_focused(
    reranker: Any,
    queries: Mapping[str, str],
    candidates: Mapping[str, Sequence[Any]],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    rel: int = 1,
    data: str = "",
    show_progress: bool = False,
    shuffle_seed: int | None = 42,
) -> dict[str, HeadScores]:
    """Run ``reranker.windows`` for each labelled query over its candidate documents, then
    :func:`query_focused_scores`. Build the reranker as the heads will be read: every head over
    the full prompt is ``AttentionReranker(llm, config="icr")`` (``heads=None`` alone selects the
    default preset with attention, ``fused``, whose rows are block attention's). How its rows were
    captured (capture mode, prompt settings, the shuffle seed) is recorded in the results' params.

    Each query's candidates are shuffled first (seeded by ``shuffle_seed``, 42 as QRHead's
    detection seeds it, and the query's id, so that a query's order does not depend on the
    queries before it; None: kept in the given order): in first-stage order, a head that attends
    to the slot nearest the query would score as the first stage does, and be chosen for it.
    Candidate ids and relevance are checked before any query runs."""
    reweight = getattr(reranker, "reweight", None)
    if reweight is not None and reweight.changes_scores:
        # (the rows are scored as captured: a set detected "for" re-weighted attention was plain attention's)
        raise InputError(
            f"detection scores each head's plain rows, so a reranker with reweight={reweight!r} would detect "
            "the heads of attention without it; build the reranker without reweight to detect"
        )
    qids = [q for q in queries if q in candidates]
    if not qids:
        raise InputError("no query has candidates; give candidates for the labelled queries")
    ids = {q: [str(getattr(d, "id", i)) for i, d in enumerate(candidates[q])] for q in qids}
    for q in qids:  # (found in the query's turn before, after the model had run the ones before it)
        if len(set(ids[q])) != len(ids[q]):
            raise InputError(f"query {q!r} has duplicate candidate ids; give each candidate once")
    if not any(qrels.get(q, {}).get(d, 0) >= 1 for q in qids for d in ids[q]):  # (qr-ndcg reads grades below rel)
        raise InputError(
            f"no candidate of the {len(qids)} queries is judged relevant (a qrels grade >= 1 for a query and document "
            "id of theirs), so no head can be scored; check that the qrels' ids match the queries' and candidates'"
        )

    def items():
        it = qids
        if show_progress:
            from tqdm.auto import tqdm

            it = tqdm(qids, desc="detect", unit="q")
        for q in it:
            docs = list(zip(ids[q], candidates[q]))  # (the ids checked above, paired before the shuffle)
            if shuffle_seed is not None:
                random.Random(f"{shuffle_seed}:{q}").shuffle(docs)
            yield q, reranker.windows(queries[q], [d for _, d in docs]), [i for i, _ in docs]

    llm = reranker.llm
    stamp = _dt.date.today().isoformat()
    return query_focused_scores(
        items(),
        qrels,
        reranker.head_list,
        llm.num_layers,
        llm.num_heads,
        rel=rel,
        calibrate=reranker.calibrate,
        use_filter=reranker.token_filter,
        data=data or f"{len(qids)} labelled queries ({stamp})",
        model_id=llm.model_id,
        fingerprint=llm.fingerprint,
        adapter=llm.adapter,
        read={
            "capture": reranker.config.capture,
            "prompt": reranker.config.prompt_settings(),
            "shuffle_seed": shuffle_seed,
        },
    )
