"""The fused scorer judged as a user meets it: trained on the other datasets, tested on one it never
saw (leave-one-dataset-out), and in-domain k-fold; with the ablations of issue 14.

    python scripts/bench_fusion.py [--data DIR] [--scifact-queries 100] [--hotpot-questions 400]
                                   [--locomo-questions 400] [--ship]

Datasets (first-stage top-20 candidates; rows from the shared row cache, attnrank.eval.rows):
DL19 BM25 top-20 (43 topics, rel >= 2), SciFact train hybrid RRF top-20 (seeded sample),
HotpotQA distractor (10 paragraphs, 2 supporting), LoCoMo (BM25 top-20 turns of the question's
conversation, evidence turns relevant). Heads of the attention feature are chosen on the training
datasets only (top-N by mean per-head nDCG@10, QRHead's selection). ``--ship`` trains preset
``fused``'s weights on all four datasets (attention = their top-16 heads, recorded in the weights)
and writes them to attnrank/heads/data/; it needs rows captured as the preset captures them
(``--attention block --prompt block_positions=shared``). Writes docs/results/fusion.{json,md}
(fusion_<dtype>_<variant>.{json,md} for other precisions, attention and prompt variants; the
markdown: attnrank.eval.fusion_report).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
from pathlib import Path

import numpy as np
from _common import fold_count, positive_int

from attnrank.benchmarks import (
    cached_likelihoods,
    candidate_signals,
    complementary_heads,
    dl19_sets,
    fusion_examples_from_rows,
    hotpot_set,
    icr_scores,
    locomo_set,
    order_agreement,
    rrf_order,
    scifact_set,
    stage_signals,
)
from attnrank.config import set_torch_threads
from attnrank.eval import sign_test
from attnrank.eval.crossval import Split, check_folds, labelled_splits, qrels_links
from attnrank.eval.datasets import data_root
from attnrank.eval.fusion_report import fusion_markdown
from attnrank.eval.metrics import per_query_ndcg_of_each
from attnrank.eval.report import command_line, environment, write_outputs
from attnrank.eval.rows import capture_all
from attnrank.llm.blocks import capture_name
from attnrank.llm.headspec import parse_heads
from attnrank.llm.rows import window_features
from attnrank.registry import resolve_heads
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RERANK_PRESETS, RerankConfig
from attnrank.rerank.fused import LIKELIHOOD, LIKELIHOOD_FEATURES, equal_weights
from attnrank.rerank.fused_resolve import resolve_fused
from attnrank.rerank.fused_training import mean_ndcg, train_fused
from attnrank.rerank.fusion_eval import EQUAL, NO_ATTENTION, WITH_ATTENTION, compare, heldout_scores

log = logging.getLogger("bench_fusion")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
CACHE = REPO / "indexes" / "bench-cache"
SCIFACT_INDEX = REPO / "indexes" / "bench-scifact"
SHIP = REPO / "attnrank" / "heads" / "data"
METRICS = {"DL19": ["nDCG@10"], "SciFact": ["nDCG@10"], "HotpotQA": ["nDCG@10", "R@2"], "LoCoMo": ["nDCG@10", "R@5"]}
FIRST = ("first stage: rank alone", "first stage: BM25 alone", "first stage: dense alone", "first stage: RRF alone")
CAND = ("rank alone", "bm25 alone", "dense alone")
HEADLINE = "default preset signals: z(dense) + z(BM25), equal weights, untrained"
TRAINED = "fused without attention, trained (preset fused's fallback)"
FUSED = "fused with attention (preset fused)"
COMPLEMENTARY = "complementary"  # the head set of complementary_heads (16 heads)
WORST = "worst"  # the 16 heads whose weakest training dataset is strongest (top_heads by="worst")
LIKELIHOOD_DEFAULT = "default preset likelihood: z(BM25) + z(dense) + z(likelihood), untrained"
NESTED = "fused with attention, head count chosen by an inner leave-one-dataset-out (4, 8, 16 or 32)"
HEAD_COUNTS = (4, 8, 16, 32)


def load(args, root: Path, rr: AttentionReranker) -> dict:
    """Per dataset: the candidate set, its rows, signals, per-head features and per-head nDCG."""
    sets = {
        "DL19": dl19_sets(root, [20])[0],
        "SciFact": scifact_set(root, args.scifact_queries, index_dir=SCIFACT_INDEX),
        "HotpotQA": hotpot_set(root, args.hotpot_questions),
        "LoCoMo": locomo_set(root, args.locomo_questions),
    }
    for g, (_, _, cands) in sets.items():  # (in_domain's folds: before any capture, hours on a cold cache)
        check_folds(args.folds, len(cands), f"{g} queries")
    out = {}
    for g, (setting, ds, cands) in sets.items():
        mode = "" if rr.config.attention == "full" else f" {rr.config.attention} attention {rr.config.block_positions}"
        mode += "".join(f" {k} {v}" for k, v in prompt_options(args).items())
        caps = capture_all(rr, setting + mode, ds.queries, cands, CACHE)
        st = stage_signals(root, setting, ds, cands, CACHE, SCIFACT_INDEX)
        extra = {
            q: {
                "first stage: BM25": np.nan_to_num(s["bm25"], nan=-1e9),
                "first stage: dense": np.nan_to_num(s["dense"], nan=-1e9),
                "first stage: RRF": rrf_order(s["bm25"], s["dense"]),
                "first stage: rank": -np.arange(len(cands[q]), dtype=float),
            }
            for q, s in st.items()
        }
        feats = {q: window_features(caps[q]["windows"], len(cands[q])) for q in cands}
        sigs = candidate_signals(setting, ds, cands, CACHE)
        out[g] = {
            "setting": setting,
            "ds": ds,
            "cands": cands,
            "caps": caps,
            "signals": with_likelihood(sigs, rr, setting, ds, cands) if args.ablation == "likelihood" else sigs,
            "extra": extra,
            "head_scores": feats,
            "head_ndcg": per_query_ndcg_of_each(
                feats, {q: [d.id for d in c] for q, c in cands.items()}, ds.qrels, rel=ds.rel
            ),
        }
        log.info("%s: %d queries", g, len(cands))
    return out


def with_likelihood(sigs: dict, rr: AttentionReranker, setting: str, ds, cands: dict) -> dict:
    """The candidate signals and, as feature ``likelihood``, the query likelihood of the default
    preset (computed by the rows' model and precision; cached, attnrank.benchmarks.cached_likelihoods)."""
    ql = cached_likelihoods(rr.llm, setting, ds, cands, CACHE)
    return {q: {**sigs[q], LIKELIHOOD: ql[q][LIKELIHOOD]} for q in sigs}


def likelihood_variants() -> dict:
    """``--ablation likelihood``: attention beside the default preset's query likelihood, each
    compared per query with the default preset ``likelihood`` (untrained): name -> (features, model)."""
    return {
        "equal weights: attention + BM25 + dense + likelihood": (["attention", "bm25", "dense", LIKELIHOOD], None),
        "trained: BM25 + dense + rank + likelihood (no attention)": (["bm25", "dense", "rank", LIKELIHOOD], "trained"),
        "trained: attention + BM25 + dense + rank + likelihood": (
            ["attention", "bm25", "dense", "rank", LIKELIHOOD],
            "trained",
        ),
    }


def prompt_options(args) -> dict:
    """``--prompt k=v,...`` as reranker options (ints where they parse)."""
    pairs = [p.split("=", 1) for p in args.prompt.split(",") if p.strip()]
    return {k.strip(): int(v) if v.strip().isdigit() else v.strip() for k, v in pairs}


def top_heads(data: dict, groups, qids=None, n: int | None = 16, by: str = "mean") -> list[int] | None:
    """The ``n`` heads (indexes into the capture's head list) with the best per-head nDCG@10,
    averaged over the queries of each of ``groups`` (``qids``: only these) and then, ``by``, over
    groups: their ``"mean"``, or their ``"worst"`` (the heads whose weakest dataset is strongest)."""
    if n is None:
        return None
    means = []
    for g in groups:
        hn = data[g]["head_ndcg"]
        keep = [q for q in hn if qids is None or q in qids]
        means.append(np.mean([hn[q] for q in keep], axis=0))
    pooled = np.min(means, axis=0) if by == "worst" else np.mean(means, axis=0)
    return [int(i) for i in np.argsort(-pooled, kind="stable")[:n]]


def examples(data: dict, g: str, heads: list[int] | None, **kw) -> list:
    d = data[g]
    return fusion_examples_from_rows(g, d["ds"], d["cands"], d["caps"], heads, d["signals"], d["extra"], **kw)


def variants() -> dict:
    """Ablations scored next to the headline: name -> (features, train options, head-set size,
    datasets left out of training, how attention is read)."""
    full = ["attention", "bm25", "dense", "rank"]
    return {
        "fused with attention, heads chosen for what they add to the signals": (full, {}, COMPLEMENTARY, (), {}),
        "fused with attention, 16 heads chosen by their weakest training dataset": (full, {}, WORST, (), {}),
        "fused with attention, attention = a passage's mean token score": (full, {}, 16, (), {"aggregate": "mean"}),
        "fused with attention, attention = a passage's highest token score": (full, {}, 16, (), {"aggregate": "max"}),
        "fused with attention, features as within-query ranks": (full, {}, 16, (), {"ranks": True}),
        "fused without attention, features as within-query ranks": (full[1:], {}, 16, (), {"ranks": True}),
        "fused with attention, no confidence gate (no first-stage fallback)": (full, {"gate": False}, 16, (), {}),
        "fused with attention, pointwise (logistic)": (full, {"learner": "pointwise"}, 16, (), {}),
        "fused with attention, pairwise (RankNet)": (full, {"learner": "pairwise"}, 16, (), {}),
        "fused with attention, listwise (nDCG@10 grid)": (full, {"learner": "listwise"}, 16, (), {}),
        "attention + dense + BM25, equal weights, gated (the gate chosen on the training datasets)": (
            ["attention", "dense", "bm25"],
            {"learner": "equal"},
            16,
            (),
            {},
        ),
        "fused with attention, datasets balanced": (full, {"balance": True}, 16, (), {}),
        "fused with attention, top-8 heads": (full, {}, 8, (), {}),
        "fused with attention, top-32 heads": (full, {}, 32, (), {}),
        "fused with attention, all heads (ICR)": (full, {}, None, (), {}),
        "fused with attention, trained without LoCoMo": (full, {}, 16, ("LoCoMo",), {}),
        "fused with attention, uncalibrated (no N/A query)": (full, {}, 16, (), {"calibrate": False}),
        "fused with attention, no token filter": (full, {}, 16, (), {"use_filter": False}),
        "fused with attention, signed weights (a negative rank weight can take out the slot's echo)": (
            full,
            {"signed": True},
            16,
            (),
            {},
        ),
        "fused without attention, signed weights": (full[1:], {"signed": True}, 16, (), {}),
        "attention + dense": (["attention", "dense"], {}, 16, (), {}),
        "attention + dense + BM25": (["attention", "dense", "bm25"], {}, 16, (), {}),
    }


def inner_head_count(data: dict, train_groups: list[str], args) -> tuple[int, dict[int, float]]:
    """The N of the top-N heads that scores best in a leave-one-dataset-out among ``train_groups``
    alone: for each N, and each of them left out in turn, heads chosen and weights trained on the
    others, the fused scorer's mean nDCG@10 on the left-out one, averaged; a choice that never sees
    the outer held-out dataset. Returns the N and each N's inner mean."""
    made: dict = {}

    def ex(h: str, idx: list[int]) -> list:
        if (h, tuple(idx)) not in made:
            made[h, tuple(idx)] = examples(data, h, idx)
        return made[h, tuple(idx)]

    inner = {}
    for n in HEAD_COUNTS:
        values = []
        for v in train_groups:
            rest = [h for h in train_groups if h != v]
            idx = top_heads(data, rest, n=n)
            fused = train_fused([e for h in rest for e in ex(h, idx)], l2=args.l2, learner=args.learner)
            values.append(mean_ndcg(ex(v, idx), lambda e, f=fused: f.score(e.signals)))
        inner[n] = float(np.mean(values))
    return max(HEAD_COUNTS, key=lambda n: inner[n]), inner


def fixed_variants() -> dict:
    """``--ablation fixed-weights``: equal weights over per-query z-scores, no training at all
    (nothing learned on the other datasets can fail to transfer): name -> features. Each pair
    with/without attention gives attention's contribution under that scheme."""
    return {
        "equal weights: attention + BM25 + dense + rank": ["attention", "bm25", "dense", "rank"],
        "equal weights: BM25 + dense + rank (no attention)": ["bm25", "dense", "rank"],
        "equal weights: attention + dense + BM25": ["attention", "dense", "bm25"],
        "equal weights: attention + dense": ["attention", "dense"],
    }


def lodo(data: dict, args) -> tuple[list[dict], dict, list[dict]]:
    """Leave-one-dataset-out: per held-out dataset, heads chosen and weights trained on the others;
    also the per-query comparison of the preset ``fused`` (with attention) against the same fusion
    trained without attention, and
    (``--ablation fixed-weights``) of each equal-weights fusion against the default."""
    rows: list[dict] = []
    paired: dict[str, dict] = {}  # per held-out dataset: preset fused against its fallback, per query
    against_default: list[dict] = []
    groups = list(data)
    for g in groups:
        train_groups = [h for h in groups if h != g]
        by_n: dict = {n: top_heads(data, train_groups, n=n) for n in (8, 16, 32, None)}
        by_n[WORST] = top_heads(data, train_groups, n=16, by="worst")
        ex = {n: ({h: examples(data, h, idx) for h in train_groups}, examples(data, g, idx)) for n, idx in by_n.items()}
        # the complementary heads are chosen against the top-16 examples' signals (attention unused)
        idx = by_n[COMPLEMENTARY] = complementary_heads(
            {h: data[h]["head_scores"] for h in train_groups}, ex[16][0], 16, l2=args.l2
        )
        ex[COMPLEMENTARY] = ({h: examples(data, h, idx) for h in train_groups}, examples(data, g, idx))
        test16 = ex[16][1]
        scores = heldout_scores(
            [Split(g, [e for h in train_groups for e in ex[16][0][h]], test16)],
            learner=args.learner,
            l2=args.l2,
            extra_signals=[f.replace(" alone", "") for f in FIRST],
        )
        default = scores.pop(EQUAL)  # the product's own untrained model
        trained, fused_scores = scores.pop(NO_ATTENTION), scores.pop(WITH_ATTENTION)
        scores = {**scores, HEADLINE: default, TRAINED: trained, FUSED: fused_scores}
        scores["attention alone (top-16 heads of the training datasets)"] = scores.pop("attention alone")
        for n in (8, 32, None):
            label = "all heads (ICR)" if n is None else f"top-{n} heads"
            scores[f"attention alone ({label})"] = {e.qid: e.signals["attention"] for e in ex[n][1]}
        worst = {e.qid: e.signals["attention"] for e in ex[WORST][1]}
        scores["attention alone (16 heads chosen by their weakest training dataset)"] = worst
        for name, (feats, kw, n, leave_out, read) in variants().items():
            train_ex, test_ex = ex[n]
            if read:  # attention read another way: its own examples
                train_ex = {h: examples(data, h, by_n[n], **read) for h in train_groups}
                test_ex = examples(data, g, by_n[n], **read)
            train = [e for h in train_groups if h not in leave_out for e in train_ex[h]]
            fused = train_fused(train, feats, l2=args.l2, **{"learner": args.learner, **kw})
            scores[name] = {e.qid: fused.score(e.signals) for e in test_ex}
        chosen, inner = inner_head_count(data, train_groups, args)
        if chosen not in ex:
            idx = top_heads(data, train_groups, n=chosen)
            ex[chosen] = ({h: examples(data, h, idx) for h in train_groups}, examples(data, g, idx))
        nested = train_fused([e for h in train_groups for e in ex[chosen][0][h]], l2=args.l2, learner=args.learner)
        scores[NESTED] = {e.qid: nested.score(e.signals) for e in ex[chosen][1]}
        if args.ablation == "fixed-weights":
            fixed_features = fixed_variants()
            for name, feats in fixed_features.items():
                fixed = equal_weights(feats)
                scores[name] = {e.qid: fixed.score(e.signals) for e in test16}
            versus = {m: scores[m] for m in (HEADLINE, *fixed_features)}
            rows_vs = compare(test16, versus, METRICS[g][:1], baselines=(HEADLINE,))[1:]
            against_default += [{"held out": g, **r} for r in rows_vs]
        if args.ablation == "likelihood":
            scores[LIKELIHOOD_DEFAULT] = {e.qid: equal_weights(LIKELIHOOD_FEATURES).score(e.signals) for e in test16}
            train16 = [e for h in train_groups for e in ex[16][0][h]]
            for name, (feats, how) in likelihood_variants().items():
                model = (
                    equal_weights(feats)
                    if how is None
                    else train_fused(train16, feats, l2=args.l2, learner=args.learner)
                )
                scores[name] = {e.qid: model.score(e.signals) for e in test16}
            versus = {m: scores[m] for m in (LIKELIHOOD_DEFAULT, *likelihood_variants())}
            rows_vs = compare(test16, versus, METRICS[g][:1], baselines=(LIKELIHOOD_DEFAULT,))[1:]
            against_default += [{"held out": g, **r} for r in rows_vs]
        paired[g] = compare(test16, {m: scores[m] for m in (TRAINED, FUSED)}, METRICS[g][:1], baselines=(TRAINED,))[1]
        for r in compare(test16, scores, METRICS[g], baselines=FIRST + CAND):
            nested_row = {"head count": chosen, "inner nDCG@10": inner} if r["method"] == NESTED else {}
            rows.append({"held out": g, **r, **nested_row})
        log.info("LODO %s done", g)
    return rows, paired, against_default + pooled_against_default(against_default)


def pooled_against_default(rows: list[dict]) -> list[dict]:
    """Per method, its per-query wins and losses against the default summed over the held-out
    datasets, with a sign test over the pooled queries."""
    out = []
    for m in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == m]
        w, l = sum(r["wins"] for r in mine), sum(r["losses"] for r in mine)
        delta = float(np.mean([r["Δ"] for r in mine]))
        out.append(
            {
                "held out": f"all {len(mine)} (pooled)",
                "method": m,
                "Δ": delta,
                "wins": w,
                "losses": l,
                "p": sign_test(w, l),
            }
        )
    return out


