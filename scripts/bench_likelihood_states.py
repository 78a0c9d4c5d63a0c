"""What reusing passage states saves the default preset ``likelihood``, and that it changes nothing.

    python scripts/bench_likelihood_states.py [--data DIR] [--dl19-depths 20,100] [--dl19-queries N] [--scifact-queries 100]
                                              [--locomo-questions 200]

The default preset scores each candidate by the LLM's likelihood of the query after a prompt that
holds the passage (UPR). The prompt before the query does not depend on the query, so the reranker
keeps its key/value states (all layers) in its state cache (``state_cache_mb``, default 1024 MB)
and a later query over the same passage runs only its own tokens over them
(attnrank.llm.likelihood). Per query, in one process, interleaved (load changes hit all alike):

- ``no reuse``: a reranker with ``state_cache_mb=0`` (every prompt computed in full, as before);
- ``first visit``: the default reranker, the query's first time (passages an earlier query of the
  set brought are reused: LoCoMo's questions about one conversation share its turns);
- ``all cached``: the default reranker, the same query again right after (every candidate reused:
  a repeated query, or a passage store warmed by earlier traffic).

Sets: DL19 BM25 top-20 and top-100 (43 topics), SciFact train hybrid RRF top-20 (a seeded sample),
LoCoMo BM25 top-20 turns (a seeded sample of questions, asked conversation by conversation, as a
user of one conversation's memory would). Rows: s/query (mean, median), peak memory above the
start, nDCG@10 of each (reused states are computed in other shapes: bfloat16 rounds differently,
as batching does), the likelihood scores' largest
difference from ``no reuse``, the share of candidates reused on first visits, and the states'
bytes per prompt token. Writes docs/results/likelihood_states.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
from _common import positive_int, positive_ints

from attnrank.benchmarks import dl19_sets, locomo_set, scifact_set
from attnrank.config import set_torch_threads
from attnrank.eval.data import strictly_decreasing
from attnrank.eval.datasets import data_root
from attnrank.eval.metrics import evaluate
from attnrank.eval.report import command_line, environment, md_table, write_outputs
from attnrank.eval.timing import timed_peak
from attnrank.llm.models import load_llm
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig

REPO = Path(__file__).resolve().parents[1]
SCIFACT_INDEX = REPO / "indexes" / "bench-scifact"
ARMS = ("no reuse", "first visit", "all cached")
EVERY_ARMS = ("first visit, every candidate", "all cached, every candidate")  # beside a --likelihood-depth
SPEEDUP = "x faster than no reuse"


def measure(llm, setting: str, ds, cands: dict, depth: int | None = None) -> list[dict]:
    """One row per arm: time, memory and nDCG@10 of the default preset on ``cands``; with a
    ``depth`` (its likelihood on a shortlist, ``likelihood_depth``), also its first visit and all
    cached scoring every candidate (the default), in turn with the others."""
    none = AttentionReranker(llm, config=RerankConfig.preset("likelihood", state_cache_mb=0, likelihood_depth=depth))
    reuse = AttentionReranker(llm, config=RerankConfig.preset("likelihood", likelihood_depth=depth))
    rerankers, turns = [none, reuse], list(zip(ARMS, (none, reuse, reuse)))
    if depth is not None:
        whole = AttentionReranker(llm, config="likelihood")
        rerankers, turns = [*rerankers, whole], [*turns, *zip(EVERY_ARMS, (whole, whole))]
    arms = [arm for arm, _ in turns]
    first = next(iter(cands))
    for rr in rerankers:  # warm-up: embedder, model, allocator
        rr.rank(ds.queries[first], cands[first])
    for rr in rerankers:  # (the first timed query is that one: its tokenization and vectors not kept either)
        rr.forget_passages()
    reuse.states.hits = reuse.states.misses = 0
    runs: dict[str, dict] = {a: {} for a in arms}
    secs: dict[str, list[float]] = {a: [] for a in arms}
    peaks: dict[str, float] = {a: 0.0 for a in arms}
    scores: dict[str, dict[str, dict[str, float]]] = {a: {} for a in arms}
    reused = seen = 0
    for n, (q, docs) in enumerate(cands.items()):
        # "no reuse" first on one query, last on the next: the arm timed first met the caches the
        # previous query left, and the one after it the pages this query's first arm brought in
        for arm, rr in turns if n % 2 == 0 else turns[1:] + turns[:1]:
            hits = rr.states.hits
            out: list = []
            s, peak = timed_peak(lambda rr=rr: out.append(rr.rank(ds.queries[q], docs)))
            secs[arm].append(s)
            peaks[arm] = max(peaks[arm], peak)
            runs[arm][q] = strictly_decreasing((d.id, d.score) for d in out[0])  # (ties in its order)
            scores[arm][q] = {d.id: d.stage_scores.get("likelihood", np.nan) for d in out[0]}
            if arm == "first visit":
                reused += rr.states.hits - hits
                seen += len(docs)
    per_token = reuse.states.nbytes / max(reuse.states.n_tokens, 1)
    rows = []
    for arm in arms:
        diffs = [
            abs(scores[arm][q][i] - scores["no reuse"][q].get(i, np.nan)) for q in scores[arm] for i in scores[arm][q]
        ]
        diff = float(np.nanmax(diffs)) if not np.isnan(diffs).all() else float("nan")  # (read by both arms)
        rows.append(
            {
                "set": setting,
                "arm": arm,
                "mean s/query": float(np.mean(secs[arm])),
                "median s/query": float(np.median(secs[arm])),
                "peak MB": peaks[arm],
                "nDCG@10": evaluate(runs[arm], ds.qrels, ["nDCG@10"], rel=ds.rel)["nDCG@10"],
                "largest Δ likelihood (nats)": diff,
                "reused on first visit": reused / seen if arm == "first visit" else float("nan"),
                "state KB per token": per_token / 1024,
                "queries": len(cands),
            }
        )
    for r in rows:
        r[SPEEDUP] = rows[0]["mean s/query"] / r["mean s/query"]
    logging.info("%s done", setting)
    return rows


def by_conversation(setting: str, ds, cands: dict) -> tuple[str, object, dict]:
    """LoCoMo's sampled questions grouped by conversation (sample order kept within each)."""
    order = sorted(cands, key=lambda q: q.split(":")[0])  # stable: each conversation's in sample order
    return setting, ds, {q: cands[q] for q in order}


