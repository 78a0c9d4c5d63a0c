"""The query-likelihood signal (UPR) on the four datasets of the fusion benchmark.

    python scripts/bench_likelihood.py [--data DIR] [--scifact-queries 400] [--hotpot-questions 400]
                                       [--locomo-questions 400] [--dtype auto]

The same candidate sets as ``scripts/bench_fusion.py`` (DL19 BM25 top-20, SciFact train hybrid RRF
top-20, HotpotQA distractor's 10 paragraphs, LoCoMo BM25 top-20 turns). For every candidate: the
first stage's own scores and order, the candidate signals (BM25, dense cosine) and the default
LLM's query likelihood (attnrank.rerank.likelihood, passages cut to 300 words), all cached in
indexes/bench-cache. Rows per dataset: each first-stage signal, preset ``signals`` (the default
until 2026-12-04), the likelihood alone, the default preset ``likelihood`` (equal weights over
z(BM25), z(dense), z(likelihood): nothing trained, so its figure on a dataset is a held-out
figure), leave-one-dataset-out trained fusions with and without the likelihood (pointwise, no
gate), and the same two fusions trained in-domain (5-fold over the dataset's queries). Each row's
Δ, wins and losses and sign test are against the best first-stage signal, and separately against
``signals``. Writes docs/results/likelihood.{json,md}.

Fusion rules (an ablation, nothing trained): the same three signals combined by other unsupervised
rules than the default's sum of z-scores: min-max scaling, reciprocal-rank fusion, z-scores of
ranks, BM25 at half weight, and agreement weights (each signal weighted per query by how well it
agrees with the others, after Klementiev et al. ICML 2007's unsupervised rank aggregation; soft,
hard and iterated). Every rule is compared with the default on each dataset; the rules were all
looked at on these four datasets, so the row "rule chosen on the other three" (for each dataset,
the rule with the best mean Δ on the other three) is the only held-out figure among them.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import numpy as np
from _common import positive_int

from attnrank.benchmarks import (
    CandidateSet,
    cached_likelihoods,
    candidate_signals,
    dl19_sets,
    hotpot_set,
    locomo_set,
    rrf_order,
    scifact_set,
    stage_signals,
)
from attnrank.config import set_torch_threads
from attnrank.eval.crossval import labelled_splits
from attnrank.eval.datasets import data_root
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.llm.models import load_llm
from attnrank.rerank.fused import LIKELIHOOD, LIKELIHOOD_FEATURES, equal_weights
from attnrank.rerank.fused_features import FusionExample, feature_matrix
from attnrank.rerank.fused_training import train_fused
from attnrank.rerank.fusion_eval import compare, fit_unless_worse, own_untrained, registration_curve
from attnrank.rerank.learned.features import standardise

log = logging.getLogger("bench_likelihood")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
CACHE = REPO / "indexes" / "bench-cache"
SCIFACT_INDEX = REPO / "indexes" / "bench-scifact"
METRICS = {"DL19": ["nDCG@10"], "SciFact": ["nDCG@10"], "HotpotQA": ["nDCG@10", "R@2"], "LoCoMo": ["nDCG@10", "R@5"]}
FIRST = ("first stage: rank", "first stage: BM25", "first stage: dense", "first stage: RRF", "bm25", "dense")
SIGNALS = "preset signals: z(BM25) + z(dense), untrained (the default until 2026-12-04)"
PRESET = "default preset likelihood: z(BM25) + z(dense) + z(likelihood), untrained"
ALONE = "likelihood alone"
TRAINED = "trained on the other datasets: BM25, dense, rank"
TRAINED_QL = "trained on the other datasets: BM25, dense, rank, likelihood"
KFOLD = "trained in-domain (5-fold over queries): BM25, dense, rank"
KFOLD_QL = "trained in-domain (5-fold over queries): BM25, dense, rank, likelihood"
TRAIN_RULE = "attnrank train in-domain (5-fold; weights kept only if not below equal weights on inner 5 folds)"
TRAIN_RULE_SIGNALS = "attnrank train --preset signals in-domain (the same rule, without the likelihood)"


def examples(group: str, root: Path, setting: str, ds, cands: dict, ql: dict) -> list[FusionExample]:
    st = stage_signals(root, setting, ds, cands, CACHE, SCIFACT_INDEX)
    sig = candidate_signals(setting, ds, cands, CACHE)
    out = []
    for q, docs in cands.items():
        s = {
            **sig[q],
            LIKELIHOOD: ql[q][LIKELIHOOD],
            "first stage: BM25": np.nan_to_num(st[q]["bm25"], nan=-1e9),
            "first stage: dense": np.nan_to_num(st[q]["dense"], nan=-1e9),
            "first stage: RRF": rrf_order(st[q]["bm25"], st[q]["dense"]),
            "first stage: rank": -np.arange(len(docs), dtype=float),
        }
        labels = np.array([ds.qrels.get(q, {}).get(d.id, 0) for d in docs], dtype=np.int64)
        out.append(FusionExample(q, [d.id for d in docs], s, labels, ds.rel, group, dict(ds.qrels.get(q, {}))))
    return out


def set_examples(llm, root: Path, sets: dict[str, CandidateSet]) -> dict[str, list[FusionExample]]:
    """Each candidate set's examples (:func:`examples`), with the model's likelihoods (cached)."""
    return {
        g: examples(g, root, setting, ds, cands, cached_likelihoods(llm, setting, ds, cands, CACHE))
        for g, (setting, ds, cands) in sets.items()
    }


def rows_for(data: dict[str, list[FusionExample]]) -> list[dict]:
    """Per dataset, every method's row against the best first stage and against preset signals."""
    rows = []
    default, preset = equal_weights(), equal_weights(LIKELIHOOD_FEATURES)
    for g, test in data.items():
        train = [e for h, ex in data.items() if h != g for e in ex]
        trained = train_fused(train, ["bm25", "dense", "rank"], gate=False)
        trained_ql = train_fused(train, ["bm25", "dense", "rank", LIKELIHOOD], gate=False)
        scores = {f"{f} alone": {e.qid: e.signals[f] for e in test} for f in FIRST}
        scores[SIGNALS] = {e.qid: default.score(e.signals) for e in test}
        scores[ALONE] = {e.qid: e.signals[LIKELIHOOD] for e in test}
        scores[PRESET] = {e.qid: preset.score(e.signals) for e in test}
        scores[TRAINED] = {e.qid: trained.score(e.signals) for e in test}
        scores[TRAINED_QL] = {e.qid: trained_ql.score(e.signals) for e in test}
        kfold, kept = in_domain(test)
        scores.update(kfold)
        vs_signals = {r["method"]: r for r in compare(test, scores, METRICS[g][:1], baselines=(SIGNALS,))}
        for r in compare(test, scores, METRICS[g], baselines=tuple(f"{f} alone" for f in FIRST)):
            d = vs_signals[r["method"]]
            rows.append(
                {
                    "dataset": g,
                    **r,
                    "Δ signals": d["Δ"],
                    "wins vs signals": d["wins"],
                    "losses vs signals": d["losses"],
                    "p vs signals": d["p"],
                    **({"weights": _weights(trained_ql)} if r["method"] == TRAINED_QL else {}),
                    **({"kept trained weights in outer folds": kept[r["method"]]} if r["method"] in kept else {}),
                }
            )
    return rows


