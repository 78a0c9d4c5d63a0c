"""How many candidates the default's query likelihood must score (``likelihood_depth``, an ablation).

    python scripts/bench_likelihood_depth.py [--data DIR] [--scifact-queries 400]
                                             [--hotpot-questions 400] [--locomo-questions 400]
                                             [--offset 400] [--new-scifact 200] [--new-locomo 400]

The default preset sums the per-query z-scores of BM25, the dense cosine and the LLM's query
likelihood (UPR) over every candidate, one LLM prompt each. With a shortlist
(attnrank.rerank.shortlist) the likelihood scores only the ``depth`` candidates that BM25 and dense
rank highest, and the rest follow them in the signals' order: the LLM's cost is that of ``depth``
candidates, whatever the number reranked. Each row scores the candidate sets of
scripts/bench_likelihood.py from their cached likelihoods (nothing trained, nothing computed but
for sets not cached yet), each depth against the default's every candidate.

Depths were looked at on these four datasets, so the row "depth chosen on the other three" (for
each dataset, the depth with the best mean Δ on the other three) is the only held-out figure
among them. The depth with the best mean Δ on all four is then scored, against every candidate,
on sets no choice looked at: the queries of SciFact train and LoCoMo after ``--offset`` in the
seeded order (those of scripts/bench_confirm.py, less the LoCoMo questions bench_locomo reports on),
and DL19's BM25 top-100 (another number of candidates; there also at depths 20, 30 and 50). The
default scores every candidate: no depth kept its quality on those sets. ``likelihood_depth`` is
an option, for a user who trades some quality for the LLM's time. Writes
docs/results/likelihood_depth.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
from _common import non_negative_int, positive_int
from bench_confirm import reported_by_bench_locomo
from bench_likelihood import METRICS, SCIFACT_INDEX, add_set_arguments, candidate_sets, chosen_rows, set_examples

from attnrank.benchmarks import dl19_sets, locomo_set, scifact_set
from attnrank.config import set_torch_threads
from attnrank.eval.datasets import data_root
from attnrank.eval.report import command_line, environment, md_table, write_outputs
from attnrank.llm.models import load_llm
from attnrank.rerank.fused import LIKELIHOOD, LIKELIHOOD_FEATURES, equal_weights
from attnrank.rerank.fused_features import FusionExample
from attnrank.rerank.fusion_eval import compare
from attnrank.rerank.shortlist import fused_on_shortlist

log = logging.getLogger("bench_likelihood_depth")
OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
DEPTHS = (5, 8, 10, 12, 15)
EVERY = "every candidate (the default)"
CHOSEN = "depth chosen on the other three datasets"


def depth_scores(test: list[FusionExample], depth: int | None) -> dict[str, np.ndarray]:
    """The default preset's scores of each query with the likelihood on a shortlist of ``depth``
    (None: every candidate)."""
    weights = equal_weights(LIKELIHOOD_FEATURES)
    out = {}
    for e in test:
        if depth is None or depth >= len(e.doc_ids):
            out[e.qid] = weights.score(e.signals)
            continue
        cached = np.asarray(e.signals[LIKELIHOOD])
        out[e.qid] = fused_on_shortlist(weights, e.signals, depth, cached.__getitem__)[0]
    return out


def name(depth: int | None) -> str:
    return EVERY if depth is None else f"the likelihood on the signals' top {depth}"


def prompts(test: list[FusionExample], depth: int | None) -> float:
    """The share of the candidates the likelihood scores (its LLM prompts), over the queries."""
    return float(np.mean([1.0 if depth is None else min(depth, len(e.doc_ids)) / len(e.doc_ids) for e in test]))


def looked_at_rows(data: dict[str, list[FusionExample]]) -> list[dict]:
    """Per dataset, each depth against every candidate, and the depth chosen on the other three."""
    scores, per = {}, {}
    for g, test in data.items():
        scores[g] = {name(d): depth_scores(test, d) for d in (None, *DEPTHS)}
        rows = compare(test, scores[g], METRICS[g][:1], baselines=(EVERY,))
        share = {name(d): prompts(test, d) for d in (None, *DEPTHS)}
        per[g] = {r["method"]: dict(r, dataset=g, prompts=share[r["method"]]) for r in rows}
    return chosen_rows(data, per, scores, EVERY, {name(d): str(d) for d in DEPTHS}, CHOSEN)


def best_depth(rows: list[dict]) -> int:
    """The depth with the best mean Δ over the datasets of ``rows`` (ties: the larger depth)."""
    mean = {d: np.mean([r["Δ"] for r in rows if r["method"] == name(d)]) for d in DEPTHS}
    return max(DEPTHS, key=lambda d: (round(float(mean[d]), 6), d))


WIDE = (20, 30, 50)  # more depths where 100 candidates are reranked


def new_rows(data: dict[str, list[FusionExample]], depth: int) -> list[dict]:
    """Per set no choice looked at, ``depth`` against every candidate (and :data:`WIDE` depths
    where a query has more than twice as many candidates as the largest of them)."""
    rows = []
    for g, test in data.items():
        wide = [d for d in WIDE if d != depth and all(len(e.doc_ids) >= 2 * max(WIDE) for e in test)]
        scores = {name(d): depth_scores(test, d) for d in (None, depth, *wide)}
        group = g.split(" ")[0]
        share = {name(d): prompts(test, d) for d in (None, depth, *wide)}
        for r in compare(test, scores, METRICS[group][:1], baselines=(EVERY,)):
            rows.append(
                {**{k: v for k, v in r.items() if k != "best first stage"}, "dataset": g, "prompts": share[r["method"]]}
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_set_arguments(ap)
    ap.add_argument("--offset", type=non_negative_int, default=400, help="where the new queries start")
    ap.add_argument("--new-scifact", type=positive_int, default=200, help="new SciFact train queries")
    ap.add_argument("--new-locomo", type=positive_int, default=400, help="new LoCoMo questions (before leaving out)")
    ap.add_argument("--out", default=None, help="output folder (default docs/results)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root = data_root(args.data)
    llm = load_llm(dtype="auto")
    data = set_examples(llm, root, candidate_sets(root, args))
    looked = looked_at_rows(data)
    depth = best_depth(looked)
    new_sets = {
        "SciFact (new queries)": scifact_set(root, args.new_scifact, index_dir=SCIFACT_INDEX, offset=args.offset),
        "LoCoMo (new queries)": locomo_set(root, args.new_locomo, offset=args.offset),
        "DL19 (BM25 top-100)": dl19_sets(root, [100])[0],
    }
    new = set_examples(llm, root, new_sets)
    left_out = reported_by_bench_locomo(root)
    new["LoCoMo (new queries)"] = [e for e in new["LoCoMo (new queries)"] if e.qid not in left_out]
    payload = {
        "date": time.strftime("%Y-%m-%d"),
        "env": environment(),
        "model": llm.model_id,
        "dtype": str(llm.dtype).removeprefix("torch."),
        "sizes": ", ".join(f"{g} {len(d)} queries" for g, d in data.items()),
        "new sizes": ", ".join(f"{g} {len(d)} queries" for g, d in new.items()),
        "depth": depth,
        "rows": looked,
        "new rows": new_rows(new, depth),
        "command": command_line(),
    }
    js, md = write_outputs("likelihood_depth", payload, markdown(payload), args.out or OUT)
    log.info("wrote %s and %s", js, md)


def markdown(p: dict) -> str:
    groups = list(dict.fromkeys(r["dataset"] for r in p["rows"]))
    table = []
    for m in dict.fromkeys(r["method"] for r in p["rows"]):
        mine = {r["dataset"]: r for r in p["rows"] if r["method"] == m}
        row = {"method": m}
        for g in groups:
            r = mine[g]
            chosen = f" (top {r['chosen']})" if "chosen" in r else ""
            row[g] = f"{r['nDCG@10']:.4f} {r['Δ']:+.2f} {r['wins']}/{r['losses']} p {r['p']:.2g}{chosen}"
        row["mean Δ"] = f"{np.mean([mine[g]['Δ'] for g in groups]):+.2f}"
        shares = [mine[g]["prompts"] for g in groups if "prompts" in mine[g]]
        row["LLM prompts"] = f"{np.mean(shares):.0%}" if shares else ""
        table.append(row)
    doc = (__doc__ or "").split("\n\n")
    new_cols = ["dataset", "method", "nDCG@10", "Δ", "wins", "losses", "p", "prompts"]
    lines = [
        f"# How many candidates the likelihood scores ({p['date']}, {p['env'].get('cpus', '?')} CPUs, "
        f"{p['env'].get('cpu', '')})",
        "",
        f"Command: `{p['command']}`. Model {p['model']} ({p['dtype']}); the candidate sets of bench_likelihood, "
        f"{p['sizes']}. Each cell: nDCG@10, Δ points, wins/losses per query and sign-test p against the default "
        "preset scoring every candidate. LLM prompts: the share of the candidates the likelihood scores (mean over "
        "the four datasets; HotpotQA's lists hold 10).",
        "",
        " ".join(doc[2].split()),
        "",
        md_table(table, ["method", *groups, "mean Δ", "LLM prompts"]),
        "",
        f"## The depth chosen on all four ({p['depth']}) on candidates no choice looked at",
        "",
        " ".join(doc[3].split()),
        f" Sets: {p['new sizes']}.",
        "",
        md_table(p["new rows"], new_cols, {"Δ": "+.2f", "p": ".2g", "prompts": ".0%"}),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
