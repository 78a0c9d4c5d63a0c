"""The benchmarks' candidate sets and scorers over cached rows (used by ``scripts/bench_*.py``).

This module sits with the entry points: it drives the first stage (:mod:`attnrank.index`), the
reranker's scoring and head detection over data and rows that :mod:`attnrank.eval` loads and caches.
A candidate set is ``(setting name, Dataset, {qid: [Document, ...] in first-stage order})``:

- DL19: Pyserini's BM25 top-``k`` of each of the 43 topics (NIST qrels, rel ≥ 2);
- SciFact train: a seeded query sample (:func:`attnrank.eval.datasets.sample_queries`), the hybrid
  retriever's RRF top-``k`` over the whole corpus (index cached in ``index_dir``). RRF is pinned
  here, not taken from the index default (convex since the published candidate sets were made), so
  the published figures stay reproducible;
- HotpotQA distractor: each question's own (up to) 10 paragraphs ordered by BM25 (statistics of
  the pooled 400-question corpus); the 2 supporting paragraphs are relevant;
- LoCoMo: each question's conversation turns ordered by BM25 over that conversation, top-``k``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import rankdata, spearmanr
from sklearn.linear_model import LogisticRegression

from .config import index_root
from .errors import AttnrankError, InputError
from .eval.datasets import (
    Dataset,
    dl19,
    dl19_run_rows,
    hotpotqa,
    locomo,
    sample_queries,
    scifact,
)
from .eval.rows import Signals, cached_signals
from .heads.queryfocused import query_focused_scores
from .index.bm25 import BM25Index
from .index.embed import encode, load_embedder
from .index.hybrid import rrf
from .index.retriever import HybridRetriever
from .index.store import corpus_checksum
from .llm.models import LLM
from .llm.prompts import DEFAULT_MAX_DOC_WORDS
from .llm.rows import check_finite, check_spans, document_scores, keep_mask, token_scores
from .rerank.fused import ATTENTION, LIKELIHOOD, FusionExample
from .rerank.learned.features import standardise
from .rerank.likelihood import query_likelihood, query_prior
from .rerank.signals import SignalComputer
from .types import Document

logger = logging.getLogger(__name__)

CandidateSet = tuple[str, Dataset, dict[str, list[Document]]]
# cached_likelihoods' per-token arrays: candidates × query tokens, and the query's tokens alone
TOKEN_LIKELIHOOD = "token likelihood"
TOKEN_PRIOR = "token prior"


def dl19_sets(root: Path, depths: Sequence[int], max_queries: int | None = None) -> list[CandidateSet]:
    """DL19 BM25 top-``k`` for each ``k`` in ``depths`` (the first ``max_queries`` topics if set)."""
    ds = dl19(root)
    if max_queries:
        ds = ds.subset(list(ds.queries)[:max_queries])
    docs = {d.id: d for d in ds.docs}
    return [
        (f"DL19 BM25 top-{k}", ds, {q: [docs[i] for i in ds.candidates[q][:k]] for q in ds.queries}) for k in depths
    ]


def scifact_retriever(ds: Dataset, index_dir: Path | None = None):
    """The hybrid retriever over ``ds.docs``, loaded from ``index_dir`` (default
    ``<index root>/bench-scifact``) if it holds this corpus, else built and saved there; it fuses
    with RRF (k = 60) whatever the index records, as the published candidate sets did."""

    path = Path(index_dir) if index_dir is not None else index_root() / "bench-scifact"
    try:
        r = HybridRetriever.load(path)
    except (AttnrankError, OSError) as e:  # none yet, or unreadable: rebuild below
        logger.info("building the SciFact benchmark index (%s)", e)
        r = None
    if r is None or corpus_checksum(r.docs) != corpus_checksum(ds.docs):
        r = HybridRetriever(fusion="rrf").index(ds.docs, show_progress=False)
        r.save(path)
    r.set_fusion("rrf")
    return r


def scifact_set(root: Path, n_queries: int, k: int = 20, index_dir: Path | None = None) -> CandidateSet:
    """SciFact train: a seeded sample of ``n_queries`` labelled queries, hybrid RRF top-``k``."""
    ds = scifact(root)
    ds = ds.subset(sample_queries(ds.queries, n_queries))  # shuffled order: any prefix is a sample
    res = scifact_retriever(ds, index_dir).search_batch(ds.queries, k, mode="hybrid")
    return (
        f"SciFact train hybrid top-{k} ({len(ds.queries)} queries)",
        ds,
        {q: x.documents() for q, x in zip(ds.queries, res)},
    )


def scifact_bm25_set(root: Path, n_queries: int, k: int = 20) -> CandidateSet:
    """SciFact train: a seeded sample of ``n_queries`` labelled queries, BM25 top-``k`` over the
    whole corpus (no dense index needed)."""

    ds = scifact(root)
    ds = ds.subset(sample_queries(ds.queries, n_queries))
    bm25 = BM25Index().index([d.full_text for d in ds.docs])
    cands = {
        q: [ds.docs[i] for i in np.argsort(-bm25.get_scores(ds.queries[q]), kind="stable")[:k]] for q in ds.queries
    }
    return (f"SciFact train BM25 top-{k} ({len(ds.queries)} queries)", ds, cands)


def _bm25_ordered(ds: Dataset, qids: Sequence[str], k: int | None = None) -> dict[str, list[Document]]:
    """Each query's candidates (deduplicated) by BM25 over the pooled ``ds.docs``, top ``k``."""

    bm25 = BM25Index().index([d.full_text for d in ds.docs])
    pos = {d.id: i for i, d in enumerate(ds.docs)}
    out = {}
    for q in qids:
        scores = bm25.get_scores(ds.queries[q])
        ids = sorted(dict.fromkeys(ds.candidates[q]), key=lambda d: -scores[pos[d]])
        out[q] = [ds.docs[pos[d]] for d in ids[:k]]
    return out