def in_domain(test: list[FusionExample], k: int = 5) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, int]]:
    """The trained fusions with and without the likelihood, in-domain: each of ``k`` folds of the
    dataset's queries scored by weights trained on the other folds (pointwise, no gate); and what
    ``attnrank train`` registers for the default preset (:func:`fit_unless_worse`: the trained
    weights where its own ``k``-fold report over the training folds finds them not below the
    equal weights, else the equal weights), so that choice is held out too (nested), and the same
    for the preset signals; and in how many of the ``k`` outer folds each kept its trained weights."""
    out: dict[str, dict[str, np.ndarray]] = {KFOLD: {}, KFOLD_QL: {}, TRAIN_RULE: {}, TRAIN_RULE_SIGNALS: {}}
    rules = {
        name: (f, equal_weights(own_untrained(f)[1]))
        for name, f in ((TRAIN_RULE, LIKELIHOOD), (TRAIN_RULE_SIGNALS, None))
    }
    kept = dict.fromkeys(rules, 0)
    # (questions that share a relevant document in one fold: dealt one by one until 2026-12-06, a
    # LoCoMo question's evidence turns were relevant to training questions of its conversation)
    for split in labelled_splits(test, k):
        for name, feats in ((KFOLD, ["bm25", "dense", "rank"]), (KFOLD_QL, ["bm25", "dense", "rank", LIKELIHOOD])):
            fused = train_fused(split.train, feats, gate=False)
            out[name].update({e.qid: fused.score(e.signals) for e in split.test})
        for name, (feature, untrained) in rules.items():
            chosen = fit_unless_worse(split.train, feature, folds=k)[1]
            kept[name] += chosen is not None
            out[name].update({e.qid: (chosen or untrained).score(e.signals) for e in split.test})
    log.info("attnrank train kept its trained weights in %s of %d outer folds of %s", kept, k, test[0].group)
    return out, kept


