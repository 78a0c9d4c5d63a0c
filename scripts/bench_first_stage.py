"""First-stage benchmark: BM25, dense, RRF and tuned convex fusion on SciFact (train qrels) and
HotpotQA (400 dev questions' paragraphs pooled into one corpus), plus build cost, size on disk,
latency, and a same-run comparison of our BM25 with bm25s and rank-bm25.

    python scripts/bench_first_stage.py [--data ../shared/data] [--datasets scifact,hotpotqa]
                                        [--out-dir DIR] [--index-dir DIR]

Writes docs/results/first_stage.{json,md} (``--out-dir`` to put them elsewhere). The indexes are
built in a temporary folder, or kept under ``--index-dir/<dataset>`` (e.g. to reuse the SciFact
index as the benchmarks' ``indexes/bench-scifact``).
"""

from __future__ import annotations

import argparse
import logging
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from attnrank.config import set_torch_threads
from attnrank.eval import evaluate, results_to_run
from attnrank.eval.datasets import data_root, hotpotqa, scifact
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.index.retriever import HybridRetriever
from attnrank.index.tokenize import make_tokenizer
from attnrank.index.tuning import tune_alpha

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
METRICS = ["nDCG@10", "R@2", "R@20", "R@100"]


def dir_size(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


def split(qids: list[str], seed: int = 0) -> tuple[list[str], list[str]]:
    q = sorted(qids)
    random.Random(seed).shuffle(q)
    return q[: len(q) // 2], q[len(q) // 2 :]


def quality(r: HybridRetriever, ds, test_ids: list[str], tune_ids: list[str]) -> list[dict]:
    rows = []
    test_q = {q: ds.queries[q] for q in test_ids}
    test_qrels = {q: ds.qrels[q] for q in test_ids}
    for label, mode, fusion in [
        ("BM25", "bm25", "rrf"),
        ("dense (MiniLM-L6)", "dense", "rrf"),
        ("hybrid RRF k=60", "hybrid", "rrf"),
    ]:
        r.set_fusion(fusion)
        run = results_to_run(r.search_batch(test_q, 100, mode=mode))
        full = results_to_run(r.search_batch(ds.queries, 100, mode=mode))
        rows.append(
            {
                "method": label,
                **evaluate(run, test_qrels, METRICS, rel=ds.rel),
                "nDCG@10 (all queries)": evaluate(full, ds.qrels, ["nDCG@10"], rel=ds.rel)["nDCG@10"],
            }
        )
    best = tune_alpha(r, {q: ds.queries[q] for q in tune_ids}, ds.qrels, rel=ds.rel)
    run = results_to_run(r.search_batch(test_q, 100, mode="hybrid"))
    rows.append(
        {
            "method": f"hybrid convex (tuned: alpha={best.alpha:.2f}, {best.norm})",
            **evaluate(run, test_qrels, METRICS, rel=ds.rel),
            "nDCG@10 (all queries)": float("nan"),
        }
    )
    r.set_fusion("rrf")
    return rows


def latency(r: HybridRetriever, queries: list[str], n: int = 200) -> list[dict]:
    rows = []
    for mode in ("bm25", "dense", "hybrid"):
        r.search(queries[0], 100, mode=mode)  # warm-up
        times = []
        for q in queries[:n]:
            t = time.perf_counter()
            r.search(q, 100, mode=mode)
            times.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        r.search_batch(queries, 100, mode=mode)
        batch = (time.perf_counter() - t) * 1e3 / len(queries)
        rows.append(
            {
                "mode": mode,
                "single p50 ms": float(np.percentile(times, 50)),
                "single p95 ms": float(np.percentile(times, 95)),
                "batched ms/query": batch,
            }
        )
    return rows


def bm25_vs_bm25s(r: HybridRetriever, ds, queries: list[str]) -> dict:
    """Same tokens into our BM25, bm25s (lucene and rank-bm25-equivalent variants) and rank-bm25."""
    import bm25s
    from rank_bm25 import BM25Okapi

    tok = make_tokenizer(r.bm25.tokenizer_config)
    texts = [d.full_text for d in ds.docs]
    p = r.bm25_params
    out = {}
    t = time.perf_counter()
    from attnrank.index.bm25 import BM25Index

    ours = BM25Index(p, r.bm25.tokenizer_config).index(texts)
    out["ours index s"] = time.perf_counter() - t
    t = time.perf_counter()
    our_idx, _ = ours.retrieve(queries, 10)
    out["ours query ms"] = (time.perf_counter() - t) * 1e3 / len(queries)

    for name, kw in [
        ("bm25s lucene", dict(method="lucene")),
        ("bm25s atire/robertson (= rank-bm25 idf)", dict(method="atire", idf_method="robertson")),
    ]:
        t = time.perf_counter()
        m = bm25s.BM25(k1=p.k1, b=p.b, **kw)
        m.index([tok(x) for x in texts], show_progress=False)
        build = time.perf_counter() - t
        t = time.perf_counter()
        idx, _ = m.retrieve([tok(q) for q in queries], k=10, show_progress=False, n_threads=1)
        qms = (time.perf_counter() - t) * 1e3 / len(queries)
        overlap = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(our_idx.tolist(), idx.tolist())]))
        out[name] = {
            "index s": build,
            "query ms": qms,
            "top10 overlap with ours": overlap,
            "speed ratio ours/bm25s (query)": out["ours query ms"] / qms,
        }
    t = time.perf_counter()
    rb = BM25Okapi([tok(x) for x in texts], k1=p.k1, b=p.b)
    rb_build = time.perf_counter() - t
    sub = queries[:100]
    t = time.perf_counter()
    for q in sub:
        rb.get_scores(tok(q))
    out["rank-bm25"] = {"index s": rb_build, "query ms": (time.perf_counter() - t) * 1e3 / len(sub)}
    return out


