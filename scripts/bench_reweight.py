"""Attention re-weighting ablation and the model's positional (slot) profile.

Cumulative steps on cached all-head attention rows (scripts/benchrows.py), nDCG@10 (trec_eval
linear gain via ir-measures), for all heads and for a head list chosen on the *other* dataset
(top-16 heads by their own nDCG@10, as bench_rerank does):

    base (plain ICR) → +sink → +IDF (ε ∈ {0.1, 0.5, 1.0} × unit piece/word)
    → +entropy (blend β ∈ {0.25, 0.5, 1, 2} or temper γ ∈ {0.5, 0.75}) → +slot correction

Held-out tuning: the queries of each setting are split in two seeded folds; every parameter
applied to fold B is chosen on fold A (greedily, step by step, by mean nDCG@10) and vice versa,
and the reported numbers pool the per-query test values of both folds. Steps without
parameters (base, +sink, +slot) are the same on both folds.

Positional profile: :func:`attnrank.rerank.position.measure_slot_profile` with the default
AttentionReranker (all heads, plain ICR config) on random DL19 passages, for 20 and 50 slots.
That plain-ICR profile is what the plot and table show. The +slot step subtracts a profile
measured in the *same* random trials but scored with that step's own config (the fold's tuned
sink/IDF/entropy config and head set), so profile and scores share a scale; the rows are
re-scored offline from the recorded trial windows (cached under indexes/bench-cache/). A
variant row uses the plain-ICR profile instead.

    python scripts/bench_reweight.py [--data DIR] [--settings dl19-20,dl19-50,scifact]
        [--max-queries N] [--profile-trials 24] [--profile-slots 20,50] [--skip-profile]

Writes docs/results/reweight.{json,md}, slot_profile_{K}.json and slot_profile.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from _common import non_negative_int

from attnrank.benchmarks import dl19_sets, head_quality, scifact_set
from attnrank.config import set_torch_threads
from attnrank.eval import evaluate, evaluate_per_query, sign_test, wins_losses
from attnrank.eval.datasets import data_root, dl19
from attnrank.eval.plot import slot_profiles
from attnrank.eval.report import command_line, environment, md_table, write_outputs
from attnrank.eval.rows import capture_all, load_windows, run_of, save_windows
from attnrank.llm.rows import WindowRows
from attnrank.rerank.position import (
    SlotProfile,
    prompt_slots,
    store_profile,
)
from attnrank.rerank.profile import measure_slot_profile
from attnrank.rerank.reweight import (
    Reweighting,
    content_free_last,
    content_free_spans,
    reweighted_document_scores,
)
from attnrank.rerank.terms import tokenized_query_terms

log = logging.getLogger("bench_reweight")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
CACHE = REPO / "indexes" / "bench-cache"  # the row cache (git-ignored)
SCIFACT_INDEX = REPO / "indexes" / "bench-scifact"

SETTINGS = {
    "dl19-20": "DL19 BM25 top-20",
    "dl19-50": "DL19 BM25 top-50",
    "scifact": "SciFact train hybrid top-20 (50 queries)",
}
HEAD_SOURCE = {"dl19-20": "scifact", "dl19-50": "scifact", "scifact": "dl19-20"}  # the other dataset
N_SELECTED = 16
SCIFACT_QUERIES = 50
IDF_GRID = [{"idf_eps": e, "idf_unit": u} for u in ("piece", "word") for e in (0.1, 0.5, 1.0)]
ENTROPY_GRID = [{"entropy_mode": "blend", "entropy_beta": b} for b in (0.25, 0.5, 1.0, 2.0)] + [
    {"entropy_mode": "temper", "temper_gamma": g} for g in (0.5, 0.75)
]
METRIC = "nDCG@10"


# -- data -------------------------------------------------------------------------------------
class Settings:
    """Candidate sets by alias, loaded once (DL19 both depths together)."""

    def __init__(self, root: Path, max_queries: int | None):
        self.root, self.max_queries, self._sets = root, max_queries, {}

    def get(self, alias: str):
        if alias not in self._sets:
            if alias.startswith("dl19"):
                for name, ds, cands in dl19_sets(self.root, [20, 50], self.max_queries):
                    self._sets["dl19-" + name.rsplit("-", 1)[1]] = (name, ds, cands)
            else:  # the 50-query sample bench_rerank caches under this name, cut for smoke runs
                name, ds, cands = scifact_set(self.root, SCIFACT_QUERIES, index_dir=SCIFACT_INDEX)
                if self.max_queries:
                    ds.queries = dict(list(ds.queries.items())[: self.max_queries])
                    ds.qrels = {q: ds.qrels[q] for q in ds.queries}
                    cands = {q: cands[q] for q in ds.queries}
                self._sets[alias] = (name, ds, cands)
            assert self._sets[alias][0] == SETTINGS[alias], (self._sets[alias][0], SETTINGS[alias])
        return self._sets[alias]


def sliced(w: WindowRows, head_idx) -> WindowRows:
    if head_idx is None:
        return w
    return WindowRows(
        w.doc_index,
        w.spans,
        w.input_ids,
        w.real[head_idx].astype(np.float64),
        None if w.null is None else w.null[head_idx].astype(np.float64),
        labelled=w.labelled,
    )


class Scorer:
    """Per-query document scores and nDCG@10 of a Reweighting config on one setting and head set
    (memoized: the grids share configs)."""

    def __init__(self, tokenizer, ds, cands, captured, head_idx=None):
        self.tok, self.ds, self.cands = tokenizer, ds, cands
        self.windows = {q: [sliced(w, head_idx) for w in c["windows"]] for q, c in captured.items()}
        self.strings = {q: [tokenizer.convert_ids_to_tokens(w.input_ids) for w in ws] for q, ws in self.windows.items()}
        self._terms, self._pq, self._scores = {}, {}, {}

    def terms(self, qid: str, unit: str) -> set[str]:
        if (qid, unit) not in self._terms:
            self._terms[qid, unit] = tokenized_query_terms(self.tok, self.ds.queries[qid], unit)
        return self._terms[qid, unit]

    def scores(self, qid: str, cfg: Reweighting, profile: SlotProfile | None = None) -> np.ndarray:
        key = (qid, cfg, profile)
        if key not in self._scores:
            s = np.zeros(len(self.cands[qid]))
            empty = np.zeros(len(self.cands[qid]), dtype=bool)
            for w, toks in zip(self.windows[qid], self.strings[qid]):
                s[w.doc_index] = reweighted_document_scores(
                    w, toks, self.terms(qid, cfg.idf_unit), cfg, use_filter=True, slot_profile=profile
                )
                empty[w.doc_index] = content_free_spans(w, toks)
            # (as the reranker scores: a candidate sink filtering reads no token of goes last over the list)
            self._scores[key] = content_free_last(s, empty.tolist()) if cfg.sink else s
        return self._scores[key]

    def run(self, cfg: Reweighting, profile: SlotProfile | None = None, qids=None) -> dict:
        qids = list(self.windows) if qids is None else qids
        return run_of({q: self.cands[q] for q in qids}, {q: self.scores(q, cfg, profile) for q in qids})

    def per_query(self, cfg: Reweighting, profile: SlotProfile | None = None) -> dict[str, float]:
        key = (cfg, profile)
        if key not in self._pq:
            pq = evaluate_per_query(self.run(cfg, profile), self.ds.qrels, [METRIC], rel=self.ds.rel)
            self._pq[key] = {q: pq[q][METRIC] for q in self.windows}
        return self._pq[key]


# -- cross-fitted cumulative ablation ----------------------------------------------------------
def folds_of(qids, seed: int) -> dict[str, list[str]]:
    qids = sorted(qids)
    random.Random(seed).shuffle(qids)
    half = (len(qids) + 1) // 2
    return {"A": sorted(qids[:half]), "B": sorted(qids[half:])}


def cfg_params(cfg: Reweighting, step: str) -> str:
    if step == "+IDF":
        return f"ε={cfg.idf_eps:g}, {cfg.idf_unit}"
    if step == "+entropy":
        return f"blend β={cfg.entropy_beta:g}" if cfg.entropy_mode == "blend" else f"temper γ={cfg.temper_gamma:g}"
    return ""


def ablation(scorer: Scorer, folds: dict, k: int, profiles: ProfileBank | None, head_key):
    """The cumulative steps; per step the pooled held-out per-query nDCG@10 and the configs."""
    other = {"A": "B", "B": "A"}
    all_q = [q for f in folds.values() for q in f]
    cur = {t: Reweighting() for t in folds}  # config applied to test fold t (chosen on the other fold)
    prof = {t: None for t in folds}
    steps, grids = [], {}

    def record(label: str, note: str = "") -> None:
        pq = {}
        for t, qs in folds.items():
            vals = scorer.per_query(cur[t], prof[t])
            pq.update({q: vals[q] for q in qs})
        run = {}
        for t, qs in folds.items():
            run.update(scorer.run(cur[t], prof[t], qs))
        steps.append(
            {
                "step": label,
                "note": note,
                "per_query": pq,
                METRIC: evaluate(run, {q: scorer.ds.qrels[q] for q in all_q}, [METRIC], rel=scorer.ds.rel)[METRIC],
                "configs": {t: asdict(cur[t]) for t in folds},
                "params": {t: cfg_params(cur[t], label) for t in folds},
            }
        )

    def tune(label: str, grid: list[dict], **fixed) -> None:
        grids[label] = {}
        new = {}
        for t in folds:
            train = folds[other[t]]
            cands = [replace(cur[t], **fixed, **g) for g in grid]
            means = []
            for c in cands:
                vals = scorer.per_query(c)
                means.append(float(np.mean([vals[q] for q in train])) if train else float("nan"))
            best = int(np.nanargmax(means)) if train else 0  # ties: first in grid order
            new[t] = cands[best]
            grids[label][f"chosen on {other[t]} (applied to {t})"] = [
                {**g, f"{METRIC} on {other[t]}": m} for g, m in zip(grid, means)
            ]
        cur.update(new)
        record(label)

    record("base (plain ICR)")
    cur.update({t: replace(cur[t], sink=True) for t in folds})
    record("+sink")
    tune("+IDF", IDF_GRID, idf=True)
    tune("+entropy", ENTROPY_GRID, entropy=True)
    before_slot = dict(cur)
    if profiles is None:
        steps.append(
            {
                "step": "+slot correction",
                "note": "not run (--skip-profile)",
                "per_query": None,
                METRIC: float("nan"),
                "configs": {},
                "params": {},
            }
        )
    else:
        for t in folds:
            prof[t] = profiles.for_config(before_slot[t], head_key, k)
            cur[t] = replace(before_slot[t], slot_correction=True)
        record("+slot correction", f"profile: K={k}, same config and heads")
        for t in folds:
            prof[t] = profiles.for_config(Reweighting(), None, k)
        record("(variant) +slot, plain-ICR all-head profile", "Δ and wins/losses vs +entropy")
    return steps, grids


def step_rows(setting: str, heads_label: str, steps: list[dict]) -> list[dict]:
    rows, base = [], steps[0]
    prev = None
    for s in steps:
        ref = prev if not s["step"].startswith("(variant)") else next(x for x in steps if x["step"] == "+entropy")
        row = {
            "setting": setting,
            "heads": heads_label,
            "step": s["step"],
            METRIC: s[METRIC],
            "params (A / B)": " / ".join(s["params"][t] for t in ("A", "B")) if any(s["params"].values()) else "",
            "note": s["note"],
        }
        if s["per_query"] is not None and ref is not None and ref["per_query"] is not None:
            d = [s["per_query"][q] - ref["per_query"][q] for q in s["per_query"]]
            w, l = wins_losses(d)
            row.update(
                {
                    "Δ prev": s[METRIC] - ref[METRIC],
                    "wins/losses": f"{w}/{l}",
                    "sign p": sign_test(w, l),
                    "Δ base": s[METRIC] - base[METRIC],
                }
            )
        else:
            row.update(
                {
                    "Δ prev": float("nan"),
                    "wins/losses": "not run" if s["per_query"] is None else "",
                    "sign p": float("nan"),
                    "Δ base": float("nan") if s["per_query"] is None else 0.0,
                }
            )
        rows.append(row)
        if not s["step"].startswith("(variant)"):
            prev = s
    return rows


# -- positional profile --------------------------------------------------------------------------
class _Recorder:
    """Stands in for the reranker inside measure_slot_profile: records every trial's windows and
    reuses trial windows cached on disk (trial t of seed s draws the same documents whatever
    n_trials is, so a cache of t trials serves any run of ≤ t)."""

    def __init__(self, reranker, folder: Path):
        self._rr, self.folder, self.trials, self.computed = reranker, folder, [], 0

    def __getattr__(self, name):
        return getattr(self._rr, name)

    def windows(self, query, docs):
        t, ids = len(self.trials), [d.id for d in docs]
        f = self.folder / f"trial_{t:03d}.npz"
        meta = f.with_suffix(".json")
        wins = None
        if f.exists() and meta.exists() and json.loads(meta.read_text()) == {"query": query, "doc_ids": ids}:
            wins, _ = load_windows(f)
        if wins is None:
            tic = time.perf_counter()
            wins = self._rr.windows(query, docs)
            save_windows(f, wins, time.perf_counter() - tic)
            meta.write_text(json.dumps({"query": query, "doc_ids": ids}))
            self.computed += 1
        self.trials.append((query, wins))
        return wins


class ProfileBank:
    """Plain-ICR profiles from measure_slot_profile, and per-config profiles re-scored from the
    same recorded trials."""

    def __init__(self, reranker, pool, n_trials: int, seed: int = 0):
        self.rr, self.pool, self.n_trials, self.seed = reranker, pool, n_trials, seed
        self.trials, self.base, self.derived, self.seconds = {}, {}, {}, {}

    def measure(self, k: int) -> SlotProfile:
        if k not in self.base:
            fp = self.rr.llm.short_key
            rec = _Recorder(self.rr, CACHE / f"slot-trials_{fp}_K{k}_seed{self.seed}_pool{len(self.pool)}")
            tic = time.perf_counter()
            self.base[k] = measure_slot_profile(rec, self.pool, n_slots=k, n_trials=self.n_trials, seed=self.seed)
            self.seconds[k] = {
                "wall": time.perf_counter() - tic,
                "trials computed": rec.computed,
                "trials from cache": self.n_trials - rec.computed,
            }
            self.trials[k] = rec.trials
            check = self.for_config(Reweighting(), None, k)  # the offline re-scoring reproduces it
            assert np.allclose(check.mean_score, self.base[k].mean_score, rtol=1e-9, atol=1e-12), "re-scoring mismatch"
            log.info(
                "slot profile K=%d: %d trials (%d computed) in %.0f s",
                k,
                self.n_trials,
                rec.computed,
                self.seconds[k]["wall"],
            )
        return self.base[k]

    def for_config(self, cfg: Reweighting, head_idx, k: int) -> SlotProfile:
        cfg = replace(cfg, slot_correction=False)
        key = (cfg, None if head_idx is None else tuple(int(h) for h in head_idx), k)
        if key not in self.derived:
            self.measure(k)
            tok = self.rr.llm.tokenizer
            table = np.empty((len(self.trials[k]), k))
            for t, (query, wins) in enumerate(self.trials[k]):
                w = sliced(wins[0], None if head_idx is None else list(key[1]))
                scores = reweighted_document_scores(
                    w,
                    tok.convert_ids_to_tokens(w.input_ids),
                    tokenized_query_terms(tok, query, cfg.idf_unit),
                    cfg,
                    use_filter=self.rr.token_filter,
                )
                table[t, prompt_slots(w.spans)] = scores
            b = self.base.get(k)
            self.derived[key] = SlotProfile(
                k,
                tuple(table.mean(0)),
                tuple(table.std(0)),
                self.rr.llm.model_id,
                self.rr.llm.fingerprint,
                len(table),
                b.date if b else "",
            )
        return self.derived[key]


def profile_table(profiles: dict[int, SlotProfile]) -> str:
    ks = sorted(profiles)
    rows = []
    for i in range(max(ks)):
        r = {"slot": str(i + 1)}
        for k in ks:
            if i < k:
                r[f"K={k} mean"], r[f"K={k} std"] = profiles[k].mean_score[i], profiles[k].std[i]
        rows.append(r)
    cols = ["slot"] + [f"K={k} {x}" for k in ks for x in ("mean", "std")]
    return md_table(rows, cols, {c: ".5f" for c in cols})


def profile_summary(p: SlotProfile) -> str:
    m = np.array(p.mean_score)
    k = len(m)
    third = max(1, k // 3)
    se = np.array(p.std) / math.sqrt(p.n_trials)
    return (
        f"K={k}: first slot {m[0]:.5f}, last slot {m[-1]:.5f}, mean of the middle third {m[third : k - third].mean():.5f}; "
        f"max at slot {int(m.argmax()) + 1}, min at slot {int(m.argmin()) + 1}; range {m.max() - m.min():.5f} "
        f"vs typical standard error of a slot mean {np.median(se):.5f}."
    )


# -- report ----------------------------------------------------------------------------------------
def markdown(rows, extra, env, args, cmd) -> str:
    out = [
        f"# Attention re-weighting ablation ({env['date']})",
        "",
        f"- Command: `{cmd}`",
        f"- Model: {extra['model']['id']} (fingerprint {extra['model']['fingerprint'][:12]}, "
        f"{extra['model']['layers']} layers × {extra['model']['heads']} heads), plain ICR prompt "
        "(documents in reverse first-stage order, ≤ 300 words each), μ−2σ token filter on.",
        f"- Machine: {env['cpus']} CPUs, torch {env['torch']}, Python {env['python']}.",
        "",
        "nDCG@10: trec_eval linear gain (ir-measures), DL19 relevance ≥ 2. Steps are cumulative. "
        f"**Held-out tuning:** each setting's queries are split into two folds (seed {args.seed}); "
        "parameters applied to fold B were chosen on fold A by mean nDCG@10 (greedily, one step at a time) "
        "and vice versa; every number pools the two folds' held-out per-query values. "
        "Δ prev / wins/losses: against the previous step, per query (nDCG@10 up / down; ties not counted); "
        "sign p: two-sided exact sign test. Params (A / B): chosen for fold A (on B) / for fold B (on A). "
        "Head list: top-16 heads by their own nDCG@10 on the other dataset (DL19 settings: heads picked on "
        "SciFact; SciFact: heads picked on DL19 top-20), as in bench_rerank; the base rows equal bench_rerank's "
        "'ICR all heads, calibrated' and head-list rows.",
        "",
    ]
    for name in dict.fromkeys(r["setting"] for r in rows):
        n = extra["settings"][name]["n_queries"]
        out += [
            f"## {name} ({n} queries; folds {extra['settings'][name]['fold_sizes']})",
            "",
            md_table(
                [r for r in rows if r["setting"] == name],
                ["heads", "step", METRIC, "Δ prev", "wins/losses", "sign p", "Δ base", "params (A / B)"],
                {"Δ prev": "+.4f", "Δ base": "+.4f", "sign p": ".3f"},
            ),
            "",
        ]
        for hl, sel in extra["settings"][name].get("head_list", {}).items():
            out.append(f"- {hl} (chosen on {sel['chosen_on']}): " + ", ".join(f"{l}-{h}" for l, h in sel["heads"]))
        out.append("")
    out += ["## Positional (slot) profile", ""]
    prof = extra.get("profile")
    if not prof:
        out += ["Not measured (--skip-profile); the +slot correction step was not run.", ""]
    else:
        out += [
            f"`measure_slot_profile` with the default AttentionReranker (all heads, plain ICR config: no sink/IDF/"
            f"entropy), {prof['n_trials']} trials, seed {prof['seed']}: each trial puts K passages drawn at random "
            f"from the {prof['pool']} DL19 passages (top-100 pools of all 43 topics) into one prompt with a "
            "content-free question and records each slot's calibrated document score. Slot 1 is the first document "
            "in the prompt; the last slot is next to the query (where rank 1 goes in reranking, order='reverse'). "
            "std is over trials (content variance); a slot mean's standard error is std/√trials.",
            "",
            f"![slot profile]({prof['png']})",
            "",
        ]
        out += [f"- {s}" for s in prof["summary"]]
        out += [
            "",
            "The +slot correction step subtracts (profile − its mean over slots) by slot, with the profile "
            "re-scored from the same trials under that step's own config and head set (fold-specific; "
            "stored in reweight.json under `slot_profiles_used`), at the setting's K (SciFact top-20 uses the "
            "20-slot profile of DL19 passages). The variant row uses the plain-ICR all-head profile instead.",
            "",
            profile_table({int(k): SlotProfile.from_json(json.dumps(v)) for k, v in prof["profiles"].items()}),
            "",
        ]
        for k, s in prof["seconds"].items():
            out.append(
                f"- K={k}: {s['wall']:.0f} s ({s['trials computed']} trials computed, "
                f"{s['trials from cache']} from cache)."
            )
    out.append(f"\nTotal wall time {extra['seconds']:.0f} s.")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--settings", default="dl19-20,dl19-50,scifact", help=f"subset of {','.join(SETTINGS)}")
    ap.add_argument(
        "--max-queries", type=non_negative_int, default=0, help="first N queries per setting (smoke runs; 0 = all)"
    )
    ap.add_argument("--no-selected", action="store_true", help="all heads only (no cross-dataset head list)")
    ap.add_argument("--seed", type=int, default=0, help="fold split seed")
    ap.add_argument("--profile-trials", type=int, default=24)
    ap.add_argument("--profile-slots", default="20,50", help="K values to profile (each setting's K is added)")
    ap.add_argument("--skip-profile", action="store_true")
    ap.add_argument("--ship", action="store_true", help="register the measured profiles in attnrank/heads/data/")
    ap.add_argument("--out", default=str(OUT), help="output folder (default docs/results)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cmd = command_line()  # (as this process ran)
    tic = time.perf_counter()
    set_torch_threads()
    aliases = [a.strip() for a in args.settings.split(",") if a.strip()]
    bad = [a for a in aliases if a not in SETTINGS]
    if bad:
        raise SystemExit(f"unknown settings {bad}; choose from {list(SETTINGS)}")
    root, out_dir = data_root(args.data, default=REPO.parent / "shared" / "data"), Path(args.out)
    from attnrank.rerank.attention import AttentionReranker

    rr = AttentionReranker(config="icr")  # the default model, all heads, plain ICR
    tok, heads = rr.llm.tokenizer, rr.head_list
    sets = Settings(root, args.max_queries or None)
    model = {
        "id": rr.llm.model_id,
        "fingerprint": rr.llm.fingerprint,
        "layers": rr.llm.num_layers,
        "heads": rr.llm.num_heads,
    }
    extra: dict = {"model": model, "settings": {}, "grids": {}, "slot_profiles_used": {}}

    # positional profiles first (model time; the ablation itself is offline)
    bank = None
    if not args.skip_profile:
        ks = sorted(
            {int(x) for x in args.profile_slots.split(",") if x.strip()}
            | {max(len(c) for c in sets.get(a)[2].values()) for a in aliases}
        )
        bank = ProfileBank(rr, dl19(root).docs, args.profile_trials)
        out_dir.mkdir(parents=True, exist_ok=True)
        for k in ks:
            bank.measure(k).save(out_dir / f"slot_profile_{k}.json")
            if args.ship:  # the package's registry entry for the default model
                store_profile(bank.base[k], root=REPO / "attnrank" / "heads" / "data")
        png = slot_profiles(bank.base, out_dir / "slot_profile.png")  # (beside a PNG there not attnrank's)
        extra["profile"] = {
            "n_trials": args.profile_trials,
            "seed": bank.seed,
            "pool": len(bank.pool),
            "png": png.name,
            "files": [f"slot_profile_{k}.json" for k in ks],
            "profiles": {str(k): json.loads(p.to_json()) for k, p in bank.base.items()},
            "summary": [profile_summary(bank.base[k]) for k in ks],
            "seconds": {str(k): v for k, v in bank.seconds.items()},
        }

    # head lists: per source setting, per-head nDCG@10 over its queries
    head_nd = {}
    if not args.no_selected:
        for src in dict.fromkeys(HEAD_SOURCE[a] for a in aliases):
            name, ds, cands = sets.get(src)
            head_nd[src] = head_quality(capture_all(rr, name, ds.queries, cands, CACHE), cands, ds.qrels, ds.rel, rr)

    rows = []
    for a in aliases:
        name, ds, cands = sets.get(a)
        captured = capture_all(rr, name, ds.queries, cands, CACHE)
        k = max(len(c) for c in cands.values())
        folds = folds_of(ds.queries, args.seed)
        info = {
            "n_queries": len(ds.queries),
            "K": k,
            "fold_sizes": f"{len(folds['A'])}/{len(folds['B'])}",
            "folds": folds,
            "capture s/query": float(np.mean([c["seconds"] for c in captured.values()])),
            "steps": {},
        }
        head_sets = [("all heads", None)]
        if HEAD_SOURCE[a] in head_nd:
            src = HEAD_SOURCE[a]
            top = [int(i) for i in np.argsort(-head_nd[src])[:N_SELECTED]]
            label = f"top-{N_SELECTED} by nDCG on {SETTINGS[src].split()[0]}"
            head_sets.append((label, top))
            info["head_list"] = {
                label: {
                    "chosen_on": SETTINGS[src],
                    "heads": [list(heads[i]) for i in top],
                    "head_nDCG@10 on source": [float(head_nd[src][i]) for i in top],
                }
            }
        for label, idx in head_sets:
            t0 = time.perf_counter()
            scorer = Scorer(tok, ds, cands, captured, idx)
            steps, grids = ablation(scorer, folds, k, bank, idx)
            rows += step_rows(name, label, steps)
            info["steps"][label] = [{kk: v for kk, v in s.items()} for s in steps]
            extra["grids"][f"{name} | {label}"] = grids
            if bank is not None:  # the profile each fold's +slot step subtracted (config of its +entropy step)
                extra["slot_profiles_used"][f"{name} | {label}"] = {
                    t: list(bank.for_config(Reweighting(**c), idx, k).mean_score)
                    for t, c in steps[3]["configs"].items()
                }
            log.info("%s, %s: %d configs scored in %.0f s", name, label, len(scorer._pq), time.perf_counter() - t0)
        extra["settings"][name] = info
        del captured
    extra["seconds"] = time.perf_counter() - tic
    env = environment()
    md = markdown(rows, extra, env, args, cmd)
    write_outputs("reweight", {"environment": env, "command": cmd, "rows": rows, **extra}, md, out_dir)
    print(md)


if __name__ == "__main__":
    main()