def train_curve(data: dict[str, list[FusionExample]]) -> list[dict]:
    """:func:`registration_curve` of each dataset (the default preset's rule, 3 fold shuffles)."""
    return [{"dataset": g, **row} for g, test in data.items() for row in registration_curve(test)]


def _ranks(x: np.ndarray) -> np.ndarray:
    """0 for the highest value of each column of ``x``, 1 for the next, …"""
    return np.argsort(np.argsort(-x, axis=0), axis=0).astype(float)


def _agreement(z: np.ndarray) -> np.ndarray:
    """Each column's Pearson correlation with the mean of the other columns (0 where undefined)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        c = [np.corrcoef(z[:, i], np.delete(z, i, 1).mean(1))[0, 1] for i in range(z.shape[1])]
    return np.nan_to_num(np.array(c))


def _iterated_agreement(z: np.ndarray, rounds: int = 5) -> np.ndarray:
    """Weights 1 + each column's correlation with the weighted sum of the others, ``rounds`` times."""
    w = np.ones(z.shape[1])
    for _ in range(rounds):
        agg = z @ w
        with np.errstate(invalid="ignore", divide="ignore"):
            c = [np.corrcoef(z[:, i], agg - w[i] * z[:, i])[0, 1] for i in range(z.shape[1])]
        w = 1 + np.nan_to_num(np.array(c))
    return z @ w


def _hard_agreement(z: np.ndarray) -> np.ndarray:
    w = np.maximum(_agreement(z), 0)
    return z @ (w / w.sum() if w.sum() > 0 else np.ones_like(w))


def _minmax(x: np.ndarray) -> np.ndarray:
    span = x.max(0) - x.min(0)
    return ((x - x.min(0)) / np.where(span > 0, span, 1)).sum(1)


DEFAULT_RULE = "z-scores summed (the default)"
FEATURES3 = list(LIKELIHOOD_FEATURES)
RULES = {  # name -> (reads raw values: False = per-query z-scores, rule)
    DEFAULT_RULE: (False, lambda z: z.sum(1)),
    "min-max scaled, summed": (True, _minmax),
    "reciprocal-rank fusion (k 60)": (True, lambda x: (1 / (61 + _ranks(x))).sum(1)),  # (ranks from 1)
    "z-scores of ranks, summed": (True, lambda x: standardise(-_ranks(x)).sum(1)),
    "BM25 at half weight": (False, lambda z: z @ np.array([0.5, 1.0, 1.0])),
    "agreement weights, soft: 1 + r": (False, lambda z: z @ (1 + _agreement(z))),
    "agreement weights, hard: max(r, 0)": (False, _hard_agreement),
    "agreement weights, iterated": (False, _iterated_agreement),
}
CHOSEN = "rule chosen on the other three datasets"


def rule_rows(data: dict[str, list[FusionExample]]) -> list[dict]:
    """Per dataset, each fusion rule against the default, and the rule chosen on the other three."""
    assert FEATURES3[0] == "bm25"  # "BM25 at half weight" reads column 0
    scores: dict[str, dict[str, dict]] = {}
    per: dict[str, dict[str, dict]] = {}
    for g, test in data.items():
        scores[g] = {
            name: {
                e.qid: rule(
                    np.column_stack([e.signals[f] for f in FEATURES3]).astype(float)
                    if raw
                    else feature_matrix(e.signals, FEATURES3)
                )
                for e in test
            }
            for name, (raw, rule) in RULES.items()
        }
        rows = compare(test, scores[g], METRICS[g][:1], baselines=(DEFAULT_RULE,))
        per[g] = {r["method"]: dict(r, dataset=g) for r in rows}
    return chosen_rows(data, per, scores, DEFAULT_RULE, {m: m for m in RULES})


def chosen_rows(
    data: dict[str, list[FusionExample]],
    per: dict[str, dict[str, dict]],
    scores: dict[str, dict[str, dict]],
    default: str,
    candidates: dict[str, str],
    label: str = CHOSEN,
) -> list[dict]:
    """Per dataset, the rows ``per[g]`` (each method against ``default``), then the row of the
    candidate method whose mean Δ on the other datasets is best (``label``, the only held-out
    figure among them; ``candidates``: method -> the name it is shown by), from ``scores[g]``."""
    rows = []
    for g, test in data.items():
        chosen = max(candidates, key=lambda m: np.mean([per[h][m]["Δ"] for h in data if h != g]))
        picked = compare(
            test, {default: scores[g][default], label: scores[g][chosen]}, METRICS[g][:1], baselines=(default,)
        )
        picked = [dict(r, dataset=g, chosen=candidates[chosen]) for r in picked if r["method"] == label]
        for r in [*per[g].values(), *picked]:
            rows.append({k: v for k, v in r.items() if k != "best first stage"})
    return rows