def in_domain(data: dict, args) -> list[dict]:
    """k-fold over each dataset's queries: heads chosen and weights trained on the training folds."""
    rows = []
    for g in data:
        qids = list(data[g]["cands"])
        scores: dict = {}
        ds = data[g]["ds"]
        # questions that share a relevant document in one fold (dealt one by one until 2026-12-07: 111 of
        # LoCoMo's 400 test questions shared an evidence turn with a training question)
        for split in labelled_splits(qids, args.folds, seed=0, links=qrels_links(ds.qrels, ds.rel)):
            idx = top_heads(data, [g], set(split.train))
            ex = {e.qid: e for e in examples(data, g, idx)}
            part = heldout_scores(
                [Split(split.name, [ex[q] for q in split.train], [ex[q] for q in split.test])],
                learner=args.learner,
                l2=args.l2,
                extra_signals=[f.replace(" alone", "") for f in FIRST],
            )
            for m, s in part.items():
                scores.setdefault(m, {}).update(s)
        every = examples(data, g, None)
        for r in compare(every, scores, METRICS[g], baselines=FIRST + CAND):
            rows.append({"dataset": g, **r})
    return rows


def targets(rows: list[dict], paired: dict) -> list[dict]:
    """The issue's targets per held-out dataset: the default preset against the best first-stage
    signal, and attention's own contribution (preset ``fused`` − the same fusion trained without
    attention; nDCG@10 points, with its per-query wins/losses and sign test)."""
    out = []
    for g in dict.fromkeys(r["held out"] for r in rows):
        by = {r["method"]: r for r in rows if r["held out"] == g}
        head, fused, trained = by[HEADLINE], by[FUSED], by[TRAINED]
        out.append(
            {
                "held out": g,
                "best first stage": head["best first stage"],
                "its nDCG@10": head["nDCG@10"] - head["Δ"] / 100,
                "default preset nDCG@10": head["nDCG@10"],
                "Δ vs best first stage": head["Δ"],
                "wins/losses": f"{head['wins']}/{head['losses']}",
                "p": head["p"],
                "preset fused nDCG@10": fused["nDCG@10"],
                "attention's contribution": 100 * (fused["nDCG@10"] - trained["nDCG@10"]),
                "attention wins/losses": f"{paired[g]['wins']}/{paired[g]['losses']}",
                "attention p": paired[g]["p"],
                "fused − default": 100 * (fused["nDCG@10"] - head["nDCG@10"]),
            }
        )
    return out


