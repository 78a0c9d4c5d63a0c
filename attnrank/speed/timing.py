"""Reranking speed by attention mode: seconds per query of each mode (see :mod:`attnrank.speed`).

:func:`measure` times one (dataset, K, mode, dtype) cell in the calling process and reads its
peak RSS; :func:`run_cells` runs each cell in a fresh process (``python -m attnrank.speed``) so
the peaks do not mix. :func:`measure_interleaved` times the three modes in turn on each query in
one process: the speed-ups the issue's targets ask for, free of the drift between cells timed
minutes apart. Both grids resume from their results file.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..eval.datasets import dl19, sample_queries, scifact
from ..eval.report import cpu_model
from ..eval.speed_report import MODES, row_positions
from ..eval.timing import timed_peak
from ..files import atomic_path
from ..rerank.attention import AttentionReranker
from ..rerank.config import RerankConfig
from ..types import Document

logger = logging.getLogger(__name__)

SPEED_DATASETS = ("dl19", "scifact")


def probe_gflops(dtype: str, n: int = 1024, reps: int = 20) -> float:
    """This machine's matrix-product rate now: GFLOP/s of an ``n`` x ``n`` x ``n`` product in
    bfloat16 for a bfloat16 cell, else in float32, on the threads torch uses.

    Why: on a shared machine the rate moved 3x within a minute (250 to 820 GFLOP/s in bfloat16 on
    2026-12-03), which a cell's s/query cannot show; a cell timed at a low rate is slow for that."""
    kind = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    a, b = torch.randn(n, n, dtype=kind), torch.randn(n, n, dtype=kind)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def speed_queries(dataset: str, root: Path, k: int, n_queries: int) -> list[tuple[str, list[Document]]]:
    """(query, K candidates) pairs: DL19 topics with their BM25 top-K passages, or seeded SciFact
    train queries with K abstracts drawn at random from the corpus (only lengths matter here)."""
    if dataset == "dl19":
        ds = dl19(root)
        docs = {d.id: d for d in ds.docs}
        return [(ds.queries[q], [docs[i] for i in ds.candidates[q][:k]]) for q in list(ds.queries)[:n_queries]]
    if dataset == "scifact":
        ds = scifact(root)
        rng = random.Random(k)
        return [(ds.queries[q], rng.sample(ds.docs, k)) for q in sample_queries(ds.queries, n_queries)]
    raise ValueError(f"dataset {dataset!r} is not one of {SPEED_DATASETS}")


