"""Reranking quality by attention mode: nDCG@10 of each mode on the same candidate sets, with
wins/losses and a sign test against a reference mode (used by ``scripts/bench_rerank.py --blocks``).

:func:`compare_modes` caches each (setting, mode) run, keyed by the resolved configuration and the
model's weights, so an interrupted comparison resumes.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..benchmarks import dl19_sets, hotpot_set, scifact_bm25_set
from ..eval import evaluate_per_query, sign_test, wins_losses
from ..eval.data import strictly_decreasing
from ..files import atomic_path
from ..rerank.attention import AttentionReranker
from ..rerank.config import RerankConfig
from ..types import Document

logger = logging.getLogger(__name__)


def mode_quality(
    reranker: AttentionReranker, cands: dict[str, list[Document]], queries: dict[str, str]
) -> tuple[dict[str, dict[str, float]], float]:
    """One reranker's run over a candidate set (``{qid: {doc id: score}}``) and its s/query."""
    run: dict[str, dict[str, float]] = {}
    t = time.perf_counter()
    for q, text in queries.items():
        run[q] = strictly_decreasing((d.id, d.score) for d in reranker.rank(text, cands[q]))  # (ties: its order)
        reranker.forget_passages()  # each query cold, as a first visit
    return run, (time.perf_counter() - t) / max(len(queries), 1)


def quality_sets(
    root: Path, hotpot_queries: int, scifact_queries: int
) -> list[tuple[str, Any, dict[str, list[Document]]]]:
    """The candidate sets the attention modes are compared on: DL19 BM25 top-20 (all 43 topics),
    a seeded sample of HotpotQA questions (their 10 paragraphs, BM25 order) and a seeded SciFact sample
    (BM25 top-20 over the whole corpus)."""
    return [
        *dl19_sets(root, [20]),
        hotpot_set(root, hotpot_queries),
        scifact_bm25_set(root, scifact_queries, 20),
    ]


def compare_modes(
    sets: list[tuple[str, Any, dict[str, list[Document]]]],
    modes: dict[str, dict[str, Any]],
    llm: Any,
    cache: Path | None = None,
) -> list[dict[str, Any]]:
    """nDCG@10 of the first stage and of each reranker mode (``{label: RerankConfig options}``,
    the first being the reference) on each set; wins/losses and a sign test against the reference.
    ``cache``: a JSON file of finished (setting, mode) runs, reused and extended (resumable)."""
    done: dict[str, Any] = json.loads(cache.read_text()) if cache is not None and cache.exists() else {}
    rows: list[dict[str, Any]] = []
    for setting, ds, cands in sets:
        first = {q: {d.id: float(len(c) - i) for i, d in enumerate(c)} for q, c in cands.items()}
        per = {"first stage": evaluate_per_query(first, ds.qrels, ["nDCG@10"], rel=ds.rel)}
        secs: dict[str, float] = {}
        measured: dict[str, str] = {}
        for label, options in modes.items():
            # keyed by what runs, the resolved configuration and the model's weights and precision, not
            # the label: a default that changed (block positions) or another model must not read old runs
            config = RerankConfig.preset("", **{"signals": None, **options})
            what = json.dumps(asdict(config), sort_keys=True, default=str)
            # ("trec32": runs whose ties were stepped below in 32-bit floats, as evaluation now reads scores;
            # a run cached before broke them by a 64-bit step, which reads back as a tie broken by doc id)
            key = f"{setting} | {label} | {what} | {getattr(llm, 'weights_key', '')} | trec32"
            if key not in done:
                run, s = mode_quality(AttentionReranker(llm, config=config), cands, ds.queries)
                done[key] = [run, s, datetime.date.today().isoformat()]
                if cache is not None:
                    with atomic_path(cache) as tmp:
                        tmp.write_text(json.dumps(done))
            run, secs[label], *day = done[key]  # runs cached before dates were kept have none
            measured[label] = day[0] if day else ""
            per[label] = evaluate_per_query(run, ds.qrels, ["nDCG@10"], rel=ds.rel)
            logger.info("%s %s nDCG@10 %.4f", setting, label, np.mean([v["nDCG@10"] for v in per[label].values()]))
        ref = next(iter(modes))
        for label, scores in per.items():
            diff = [scores[q]["nDCG@10"] - per[ref][q]["nDCG@10"] for q in scores]
            wins, losses = wins_losses(diff)
            rows.append(
                {
                    "setting": setting,
                    "mode": label,
                    "nDCG@10": float(np.mean([v["nDCG@10"] for v in scores.values()])),
                    f"wins/losses vs {ref}": f"{wins}/{losses}",
                    "sign test p": sign_test(wins, losses),
                    "s/query": secs.get(label),
                    "measured": measured.get(label, ""),
                }
            )
    return rows