def markdown(p: dict) -> str:
    env = p["environment"]
    cols = [
        "set",
        "arm",
        "mean s/query",
        "median s/query",
        SPEEDUP,
        "peak MB",
        "nDCG@10",
        "largest Δ likelihood (nats)",
        "reused on first visit",
        "state KB per token",
        "queries",
    ]
    fmt = {
        "mean s/query": ".3f",
        "median s/query": ".3f",
        SPEEDUP: ".1f",
        "peak MB": ".0f",
        "largest Δ likelihood (nats)": ".3f",
        "reused on first visit": ".1%",
        "state KB per token": ".1f",
    }
    return "\n".join(
        [
            f"# The default preset with reused passage states ({env['date']}, {env['cpus']} CPUs, {env.get('cpu', '')})",
            "",
            f"Command: `{command_line()}`",
            "",
            f"SmolLM2-135M-Instruct ({p['dtype']}), preset `likelihood` (z(BM25) + z(dense) + z(query likelihood)). "
            "`no reuse`: every candidate's prompt computed in full (`state_cache_mb=0`); `first visit`: the default "
            "reranker (state cache 1024 MB) on the query's first time, reusing what earlier queries of the set "
            "brought; `all cached`: the same query again, every candidate's prompt states reused, so only the "
            "query's tokens run. Each query runs the three in turn."
            + (
                f" The preset's likelihood scores the {p['likelihood_depth']} candidates BM25 and dense rank highest "
                "(`likelihood_depth`); the arms `..., every candidate` run the same preset scoring every candidate "
                "(the default), in turn with the others."
                if p.get("likelihood_depth")
                else ""
            )
            + " The largest likelihood change is bfloat16 "
            "rounding: reused states meet the query in other shapes than one full pass (in float32 the two agree "
            "to 1e-5, tests/llm/test_likelihood.py; batching the same prompts differently moves bfloat16 scores "
            "too); nDCG@10 shows what it does to the ranking. reused on first visit: the share of candidates "
            "whose states an earlier query of the set left. peak MB: the largest rise in resident memory during "
            "one query. The machine is shared: compare the arms of one set, not runs of other days.",
            "",
            md_table(p["rows"], cols, fmt),
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--dl19-depths", type=positive_ints, default="20,100")
    ap.add_argument("--dl19-queries", type=positive_int, default=None, help="the first N topics (default: all 43)")
    ap.add_argument("--scifact-queries", type=positive_int, default=100)
    ap.add_argument("--locomo-questions", type=positive_int, default=200)
    ap.add_argument(
        "--likelihood-depth",
        type=positive_int,
        default=None,
        help="time the preset with its likelihood on this shortlist, beside every candidate (the default)",
    )
    ap.add_argument("--name", default="likelihood_states", help="the record's name in the output folder")
    ap.add_argument("--out", default=str(REPO / "docs" / "results"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root = data_root(args.data, default=REPO.parent / "shared" / "data")
    sets = [
        *dl19_sets(root, args.dl19_depths, args.dl19_queries),
        scifact_set(root, args.scifact_queries, index_dir=SCIFACT_INDEX),
        by_conversation(*locomo_set(root, args.locomo_questions)),
    ]
    llm = load_llm()
    depth = args.likelihood_depth
    rows = [row for setting, ds, cands in sets for row in measure(llm, setting, ds, cands, depth)]
    payload = {
        "environment": environment(),
        "dtype": str(llm.dtype).removeprefix("torch."),
        "likelihood_depth": depth,
        "rows": rows,
    }
    md = markdown(payload)
    write_outputs(args.name, payload, md, args.out)
    print(md)


if __name__ == "__main__":
    main()
