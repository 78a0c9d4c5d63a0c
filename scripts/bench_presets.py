"""What the reranking presets cost and score as a user runs them: seconds per query and nDCG@10 of
the default preset ``likelihood`` (the candidates' BM25, dense cosine and the LLM's query likelihood
given each, z-scored and summed; no attention), preset ``signals`` (the same without the likelihood:
no LLM) and preset ``fused`` (block attention from the heads its weights record, fused with BM25 and
dense by those weights; ``--presets`` chooses others), each query reranked by every preset in turn
in one process (interleaved, so load changes hit all alike), the LLM in its default dtype, ``fused``
with the shipped weights. Baseline: the first-stage order.

    python scripts/bench_presets.py [--data DIR] [--scifact-queries 20] [--presets likelihood,signals,fused]

Sets: DL19 BM25 top-20 (43 topics, rel >= 2) and SciFact train hybrid RRF top-20 (a seeded sample).
On SciFact, whose candidates come from an index, ``signals`` is also timed as a search pipeline runs
it: its dense signal read from the index's stored vectors (``AttentionReranker.use_index``) instead
of a MiniLM pass over the candidates; row "signals, index vectors". Where the CPU runs the
candidates' embedder in bfloat16 (the reranker's auto dtype), row "signals, float32 embedder" is
``signals`` with it in float32. ``likelihood`` and ``signals`` are untrained, so their nDCG@10 is held
out; the shipped weights (``fused``) were trained on these queries among others, so read its
nDCG@10 as in-domain (held out: docs/results/fusion_bfloat16_block_block_positions-shared.md).
Model and embedder load before the clock starts; each preset's first query is timed too (a warm-up
query runs first). Writes docs/results/rerank_presets.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
from _common import positive_int

from attnrank.benchmarks import dl19_sets, scifact_retriever, scifact_set
from attnrank.config import set_torch_threads
from attnrank.eval.data import strictly_decreasing
from attnrank.eval.datasets import data_root, scifact
from attnrank.eval.metrics import evaluate
from attnrank.eval.report import command_line, environment, md_table, write_outputs
from attnrank.llm.models import load_llm
from attnrank.rerank.attention import AttentionReranker
from attnrank.speed import probe_gflops

REPO = Path(__file__).resolve().parents[1]
SCIFACT_INDEX = REPO / "indexes" / "bench-scifact"
INDEXED = "signals, index vectors"  # preset signals reading its candidates' vectors from the index
FLOAT32 = "signals, float32 embedder"  # preset signals with its embedder in float32
FIRST_TIME = "x the first preset's time"


def rerankers_for(llm, presets: list[str], retriever) -> dict[str, AttentionReranker]:
    """The presets' rerankers, then preset ``signals``' variants this set and CPU can show."""
    rerankers = {p: AttentionReranker(llm, config=p) for p in presets}
    if "signals" not in presets:
        return rerankers
    if rerankers["signals"].signals.backend == "torch-bf16":
        # without the (bfloat16) llm: a given model's dtype would set the embedder's, not dtype=
        rerankers[FLOAT32] = AttentionReranker(config="signals", dtype="float32")
        assert rerankers[FLOAT32].signals.backend == "torch", rerankers[FLOAT32].signals.backend
    if retriever is not None:
        rerankers[INDEXED] = AttentionReranker(llm, config="signals")
        assert rerankers[INDEXED].use_index(retriever), "the index's vectors cannot be read"
    return rerankers


def measure(sets: list, presets: list[str]) -> list[dict]:
    """One row per set and preset (plus the first-stage order): nDCG@10, mean and median s/query.
    The default preset's variants (:func:`rerankers_for`) add rows."""
    llm = load_llm()
    rows = []
    for setting, ds, cands, retriever in sets:
        rerankers = rerankers_for(llm, presets, retriever)
        probes = [(probe_gflops("bfloat16"), probe_gflops("float32"))]
        first = next(iter(cands))
        for rr in rerankers.values():  # warm-up: the embedder and the model's first pass
            rr.rank(ds.queries[first], cands[first])
            rr.forget_passages()  # (the first timed query is that one: a first visit, not a cached one)
        runs: dict[str, dict] = {"first stage": {}, **{p: {} for p in rerankers}}
        secs: dict[str, list[float]] = {p: [] for p in rerankers}
        for q, docs in cands.items():
            runs["first stage"][q] = {d.id: -float(i) for i, d in enumerate(docs)}
            for p, rr in rerankers.items():
                t = time.perf_counter()
                res = rr.rank(ds.queries[q], docs)
                secs[p].append(time.perf_counter() - t)
                runs[p][q] = strictly_decreasing((d.id, d.score) for d in res)  # (ties in its order)
        probes.append((probe_gflops("bfloat16"), probe_gflops("float32")))
        rate = " / ".join(f"{np.mean([p[i] for p in probes]):.0f}" for i in (0, 1))
        for name, run in runs.items():
            s = secs.get(name)
            rows.append(
                {
                    "set": setting,
                    "preset": name,
                    "attention": "—" if s is None else _attention(rerankers[name]),
                    "nDCG@10": evaluate(run, ds.qrels, ["nDCG@10"], rel=ds.rel)["nDCG@10"],
                    "mean s/query": float(np.mean(s)) if s else float("nan"),
                    "median s/query": float(np.median(s)) if s else float("nan"),
                    "queries": len(cands),
                    "probe GFLOP/s bf16 / f32": rate,
                }
            )
        logging.info("%s done", setting)
    for r in rows:  # time relative to the default preset on the same set, same run
        base = next(x for x in rows if x["set"] == r["set"] and x["preset"] == presets[0])
        r[FIRST_TIME] = r["mean s/query"] / base["mean s/query"]
    return rows