def precision(data32: dict, data: dict, rr: AttentionReranker) -> list[dict]:
    """What ``dtype`` changes for a user of the preset ``fused`` whose shipped weights were fitted to
    full attention (none, where they were fitted to block attention, as since 2026-12-04): per dataset, nDCG@10 on rows captured in float32 and
    in ``rr``'s dtype, wins/losses against float32, the mean per-query Spearman correlation of the
    attention scores, and the mean capture seconds per query of every head's rows (from the row
    cache: each precision's captures ran at their own time)."""
    from scipy.stats import spearmanr

    dtype = str(rr.llm.dtype).removeprefix("torch.")
    fused = resolve_fused("auto", rr.llm.model_id, rr.llm.fingerprint)
    assert fused is not None
    if fused.capture not in (None, "full"):  # (the shipped weights since 2026-12-04: block attention)
        log.warning(
            "precision section skipped: the shipped fused weights were fitted to %s attention, and these rows "
            "are full attention",
            fused.capture,
        )
        return []
    heads = parse_heads(fused.heads) if fused.heads is not None else resolve_heads("auto", rr.llm)
    idx = [rr.head_list.index(tuple(h)) for h in heads or rr.head_list]
    rows = []
    for g in data:
        ex32, ex = examples(data32, g, idx), examples(data, g, idx)
        rho = [spearmanr(a.signals["attention"], b.signals["attention"])[0] for a, b in zip(ex32, ex)]
        secs = {k: np.mean([c["seconds"] for c in d[g]["caps"].values()]) for k, d in (("f32", data32), ("x", data))}
        for what, score in (
            ("attention alone", lambda e: e.signals["attention"]),
            ("preset fused", lambda e: fused.score(e.signals)),
        ):
            base = f"{what}, float32"
            scores = {base: {e.qid: score(e) for e in ex32}, f"{what}, {dtype}": {e.qid: score(e) for e in ex}}
            for r in compare(ex32, scores, METRICS[g][:1], baselines=(base,)):
                rows.append({"dataset": g, **r, "Δ vs float32": r["Δ"], "Spearman vs float32": float(np.nanmean(rho))})
        rows[-1]["capture s/query"] = float(secs["x"])
        rows[-2]["capture s/query"] = float(secs["f32"])
    return rows


