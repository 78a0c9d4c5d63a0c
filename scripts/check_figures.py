"""Recompute the first-stage figures of docs/results/heads.json and rerank.json (the rows that need
no LLM) through the package and the bench scripts' own row code, and compare them with the
published JSON.

heads.json: the held-out rows 'first stage', 'first stage: BM25 scores', 'first stage: dense
(MiniLM) scores' and 'first stage: RRF of BM25 and dense' of DL19 top-20, SciFact train hybrid
top-20 (809 queries) and HotpotQA (400 questions), 5-fold and pooled as ``bench_heads.heldout``
computes them; rerank.json: 'first stage' and 'MiniLM-L6 bi-encoder cosine' of DL19 top-20/50 and
SciFact top-20 (50 queries), as ``bench_rerank.quality``. The SciFact candidates come from
:func:`attnrank.benchmarks.scifact_set` (hybrid RRF top-20; the index is built in ``--index-dir``
if it is not there). Signals are computed afresh (no row cache).

    python scripts/check_figures.py [--data DIR] [--index-dir indexes/bench-scifact] [--out FILE.json]

Prints one line per figure: published, recomputed, equal (|Δ| < 1e-12) or the difference.
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path

import bench_heads
import bench_rerank
import numpy as np

from attnrank.benchmarks import dl19_sets, hotpot_set, scifact_set, stage_signals
from attnrank.config import set_torch_threads
from attnrank.eval import evaluate, evaluate_per_query, wins_losses
from attnrank.eval.crossval import kfold_splits, pool
from attnrank.eval.datasets import data_root
from attnrank.eval.rows import first_stage_run, run_of

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"


def heads_rows(root: Path, index_dir: Path, folds: int = 5) -> list[dict]:
    """bench_heads' first-stage held-out rows (its ``evaluate_scores`` and ``FIRST_STAGES``)."""
    rows = []
    setups = dl19_sets(root, [20]) + [scifact_set(root, 809, index_dir=index_dir), hotpot_set(root, 400)]
    for name, ds, cands in setups:
        sig = stage_signals(root, name, ds, cands, None, index_dir)
        feats = {q: types.SimpleNamespace(stages=sig[q]) for q in cands}
        by_method: dict[str, list[dict]] = {}
        for split in kfold_splits(sorted(cands), folds, seed=0):
            test = split.test
            scorers = {"first stage": lambda q: first_stage_run({q: cands[q]})[q].values()}
            for label, fn in bench_heads.FIRST_STAGES.items():
                scorers[f"first stage: {label}"] = lambda q, fn=fn: np.nan_to_num(fn(feats[q]), nan=-1e9)
            for label, scorer in scorers.items():
                by_method.setdefault(label, []).append(
                    {"n": len(test), **bench_heads.evaluate_scores(cands, test, scorer, ds)}
                )
        rows += [{"setting": name, "method": m, **pool(r, n="n")} for m, r in by_method.items()]
    return rows


def rerank_rows(root: Path, index_dir: Path) -> list[dict]:
    """bench_rerank's 'first stage' and 'MiniLM-L6 bi-encoder cosine' rows."""
    rows = []
    for name, ds, cands in dl19_sets(root, [20, 50]) + [scifact_set(root, 50, index_dir=index_dir)]:
        base = first_stage_run(cands)
        cos, _ = bench_rerank.cosine_scores(ds.queries, cands)
        base_pq = evaluate_per_query(base, ds.qrels, ["nDCG@10"], rel=ds.rel)
        for label, run in (("first stage", base), ("MiniLM-L6 bi-encoder cosine", run_of(cands, cos))):
            pq = evaluate_per_query(run, ds.qrels, ["nDCG@10"], rel=ds.rel)
            diff = [pq[q]["nDCG@10"] - base_pq[q]["nDCG@10"] for q in pq]
            rows.append(
                {
                    "setting": name,
                    "method": label,
                    "nDCG@10": evaluate(run, ds.qrels, ["nDCG@10"], rel=ds.rel)["nDCG@10"],
                    "wins/losses vs first stage": "{}/{}".format(*wins_losses(diff)),
                }
            )
    return rows


def compare(new: dict[str, list[dict]]) -> int:
    """Print published vs recomputed per figure; returns the number of differences."""
    published = {
        "heads": json.loads((RESULTS / "heads.json").read_text())["heldout"],
        "rerank": json.loads((RESULTS / "rerank.json").read_text())["quality"],
    }
    differ = 0
    for part, rows in new.items():
        index = {(r["setting"], r["method"]): r for r in published[part]}
        for r in rows:
            p = index.get((r["setting"], r["method"]), {})
            for key in ("nDCG@10", "R@2", "wins/losses vs first stage"):
                if key not in r:
                    continue
                a, b = p.get(key), r[key]
                same = a == b if isinstance(b, str) else a is not None and abs(a - b) < 1e-12
                differ += not same
                print(
                    f"{part}.json | {r['setting']} | {r['method']} | {key} | {a} | {b} | {'equal' if same else 'DIFFERENT'}"
                )
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--index-dir", default=str(REPO / "indexes" / "bench-scifact"), help="the SciFact index")
    ap.add_argument("--out", default=None, help="also write the recomputed rows as JSON")
    args = ap.parse_args()
    set_torch_threads()
    root = data_root(args.data, default=REPO.parent / "shared" / "data")
    index_dir = Path(args.index_dir)
    new = {"heads": heads_rows(root, index_dir), "rerank": rerank_rows(root, index_dir)}
    if args.out:
        Path(args.out).write_text(json.dumps(new, indent=1))
    differ = compare(new)
    print(f"{differ} figure(s) differ")
    raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