def run_dataset(ds, tmp: Path) -> dict:
    logging.info("%s: %d docs, %d queries", ds.name, len(ds.docs), len(ds.queries))
    r = HybridRetriever(fusion="rrf")  # pinned: each quality row sets its fusion; latency is RRF's
    t = time.perf_counter()
    r.index(ds.docs, show_progress=False)
    build_s = time.perf_counter() - t
    r.save(tmp / ds.name)
    sizes = {c: dir_size(tmp / ds.name / c) for c in ("bm25", "dense")}
    sizes["docs.jsonl"] = (tmp / ds.name / "docs.jsonl").stat().st_size
    t = time.perf_counter()
    HybridRetriever.load(tmp / ds.name).search("warm", 10)
    load_s = time.perf_counter() - t
    tune_ids, test_ids = split(list(ds.queries))
    qtexts = list(ds.queries.values())
    return {
        "dataset": ds.name,
        "docs": len(ds.docs),
        "queries": len(ds.queries),
        "tune/test": [len(tune_ids), len(test_ids)],
        "build": {**r.build_info, "total_s": build_s, "load_s": load_s},
        "bytes": sizes,
        "quality": quality(r, ds, test_ids, tune_ids),
        "latency": latency(r, qtexts),
        "bm25_comparison": bm25_vs_bm25s(r, ds, qtexts),
    }


def markdown(res: list[dict], env: dict) -> str:
    out = [f"# First-stage benchmark ({env['date']}, {env['cpus']} CPUs, torch threads {env['threads']})", ""]
    for d in res:
        out += [
            f"## {d['dataset']}: {d['docs']} docs, {d['queries']} queries "
            f"(quality on the {d['tune/test'][1]}-query test half; convex alpha tuned on the other half)",
            "",
            md_table(d["quality"], ["method", *METRICS, "nDCG@10 (all queries)"]),
            "",
            f"Build: BM25 {d['build']['bm25_seconds']:.1f} s, dense {d['build']['dense_seconds']:.1f} s; "
            f"load {d['build']['load_s']:.2f} s. Size: BM25 {d['bytes']['bm25'] / 1e6:.1f} MB, "
            f"dense {d['bytes']['dense'] / 1e6:.1f} MB, docs {d['bytes']['docs.jsonl'] / 1e6:.1f} MB.",
            "",
            md_table(d["latency"], ["mode", "single p50 ms", "single p95 ms", "batched ms/query"], {"": ".2f"}),
            "",
        ]
        c = d["bm25_comparison"]
        rows = [{"implementation": "attnrank BM25", "index s": c["ours index s"], "query ms": c["ours query ms"]}]
        for name in ("bm25s lucene", "bm25s atire/robertson (= rank-bm25 idf)"):
            rows.append(
                {
                    "implementation": name,
                    "index s": c[name]["index s"],
                    "query ms": c[name]["query ms"],
                    "top-10 overlap with ours": c[name]["top10 overlap with ours"],
                    "query time ours/theirs": c[name]["speed ratio ours/bm25s (query)"],
                }
            )
        rows.append(
            {
                "implementation": "rank-bm25 get_scores (100 queries)",
                "index s": c["rank-bm25"]["index s"],
                "query ms": c["rank-bm25"]["query ms"],
                "query time ours/theirs": c["ours query ms"] / c["rank-bm25"]["query ms"],
            }
        )
        out += [
            "Same tokens into each BM25 (top-10 retrieval, one thread):",
            "",
            md_table(
                rows,
                ["implementation", "index s", "query ms", "top-10 overlap with ours", "query time ours/theirs"],
                {
                    "index s": ".2f",
                    "query ms": ".3f",
                    "top-10 overlap with ours": ".3f",
                    "query time ours/theirs": ".2f",
                },
            ),
            "",
        ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--datasets", default="scifact,hotpotqa")
    ap.add_argument("--out-dir", default=str(OUT), help="folder for first_stage.{json,md}")
    ap.add_argument("--index-dir", default=None, help="keep the built indexes here (default: a temporary folder)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    set_torch_threads()
    root = data_root(args.data, default=REPO.parent / "shared" / "data")
    loaders = {"scifact": scifact, "hotpotqa": hotpotqa}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(args.index_dir) if args.index_dir else Path(tmp)
        res = [run_dataset(loaders[n](root), where) for n in args.datasets.split(",")]
    env = environment()
    md = markdown(res, env)
    write_outputs("first_stage", {"environment": env, "results": res}, md, Path(args.out_dir))
    print(md)


if __name__ == "__main__":
    main()