def _weights(fused) -> str:
    return ", ".join(f"{f} {w:.3f}" for f, w in zip(fused.features, fused.weights))


def means(rows: list[dict]) -> list[dict]:
    """Per method, nDCG@10 and Δ averaged over the datasets, and on how many datasets it is at or
    above the best first stage, and above preset signals."""
    out = []
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        out.append(
            {
                "method": m,
                "mean nDCG@10": float(np.mean([r["nDCG@10"] for r in mine])),
                "mean Δ": float(np.mean([r["Δ"] for r in mine])),
                ">= best first stage": sum(r["Δ"] >= 0 for r in mine),
                "mean Δ signals": float(np.mean([r["Δ signals"] for r in mine])),
                "> signals": sum(r["Δ signals"] > 0 for r in mine),
            }
        )
    return out


def markdown(p: dict, command: str) -> str:
    lines = [
        f"# Query likelihood (UPR) as a reranking signal ({p['date']}, {p['env'].get('cpus', '?')} CPUs, "
        f"{p['env'].get('cpu', '')})",
        "",
        f"Command: `{command}`. Model {p['model']} ({p['dtype']}); {p['sizes']}. Each passage is its own "
        'prompt ("Passage: ... Please write a question based on this passage. Question:", Sachan et '
        "al. EMNLP 2022); the score is the mean log-probability of the query's tokens. Untrained rows "
        "(every first-stage signal, `signals`, the likelihood alone, `likelihood`) saw no labels, so each "
        "dataset is held out for them; two trained rows are trained on the other three datasets "
        "(leave-one-dataset-out, pointwise, no gate), two on the dataset's other queries (in-domain, "
        "5-fold over queries, the same model), and two rows are what `attnrank train` registers for the default "
        "preset and for `signals` (`--preset signals`), in-domain: in each outer fold, the trained weights if its "
        "own 5-fold report over the training folds found them not below the preset's equal weights, else the equal "
        "weights (nested, so that choice is held out too). Δ, wins/losses and p (two-sided sign test over "
        "queries): against the best first-stage signal on that dataset (chosen on the same queries, "
        "which flatters it), and against the preset `signals` (the default until 2026-12-04). The first stage's own scores are "
        "`first stage: ...` (DL19: Pyserini BM25; SciFact: the hybrid retriever's BM25, dense and RRF; "
        "HotpotQA and LoCoMo: BM25 over the pooled documents); `bm25`/`dense` are the reranker's "
        "candidate signals.",
        "",
        "## Mean over the four datasets",
        "",
        md_table(
            p["means"],
            ["method", "mean nDCG@10", "mean Δ", ">= best first stage", "mean Δ signals", "> signals"],
            {"mean Δ": "+.2f", "mean Δ signals": "+.2f"},
        ),
        "",
        "What it costs per query, timed in one process beside the other presets: rerank_presets.md "
        "(`python scripts/bench_presets.py`).",
    ]
    for g in dict.fromkeys(r["dataset"] for r in p["rows"]):
        rows = [r for r in p["rows"] if r["dataset"] == g]
        metrics = METRICS[g]
        cols = [
            "method",
            *metrics,
            "Δ",
            "wins",
            "losses",
            "p",
            "Δ signals",
            "wins vs signals",
            "losses vs signals",
            "p vs signals",
        ]
        lines += [
            "",
            f"## {g} (best first stage: {rows[0]['best first stage']})",
            "",
            md_table(rows, cols, {"Δ": "+.2f", "Δ signals": "+.2f", "p": ".3g", "p vs signals": ".3g"}),
        ]
        w = [r["weights"] for r in rows if "weights" in r]
        if w:
            lines += ["", f"Weights of the trained row with likelihood: {w[0]}."]
        kept = [r for r in rows if "kept trained weights in outer folds" in r]
        if kept:
            said = "; ".join(
                f"{r['method'].split(' in-domain')[0]}: {r['kept trained weights in outer folds']}" for r in kept
            )
            lines += ["", f"Outer folds (of 5) in which `attnrank train` kept its trained weights: {said}."]
    curve = [
        "",
        "## What `attnrank train` registers, by the number of labelled queries",
        "",
        "In each of 5 outer folds of a dataset, n of the training folds' queries are drawn; train's rule "
        "(its own 5-fold report on them: trained weights only if not below the equal weights) decides, and the "
        "held-out fold is scored by its choice. Δ: nDCG@10 points against the default's equal weights, mean over "
        "3 fold shuffles (worst shuffle beside it); DL19 has too few queries beyond 20.",
        "",
        md_table(
            p["train curve"], list(p["train curve"][0]), {"Δ vs equal weights": "+.2f", "worst shuffle Δ": "+.2f"}
        ),
    ]
    return "\n".join(lines + rules_markdown(p["rules"]) + curve) + "\n"