def coarse_to_fine(data: dict, rr: AttentionReranker, args, keep: int = 10) -> list[dict]:
    """CAFE-style coarse-to-fine, held out: the preset ``fused`` (trained on the other datasets) ranks
    all candidates; its top ``keep`` are re-scored in a second, shorter prompt of only them (in the
    first pass's order) by the same fused weights (fresh attention, the other signals of those
    candidates), and reordered above the rest. Rows: Δ against the one-pass ``fused``."""
    rows = []
    for g in data:
        others = [h for h in data if h != g]
        idx = top_heads(data, others, n=16)
        train = [e for h in others for e in examples(data, h, idx)]
        fused = train_fused(train, learner=args.learner, l2=args.l2)
        ex = examples(data, g, idx)
        first = {e.qid: fused.score(e.signals) for e in ex}
        top = {q: np.argsort(-s, kind="stable")[:keep] for q, s in first.items()}
        cands = data[g]["cands"]
        sub = {q: [cands[q][i] for i in t] for q, t in top.items()}
        digest = hashlib.sha256(json.dumps({q: [d.id for d in c] for q, c in sub.items()}).encode()).hexdigest()
        setting = f"{data[g]['setting']} top-{keep} of preset fused {digest[:10]}"  # a row-cache key
        queries = {q: data[g]["ds"].queries[q] for q in sub}
        caps = capture_all(rr, setting, queries, sub, CACHE)
        refined, attention_only = {}, {}
        for e in ex:
            t = top[e.qid]
            signals = {k: np.asarray(v)[t] for k, v in e.signals.items()}
            signals["attention"] = icr_scores(caps[e.qid]["windows"], len(t), idx)
            for out, second in ((refined, fused.score(signals)), (attention_only, signals["attention"])):
                s = first[e.qid].copy()
                s[t] = s.max() + 1 + second - second.min()  # the top keep, reordered, stay on top
                out[e.qid] = s
        scores = {
            FUSED: first,
            f"coarse-to-fine: top-{keep} re-scored by the fused weights": refined,
            f"coarse-to-fine: top-{keep} re-scored by attention alone": attention_only,
        }
        for r in compare(ex, scores, METRICS[g], baselines=(FUSED,)):
            rows.append({"held out": g, **r})
    return rows