def measure(
    dataset: str, root: Path, k: int, mode: str, dtype: str = "auto", n_queries: int = 3, max_doc_words: int = 300
) -> dict[str, Any]:
    """Seconds per query and peak extra memory of one cell (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    options: dict[str, Any] = {"dtype": dtype, "max_doc_words": max_doc_words}
    if mode != "full":  # room for every candidate's states: a warm cell must not evict
        options.update(attention="block", state_cache_mb=1 << 16)
    reranker = AttentionReranker(**{"signals": None, **options})
    pairs = speed_queries(dataset, root, k, n_queries)
    reranker.rank("warm up", pairs[0][1][:2])  # first-call overheads, and the shared prefix
    times, peaks, probes = [], [], [probe_gflops(dtype)]
    for query, docs in pairs:
        if mode == "block-warm":
            reranker.rank(query, docs)  # fills the state cache
        elif mode == "block-cold":
            reranker.forget_passages()  # (the tokenization too: a cold query tokenizes its passages)
        secs, peak = timed_peak(functools.partial(reranker.rank, query, docs))
        times.append(secs)
        peaks.append(peak)
    probes.append(probe_gflops(dtype))
    return {
        "dataset": dataset,
        "K": k,
        "mode": mode,
        "dtype": dtype,
        "queries": len(pairs),
        "s/query": float(np.mean(times)),
        "peak extra MB": float(np.max(peaks)),
        "cached MB": reranker.states.nbytes / 2**20,
        "state bytes/token": reranker.states.nbytes / max(reranker.states.n_tokens, 1),
        "probe GFLOP/s": float(np.mean(probes)),  # before and after the queries (probe_gflops)
    }


def measure_interleaved(
    dataset: str,
    root: Path,
    k: int,
    dtype: str = "auto",
    n_queries: int = 3,
    max_doc_words: int = 300,
    positions: str = RerankConfig.block_positions,
) -> dict[str, Any]:
    """Seconds per query of the three modes timed in turn on each query, in one process, with one
    model shared by a full-prompt and a block reranker whose blocks take ``positions``
    (:data:`~attnrank.llm.blocks.BLOCK_POSITIONS`; the preset ``fused`` reads ``"shared"``); no
    memory peaks (:func:`measure` has them).

    Why: a shared machine's matrix-product rate moved 3x within a minute (:func:`probe_gflops`), so
    a speed-up taken from two cells timed minutes apart carries that drift; modes interleaved
    query by query share it. The order alternates per query (full first, then block first), and
    block-warm directly follows block-cold, whose states it reuses."""
    full = AttentionReranker(signals=None, dtype=dtype, max_doc_words=max_doc_words)
    block = AttentionReranker(
        full.llm,
        signals=None,
        max_doc_words=max_doc_words,
        attention="block",
        block_positions=positions,
        state_cache_mb=1 << 16,
    )
    pairs = speed_queries(dataset, root, k, n_queries)
    for reranker in (full, block):  # untimed, on the first query at this K: one-time costs of its shapes
        reranker.rank(*pairs[0])  # (two passages under "warm up" left one DL19 K=10 query at 0.12x)
        reranker.forget_passages()  # (the first query's timed arms then start as cold as the others')
    times: dict[str, list[float]] = {m: [] for m in MODES}
    probes = [probe_gflops(dtype)]

    def timed(mode: str, query: str, docs: list[Document]) -> None:
        if mode == "block-cold":
            block.forget_passages()  # (the tokenization too: a cold query tokenizes its passages)
        t = time.perf_counter()
        (full if mode == "full" else block).rank(query, docs)
        times[mode].append(time.perf_counter() - t)

    for i, (query, docs) in enumerate(pairs):
        order = ("full", "block-cold", "block-warm") if i % 2 == 0 else ("block-cold", "block-warm", "full")
        for mode in order:
            timed(mode, query, docs)
    probes.append(probe_gflops(dtype))
    ratios = np.asarray(times["full"]) / np.asarray(times["block-cold"])
    return {
        "dataset": dataset,
        "K": k,
        "dtype": dtype,
        "positions": positions,
        "queries": len(pairs),
        **{f"{m} s/query": float(np.mean(times[m])) for m in MODES},
        "cold speed-up": float(np.mean(times["full"]) / np.mean(times["block-cold"])),
        "cold speed-up per query (min-max)": f"{ratios.min():.2f}-{ratios.max():.2f}",
        "probe GFLOP/s": float(np.mean(probes)),
    }


def interleaved_grid() -> list[tuple[str, int, int]]:
    """(dataset, K, queries) of the interleaved timing: K = 10/20/50/100 on DL19 and SciFact.

    Queries: DL19 20/20/5/2, SciFact 5/10/3/2. Why more at K=20: the targets' cold speed-up is
    read there, and over five DL19 queries one query's timing moved it from 1.15x to 1.60x between
    two runs minutes apart; the large K are few because SciFact's full prompt at K=100 costs most of
    a minute on a 2-core CPU."""
    counts = {"dl19": {10: 20, 20: 20, 50: 5, 100: 2}, "scifact": {10: 5, 20: 10, 50: 3, 100: 2}}
    return [(ds, k, counts[ds][k]) for ds in SPEED_DATASETS for k in (10, 20, 50, 100)]


def run_interleaved(
    root: Path, results: Path, dtype: str, positions: str = RerankConfig.block_positions
) -> list[dict[str, Any]]:
    """:func:`measure_interleaved` over :func:`interleaved_grid` in this process, skipping rows
    already in ``results`` (JSON list, rewritten after every row, so an interrupted run resumes;
    rows from before positions were recorded are ``"rotated"``, the default then as now:
    :func:`~attnrank.eval.speed_report.row_positions`)."""
    done: list[dict[str, Any]] = json.loads(results.read_text()) if results.exists() else []
    for dataset, k, n in interleaved_grid():
        key = (dataset, k, dtype, positions)
        same = [r for r in done if (r["dataset"], r["K"], r["dtype"], row_positions(r)) == key]
        if same and all(_enough(r, n) for r in same):
            continue
        done[:] = [r for r in done if r not in same]  # (measured over fewer queries than the grid asks now)
        _record({**measure_interleaved(dataset, root, k, dtype, n, positions=positions), "asked": n}, done, results)
    return done


def _enough(row: dict[str, Any], n: int) -> bool:
    """Whether a stored row was asked for at least the ``n`` queries its cell asks now (``asked``;
    rows from before it was recorded: the queries measured; neither: taken as it is): a grid raised
    from 5 to 20 queries measures again, a dataset with fewer than asked does not each time."""
    return row.get("asked", row.get("queries", n)) >= n


# -- the benchmark section: cells in fresh processes, resumable -----------------------------------
def run_cells(
    cells: list[tuple[str, int, str, str, int]], root: Path, results: Path, timeout: float = 3600
) -> list[dict[str, Any]]:
    """Measure each ``(dataset, K, mode, dtype, n_queries)`` cell in a fresh process
    (``python -m attnrank.speed``), skipping cells already in ``results`` (JSON list, rewritten
    after every cell, so an interrupted run resumes; a cell that failed or timed out is measured
    again, its row replaced, and so is one measured over fewer queries than its cell asks now).
    Rows come back in the order of ``cells``."""
    done: list[dict[str, Any]] = json.loads(results.read_text()) if results.exists() else []
    asked = {(d, k, m, t): n for d, k, m, t, n in cells}

    def cell_of(r: dict[str, Any]) -> tuple[str, int, str, str]:
        return r["dataset"], r["K"], r["mode"], r["dtype"]

    have = {cell_of(r) for r in done if "error" not in r and _enough(r, asked.get(cell_of(r), 0))}
    for dataset, k, mode, dtype, n in cells:
        if (dataset, k, mode, dtype) in have:
            continue
        done[:] = [r for r in done if cell_of(r) != (dataset, k, mode, dtype)]
        cmd = [sys.executable, "-m", "attnrank.speed", dataset, str(root), str(k), mode, dtype, str(n)]
        cell = {"dataset": dataset, "K": k, "mode": mode, "dtype": dtype}
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:  # one slow cell is a row that says so, not the end of the grid
            row = {**cell, "error": f"timed out after {timeout:g} s"}
        else:
            tail = (p.stderr.strip().splitlines() or ["?"])[-1]
            row = {**cell, "error": tail[:200]} if p.returncode != 0 else json.loads(p.stdout.strip().splitlines()[-1])
        row["asked"] = n
        _record(row, done, results)
    return in_grid_order(done, cells)


def _record(row: dict[str, Any], done: list[dict[str, Any]], results: Path) -> None:
    """Stamp a measured row with its day and CPU (rows of one table may come from several runs
    and machines), add it to ``done`` and rewrite ``results`` atomically (a crash mid-write must
    not lose the rows measured so far)."""
    row["measured"] = datetime.date.today().isoformat()
    row["cpu"] = cpu_model()
    logger.info("speed row %s", row)
    done.append(row)
    results.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(results) as tmp:
        tmp.write_text(json.dumps(done, indent=1))


def in_grid_order(rows: list[dict[str, Any]], cells: list[tuple[str, int, str, str, int]]) -> list[dict[str, Any]]:
    """Speed rows in the order of ``cells`` (rows of other cells last)."""
    place = {(d, k, m, t): i for i, (d, k, m, t, _) in enumerate(cells)}
    return sorted(rows, key=lambda r: place.get((r["dataset"], r["K"], r["mode"], r["dtype"]), len(place)))


def speed_cells(dtypes: list[str]) -> list[tuple[str, int, str, str, int]]:
    """The speed grid: K = 10/20/50/100 x modes on DL19 and SciFact, every cell in the first
    dtype; the others on all DL19 cells and SciFact K=20 and 100 only (SciFact's full prompts at
    K >= 50 cost up to a minute per query on a 2-core CPU). Queries per cell: 3, 3, 2, 1."""
    return [
        (ds, k, mode, dtype, {10: 3, 20: 3, 50: 2, 100: 1}[k])
        for dtype in dtypes
        for ds in SPEED_DATASETS
        for k in (10, 20, 50, 100)
        for mode in MODES
        if dtype == dtypes[0] or ds == "dl19" or k in (20, 100)
    ]
