"""The benchmarks' candidate sets: ``(setting name, Dataset, {qid: [Document, ...] in first-stage order})``.

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

import numpy as np

from ..config import RRF_K, index_root
from ..errors import AttnrankError, InputError
from ..eval.datasets import Dataset, check_sample_size, dl19, hotpotqa, locomo, sample_order, sample_queries, scifact
from ..index.bm25 import BM25Index
from ..index.retriever import HybridRetriever
from ..index.store import corpus_checksum
from ..index.tokenize import resolve_config
from ..types import Document, is_count

logger = logging.getLogger(__name__)

CandidateSet = tuple[str, Dataset, dict[str, list[Document]]]


def dl19_sets(root: Path, depths: Sequence[int], max_queries: int | None = None) -> list[CandidateSet]:
    """DL19 BM25 top-``k`` for each ``k`` in ``depths`` (the first ``max_queries`` topics if set);
    a depth must be a count no deeper than the stored run (a negative one cut from the end)."""
    check_sample_size(max_queries)
    ds = dl19(root)
    deepest = max((len(c) for c in ds.candidates.values()), default=0)
    for k in depths:
        if not is_count(k) or k > deepest:
            raise InputError(
                f"DL19 depth {k!r}: the BM25 run holds up to {deepest} candidates a topic; give 1 to {deepest}"
            )
    if max_queries:
        ds = ds.subset(list(ds.queries)[:max_queries])
    docs = {d.id: d for d in ds.docs}
    return [
        (f"DL19 BM25 top-{k}", ds, {q: [docs[i] for i in ds.candidates[q][:k]] for q in ds.queries}) for k in depths
    ]


def scifact_retriever(ds: Dataset, index_dir: Path | None = None):
    """The hybrid retriever over ``ds.docs``, loaded from ``index_dir`` (default
    ``<index root>/bench-scifact``) if it holds this corpus and was built with the default settings
    (embedder, dense index, BM25 and its tokenizer), else built and saved there; it fuses with RRF
    (k = 60) and the default depth whatever the index records, as the published candidate sets did."""

    path = Path(index_dir) if index_dir is not None else index_root() / "bench-scifact"
    fresh = HybridRetriever(fusion="rrf")
    try:
        r = HybridRetriever.load(path)
    except (AttnrankError, OSError) as e:  # none yet, or unreadable: rebuild below
        logger.info("building the SciFact benchmark index (%s)", e)
        r = None
    if r is not None and _built_otherwise(r, fresh):  # (reused, it changed every candidate set silently)
        logger.warning("the SciFact benchmark index at %s was built with other settings: rebuilding it", path)
        r = None
    if r is None or corpus_checksum(r.docs) != corpus_checksum(ds.docs):
        r = fresh.index(ds.docs, show_progress=False)
        r.save(path)
    r.set_fusion("rrf", rrf_k=RRF_K)  # (an index saved with another k keeps it otherwise)
    r.depth = fresh.depth
    return r


def _built_otherwise(r: HybridRetriever, fresh: HybridRetriever) -> bool:
    """Whether ``r`` was built with other settings than ``fresh`` would build it with now."""
    if r.bm25 is None:
        return True
    built = (r.embedder, r.dense_kind, r.embed_backend, r.bm25_params, r.bm25.tokenizer_config.to_dict())
    now = (fresh.embedder, fresh.dense_kind, fresh.embed_backend, fresh.bm25_params)
    return built != (*now, resolve_config(fresh.stopwords, fresh.stemmer).to_dict())


def scifact_set(
    root: Path, n_queries: int | None, k: int = 20, index_dir: Path | None = None, offset: int = 0
) -> CandidateSet:
    """SciFact train: a seeded sample of ``n_queries`` labelled queries, hybrid RRF top-``k``;
    with ``offset``, the sample's queries from that position on (all of them if ``n_queries`` is
    None), which no run of the first ``offset`` saw. The setting's name does not say the offset:
    caches are keyed by it and by query id, so every sample shares one cache."""
    ds = scifact(root)
    ds = ds.subset(_sampled(ds, n_queries, offset))  # shuffled order: any prefix is a sample
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


def bm25_order(ds: Dataset) -> dict[str, list[str]]:
    """Each query's candidate ids (``ds.candidates``, deduplicated) by BM25, ties in stored order:
    the first stage the benchmark sets rank HotpotQA's paragraphs and LoCoMo's turns by. LoCoMo's
    BM25 has the statistics of the question's own conversation (every question of one conversation
    has its turns as candidates); any other dataset's, of the pooled ``ds.docs``."""
    per_list = ds.name.startswith("locomo")
    groups: dict[tuple[str, ...], list[str]] = {}
    for q in ds.queries:
        groups.setdefault(tuple(dict.fromkeys(ds.candidates[q])) if per_list else (), []).append(q)
    by_id = {d.id: d for d in ds.docs}
    out: dict[str, list[str]] = {}
    for key, members in groups.items():
        pool = [by_id[d] for d in key] if per_list else ds.docs
        bm25 = BM25Index().index([d.full_text for d in pool])
        at = {d.id: i for i, d in enumerate(pool)}
        for q in members:
            ids = list(dict.fromkeys(ds.candidates[q]))
            scores = bm25.get_scores(ds.queries[q])[[at[d] for d in ids]]
            out[q] = [ids[i] for i in np.argsort(-scores, kind="stable")]
    return out


