"""Sharded indexing and batch reranking on a local Ray (issue 17).

On full SciFact (5,183 abstracts, all 1,109 queries): a 4-shard build vs the single-process
build (same BM25 and dense scores to 1e-6, same top-100 per query in bm25/dense/hybrid modes,
build times), merge back to one index; batch search + rerank throughput with 1 and 2 Ray actors
vs the single-process loop (a small query sample, the real SmolLM2-135M); Ray's start-up and
memory overhead; a scale test of the BM25 statistics + shard build + merge on a synthetic corpus of
short documents drawn from the shared corpora's vocabulary (BM25 only), with peak memory per task.

    nice -n 10 python scripts/bench_sharded.py [--data DIR] [--sample 10] [--rerank 10] [--synthetic 1000000]
        [--sections build,overhead,batch,scale,realbuild]

Writes docs/results/sharded.{json,md}. The dense embedding is done once (the single build); the
sharded indexes are built from the same vectors; the ``realbuild`` section times a sharded build
that embeds in its Ray tasks (the second and last embedding pass) and compares it too.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np

from attnrank.batch import BatchConfig, Resources, run_batch
from attnrank.batch.stages import rerank_head
from attnrank.corpus import load_corpus
from attnrank.eval import write_run
from attnrank.eval.datasets import data_root
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.index.bm25 import BM25Index, BM25Params
from attnrank.index.retriever import HybridRetriever
from attnrank.index.sharded import LocalExecutor, RayExecutor, ShardedIndexer, ShardedRetriever, merge_shards
from attnrank.index.sharded.build import global_stats, peak_rss_mb
from attnrank.index.sharded.layout import shard_bounds
from attnrank.index.sharded.merge import merge_bm25
from attnrank.index.tokenize import resolve_config, tokenize_all
from attnrank.queries import load_queries

log = logging.getLogger("bench_sharded")
RESULTS: dict = {}
RESULTS_DIR = Path(__file__).resolve().parent.parent / "docs" / "results"
PARTIAL = Path(__file__).parent / "out" / "sharded.partial.json"  # sections done so far (git-ignored)
ALL_SECTIONS = ("build", "denseties", "overhead", "batch", "scale", "realbuild")


def save_partial() -> None:
    PARTIAL.parent.mkdir(parents=True, exist_ok=True)
    PARTIAL.write_text(json.dumps(RESULTS, indent=1), encoding="utf-8")


def compare(single: HybridRetriever, sharded: HybridRetriever, queries: dict[str, str], k: int = 100) -> dict:
    """Max score difference and top-k agreement per mode, over every query."""
    out = {}
    for mode in ("bm25", "dense", "hybrid"):
        a, b = single.search_batch(queries, k, mode=mode), sharded.search_batch(queries, k, mode=mode)
        same = sum(x.ids == y.ids for x, y in zip(a, b))
        diff = max(float(np.max(np.abs(np.array(x.scores) - np.array(y.scores)))) for x, y in zip(a, b))
        out[mode] = {"queries": len(a), "same_top_k": same, "max_abs_score_diff": diff}
    return out


def bm25_all_scores_diff(single: HybridRetriever, sharded: ShardedRetriever, queries: list[str]) -> float:
    worst = 0.0
    for q in queries:
        parts = np.concatenate([b.get_scores(q) for b in sharded.shard_bm25])
        worst = max(worst, float(np.max(np.abs(parts - single.bm25.get_scores(q)))))
    return worst


def ray_overhead() -> dict:
    """Start-up time and resident memory of a local Ray (2 CPUs), idle, via psutil."""
    import psutil

    before = {p.pid for p in psutil.process_iter()}
    ex = RayExecutor(num_cpus=2, object_store_mb=256)
    time.sleep(3)
    procs = [
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.pid not in before and any("ray" in part for part in (p.info["cmdline"] or [p.info["name"] or ""]))
    ]
    rss = sum(p.memory_info().rss for p in procs if p.is_running())
    info = {
        "startup_seconds": round(ex.startup_seconds, 2),
        "processes": len(procs),
        "rss_mb": round(rss / 2**20, 1),
        "object_store_mb": 256,
    }
    ex.close()
    return info


def build_section(docs, queries, tmp: Path) -> tuple[HybridRetriever, Path]:
    t0 = time.perf_counter()
    single = HybridRetriever(fusion="rrf").index(docs, show_progress=False)  # RRF: as published
    RESULTS["single_build"] = {**single.build_info, "total_seconds": round(time.perf_counter() - t0, 2)}
    single.save(tmp / "single")
    save_partial()
    vectors = single.dense.faiss_index.reconstruct_n(0, single.num_docs)
    builds = {}
    for label, make in (("local", LocalExecutor), ("ray", lambda: RayExecutor(num_cpus=2, object_store_mb=512))):
        ex = make()
        ix = ShardedIndexer(HybridRetriever(fusion="rrf"), shards=4, executor=ex, block_size=1300)
        t = time.perf_counter()
        ix.build(docs, tmp / f"sharded-{label}", embeddings=vectors)
        builds[label] = {
            **ix.build_info,
            "total_seconds": round(time.perf_counter() - t, 2),
            "ray_startup_seconds": round(getattr(ex, "startup_seconds", 0.0), 2),
        }
        ex.close()
    RESULTS["sharded_build_same_vectors"] = builds
    sharded = ShardedRetriever.load(tmp / "sharded-ray", verify=True)
    RESULTS["equality_4_shards"] = {
        "top100": compare(single, sharded, queries),
        "bm25_all_docs_max_abs_diff": bm25_all_scores_diff(single, sharded, list(queries.values())),
    }
    t = time.perf_counter()
    merged = HybridRetriever.load(merge_shards(tmp / "sharded-ray", tmp / "merged"))
    RESULTS["merge"] = {
        "seconds": round(time.perf_counter() - t, 2),
        "bm25_arrays_identical": all(
            np.array_equal(np.asarray(getattr(merged.bm25, n)), np.asarray(getattr(single.bm25, n)))
            for n in ("data", "indices", "indptr")
        ),
        "dense_vectors_identical": bool(
            np.array_equal(merged.dense.faiss_index.reconstruct_n(0, merged.num_docs), vectors)
        ),
        "top100": compare(single, merged, queries),
    }
    save_partial()
    return single, tmp / "sharded-ray"


def dense_ties_section(queries: dict[str, str], tmp: Path) -> None:
    """Where 4-shard and single dense top-100 lists differ: score agreement rank by rank, with FAISS's
    BLAS path (default for >= 20 queries at once) and with its per-pair path (BLAS threshold raised)."""
    import faiss

    from attnrank.index.sharded.retriever import merge_topk

    single, sharded = HybridRetriever.load(tmp / "single"), ShardedRetriever.load(tmp / "sharded-ray")
    texts = list(queries.values())
    q = single.dense.encode_queries(texts)
    default = faiss.cvar.distance_compute_blas_threshold
    out = {}
    for label, threshold in (("blas (default)", default), ("per-pair inner products", 10**9)):
        faiss.cvar.distance_compute_blas_threshold = threshold
        a_i, a_s = single.dense.retrieve(texts, 100, query_embeddings=q)
        b_i, b_s = merge_topk([d.retrieve(texts, 100, query_embeddings=q) for d in sharded.shard_dense], 100)
        differ = [r for r in range(len(texts)) if not np.array_equal(a_i[r], b_i[r])]
        out[label] = {
            "queries": len(texts),
            "same_top100": len(texts) - len(differ),
            "max_abs_score_diff": float(np.max(np.abs(a_s - b_s))),
            "differing_queries": [
                {
                    "query": list(queries)[r],
                    "ranks_differing": int(np.sum(a_i[r] != b_i[r])),
                    "max_score_diff_at_same_rank": float(np.max(np.abs(a_s[r] - b_s[r]))),
                }
                for r in differ
            ],
        }
    faiss.cvar.distance_compute_blas_threshold = default
    RESULTS["dense_ties"] = out
    save_partial()


def real_build_section(docs, queries, tmp: Path) -> None:
    """A 4-shard Ray build that embeds in its tasks (the second embedding pass), vs the single index."""
    single = HybridRetriever.load(tmp / "single")
    ex = RayExecutor(num_cpus=2, object_store_mb=512)
    ix = ShardedIndexer(HybridRetriever(fusion="rrf"), shards=4, executor=ex, block_size=1300)
    t = time.perf_counter()
    ix.build(docs, tmp / "sharded-real")
    RESULTS["sharded_build_real"] = {
        **ix.build_info,
        "total_seconds": round(time.perf_counter() - t, 2),
        "ray_startup_seconds": round(ex.startup_seconds, 2),
    }
    ex.close()
    real = ShardedRetriever.load(tmp / "sharded-real")
    RESULTS["equality_4_shards_real_embedding"] = {"top100": compare(single, real, queries)}
    save_partial()


def batch_section(single_dir: Path, sharded_dir: Path, sample: dict[str, str], depth: int, tmp: Path) -> None:
    from attnrank.rerank.attention import AttentionReranker

    t0 = time.perf_counter()
    r = HybridRetriever.load(single_dir)
    reranker = AttentionReranker(signals=None)
    t1 = time.perf_counter()
    results = [rerank_head(reranker, res, depth).top_k(10) for res in r.search_batch(sample, max(10, depth))]
    t2 = time.perf_counter()
    write_run(results, tmp / "loop.trec", tag="attnrank-hybrid")
    rows = [
        {
            "runner": "single process (search --rerank loop)",
            "actors": 1,
            "startup_s": round(t1 - t0, 1),
            "work_s": round(t2 - t1, 1),
            "total_s": round(t2 - t0, 1),
            "q_per_s_total": len(sample) / (t2 - t0),
            "q_per_s_work": len(sample) / (t2 - t1),
            "run_equals_loop": True,
        }
    ]
    for actors in (1, 2):
        res = Resources(
            retrieval_actors=1,
            rerank_actors=actors,
            retrieval_cpus=0.5,
            rerank_cpus=1.5 / actors,
            retrieval_batch=4,
            rerank_batch=1,
        )
        out = tmp / f"ray{actors}.trec"
        shutil.rmtree(tmp / f"ray{actors}.trec.parts", ignore_errors=True)  # a fresh run, not a resume
        t = time.perf_counter()
        stats = run_batch(
            sample,
            BatchConfig(str(sharded_dir), k=10, rerank=depth),
            output=out,
            resources=res,
            num_cpus=2,
            object_store_mb=512,
            progress=False,
        )
        total = time.perf_counter() - t
        rows.append(
            {
                "runner": f"Ray Data, {actors} rerank actor(s)",
                "actors": actors,
                "startup_s": stats["ray_startup_seconds"],
                "work_s": stats["pipeline_seconds"],
                "total_s": round(total, 1),
                "q_per_s_total": len(sample) / total,
                "q_per_s_work": stats["queries_per_second"],
                "run_equals_loop": out.read_text() == (tmp / "loop.trec").read_text(),
            }
        )
        RESULTS["batch"] = {"queries": len(sample), "rerank_depth": depth, "rows": rows}
        save_partial()


def synthetic_vocab(root: Path, limit: int = 200_000) -> list[str]:
    """Words of the shared corpora (SciFact abstracts + HotpotQA paragraphs), most frequent first."""
    import gzip
    from collections import Counter

    words: Counter = Counter()
    docs, _ = load_corpus(root / "scifact" / "corpus.jsonl.gz")
    for d in docs:
        words.update(re.findall(r"[a-z]+", d.full_text.lower()))
    with gzip.open(root / "hotpotqa" / "hotpotqa_dev_distractor_400.jsonl.gz", "rt", encoding="utf-8") as f:
        words.update(re.findall(r"[a-z]+", f.read().lower()))
    return [w for w, _ in words.most_common(limit)]


def _bm25_shard(texts: list[str], tok, idf, avgdl: float, params: BM25Params, out: str) -> dict:
    t = time.perf_counter()
    b = BM25Index(params, tok).index_tokens(tokenize_all(texts, tok), idf, avgdl)
    b.save(out)
    return {
        "seconds": round(time.perf_counter() - t, 2),
        "nnz": int(len(b.data)),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def scale_section(root: Path, n_docs: int, shards: int, tmp: Path) -> None:
    """BM25 statistics, per-shard BM25 build and merge on ``n_docs`` synthetic short documents (Ray, 2 CPUs)."""
    vocab = synthetic_vocab(root)
    rng = np.random.default_rng(0)
    ranks = np.arange(1, len(vocab) + 1)
    p = 1.0 / ranks
    p /= p.sum()  # Zipf over the real vocabulary
    lens = rng.integers(5, 21, size=n_docs)
    words = rng.choice(len(vocab), size=int(lens.sum()), p=p)
    cuts = np.concatenate([[0], np.cumsum(lens)])
    texts = [" ".join(vocab[w] for w in words[cuts[i] : cuts[i + 1]]) for i in range(n_docs)]
    del words
    tok, params = resolve_config(), BM25Params()
    for old in [*tmp.glob("syn-*")]:  # a rerun writes fresh folders (an index part saves only into one)
        shutil.rmtree(old)
    ex = RayExecutor(num_cpus=2, object_store_mb=1024)
    try:
        t0 = time.perf_counter()
        stats, pass1 = global_stats(texts, tok, ex, block_size=50_000)
        idf = stats.idf(params)
        t1 = time.perf_counter()
        idf_ref = ex.put(idf)
        tasks = [
            (texts[a:b], tok, idf_ref, stats.avgdl, params, str(tmp / f"syn-{i}"))
            for i, (a, b) in enumerate(shard_bounds(n_docs, shards))
        ]
        shard_info = ex.map(_bm25_shard, tasks)
        t2 = time.perf_counter()
    finally:
        ex.close()
    del texts
    loaded = [BM25Index.load(tmp / f"syn-{i}") for i in range(shards)]
    t3 = time.perf_counter()
    merged = merge_bm25(loaded, [a for a, _ in shard_bounds(n_docs, shards)])
    merged.save(tmp / "syn-merged")
    t4 = time.perf_counter()
    RESULTS["scale"] = {
        "documents": n_docs,
        "vocabulary_source_words": len(vocab),
        "mean_terms": float(lens.mean()),
        "shards": shards,
        "pass1": pass1,
        "pass1_plus_idf_seconds": round(t1 - t0, 2),
        "pass2_seconds": round(t2 - t1, 2),
        "shards_info": shard_info,
        "merge_seconds": round(t4 - t3, 2),
        "merged_nnz": int(len(merged.data)),
        "driver_peak_rss_mb": round(peak_rss_mb(), 1),
        "per_doc_us": {
            "pass1": round((t1 - t0) / n_docs * 1e6, 2),
            "pass2": round((t2 - t1) / n_docs * 1e6, 2),
            "merge": round((t4 - t3) / n_docs * 1e6, 2),
        },
    }
    save_partial()


def markdown() -> str:
    R = RESULTS
    lines = [
        "# Sharded indexing and batch reranking on Ray (issue 17)",
        "",
        f"Environment: {json.dumps(R['environment'])}. Local Ray, 2 logical CPUs, on a 2-core machine shared "
        "with other jobs: the point is correctness and overhead, not speed.",
        "",
    ]
    if "single_build" in R:
        sb, sh = R["single_build"], R.get("sharded_build_same_vectors", {})
        lines += [
            "## SciFact: 4 shards vs one index (5,183 abstracts, all 1,109 queries)",
            "",
            f"Single-process build: BM25 {sb['bm25_seconds']} s, dense (embedding) {sb['dense_seconds']} s.",
            "",
        ]
        rows = [
            {
                "build": f"4 shards, {k}",
                "pass 1 (stats) s": v["pass1_seconds"],
                "pass 2 (shards) s": v["pass2_seconds"],
                "total s": v["total_seconds"],
                "Ray start s": v["ray_startup_seconds"],
            }
            for k, v in sh.items()
        ]
        if "sharded_build_real" in R:
            v = R["sharded_build_real"]
            rows.append(
                {
                    "build": "4 shards, ray, embedding in the tasks",
                    "pass 1 (stats) s": v["pass1_seconds"],
                    "pass 2 (shards) s": v["pass2_seconds"],
                    "total s": v["total_seconds"],
                    "Ray start s": "—",
                }
            )
        lines += [
            "Sharded builds from the single build's vectors (BM25 + FAISS + writing; no embedding):",
            "",
            md_table(
                rows,
                list(rows[0]),
                {"pass 1 (stats) s": ".2f", "pass 2 (shards) s": ".2f", "total s": ".2f", "Ray start s": ".2f"},
            ),
            "",
        ]
        eq = R.get("equality_4_shards", {})
        erows = [{"check": f"4 shards, {m}", **v} for m, v in eq.get("top100", {}).items()]
        erows += [{"check": f"merged index, {m}", **v} for m, v in R.get("merge", {}).get("top100", {}).items()]
        erows += [
            {"check": f"4 shards with their own embedding, {m}", **v}
            for m, v in R.get("equality_4_shards_real_embedding", {}).get("top100", {}).items()
        ]
        lines += [
            "Equality with the single index (top-100 per query; scores compared rank by rank):",
            "",
            md_table(erows, ["check", "queries", "same_top_k", "max_abs_score_diff"], {"max_abs_score_diff": ".2e"}),
            "",
            f"BM25 score of every (query, document) pair, shards vs single: max |diff| = "
            f"{eq.get('bm25_all_docs_max_abs_diff', float('nan')):.2e}. Merge: {R.get('merge', {}).get('seconds')} s; "
            f"BM25 arrays identical: {R.get('merge', {}).get('bm25_arrays_identical')}; dense vectors identical: "
            f"{R.get('merge', {}).get('dense_vectors_identical')}.",
            "",
        ]
    if "single_build" in R and "sharded_build_real" not in R:
        lines += [
            "Not run in this record: the `realbuild` section (a sharded build that embeds again; the single "
            f"build's embedding took {R['single_build']['dense_seconds']:.0f} s at this machine's load).",
            "",
        ]
    if "dense_ties" in R:
        rows = [
            {
                "FAISS inner products": k,
                "queries": v["queries"],
                "same top-100": v["same_top100"],
                "max |score diff|": v["max_abs_score_diff"],
                "differing queries (ranks differing, max diff at the same rank)": "; ".join(
                    f"{d['query']} ({d['ranks_differing']}, {d['max_score_diff_at_same_rank']:.1e})"
                    for d in v["differing_queries"]
                )
                or "none",
            }
            for k, v in R["dense_ties"].items()
        ]
        lines += [
            "Dense top-100, 4 shards vs single, the same query vectors, two FAISS code paths:",
            "",
            md_table(rows, list(rows[0]), {"max |score diff|": ".2e"}),
            "",
        ]
    if "batch" in R:
        b = R["batch"]
        lines += [
            f"## Batch search + rerank ({b['queries']} queries, hybrid top-{b['rerank_depth']} reranked by "
            "SmolLM2-135M, top-10 written)",
            "",
            md_table(
                b["rows"],
                ["runner", "startup_s", "work_s", "total_s", "q_per_s_work", "q_per_s_total", "run_equals_loop"],
                {"q_per_s_work": ".3f", "q_per_s_total": ".3f", "startup_s": ".1f", "work_s": ".1f", "total_s": ".1f"},
            ),
            "",
            "startup = loading the index and model (single process) or starting Ray (Ray rows; actor start-up "
            "and model loading fall inside work_s).",
            "",
        ]
    if "ray_overhead" in R:
        o = R["ray_overhead"]
        lines += [
            f"## Ray overhead: local start {o['startup_seconds']} s, {o['processes']} processes, "
            f"{o['rss_mb']} MiB resident when idle (object store capped at {o['object_store_mb']} MiB)",
            "",
        ]
    if "scale" in R:
        s = R["scale"]
        rows = [{"shard": i, **v} for i, v in enumerate(s["shards_info"])]
        lines += [
            f"## Scale: {s['documents']:,} synthetic documents ({s['mean_terms']:.1f} words on average, Zipf over "
            f"{s['vocabulary_source_words']:,} words of SciFact + HotpotQA), BM25 only, Ray 2 CPUs",
            "",
            f"Pass 1 ({s['pass1']['blocks']} blocks of 50k): count {s['pass1']['count_seconds']} s, merge "
            f"{s['pass1']['merge_seconds']} s, peak RSS per task {s['pass1']['peak_rss_mb_per_task']:.0f} MiB, "
            f"vocabulary {s['pass1']['vocab_size']:,} terms. Pass 2 ({s['shards']} shards): {s['pass2_seconds']} s. "
            f"Merge into one index: {s['merge_seconds']} s ({s['merged_nnz']:,} weights), driver peak RSS "
            f"{s['driver_peak_rss_mb']:.0f} MiB. Per document: {json.dumps(s['per_doc_us'])} µs.",
            "",
            md_table(rows, ["shard", "seconds", "nnz", "peak_rss_mb"], {"peak_rss_mb": ".0f", "seconds": ".2f"}),
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data")
    ap.add_argument("--sample", type=int, default=10)
    ap.add_argument("--rerank", type=int, default=10)
    ap.add_argument("--synthetic", type=int, default=1_000_000)
    ap.add_argument(
        "--sections",
        default=",".join(ALL_SECTIONS),
        help="Comma-separated; realbuild = a sharded build that embeds again (the second embedding pass).",
    )
    ap.add_argument("--work", default=str(Path(__file__).parent / "out" / "sharded"), help="Work folder (indexes).")
    ap.add_argument("--render-only", action="store_true", help="Write sharded.{json,md} from sharded.partial.json.")
    args = ap.parse_args()
    if args.render_only:  # e.g. after a run stopped before its last section
        RESULTS.update(json.loads(PARTIAL.read_text(encoding="utf-8")))
        write_outputs("sharded", RESULTS, markdown(), RESULTS_DIR)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    root = data_root(args.data)
    sections = args.sections.split(",")
    if PARTIAL.exists() and set(sections) != set(ALL_SECTIONS):  # rerunning some sections: keep the others
        RESULTS.update(json.loads(PARTIAL.read_text(encoding="utf-8")))
    RESULTS["environment"] = environment()
    command = RESULTS["environment"]["command"]  # (as this process ran)
    RESULTS["commands"] = [
        *RESULTS.get("commands", []),
        *([RESULTS.pop("command")] if "command" in RESULTS else []),
        command,
    ]
    tmp = Path(args.work)  # kept between runs, so that a section can be rerun on the same indexes
    tmp.mkdir(parents=True, exist_ok=True)
    if True:
        docs, _ = load_corpus(root / "scifact" / "corpus.jsonl.gz")
        queries = load_queries(root / "scifact" / "queries.jsonl")
        if "build" in sections:
            build_section(docs, queries, tmp)
        if "denseties" in sections:
            dense_ties_section(queries, tmp)
        if "overhead" in sections:
            RESULTS["ray_overhead"] = ray_overhead()
            save_partial()
        if "batch" in sections:
            sample = dict(random.Random(0).sample(sorted(queries.items()), args.sample))
            batch_section(tmp / "single", tmp / "sharded-ray", sample, args.rerank, tmp)
        if "scale" in sections:
            scale_section(root, args.synthetic, 4, tmp)
        if "realbuild" in sections:
            real_build_section(docs, queries, tmp)
    write_outputs("sharded", RESULTS, markdown(), RESULTS_DIR)


if __name__ == "__main__":
    main()
