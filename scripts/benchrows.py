"""Candidate sets and the per-query attention-row cache shared by the reranking benchmarks.

Every attention-reranking benchmark needs, per query, all heads' attention rows (real query and
"N/A") over the same candidate prompt; capturing them is the expensive part, so they are cached as
``.npz`` under ``indexes/bench-cache/<setting>_<model fingerprint>/<qid>.npz`` and reused by
bench_rerank, bench_heads and bench_reweight.
"""

from __future__ import annotations

import logging
import random
import re
import time
from pathlib import Path

import numpy as np

from attnrank.index.store import corpus_checksum
from attnrank.types import Document
from benchdata import REPO, dl19, hotpotqa, scifact

log = logging.getLogger("benchrows")
CACHE = REPO / "indexes" / "bench-cache"


# -- candidate sets: (setting name, Dataset, {qid: [Document, ...] in first-stage order}) --------
def dl19_sets(root: Path, depths: list[int], max_queries: int | None = None):
    ds = dl19(root)
    if max_queries:
        ds.queries = dict(list(ds.queries.items())[:max_queries])
        ds.qrels = {q: ds.qrels[q] for q in ds.queries}
    docs = {d.id: d for d in ds.docs}
    return [(f"DL19 BM25 top-{k}", ds, {q: [docs[i] for i in ds.candidates[q][:k]] for q in ds.queries}) for k in depths]


def scifact_retriever(ds):
    from attnrank.index.retriever import HybridRetriever

    path = REPO / "indexes" / "bench-scifact"
    try:
        r = HybridRetriever.load(path)
        assert corpus_checksum(r.docs) == corpus_checksum(ds.docs)
    except Exception:  # noqa: BLE001 - (re)build the cached benchmark index
        r = HybridRetriever().index(ds.docs, show_progress=False)
        r.save(path)
    return r


def scifact_set(root: Path, n_queries: int, k: int = 20):
    """SciFact train: a seeded sample of ``n_queries`` labelled queries, hybrid RRF top-``k``."""
    ds = scifact(root)
    qids = sorted(ds.queries)
    random.Random(0).shuffle(qids)
    qids = qids[:n_queries]  # shuffled order: any prefix of a capture run is itself a sample
    ds.queries = {q: ds.queries[q] for q in qids}
    ds.qrels = {q: ds.qrels[q] for q in qids}
    res = scifact_retriever(ds).search_batch(ds.queries, k, mode="hybrid")
    return (f"SciFact train hybrid top-{k} ({len(qids)} queries)", ds, {q: x.documents() for q, x in zip(qids, res)})


def hotpot_set(root: Path, n_queries: int | None = None):
    """HotpotQA distractor: each question's own (up to) 10 paragraphs, ordered by BM25 (statistics
    of the pooled 400-question corpus) — the first stage; the 2 supporting paragraphs are relevant."""
    from attnrank.index.bm25 import BM25Index

    ds = hotpotqa(root)
    qids = list(ds.queries)[:n_queries] if n_queries else list(ds.queries)
    ds.queries = {q: ds.queries[q] for q in qids}
    ds.qrels = {q: ds.qrels[q] for q in qids}
    bm25 = BM25Index().index([d.full_text for d in ds.docs])
    pos = {d.id: i for i, d in enumerate(ds.docs)}
    cands = {}
    for q in qids:
        scores = bm25.get_scores(ds.queries[q])
        ids = sorted(dict.fromkeys(ds.candidates[q]), key=lambda d: -scores[pos[d]])
        cands[q] = [ds.docs[pos[d]] for d in ids]
    return (f"HotpotQA distractor BM25-ordered ({len(qids)} questions)", ds, cands)


# -- first-stage signals of the candidates ------------------------------------------------------
def stage_signals(root: Path, setting: str, ds, cands: dict, cache: Path | None = CACHE) -> dict:
    """``{qid: {"bm25": [...], "dense": [...]}}`` over each query's candidates (input order), the
    scores a :class:`HybridRetriever` leaves in ``ScoredDocument.stage_scores``: for SciFact its
    own results (NaN where a side did not return the passage), for DL19 the run's Pyserini BM25
    scores, for HotpotQA BM25 over the pooled paragraphs; ``dense`` = MiniLM cosine. Cached as JSON."""
    import json

    path = None if cache is None else cache / f"signals_{setting_key(setting)}.json"
    known = json.loads(path.read_text()) if path is not None and path.exists() else {}
    todo = [q for q in cands if q not in known]
    if todo:
        known.update(_signals(root, setting, ds, {q: cands[q] for q in todo}))
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(known))
            tmp.replace(path)
    return {q: {k: np.array(v, dtype=np.float64) for k, v in known[q].items()} for q in cands}


def _signals(root: Path, setting: str, ds, cands: dict) -> dict:
    import gzip
    import json

    from attnrank.index.bm25 import BM25Index
    from attnrank.index.embed import encode, load_embedder

    qids = list(cands)
    if setting.startswith("SciFact"):  # the hybrid retriever's own stage scores
        res = scifact_retriever(ds).search_batch({q: ds.queries[q] for q in qids}, len(cands[qids[0]]), mode="hybrid")
        out = {}
        for q, r in zip(qids, res):
            by_id = {d.id: d.stage_scores for d in r.results}
            out[q] = {s: [by_id.get(d.id, {}).get(s, float("nan")) for d in cands[q]] for s in ("bm25", "dense")}
        return out
    if setting.startswith("DL19"):
        with gzip.open(root / "trec_dl" / "dl19_bm25_top100.jsonl.gz", "rt", encoding="utf-8") as f:
            runs = {r["qid"]: {c["docid"]: c["score"] for c in r["candidates"]} for r in map(json.loads, f)}
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