def hotpot_set(root: Path, n_queries: int | None = None) -> CandidateSet:
    """HotpotQA distractor: every question in file order, or ``n_queries`` of them, the first of
    the seeded order (:func:`~attnrank.eval.datasets.sample_order`); their paragraphs in BM25 order.

    Why not the file's first ``n``: the file holds its 200 bridge questions before its 200
    comparison ones, so any part of it shorter than 201 questions was of one type. A sample's
    setting says so ("seeded"): caches keyed by the setting held the file's first questions."""
    check_sample_size(n_queries)
    ds = hotpotqa(root)
    every = list(ds.queries)
    sample = n_queries is not None and 0 < n_queries < len(every)
    ds = ds.subset(_sampled(ds, n_queries, 0) if sample else every)
    count = f"{len(ds.queries)} {'seeded ' if sample else ''}questions"
    docs = {d.id: d for d in ds.docs}
    cands = {q: [docs[i] for i in ids] for q, ids in bm25_order(ds).items()}
    return (f"HotpotQA distractor BM25-ordered ({count})", ds, cands)


def locomo_set(root: Path, n_queries: int | None = None, k: int = 20, offset: int = 0) -> CandidateSet:
    """LoCoMo: a seeded sample of ``n_queries`` questions (from position ``offset`` of the seeded
    order, as :func:`scifact_set`); per question its conversation's turns ordered by BM25
    (statistics of that conversation's turns), top ``k``."""

    ds = locomo(root)
    ds = ds.subset(_sampled(ds, n_queries, offset))
    docs = {d.id: d for d in ds.docs}
    cands = {q: [docs[i] for i in ids[:k]] for q, ids in bm25_order(ds).items()}
    return (f"LoCoMo turns BM25 top-{k} ({len(ds.queries)} queries)", ds, cands)


def _sampled(ds: Dataset, n: int | None, offset: int) -> list[str]:
    """Positions ``offset`` to ``offset + n`` (to the end if ``n`` is None) of ``ds``'s seeded
    order (:func:`~attnrank.eval.datasets.sample_order`)."""
    check_sample_size(n)
    order = sample_order(ds)
    if offset and not 0 < offset < len(order):
        raise AttnrankError(f"offset {offset}: the seeded order has {len(order)} queries; give 0 to {len(order) - 1}")
    return order[offset : offset + n if n else None]