def wide_table(rows: list[dict], first: str, detail: bool = False) -> list[dict]:
    """One row per method (column ``first``), one cell per dataset: nDCG@10, Δ, wins/losses (with
    ``detail`` the sign test's p too, and a mean nDCG@10 column), the chosen method's name where a
    row has one; and the mean Δ."""
    groups = list(dict.fromkeys(r["dataset"] for r in rows))
    table = []
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = {r["dataset"]: r for r in rows if r["method"] == m}
        row = {first: m}
        for g in groups:
            r = mine[g]
            p = f" p {r['p']:.2g}" if detail else ""
            name = f" ({r['chosen']})" if "chosen" in r else ""
            row[g] = f"{r['nDCG@10']:.4f} {r['Δ']:+.2f} {r['wins']}/{r['losses']}{p}{name}"
        if detail:
            row["mean nDCG@10"] = f"{np.mean([mine[g]['nDCG@10'] for g in groups]):.4f}"
        row["mean Δ"] = f"{np.mean([mine[g]['Δ'] for g in groups]):+.2f}"
        table.append(row)
    return table


def rules_markdown(rows: list[dict]) -> list[str]:
    """The fusion-rule ablation: one row per rule, one column group per dataset."""
    groups = list(dict.fromkeys(r["dataset"] for r in rows))
    table = wide_table(rows, "rule")
    return [
        "",
        "## Fusion rules (ablation, nothing trained)",
        "",
        "The default's three signals (BM25, dense cosine, likelihood) combined by other unsupervised "
        "rules. Each cell: nDCG@10, Δ points against the default, wins/losses per query. Agreement "
        "weights: each signal's weight in a query is set by its Pearson correlation r with the mean of "
        "the other two z-scores (after Klementiev et al., ICML 2007; iterated: with the weighted sum, "
        "five rounds). All rules were looked at on these datasets; the last row chooses, for each "
        "dataset, the rule with the best mean Δ on the other three (named in brackets), and is the "
        "only held-out figure among them.",
        "",
        md_table(table, ["rule", *groups, "mean Δ"]),
    ]


def add_set_arguments(ap: argparse.ArgumentParser) -> None:
    """The data folder and the sizes of the four candidate sets (:func:`candidate_sets`)."""
    ap.add_argument("--data", default=None)
    ap.add_argument("--scifact-queries", type=positive_int, default=400)
    ap.add_argument("--hotpot-questions", type=positive_int, default=400)
    ap.add_argument("--locomo-questions", type=positive_int, default=400)


def candidate_sets(root: Path, args: argparse.Namespace) -> dict[str, CandidateSet]:
    """The four candidate sets of this benchmark and of the ones built on it (likelihood_cut,
    likelihood_tokens), sized by :func:`add_set_arguments`' options."""
    return {
        "DL19": dl19_sets(root, [20])[0],
        "SciFact": scifact_set(root, args.scifact_queries, index_dir=SCIFACT_INDEX),
        "HotpotQA": hotpot_set(root, args.hotpot_questions),
        "LoCoMo": locomo_set(root, args.locomo_questions),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_set_arguments(ap)
    ap.add_argument("--dtype", default="auto", help="the LLM's precision (auto: bfloat16 on a CPU that has it)")
    ap.add_argument("--out", default=None, help="output folder (default docs/results)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root = data_root(args.data)
    llm = load_llm(dtype=args.dtype)
    sets = candidate_sets(root, args)
    data = set_examples(llm, root, sets)
    sizes = [f"{g} {len(cands)} queries" for g, (_, _, cands) in sets.items()]
    rows = rows_for(data)
    payload = {
        "date": time.strftime("%Y-%m-%d"),
        "env": environment(),
        "model": llm.model_id,
        "dtype": str(llm.dtype).removeprefix("torch."),
        "sizes": ", ".join(sizes),
        "rows": rows,
        "means": means(rows),
        "rules": rule_rows(data),
        "train curve": train_curve(data),
    }
    command = payload["env"]["command"]  # (as this process ran: options a retyped line dropped)
    js, md = write_outputs("likelihood", payload, markdown(payload, command), args.out or OUT)
    log.info("wrote %s and %s", js, md)


if __name__ == "__main__":
    main()