def rrf_order(*scores) -> np.ndarray:
    """Reciprocal-rank fusion (the retriever's :func:`attnrank.index.hybrid.rrf`) of score lists
    over the same candidates, as scores in candidate order; NaN = not returned by that list."""
    from attnrank.index.hybrid import rrf

    rankings = []
    for s in scores:
        s = np.asarray(s, dtype=np.float64)
        rankings.append(np.array([i for i in np.argsort(-np.nan_to_num(s, nan=-np.inf), kind="stable")
                                  if np.isfinite(s[i])], dtype=np.int64))
    ids, fused = rrf(rankings, len(scores[0]))
    out = np.zeros(len(scores[0]))
    out[ids] = fused
    return out


# -- the row cache ------------------------------------------------------------------------------
def setting_key(setting: str) -> str:
    """A file-name key for a setting without its sample size: larger samples are supersets of
    smaller ones (seeded shuffle / file order), so rows captured for 50 queries serve a run over 200."""
    return re.sub(r"[^A-Za-z0-9]+", "_", re.sub(r"\s*\(\d+ (queries|questions)\)", "", setting))


def _cache_file(cache: Path | None, setting: str, qid: str, reranker) -> Path | None:
    if cache is None:
        return None
    key = f"{setting_key(setting)}_{reranker.llm.fingerprint[:12]}"
    return cache / key / f"{re.sub(r'[^A-Za-z0-9]+', '_', qid)}.npz"


def save_windows(path: Path, wins, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"seconds": np.array(seconds)}
    for i, w in enumerate(wins):
        arrays.update({f"w{i}_doc_index": np.array(w.doc_index), f"w{i}_spans": np.array(w.spans),
                       f"w{i}_input_ids": np.array(w.input_ids), f"w{i}_real": w.real.astype(np.float32),
                       f"w{i}_null": w.null.astype(np.float32)})
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def load_windows(path: Path):
    from attnrank.llm.rows import WindowRows

    class StoredRows(WindowRows):
        """Rows kept as the float32 the model produced (half the memory of float64: 800 SciFact
        queries would not fit otherwise); ``rows`` is computed in float64 as the reranker does."""

        @property
        def rows(self) -> np.ndarray:
            return self.real.astype(np.float64) - self.null.astype(np.float64)

    z = np.load(path)
    wins, i = [], 0
    while f"w{i}_real" in z:
        wins.append(StoredRows(z[f"w{i}_doc_index"].tolist(), [tuple(s) for s in z[f"w{i}_spans"].tolist()],
                               z[f"w{i}_input_ids"].tolist(), z[f"w{i}_real"], z[f"w{i}_null"]))
        i += 1
    return wins, float(z["seconds"])


def capture_all(reranker, setting: str, queries: dict, cands: dict, cache: Path | None = CACHE) -> dict:
    """All-head real and N/A rows per query: ``{qid: {"windows": [...], "seconds": s}}`` (cached)."""
    out = {}
    for qid, q in queries.items():
        f = _cache_file(cache, setting, qid, reranker)
        if f is not None and f.exists():
            wins, secs = load_windows(f)
        else:
            t = time.perf_counter()
            wins = reranker.windows(q, cands[qid])
            secs = time.perf_counter() - t
            if f is not None:
                save_windows(f, wins, secs)
            log.info("%s: captured %s in %.1f s (%d/%d)", setting, qid, secs, len(out) + 1, len(queries))
        out[qid] = {"windows": wins, "seconds": secs}
    log.info("%s: %d queries captured", setting, len(out))
    return out


def icr_scores(windows, n_docs: int, head_idx=None, calibrate=True, use_filter=True) -> np.ndarray:
    """ICR document scores (input order) from cached windows, optionally for a subset of heads."""
    from attnrank.llm.rows import document_scores, token_scores

    s = np.zeros(n_docs)
    for w in windows:
        rows = w.rows if calibrate else w.real.astype(np.float64)
        rows = rows if head_idx is None else rows[head_idx]
        s[w.doc_index] = document_scores(token_scores(rows), w.spans, use_filter=use_filter)
    return s


def head_quality(captured: dict, cands: dict, qrels: dict, rel: int, reranker) -> np.ndarray:
    """nDCG@10 of every captured head used alone (QRHead's BEIR selection, :func:`query_focused_scores`),
    averaged over the queries, in ``reranker.head_list`` order."""
    from attnrank.heads.detect import query_focused_scores

    items = [(q, c["windows"], [d.id for d in cands[q]]) for q, c in captured.items()]
    llm = reranker.llm
    hs = query_focused_scores(items, qrels, reranker.head_list, llm.num_layers, llm.num_heads, rel=rel)["qr-ndcg"]
    return np.array([hs.scores[l, h] for l, h in reranker.head_list])


def run_of(cands: dict, scores: dict) -> dict:
    return {q: {d.id: float(s) for d, s in zip(cands[q], scores[q])} for q in cands}


def first_stage_run(cands: dict) -> dict:
    return {q: {d.id: float(len(c) - i) for i, d in enumerate(c)} for q, c in cands.items()}