def hotpot_set(root: Path, n_queries: int | None = None) -> CandidateSet:
    """HotpotQA distractor: the first ``n_queries`` questions, their paragraphs in BM25 order."""
    ds = hotpotqa(root)
    ds = ds.subset(list(ds.queries)[:n_queries] if n_queries else list(ds.queries))
    return (f"HotpotQA distractor BM25-ordered ({len(ds.queries)} questions)", ds, _bm25_ordered(ds, list(ds.queries)))


def locomo_set(root: Path, n_queries: int | None = None, k: int = 20) -> CandidateSet:
    """LoCoMo: a seeded sample of ``n_queries`` questions; per question its conversation's turns
    ordered by BM25 (statistics of that conversation's turns), top ``k``."""

    ds = locomo(root)
    ds = ds.subset(sample_queries(ds.queries, n_queries))
    docs = {d.id: d for d in ds.docs}
    cands: dict[str, list[Document]] = {}
    by_conv: dict[str, list[str]] = {}
    for q in ds.queries:
        by_conv.setdefault(q.split(":")[0], []).append(q)
    for qids in by_conv.values():
        turns = [docs[i] for i in ds.candidates[qids[0]]]
        bm25 = BM25Index().index([d.full_text for d in turns])
        for q in qids:
            order = np.argsort(-bm25.get_scores(ds.queries[q]), kind="stable")[:k]
            cands[q] = [turns[i] for i in order]
    return (f"LoCoMo turns BM25 top-{k} ({len(ds.queries)} queries)", ds, cands)


# -- first-stage signals of the candidates ------------------------------------------------------
def stage_signals(
    root: Path,
    setting: str,
    ds: Dataset,
    cands: dict[str, list[Document]],
    cache: Path | None,
    index_dir: Path | None = None,
) -> Signals:
    """``{qid: {"bm25": [...], "dense": [...]}}`` over each query's candidates (input order), the
    scores a :class:`HybridRetriever` leaves in ``ScoredDocument.stage_scores``: for SciFact its
    own results (NaN where a side did not return the passage), for DL19 the run's Pyserini BM25
    scores, otherwise BM25 over the pooled documents; ``dense`` = MiniLM cosine. Cached as JSON
    (:func:`attnrank.eval.rows.cached_signals`)."""
    return cached_signals(setting, list(cands), lambda qids: _signals(root, setting, ds, cands, qids, index_dir), cache)


def _signals(
    root: Path, setting: str, ds: Dataset, cands: dict[str, list[Document]], qids: list[str], index_dir: Path | None
) -> dict[str, dict[str, list[float]]]:

    if setting.startswith("SciFact"):  # the hybrid retriever's own stage scores
        res = scifact_retriever(ds, index_dir).search_batch(
            {q: ds.queries[q] for q in qids}, len(cands[qids[0]]), mode="hybrid"
        )
        out = {}
        for q, r in zip(qids, res):
            by_id = {d.id: d.stage_scores for d in r.results}
            out[q] = {s: [by_id.get(d.id, {}).get(s, float("nan")) for d in cands[q]] for s in ("bm25", "dense")}
        return out
    if setting.startswith("DL19"):
        runs = {r["qid"]: {c["docid"]: c["score"] for c in r["candidates"]} for r in dl19_run_rows(root)}
        bm25 = {q: [runs[q][d.id] for d in cands[q]] for q in qids}
    else:
        index = BM25Index().index([d.full_text for d in ds.docs])
        pos = {d.id: i for i, d in enumerate(ds.docs)}
        bm25 = {q: index.get_scores(ds.queries[q])[[pos[d.id] for d in cands[q]]].tolist() for q in qids}
    model = load_embedder()
    docs = {d.id: d for q in qids for d in cands[q]}
    emb = dict(zip(docs, encode(model, [d.full_text for d in docs.values()])))
    qemb = encode(model, [ds.queries[q] for q in qids])
    return {q: {"bm25": bm25[q], "dense": [float(emb[d.id] @ v) for d in cands[q]]} for q, v in zip(qids, qemb)}