def ship(data: dict, rr: AttentionReranker, args) -> dict:
    """Preset ``fused``'s shipped weights: its attention feature = the top-16 heads over all four
    datasets (the selection every held-out row above used, on the other datasets), the weights
    trained on all four; both recorded with how the rows were captured."""
    heads = [rr.head_list[i] for i in top_heads(data, list(data))]
    every = [e for g in data for e in examples(data, g, [rr.head_list.index(h) for h in heads])]
    desc = " + ".join(f"{g} ({len(data[g]['cands'])})" for g in data)
    capture = capture_name(rr.config.attention, rr.config.block_positions)
    fused = train_fused(
        every,
        learner=args.learner,
        l2=args.l2,
        heads=heads,
        capture=capture,
        prompt=rr.config.prompt_settings(),
        trained_on=f"{desc}; attention: their top-16 heads, {capture} attention, {args.dtype} rows",
    )
    fused.save(rr.llm.model_id, rr.llm.fingerprint, root=SHIP)
    return {
        "features": fused.features,
        "weights": fused.weights,
        "base_weights": fused.base_weights,
        "gate": fused.gate,
        "heads": fused.heads,
        "capture": fused.capture,
        "trained_on": fused.trained_on,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--scifact-queries", type=positive_int, default=100)
    ap.add_argument("--hotpot-questions", type=positive_int, default=400)
    ap.add_argument("--locomo-questions", type=positive_int, default=400)
    ap.add_argument("--folds", type=fold_count, default=5)
    ap.add_argument("--l2", type=float, default=1.0)
    ap.add_argument(
        "--learner",
        default="pointwise",
        help="the trained rows' learner (the fusion without attention and preset fused): pointwise | pairwise | listwise | equal",
    )
    ap.add_argument("--ship", action="store_true")
    ap.add_argument("--out", default=None, help="output folder (default docs/results)")
    ap.add_argument("--coarse-to-fine", action="store_true", help="the CAFE ablation (captures top-10 prompts)")
    ap.add_argument(
        "--prompt", default="", help="prompt/truncation variant, e.g. instruction=qa or order=forward,max_doc_words=100"
    )
    ap.add_argument(
        "--attention", default="full", help="full | block (rotated positions): heads and weights chosen on block rows"
    )
    ap.add_argument(
        "--dtype", default="float32", help="the LLM's precision; other than float32 writes fusion_<dtype>.{json,md}"
    )
    ap.add_argument(
        "--ablation",
        default="",
        choices=["", "fixed-weights", "likelihood"],
        help="fixed-weights: add equal-weight (untrained) fusions; likelihood: attention beside the default preset's "
        "query likelihood; writes fusion_<dtype>_<ablation>, no precision section",
    )
    args = ap.parse_args()
    preset = RERANK_PRESETS["fused"]
    wanted = capture_name(preset.attention, preset.block_positions)
    options = prompt_options(args)
    given = capture_name(args.attention, options.pop("block_positions", RerankConfig.block_positions))
    if args.ship and (given != wanted or options or args.ablation):
        ap.error(
            f"--ship trains preset fused's weights on rows captured as it captures them ({wanted}): give "
            f"--attention {preset.attention} --prompt block_positions={preset.block_positions}, no other "
            "--prompt option and no --ablation"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root = data_root(args.data, default=REPO.parent / "shared" / "data")
    # every head: the cached rows serve every head set
    rr = AttentionReranker(config="icr", dtype=args.dtype, attention=args.attention, **prompt_options(args))
    data = load(args, root, rr)
    precise = args.dtype != "float32" and args.attention == "full" and not args.prompt and not args.ablation
    icr32 = AttentionReranker(config="icr", dtype="float32") if precise else None
    held, paired, against_default = lodo(data, args)
    payload = {
        "environment": environment(),
        "dtype": str(rr.llm.dtype).removeprefix("torch.") + ("-int8" if rr.llm.quantization else ""),
        "attention": args.attention,
        "prompt": prompt_options(args),
        "ablation": args.ablation,
        "sizes": {g: len(d["cands"]) for g, d in data.items()},
        "targets": targets(held, paired),
        "fixed_vs_default": against_default,
        "default_preset": LIKELIHOOD_DEFAULT if args.ablation == "likelihood" else "signals",
        "lodo": held,
        "in_domain": in_domain(data, args),
        "order_agreement": {g: order_agreement(d["caps"], d["signals"], d["cands"]) for g, d in data.items()},
        "shipped": ship(data, rr, args) if args.ship else None,
        "coarse_to_fine": coarse_to_fine(data, rr, args) if args.coarse_to_fine else None,
        "precision": precision(load(args, root, icr32), data, rr) if icr32 is not None else None,
    }
    md = fusion_markdown(payload, command_line())
    variant = [f"{k}-{v}" for k, v in prompt_options(args).items()] + [args.ablation] * bool(args.ablation)
    name = "_".join(
        ["fusion"] + [args.dtype] * (args.dtype != "float32") + ["block"] * (args.attention == "block") + variant
    )
    write_outputs(name, payload, md, Path(args.out) if args.out else OUT)
    print(md)


if __name__ == "__main__":
    main()
