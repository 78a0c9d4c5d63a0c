"""Retrieval heads of the default model: detection (copy-paste NIAH and query-focused), held-out
quality of selected / all / random heads and of the learned head weighting, and latency.

    python scripts/bench_heads.py [--data DIR] [--hotpot-questions 400] [--ship]

Data: DL19 BM25 top-20 (43 queries, graded qrels, rel ≥ 2), SciFact train hybrid top-20 (the
bench_rerank sample), HotpotQA distractor (each question's 10 paragraphs, 2 supporting). Rows
come from the shared row cache (attnrank.eval.rows). Held-out: k-fold over queries within each
dataset (heads are selected and weights trained on the training folds only) and
leave-one-dataset-out for the learned weights. ``--ship`` writes the head sets and the learned
weights trained on all the dev data into attnrank/heads/data/.
Writes docs/results/heads.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import time
from pathlib import Path

import numpy as np
from _common import fold_count, non_negative_int, positive_int

from attnrank.benchmarks import (
    dl19_sets,
    hotpot_set,
    icr_scores,
    rrf_order,
    scifact_set,
    stage_signals,
)
from attnrank.config import set_torch_threads
from attnrank.eval import evaluate
from attnrank.eval.crossval import group_splits, labelled_splits, pool, qrels_links
from attnrank.eval.datasets import data_root
from attnrank.eval.report import command_line, environment, md_table, write_outputs
from attnrank.eval.rows import capture_all, first_stage_run
from attnrank.heads.copypaste import detect_copy_heads
from attnrank.heads.queryfocused import query_focused_scores
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.learned import query_features, restrict_heads, train_head_weights

log = logging.getLogger("bench_heads")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
CACHE = REPO / "indexes" / "bench-cache"  # the row cache (git-ignored)
SCIFACT_INDEX = REPO / "indexes" / "bench-scifact"
SHIP = REPO / "attnrank" / "heads" / "data"


def metrics_for(ds) -> list[str]:
    return ["nDCG@10", "R@2"] if ds.name.startswith("hotpot") else ["nDCG@10"]


def evaluate_scores(cands, qids, scorer, ds) -> dict:
    run = {q: {d.id: float(s) for d, s in zip(cands[q], scorer(q))} for q in qids}
    return evaluate(run, {q: ds.qrels[q] for q in qids}, metrics_for(ds), rel=ds.rel)


def qr_detect(cap, cands, ds, qids, rr):
    items = [(q, cap[q]["windows"], [d.id for d in cands[q]]) for q in qids]
    return query_focused_scores(
        items,
        ds.qrels,
        rr.head_list,
        rr.llm.num_layers,
        rr.llm.num_heads,
        rel=ds.rel,
        data=ds.name,
        model_id=rr.llm.model_id,
        fingerprint=rr.llm.fingerprint,
    )


def features(setups, caps, rr, signals) -> dict:
    """``{setting: {qid: QueryFeatures}}``: all heads' passage scores, first-stage rank, the BM25
    and dense stage scores, labels."""
    return {
        name: {
            q: query_features(
                q,
                caps[name][q]["windows"],
                [d.id for d in cands[q]],
                rr.head_list,
                ds.qrels,
                rel=ds.rel,
                group=name,
                first_stage=list(first_stage_run({q: cands[q]})[q].values()),
                stages=signals[name][q],
            )
            for q in sorted(cands)
        }
        for name, ds, cands in setups
    }


FIRST_STAGES = {
    "BM25 scores": lambda f: f.stages["bm25"],
    "dense (MiniLM) scores": lambda f: f.stages["dense"],
    "RRF of BM25 and dense": lambda f: rrf_order(f.stages["bm25"], f.stages["dense"]),
}


def heldout(name, ds, cands, cap, rr, args, feats, others) -> list[dict]:
    """k-fold: select heads (qr-ndcg, qr-score) and train weights on k−1 folds, test on the rest
    (``others``: the other datasets' features, added to the training folds in one variant)."""
    qids = sorted(cands)
    index = {h: i for i, h in enumerate(rr.head_list)}
    rows: dict[str, list[dict]] = {}
    failed: dict[str, list[int]] = {}  # the folds in which a variant could not be trained

    def add(label, vals, n):
        rows.setdefault(label, []).append({"n": n, **vals})

    # questions that share a relevant document in one fold (dealt one by one until 2026-12-07)
    for f, split in enumerate(labelled_splits(qids, args.folds, seed=0, links=qrels_links(ds.qrels, ds.rel))):
        train, test = split.train, split.test
        det = qr_detect(cap, cands, ds, train, rr)
        add(
            "first stage",
            evaluate_scores(cands, test, lambda q: first_stage_run({q: cands[q]})[q].values(), ds),
            len(test),
        )
        for label, fn in FIRST_STAGES.items():  # every first-stage signal over the same candidates
            add(
                f"first stage: {label}",
                evaluate_scores(cands, test, lambda q: np.nan_to_num(fn(feats[q]), nan=-1e9), ds),
                len(test),
            )
        add(
            "all heads (ICR)",
            evaluate_scores(cands, test, lambda q: icr_scores(cap[q]["windows"], len(cands[q])), ds),
            len(test),
        )
        for method in ("qr-ndcg", "qr-score"):
            for n in (8, 16, 32):
                idx = [index[h] for h in det[method].top(n)]
                add(
                    f"top-{n} {method}",
                    evaluate_scores(cands, test, lambda q: icr_scores(cap[q]["windows"], len(cands[q]), idx), ds),
                    len(test),
                )
        for n in (8, 16, 32):
            draws = []
            for seed in range(args.random_draws):
                idx = random.Random(seed).sample(range(len(rr.head_list)), n)
                draws.append(
                    evaluate_scores(cands, test, lambda q: icr_scores(cap[q]["windows"], len(cands[q]), idx), ds)
                )
            add(
                f"random {n} heads (mean of {args.random_draws})",
                {m: float(np.mean([d[m] for d in draws])) for m in draws[0]},
                len(test),
            )
        top32 = det["qr-ndcg"].top(32)
        sub = {q: restrict_heads(feats[q], top32) for q in qids}

        def variant(label, fq, stages=(), *, extra=(), first_stage=False, l2=args.l2, learner="pointwise"):
            return label, fq, list(extra), first_stage, l2, stages, learner

        variants = (
            variant("learned weighting (logistic, all heads)", feats),
            variant("learned + first-stage rank", feats, first_stage=True),
            variant(
                "learned + first-stage rank, also trained on the other datasets", feats, extra=others, first_stage=True
            ),
            variant("learned, top-32 qr-ndcg heads of the training folds, l2=1", sub, l2=1.0),
            variant("learned, top-32 qr-ndcg heads of the training folds, l2=10", sub, l2=10.0),
            variant("learned + dense score (stages=['dense'])", feats, ("dense",)),
            variant("learned + dense and BM25 scores", feats, ("dense", "bm25")),
            variant("learned, top-32 of the training folds + dense score", sub, ("dense",)),
            variant("learned, top-32 of the training folds + dense score, l2=1", sub, ("dense",), l2=1.0),
            variant(
                "learned pairwise (RankNet), top-32 of the training folds + dense score",
                sub,
                ("dense",),
                learner="pairwise",
            ),
            variant("learned pairwise (RankNet), all heads + dense score", feats, ("dense",), learner="pairwise"),
        )
        for label, fq, extra, fs, l2, stages, learner in variants:
            try:
                extra = [restrict_heads(x, fq[train[0]].heads) for x in extra]
                model = train_head_weights(
                    [fq[q] for q in train] + extra, learner=learner, l2=l2, rel=ds.rel, first_stage=fs, stages=stages
                )
                add(
                    label,
                    evaluate_scores(
                        cands, test, lambda q: model.score_features(fq[q].features, fq[q].first_stage, fq[q].stages), ds
                    ),
                    len(test),
                )
            except Exception as e:
                failed.setdefault(label, []).append(f)
                log.warning("%s fold %d: %s not trained (%s)", name, f, label, e)
    for label, folds in failed.items():  # pooled over the folds that trained, it would pass for a k-fold figure
        log.warning("%s: %s left out, not trained in fold(s) %s", name, label, folds)
    return [
        {"setting": name, "method": label, **pool(fold_rows, n="n")}
        for label, fold_rows in rows.items()
        if label not in failed
    ]


def targets(held: list[dict]) -> list[dict]:
    """Per setting: the best of the first-stage signals (its test-fold score, which flatters the
    baseline) against the learned weightings (all heads, and the best learned variant), nDCG@10 points."""
    out = []
    for name in dict.fromkeys(r["setting"] for r in held):
        rows = {r["method"]: r["nDCG@10"] for r in held if r["setting"] == name}
        best = max((m for m in rows if m.startswith("first stage")), key=rows.get)
        # (a variant not trained in every fold is left out of the rows: not a target either)
        att = rows.get("learned weighting (logistic, all heads)", math.nan)
        top = max((m for m in rows if m.startswith("learned")), key=rows.get, default=None)
        out.append(
            {
                "setting": name,
                "best first stage": best,
                "first stage nDCG@10": rows[best],
                "learned, all heads": att,
                "best learned variant": top or "none trained in every fold",
                "its nDCG@10": rows[top] if top else math.nan,
                "Δ all heads": 100 * (att - rows[best]),
                "Δ best variant": 100 * (rows[top] - rows[best]) if top else math.nan,
            }
        )
    return out


def cross_dataset(setups, feats, args) -> list[dict]:
    """Learned weights trained on the other datasets, tested on one (all its queries): the
    package's leave-one-group-out split over the features' groups (= settings, in setup order)."""
    out = []
    every = [f for fq in feats.values() for f in fq.values()]
    splits = group_splits(every, lambda f: f.group, groups=[name for name, _, _ in setups])
    for (name, ds, cands), split in zip(setups, splits):
        test = {f.qid: f for f in split.test}
        for fs in (False, True):
            model = train_head_weights(split.train, learner="pointwise", l2=args.l2, first_stage=fs)
            out.append(
                {
                    "setting": name,
                    "method": "learned weighting, trained on the other datasets"
                    + (" (+ first-stage rank)" if fs else ""),
                    **evaluate_scores(
                        cands, list(test), lambda q: model.score_features(test[q].features, test[q].first_stage), ds
                    ),
                }
            )
    return out


def latency(rr_all, head_sets, setups, n=5) -> list[dict]:
    """Seconds per query (first ``n`` DL19 queries, same run) with all heads and each head set."""
    name, ds, cands = setups[0]
    runs = [("all heads", rr_all)] + [
        (f"{len(h)} {label} (deepest layer {max(l for l, _ in h)})", AttentionReranker(rr_all.llm, h, signals=None))
        for label, h in head_sets
    ]
    rows = []
    for label, r in runs:
        qs = list(cands)[:n]
        r.score(ds.queries[qs[0]], cands[qs[0]][:2])  # warm-up
        t = time.perf_counter()
        for q in qs:
            r.score(ds.queries[q], cands[q])
        rows.append({"heads": label, "setting": name, "s/query": (time.perf_counter() - t) / len(qs)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--hotpot-questions", type=positive_int, default=400)
    ap.add_argument("--scifact-queries", type=positive_int, default=50)
    ap.add_argument("--folds", type=fold_count, default=5)
    ap.add_argument("--random-draws", type=positive_int, default=5)
    ap.add_argument("--l2", type=float, default=10.0)
    ap.add_argument("--copy-lengths", default="500,1000,2000")
    ap.add_argument("--copy-depths", default="0,50,100")
    ap.add_argument("--skip-copy", action="store_true")
    ap.add_argument("--ship", action="store_true")
    ap.add_argument("--capture-only", action="store_true", help="fill the row cache and stop")
    ap.add_argument("--ship-first-stage", action="store_true", help="shipped weights use the first-stage rank too")
    ap.add_argument(
        "--ship-heads",
        choices=["all", "top32"],
        default="top32",
        help="heads of the shipped learned weights: the pooled qr-ndcg top-32 (default; faster, "
        "better held-out on SciFact and DL19) or all",
    )
    ap.add_argument(
        "--latency-queries", type=non_negative_int, default=5, help="DL19 queries timed per head set (0: skip)"
    )
    ap.add_argument("--out", default=None, help="output folder (default docs/results)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root = data_root(args.data, default=REPO.parent / "shared" / "data")
    rr = AttentionReranker(config="icr")  # every head: the captured rows serve all variants
    setups = dl19_sets(root, [20]) + [
        scifact_set(root, args.scifact_queries, index_dir=SCIFACT_INDEX),
        hotpot_set(root, args.hotpot_questions),
    ]
    caps = {name: capture_all(rr, name, ds.queries, cands, CACHE) for name, ds, cands in setups}
    if args.capture_only:
        return
    L, H = rr.llm.num_layers, rr.llm.num_heads

    # detection on all the dev data of each dataset, and pooled
    full = {name: qr_detect(caps[name], cands, ds, sorted(cands), rr) for name, ds, cands in setups}
    copy = (
        None
        if args.skip_copy
        else detect_copy_heads(
            rr.llm,
            data=root / "niah",
            lengths=[int(x) for x in args.copy_lengths.split(",")],
            depths=[float(x) for x in args.copy_depths.split(",")],
        )
    )
    pooled = np.nanmean([full[n]["qr-ndcg"].scores for n in full], axis=0)
    pooled_top = [(int(i // H), int(i % H)) for i in np.argsort(-pooled, axis=None)[:16]]
    det_rows = []
    for name in full:
        for method, hs in full[name].items():
            det_rows.append(
                {
                    "data": name,
                    "method": method,
                    "top-16": ",".join(f"{l}-{h}" for l, h in hs.top(16)),
                    "seconds": hs.seconds,
                }
            )
    copy_info = {}
    if copy is not None:
        above = copy.above(0.1)
        qr16 = set(pooled_top)
        copy_info = {
            "accepted trials": f"{copy.n_used}/{copy.n_total}",
            "seconds": copy.seconds,
            "note": copy.note,
            "heads > 0.1": len(above),
            "share > 0.1": len(above) / (L * H),
            "top-16": ",".join(f"{l}-{h}" for l, h in copy.top(16)),
            "overlap of copy top-16 with pooled qr-ndcg top-16": len(set(copy.top(16)) & qr16),
            "trials": copy.trials,
        }
    signals = {name: stage_signals(root, name, ds, cands, CACHE, SCIFACT_INDEX) for name, ds, cands in setups}
    feats = features(setups, caps, rr, signals)
    held = [
        r
        for name, ds, cands in setups
        for r in heldout(
            name,
            ds,
            cands,
            caps[name],
            rr,
            args,
            feats[name],
            [f for n, fq in feats.items() if n != name for f in fq.values()],
        )
    ]
    cross = cross_dataset(setups, feats, args)
    pooled32 = [(int(i // H), int(i % H)) for i in np.argsort(-pooled, axis=None)[:32]]
    lat = (
        latency(
            rr,
            [
                ("selected heads (pooled qr-ndcg)", pooled_top),
                ("pooled qr-ndcg top-32 heads (--ship-heads top32)", pooled32),
            ],
            setups,
            args.latency_queries,
        )
        if args.latency_queries
        else []
    )
    if args.ship:
        ship(rr, full, pooled, pooled_top, pooled32, copy, setups, feats, args)
    env = environment()
    payload = {
        "environment": env,
        "targets": targets(held),
        "detection": det_rows,
        "copy": copy_info,
        "heldout": held,
        "cross_dataset": cross,
        "latency": lat,
        "pooled_qr_ndcg_top16": [list(h) for h in pooled_top],
        "qr_ndcg_matrix_pooled": np.round(pooled, 4).tolist(),
    }
    md = markdown(payload, args)
    write_outputs("heads", payload, md, Path(args.out) if args.out else OUT)
    print(md)


def ship(rr, full, pooled, pooled_top, pooled32, copy, setups, feats, args) -> None:
    from attnrank.registry_save import save_head_set

    data = " + ".join(n for n, _, _ in setups)
    save_head_set(
        rr.llm.model_id,
        rr.llm.fingerprint,
        "qr-ndcg",
        pooled_top,
        name="qr-ndcg",
        scores=pooled,
        data=f"mean per-head nDCG@10 over {data}",
        params={"top": 16},
        root=SHIP,
    )
    if copy is not None and copy.n_used:
        copy.save(16, root=SHIP)
    # attention-only features, so the shipped weights rerank any candidates (plain Documents too)
    every = [f for fq in feats.values() for f in fq.values()]
    heads = "all heads"
    if args.ship_heads == "top32":
        every, heads = [restrict_heads(f, pooled32) for f in every], "pooled qr-ndcg top-32"
    model = train_head_weights(
        every,
        learner="pointwise",
        l2=args.l2,
        first_stage=args.ship_first_stage,
        trained_on=f"{data} ({len(every)} queries); heads: {heads}",
        prompt=rr.config.prompt_settings(),
    )
    model.save(rr.llm.model_id, rr.llm.fingerprint, root=SHIP)


def markdown(p, args) -> str:
    env = p["environment"]
    n_variants = len({r["method"] for r in p["heldout"] if r["method"].startswith("learned")})  # as targets() picks
    out = [
        f"# Retrieval heads of SmolLM2-135M-Instruct ({env['date']}, {env['cpus']} CPUs)",
        "",
        f"Command: `{command_line()}`",
        "",
        "## Targets: learned weighting against the best first-stage signal (held-out)",
        "",
        "Both sides are picked on the test folds: the best first-stage signal and the best of "
        f"the {n_variants} learned variants, so Δ best variant is optimistic by the choice among variants "
        "(the all-heads column is one pre-set model).",
        "",
        md_table(
            p["targets"],
            [
                "setting",
                "best first stage",
                "first stage nDCG@10",
                "learned, all heads",
                "best learned variant",
                "its nDCG@10",
                "Δ all heads",
                "Δ best variant",
            ],
            {"Δ all heads": "+.1f", "Δ best variant": "+.1f"},
        ),
        "",
        "## Held-out quality (k-fold over queries; heads selected / weights trained on the training folds)",
        "",
        md_table(p["heldout"], ["setting", "method", "nDCG@10", "R@2"]),
        "",
        "## Learned weighting across datasets (trained on the other two, tested on all of one)",
        "",
        md_table(p["cross_dataset"], ["setting", "method", "nDCG@10", "R@2"]),
        "",
        "## Detection on all dev data (query-focused)",
        "",
        md_table(p["detection"], ["data", "method", "top-16", "seconds"], {"seconds": ".1f"}),
        "",
        "Pooled qr-ndcg top-16 (mean over datasets): " + ",".join(f"{l}-{h}" for l, h in p["pooled_qr_ndcg_top16"]),
        "",
    ]
    if p["copy"]:
        c = {k: v for k, v in p["copy"].items() if k != "trials"}
        out += [
            "## Copy-paste retrieval heads (Wu et al., NIAH)",
            "",
            "\n".join(f"- {k}: {v:.4f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in c.items()),
            "",
        ]
    out += [
        "## Latency (early exit after the deepest selected layer)",
        "",
        md_table(p["latency"], ["heads", "setting", "s/query"], {"s/query": ".2f"}),
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    main()