def rrf_order(*scores: Sequence[float]) -> np.ndarray:
    """Reciprocal-rank fusion (the retriever's :func:`attnrank.index.hybrid.rrf`) of score lists
    over the same candidates, as scores in candidate order; NaN = not returned by that list."""

    rankings = []
    for s in scores:
        a = np.asarray(s, dtype=np.float64)
        rankings.append(
            np.array(
                [i for i in np.argsort(-np.nan_to_num(a, nan=-np.inf), kind="stable") if np.isfinite(a[i])],
                dtype=np.int64,
            )
        )
    ids, fused = rrf(rankings, len(scores[0]))
    out = np.zeros(len(scores[0]))
    out[ids] = fused
    return out


# -- scores from cached rows --------------------------------------------------------------------
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
    averaged over the queries, in ``reranker.head_list`` order."""

    items = [(q, c["windows"], [d.id for d in cands[q]]) for q, c in captured.items()]
    llm = reranker.llm
    hs = query_focused_scores(items, qrels, reranker.head_list, llm.num_layers, llm.num_heads, rel=rel)["qr-ndcg"]
    return np.array([hs.scores[l, h] for l, h in reranker.head_list])


# -- the fused scorer's material ----------------------------------------------------------------
def candidate_signals(setting: str, ds: Dataset, cands: dict[str, list[Document]], cache: Path | None) -> Signals:
    """The fused scorer's first-stage signals of each query's candidates (BM25 over the candidate
    texts, MiniLM cosine, rank: :class:`attnrank.rerank.signals.SignalComputer`), cached as JSON."""

    sc = SignalComputer()

    def compute(qids: list[str]) -> dict[str, dict[str, list[float]]]:
        return {q: {k: v.tolist() for k, v in sc(ds.queries[q], [d.full_text for d in cands[q]]).items()} for q in qids}

    # (the name says which BM25 terms: a cache of the earlier Lucene-stopword signals is not read)
    return cached_signals("candidate signals, sklearn stopwords, " + setting, list(cands), compute, cache)


def cached_likelihoods(
    llm: LLM,
    setting: str,
    ds: Dataset,
    cands: dict[str, list[Document]],
    cache: Path | None,
    chunk: int = 25,
    max_doc_words: int = DEFAULT_MAX_DOC_WORDS,
) -> Signals:
    """Each query's candidates' query likelihood, passages cut to ``max_doc_words``: per token
    (``TOKEN_LIKELIHOOD``, candidates × query tokens, :func:`attnrank.rerank.likelihood.query_likelihood`),
    its mean per candidate (``LIKELIHOOD``, UPR's score) and the query's tokens after an empty
    passage (``TOKEN_PRIOR``, :func:`~attnrank.rerank.likelihood.query_prior`). Cached as JSON per model weights and
    precision; computed ``chunk`` queries at a time, each chunk saved (a long run that stops keeps
    what it computed)."""
    key = f"query token likelihood {llm.short_key} words {max_doc_words} {setting}"
    qids = list(cands)

    def compute(todo: list[str]) -> dict[str, dict[str, list]]:
        out = {}
        for q in todo:
            tokens = query_likelihood(llm, ds.queries[q], cands[q], max_doc_words=max_doc_words)
            prior = query_prior(llm, ds.queries[q])
            out[q] = {TOKEN_LIKELIHOOD: tokens.tolist(), TOKEN_PRIOR: prior.tolist()}
        return out

    for i in range(0, len(qids), chunk):
        cached_signals(key, qids[i : i + chunk], compute, cache)
        logger.info("%s: likelihood %d/%d", setting, min(i + chunk, len(qids)), len(qids))
    found = cached_signals(key, qids, compute, cache)
    for sig in found.values():
        sig[LIKELIHOOD] = sig[TOKEN_LIKELIHOOD].mean(axis=1)
    return found


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
    """:class:`~attnrank.rerank.fused.FusionExample` per query from cached all-head rows: attention
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
