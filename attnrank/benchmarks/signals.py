"""The first-stage and LLM signals of the benchmarks' candidates, cached as JSON per setting
(:func:`attnrank.eval.rows.cached_signals`): the first stage's own scores, the fused scorer's
candidate signals, and the query likelihood (UPR)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..eval.datasets import Dataset, dl19_run_rows
from ..eval.rows import Signals, cached_signals
from ..index.bm25 import BM25Index
from ..index.embed import encode, load_embedder
from ..index.hybrid import rrf
from ..llm.models import LLM
from ..llm.prompts import DEFAULT_MAX_DOC_WORDS
from ..rerank.fused import LIKELIHOOD
from ..rerank.likelihood import query_likelihood, query_prior
from ..rerank.signals import SignalComputer
from ..rerank.versions import SCORING_VERSION
from ..types import Document
from .sets import scifact_retriever

logger = logging.getLogger(__name__)

# cached_likelihoods' per-token arrays: candidates × query tokens, and the query's tokens alone
TOKEN_LIKELIHOOD = "token likelihood"
TOKEN_PRIOR = "token prior"


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
    return cached_signals(
        setting, list(cands), lambda qids: _signals(root, setting, ds, cands, qids, index_dir), cache, _ids(cands)
    )


def _signals(
    root: Path, setting: str, ds: Dataset, cands: dict[str, list[Document]], qids: list[str], index_dir: Path | None
) -> dict[str, dict[str, list[float]]]:

    if setting.startswith("SciFact train hybrid"):  # the hybrid retriever's own stage scores (scifact_set)
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
    emb = dict(zip(docs, encode(model, [d.full_text for d in docs.values()], role="document")))
    qemb = encode(model, [ds.queries[q] for q in qids], role="query")
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


def candidate_signals(setting: str, ds: Dataset, cands: dict[str, list[Document]], cache: Path | None) -> Signals:
    """The fused scorer's first-stage signals of each query's candidates (BM25 over the candidate
    texts, MiniLM cosine, rank: :class:`attnrank.rerank.signals.SignalComputer`), cached as JSON."""

    sc = SignalComputer()

    def compute(qids: list[str]) -> dict[str, dict[str, list[float]]]:
        return {q: {k: v.tolist() for k, v in sc(ds.queries[q], [d.full_text for d in cands[q]]).items()} for q in qids}

    # (the name says which BM25 terms: a cache of the earlier Lucene-stopword signals is not read)
    return cached_signals("candidate signals, sklearn stopwords, " + setting, list(cands), compute, cache, _ids(cands))


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
    # (the scoring version: likelihoods of an earlier prompt are not read, SCORING_VERSION 2 stripped titles)
    key = f"query token likelihood {llm.short_key} words {max_doc_words} scoring {SCORING_VERSION} {setting}"
    qids = list(cands)

    def compute(todo: list[str]) -> dict[str, dict[str, list]]:
        out = {}
        for q in todo:
            tokens = query_likelihood(llm, ds.queries[q], cands[q], max_doc_words=max_doc_words)
            prior = query_prior(llm, ds.queries[q])
            out[q] = {TOKEN_LIKELIHOOD: tokens.tolist(), TOKEN_PRIOR: prior.tolist()}
        return out

    if cache is not None:  # (without one, the chunks' results were thrown away and computed again below)
        for i in range(0, len(qids), chunk):
            cached_signals(key, qids[i : i + chunk], compute, cache, _ids(cands))
            logger.info("%s: likelihood %d/%d", setting, min(i + chunk, len(qids)), len(qids))
    found = cached_signals(key, qids, compute, cache, _ids(cands))
    for sig in found.values():
        sig[LIKELIHOOD] = sig[TOKEN_LIKELIHOOD].mean(axis=1)
    return found


def _ids(cands: dict[str, list[Document]]) -> dict[str, list[str]]:
    """Each query's candidate ids, in order: what a cached entry must have been computed over."""
    return {q: [d.id for d in docs] for q, docs in cands.items()}