def _attention(rr: AttentionReranker) -> str:
    if rr.uses_attention:
        return "yes"
    return "no (query likelihood)" if rr.uses_llm else "no"


def markdown(p: dict) -> str:
    env = p["environment"]
    cols = [
        "set",
        "preset",
        "attention",
        "nDCG@10",
        "mean s/query",
        "median s/query",
        FIRST_TIME,
        "queries",
        "probe GFLOP/s bf16 / f32",
    ]
    return "\n".join(
        [
            f"# Reranking presets: cost and nDCG@10 ({env['date']}, {env['cpus']} CPUs, {env.get('cpu', '')})",
            "",
            f"Command: `{command_line()}`",
            "",
            f"SmolLM2-135M-Instruct ({p['dtype']}); every preset reranks each query in turn in one process. The "
            "default preset `likelihood` and the preset `signals` are untrained (equal weights on per-query z-scores: "
            "BM25, dense cosine and, for `likelihood`, the LLM's query likelihood given each candidate, one prompt "
            "per candidate through the whole model; UPR), so their figures here are held out (likelihood.md); "
            "`fused` (block attention at shared positions) reads the shipped weights, trained on these queries "
            "among others, so its nDCG@10 is in-domain (held out: fusion_bfloat16_block_block_positions-shared.md). "
            "`signals` embeds the candidates in the "
            "reranker's dtype (bfloat16 on CPUs with AMX or AVX-512 BF16); `signals, float32 embedder` is the same "
            "preset with float32 embeddings, and `signals, index vectors` reads the candidates' vectors from the "
            "index they came from (as `search --rerank`, `ask`, the server and the retriever adapters do), embedding "
            "only the query. probe GFLOP/s: this machine's 1024³ matrix-product rate in bfloat16 and float32 "
            "before and after the set's queries (attnrank.speed.probe_gflops; a shared machine's rate varies).",
            "",
            md_table(p["rows"], cols, {"mean s/query": ".3f", "median s/query": ".3f", FIRST_TIME: ".1f"}),
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--scifact-queries", type=positive_int, default=20)
    ap.add_argument(
        "--presets",
        default="likelihood,signals,fused",
        help="comma-separated; times are shown as multiples of the first's",
    )
    ap.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root = data_root(args.data, default=REPO.parent / "shared" / "data")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    sets = [
        (*dl19_sets(root, [20])[0], None),
        (
            *scifact_set(root, args.scifact_queries, index_dir=SCIFACT_INDEX),
            scifact_retriever(scifact(root), SCIFACT_INDEX),
        ),
    ]
    payload = {
        "environment": environment(),
        "dtype": str(load_llm().dtype).removeprefix("torch."),
        "rows": measure(sets, presets),
    }
    md = markdown(payload)
    write_outputs("rerank_presets", payload, md, args.out)
    print(md)


if __name__ == "__main__":
    main()
