"""The default preset on queries that no choice behind it looked at.

    python scripts/bench_confirm.py [--data DIR] [--offset 400] [--scifact-queries N] [--locomo-questions 400]

Every choice behind the default preset (equal weights, the likelihood rather than attention, UPR's
mean over the query's tokens, the 300-word passage cut, the preset itself) was made looking at the
candidate sets of ``scripts/bench_likelihood.py``: all of DL19 and of HotpotQA dev's 400
questions, and the first 400 queries of SciFact train and of LoCoMo in the benchmarks' seeded order
(:func:`attnrank.eval.datasets.sample_order`). Their figures are therefore a little flattered
(a winner's bias). SciFact train and LoCoMo have more labelled queries than that: this benchmark
scores the same methods on the queries after position ``--offset`` of the same seeded order
(``--scifact-queries`` of SciFact train's, default all; ``--locomo-questions`` of LoCoMo's), with
the same candidate generation, caches and code. Other records did report on some of these
queries, for other things: ``bench_heads`` (attention-only rerankers and head detection) on all
809 SciFact train queries, and ``bench_first_stage`` tuned the index's convex fusion weight on a
half of them (these candidate sets fuse by RRF); the 100 LoCoMo questions ``bench_locomo``
evaluates (the presets' answers) are left out here.

Rows, on the new queries:
- each first-stage signal, preset ``signals`` and the default preset ``likelihood`` (untrained);
- ``attnrank train`` on the dataset's first ``--offset`` queries (its rule: trained weights only
  where its own 5-fold report finds them not below the equal weights), applied to the new queries;
- the fusion of BM25, dense, rank and likelihood trained on every query of the four earlier
  candidate sets (what "trained on everything we have" would ship).

Δ, wins/losses and the sign test are against the first-stage signal that scored best on the same
dataset's earlier queries, fixed before the new ones were scored; the best first-stage signal
on the new queries themselves (post hoc, which flatters it) is in a second column. Writes
docs/results/confirm.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from _common import non_negative_int, positive_int
from bench_likelihood import FIRST, METRICS, PRESET, SCIFACT_INDEX, SIGNALS, candidate_sets, set_examples

from attnrank.benchmarks import locomo_set, scifact_set
from attnrank.config import set_torch_threads
from attnrank.eval.datasets import data_root, locomo, sample_order
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.llm.models import load_llm
from attnrank.rerank.fused import LIKELIHOOD, LIKELIHOOD_FEATURES, equal_weights
from attnrank.rerank.fused_training import train_fused
from attnrank.rerank.fusion_eval import compare, fit_unless_worse

log = logging.getLogger("bench_confirm")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
TRAIN_RULE = "attnrank train on the earlier queries (weights only if not below equal weights, 5-fold)"
ALL_DATA = "trained on every earlier query of the four datasets: BM25, dense, rank, likelihood"
FIRST_ALONE = tuple(f"{f} alone" for f in FIRST)


def scores_for(new, earlier, pooled) -> dict:
    """Every method's scores of the ``new`` examples; ``earlier``: this dataset's earlier examples
    (what ``attnrank train`` learns from), ``pooled``: every earlier example of the four datasets."""
    rule = fit_unless_worse(earlier, LIKELIHOOD)[1] or equal_weights(LIKELIHOOD_FEATURES)
    everything = train_fused(pooled, ["bm25", "dense", "rank", LIKELIHOOD], gate=False)
    scores = {f"{f} alone": {e.qid: e.signals[f] for e in new} for f in FIRST}
    scores[SIGNALS] = {e.qid: equal_weights().score(e.signals) for e in new}
    scores[PRESET] = {e.qid: equal_weights(LIKELIHOOD_FEATURES).score(e.signals) for e in new}
    scores[TRAIN_RULE] = {e.qid: rule.score(e.signals) for e in new}
    scores[ALL_DATA] = {e.qid: everything.score(e.signals) for e in new}
    return scores


def rows_for(group: str, new, earlier, pooled) -> list[dict]:
    """Rows against the first stage best on ``earlier`` (fixed in advance) and against the best on ``new``."""
    metrics = METRICS[group]
    alone = {f"{f} alone": {e.qid: e.signals[f] for e in earlier} for f in FIRST}
    earlier_best = compare(earlier, alone, metrics[:1], FIRST_ALONE)[0]["best first stage"]
    scores = scores_for(new, earlier, pooled)
    post_hoc = {r["method"]: r for r in compare(new, scores, metrics[:1], FIRST_ALONE)}
    rows = []
    for r in compare(new, scores, metrics, (earlier_best,)):
        ph = post_hoc[r["method"]]
        rows.append(
            {
                "dataset": group,
                **r,
                "Δ best on these queries": ph["Δ"],
                "best on these queries": ph["best first stage"],
                "wins/losses vs it": f"{ph['wins']}/{ph['losses']}",
            }
        )
    return rows


def reported_by_bench_locomo(root: Path, skip: int = 400, n: int = 100) -> set[str]:
    """The LoCoMo questions ``scripts/bench_locomo.py`` reported on before this benchmark, so left
    out of its new questions: those of its record (``docs/results/locomo.json``) where there is one
    (its questions were drawn by the loader of its day), else the ones it evaluates with its
    defaults today (the first ``n`` of categories 1-4 with an answer after position ``skip`` of the
    seeded order)."""
    record = OUT / "locomo.json"
    if record.is_file():
        return {q["id"] for q in json.loads(record.read_text(encoding="utf-8"))["per_question"]}
    category = {q for c in (1, 2, 3, 4) for q in locomo(root, categories=[c]).queries}
    ds = locomo(root)
    order = sample_order(ds)
    return set([q for q in order[skip:] if q in category and ds.answers.get(q)][:n])


def markdown(p: dict, command: str) -> str:
    cols = [
        "dataset",
        "method",
        *sorted({m for r in p["rows"] for m in METRICS[r["dataset"]]}, reverse=True),
        "Δ",
        "wins",
        "losses",
        "p",
        "Δ best on these queries",
        "wins/losses vs it",
    ]
    fmt = {"Δ": "+.2f", "p": ".2g", "Δ best on these queries": "+.2f"}
    return "\n".join(
        [
            "# The default preset on queries no choice behind it looked at",
            "",
            f"Command: `{command}`. Date: {p['date']}. Machine: {p['env']['cpu']}, {p['env']['threads']} threads. "
            f"Model: {p['model']} ({p['dtype']}). New queries: {p['sizes']}.",
            "",
            "Every choice behind the default preset was made on the earlier queries of these datasets (the first "
            f"{p['offset']} of the seeded order) and on DL19 and HotpotQA; these queries come after them, and no such "
            "choice looked at them (other records report on some, for other things: see the script's docstring). Δ (points of the first metric), wins/losses and p (sign test): against the "
            "first-stage signal that was best on the same dataset's earlier queries (named in each row's `best first "
            "stage`), fixed before these queries were scored. `Δ best on these queries`: against whichever "
            "first-stage signal scores best on these queries themselves (post hoc, flattering the baseline).",
            "",
            md_table(p["rows"], cols + ["best first stage", "best on these queries"], fmt),
            "",
        ]
    )


EARLIER = 400  # the queries the presets were chosen on, per dataset (the first of the seeded order)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument(
        "--offset", type=non_negative_int, default=400, help="where the new queries start in the seeded order"
    )
    ap.add_argument(
        "--scifact-queries", type=positive_int, default=None, help="how many new SciFact queries (default: all)"
    )
    ap.add_argument("--locomo-questions", type=positive_int, default=400)
    ap.add_argument("--dtype", default="auto", help="the LLM's precision (auto: bfloat16 on a CPU that has it)")
    ap.add_argument("--out", default=None, help="output folder (default docs/results)")
    args = ap.parse_args()
    if args.offset < EARLIER:  # the earlier queries (training, choices) are the first EARLIER: no overlap
        ap.error(
            f"--offset {args.offset} would score queries the earlier {EARLIER} trained on; give --offset >= {EARLIER}"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root = data_root(args.data)
    llm = load_llm(dtype=args.dtype)
    earlier_sets = candidate_sets(
        root, argparse.Namespace(scifact_queries=EARLIER, hotpot_questions=EARLIER, locomo_questions=EARLIER)
    )
    earlier = set_examples(llm, root, earlier_sets)
    pooled = [e for ex in earlier.values() for e in ex]
    new_sets = {
        "SciFact": scifact_set(root, args.scifact_queries, index_dir=SCIFACT_INDEX, offset=args.offset),
        "LoCoMo": locomo_set(root, args.locomo_questions, offset=args.offset),
    }
    rows, sizes = [], []
    for g, new in set_examples(llm, root, new_sets).items():
        setting = new_sets[g][0]
        left_out = reported_by_bench_locomo(root) & {e.qid for e in new} if g == "LoCoMo" else set()
        positions = f"positions {args.offset + 1}-{args.offset + len(new)} of the seeded order"
        new = [e for e in new if e.qid not in left_out]
        rows += rows_for(g, new, earlier[g], pooled)
        said = f", less the {len(left_out)} that bench_locomo reports on" if left_out else ""
        sizes.append(f"{g} {len(new)} ({setting.split(' (')[0]}, {positions}{said})")
    payload = {
        "date": time.strftime("%Y-%m-%d"),
        "env": environment(),
        "model": llm.model_id,
        "dtype": str(llm.dtype).removeprefix("torch."),
        "offset": args.offset,
        "sizes": "; ".join(sizes),
        "rows": rows,
    }
    command = payload["env"]["command"]  # (as this process ran: options a retyped line dropped)
    js, md = write_outputs("confirm", payload, markdown(payload, command), args.out or OUT)
    log.info("wrote %s and %s", js, md)


if __name__ == "__main__":
    main()
