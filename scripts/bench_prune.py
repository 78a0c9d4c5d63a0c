"""Context-pruning benchmark (issue: attention-guided context pruning): supporting-fact recall
vs compression on HotpotQA distractor dev, attention pruning against baselines in the same run.

Per question the context is its own (up to 10) paragraphs, split into the dataset's ``sentences``
(official split for the 83 questions with sentence-level supporting facts, the documented
double-space heuristic for the other 317) and passed to the pruner verbatim, so sentence ids
line up with the labels. Every sentence is scored ONCE per method:

- ``query``: :meth:`ContextPruner.score_sentences`, method="query" (ICR query span, calibrated);
- ``focus``: the same, method="focus" (AttentionRAG-style answer-hint token);
- ``query-sink`` (not in the default list): ``query`` with the reranker's sink filtering (``sink=True``);
- ``bm25``: BM25 (attnrank's :class:`BM25Index`, k1=0.9, b=0.4) of the question against each
  sentence's text, statistics over that question's sentences only;
- ``embed``: cosine of MiniLM (all-MiniLM-L6-v2, packaged) embeddings of question and sentence;
- ``lead``: position in the paragraph (first sentences first) — a cheap HotpotQA prior;
- ``random``: seeded uniform scores, metrics averaged over ``--seeds`` draws;
- ``probe`` / ``probe-heads`` / ``probe-bm25``: the Sentinel-style :class:`SentenceProbe` over
  the ``query`` method's per-head sentence scores (same forward pass), with the passage/position
  extras, heads only, or the extras plus the sentence's BM25 score. Held out: on the sentence-labelled questions, k-fold cross-fitting over questions
  (``--folds``, a probe trained on the other folds scores each question); the other questions
  are scored by a probe trained on all labelled questions (disjoint questions). ``--ship``
  registers the probe trained on all labelled questions for the default model.

Then, for each keep ratio, the library's own selection (:func:`attnrank.prune.context.select`
on copies of the pruner's :class:`ScoredSentence` list with the method's scores, budget
``floor(ratio × sentence tokens)`` from :func:`resolve_budget`) — exactly what
``ContextPruner.prune(keep_ratio=r)`` does: greedy by score, a misfit skipped, no neighbours.
Token counts are the default model's prompt tokens of each sentence (sentence tokens only, the
``[i] title`` lines are not counted), identical for every method.

Metrics: sentence-level supporting-fact recall (83 labelled questions: fraction of gold
sentences kept, macro-averaged; and the share of questions with every gold sentence kept);
paragraph-level recall (the other questions: fraction of the 2 supporting paragraphs with >= 1
kept sentence); compression = sentence tokens / kept tokens, pooled over questions (Σ/Σ), and
the smallest per-question value. LLMLingua-2 is only checked for availability (its model is a
hub download).

    python scripts/bench_prune.py [--data DIR] [--questions N] [--ratios 0.1,0.15,...]
                                  [--methods query,focus,bm25,embed,lead,random] [--seeds 5]

``--dtype`` (default auto) and ``--attention block`` (the pruner in block attention, its probe
retrained on block-attention features by the same cross-fitting) name what is measured.

Writes docs/results/<name>.{json,md} and <name>_recall.png (``--name``, default ``prune``;
``--out-dir`` to put them elsewhere);
per-question scores are cached under indexes/bench-cache/prune_* (``--cache-dir ''`` disables), and
the per-question metrics go to indexes/bench-cache/prune_per_question*.json (too large for docs/).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import re
import time
from pathlib import Path

import numpy as np
from _common import fold_count, non_negative_int, positive_int

from attnrank.config import set_torch_threads
from attnrank.eval.datasets import data_root, hotpotqa_rows
from attnrank.eval.plot import recall_curves
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.prune.context import resolve_budget, select
from attnrank.types import Document

log = logging.getLogger("bench_prune")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"

ALL_METHODS = (
    "query",
    "focus",
    "bm25",
    "embed",
    "lead",
    "random",
    "probe",
    "probe-heads",
    "probe-bm25",
    "probe-passage-heads",
    "query-sink",
)
PROBES = {
    "probe": ("passage", "first", "position"),
    "probe-heads": (),
    "probe-bm25": ("passage", "first", "position", "bm25"),
    "probe-passage-heads": ("passage", "passage-heads", "first", "position"),
}
ATTENTION = ("query", "focus", "query-sink")
DEFAULT_METHODS = [m for m in ALL_METHODS if m != "query-sink"]  # query-sink: an extra forward pass
DEFAULT_RATIOS = "0.1,0.15,0.2,0.25,0.33,0.5"
TARGET_COMPRESSION, TARGET_RECALL = 4.0, 0.90
LLMLINGUA2_MODELS = (
    "microsoft/llmlingua-2-xlm-roberta-large-meetingbank",
    "microsoft/llmlingua-2-bert-base-multilingual-cased-meetingbank",
)


# -- questions --------------------------------------------------------------------------------------
def load_questions(root: Path, n: int | None) -> list[dict]:
    """Sentence-labelled questions first (file order), then the rest; the first ``n``.

    Empty sentences are dropped (the pruner skips them too); ``orig_ids`` maps each kept
    sentence back to its index in the dataset so the labels stay aligned.
    """
    rows = hotpotqa_rows(root)
    rows = [r for r in rows if r.get("has_sentence_level_sf")] + [r for r in rows if not r.get("has_sentence_level_sf")]
    out = []
    for r in rows[:n] if n else rows:
        docs, sents, gold_sent, gold_para = [], [], set(), set()
        dropped = 0
        for d, p in enumerate(r["paragraphs"]):
            keep = [(i, s.strip()) for i, s in enumerate(p["sentences"]) if s.strip()]
            ids = [i for i, _ in keep]
            sents.append([s for _, s in keep])
            docs.append(Document(f"{r['id']}_{p['pid']}", " ".join(s for _, s in keep) or p["text"], p["title"]))
            if p["is_supporting"]:
                gold_para.add(d)
            for i in p.get("supporting_sentence_ids") or []:
                if i in ids:
                    gold_sent.add((d, ids.index(i)))
                else:
                    dropped += 1
        if dropped:
            log.warning("question %s: %d gold sentence(s) empty or out of range, ignored", r["id"], dropped)
        out.append(
            {
                "id": r["id"],
                "question": r["question"],
                "labelled": bool(r.get("has_sentence_level_sf")),
                "docs": docs,
                "sentences": sents,
                "gold_sent": gold_sent,
                "gold_para": gold_para,
            }
        )
    return out


# -- scoring, once per question and method ----------------------------------------------------------
class Scorers:
    def __init__(self, methods: list[str], heads, dtype: str = "auto", attention: str = "full"):
        from attnrank.llm.models import load_llm
        from attnrank.prune.pruner import ContextPruner

        self.llm = load_llm(None, dtype=dtype)
        self.attention = attention
        self.pruners = {
            m: ContextPruner(self.llm, heads, method=m.split("-")[0], sink=m.endswith("-sink"), attention=attention)
            for m in ATTENTION
        }
        self.methods = methods
        self.embedder = None
        if "embed" in methods:
            from attnrank.index.embed import load_embedder

            self.embedder = load_embedder(None)

    def base(self, q: dict):
        """The pruner's sentence list (reading order, prompt token counts), without a model call."""
        return self.pruners["query"]._prepare(q["question"], q["docs"], q["sentences"])[2]

    def features(self, q: dict, base) -> np.ndarray:
        """Per-head ``query`` sentence scores ``[S, H]`` (rows sum to the ``query`` score)."""
        scored, feats = self.pruners["query"].sentence_features(q["question"], q["docs"], sentences=q["sentences"])
        if [s.tokens for s in scored] != [s.tokens for s in base]:
            raise RuntimeError(f"{q['id']}: token counts differ between the query prompt and the base plan")
        return feats

    def score(self, q: dict, method: str, base) -> list[float]:
        texts = [s.text for s in base]
        if method in ATTENTION:
            scored = self.pruners[method].score_sentences(q["question"], q["docs"], sentences=q["sentences"])
            if [s.tokens for s in scored] != [s.tokens for s in base]:
                raise RuntimeError(f"{q['id']}: token counts differ between the {method} prompt and the base plan")
            return [s.score for s in scored]
        if method == "bm25":  # the probe's lexical feature, exactly
            from attnrank.prune.probe import lexical_scores

            return lexical_scores(q["question"], texts).tolist()
        if method == "embed":
            from attnrank.index.embed import encode

            emb = encode(self.embedder, [q["question"]] + texts)
            return (emb[1:] @ emb[0]).astype(float).tolist()
        if method == "lead":
            return [-float(s.sentence_index) for s in base]
        raise ValueError(method)


def cache_path(cache_dir: str, llm, heads, qid: str, attention: str = "full") -> Path | None:
    if not cache_dir:
        return None
    mode = "" if attention == "full" else f"_{attention}"
    tag = re.sub(r"[^A-Za-z0-9]+", "_", f"prune_{llm.model_id}_{llm.short_key}_{heads or 'all'}{mode}")
    return Path(cache_dir) / tag / f"{re.sub(r'[^A-Za-z0-9]+', '_', qid)}.json"


def score_question(scorers: Scorers, q: dict, methods: list[str], cache_dir: str, heads) -> dict:
    """``{"tokens": [...], "scores": {method: [...]}, "seconds": {method: s}}`` (cached per question)."""
    path = cache_path(cache_dir, scorers.llm, heads, q["id"], scorers.attention)
    rec = json.loads(path.read_text()) if path is not None and path.exists() else {"scores": {}, "seconds": {}}
    t = time.perf_counter()
    base = scorers.base(q)
    plan_s = time.perf_counter() - t
    tokens = [s.tokens for s in base]
    if rec.get("tokens") not in (None, tokens):
        rec = {"scores": {}, "seconds": {}}  # stale cache (other sentences or tokenizer)
    rec["tokens"] = tokens
    rec["seconds"].setdefault("plan", plan_s)
    changed = False
    feat_path = path.with_suffix(".npz") if path is not None else None
    if any(m in methods for m in ("query", *PROBES)):
        if feat_path is not None and feat_path.exists() and "query" in rec["scores"]:
            rec["features"] = np.load(feat_path)["features"]
        else:  # one forward pass gives the query score and the probe's features
            t = time.perf_counter()
            rec["features"] = scorers.features(q, base)
            rec["scores"]["query"] = rec["features"].sum(1).tolist()
            rec["seconds"]["query"] = time.perf_counter() - t
            changed = True
            if feat_path is not None:
                feat_path.parent.mkdir(parents=True, exist_ok=True)
                np.savez(feat_path, features=rec["features"].astype(np.float32))
    for m in methods:
        if m == "random" or m in PROBES or m in rec["scores"]:
            continue
        t = time.perf_counter()
        rec["scores"][m] = scorers.score(q, m, base)
        rec["seconds"][m] = time.perf_counter() - t
        changed = True
    if path is not None and changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: v for k, v in rec.items() if k != "features"}))
        tmp.replace(path)
    rec["base"] = base
    return rec


def probe_scores(questions: list[dict], recs: list[dict], methods: list[str], heads, args, capture: dict) -> dict:
    """Held-out probe scores into ``rec["scores"]`` (see the module doc); returns the probes
    trained on all labelled questions, by method."""
    from attnrank.prune.probe import (
        ProbeExample,
        crossfit_scores,
        select_l2,
        train_probe,
    )

    examples, trained = {}, {}
    for q, rec in zip(questions, recs):
        pos = [(s.doc_index, s.sentence_index) for s in rec["base"]]
        labels = np.array([p in q["gold_sent"] for p in pos])
        lexical = np.array(rec["scores"]["bm25"]) if "bm25" in rec["scores"] else None
        rec["lexical"] = lexical
        if q["labelled"] and labels.any():
            examples[q["id"]] = ProbeExample(q["id"], rec["features"].astype(np.float64), pos, labels, lexical)
    if "probe-bm25" in methods and "bm25" not in methods:
        raise SystemExit("method probe-bm25 needs method bm25 (its lexical feature)")
    for m in [m for m in methods if m in PROBES]:
        grid, ex = [float(x) for x in args.l2.split(",")], list(examples.values())
        held = crossfit_scores(ex, heads, folds=args.folds, l2=grid, extras=PROBES[m])
        l2 = select_l2(ex, heads, grid, extras=PROBES[m])
        trained[m] = train_probe(
            ex,
            heads,
            extras=PROBES[m],
            l2=l2,
            trained_on=f"{len(ex)} HotpotQA distractor dev questions with sentence-level supporting facts",
            capture=capture,  # how the query pruner that read the features captured them
        )
        for q, rec in zip(questions, recs):
            pos = [(s.doc_index, s.sentence_index) for s in rec["base"]]
            rec["scores"][m] = (
                held[q["id"]]
                if q["id"] in held
                else trained[m].score(rec["features"].astype(np.float64), pos, rec["lexical"])
            ).tolist()
        log.info(
            "%s: %d labelled questions cross-fitted in %d folds; all-data probe l2=%g", m, len(held), args.folds, l2
        )
    return trained


# -- selection and metrics --------------------------------------------------------------------------
def keep_mask(base, scores, ratio: float) -> tuple[np.ndarray, int]:
    """The library's greedy selection (``select``) with these scores at ``floor(ratio × tokens)``."""
    original = sum(s.tokens for s in base)
    target, _ = resolve_budget(None, ratio, original)
    items = [dataclasses.replace(s, score=float(x), kept=False) for s, x in zip(base, scores)]
    if target >= original:
        return np.ones(len(items), bool), target
    select(items, target, 0)
    return np.array([s.kept for s in items]), target


def question_metrics(q: dict, base, kept: np.ndarray) -> dict:
    tokens = np.array([s.tokens for s in base])
    keys = [(s.doc_index, s.sentence_index) for s in base]
    kept_keys = {k for k, on in zip(keys, kept) if on}
    kept_docs = {d for d, _ in kept_keys}
    out = {"orig": int(tokens.sum()), "kept": int(tokens[kept].sum())}
    if q["labelled"] and q["gold_sent"]:
        hit = len(q["gold_sent"] & kept_keys)
        out["sent_recall"] = hit / len(q["gold_sent"])
        out["sent_all"] = float(hit == len(q["gold_sent"]))
    if q["gold_para"]:
        out["para_recall"] = len(q["gold_para"] & kept_docs) / len(q["gold_para"])
    return out


def evaluate(
    questions: list[dict], recs: list[dict], methods: list[str], ratios: list[float], seeds: int
) -> tuple[list[dict], list[dict]]:
    rows, per_q = [], []
    for m in methods:
        for r in ratios:
            qm = []
            for qi, (q, rec) in enumerate(zip(questions, recs)):
                base = rec["base"]
                if m == "random":
                    draws = []
                    for s in range(seeds):
                        rng = np.random.default_rng([s, qi])
                        draws.append(question_metrics(q, base, keep_mask(base, rng.random(len(base)), r)[0]))
                    mq = {k: float(np.mean([d[k] for d in draws])) for k in draws[0]}
                else:
                    mq = question_metrics(q, base, keep_mask(base, rec["scores"][m], r)[0])
                mq.update(id=q["id"], labelled=q["labelled"])
                qm.append(mq)
                per_q.append({"method": m, "ratio": r, **mq})
            rows.append(aggregate(m, r, qm))
    return rows, per_q


def aggregate(method: str, ratio: float, qm: list[dict]) -> dict:
    lab = [x for x in qm if x["labelled"] and "sent_recall" in x]
    oth = [x for x in qm if not x["labelled"] and "para_recall" in x]
    orig, kept = sum(x["orig"] for x in qm), sum(x["kept"] for x in qm)
    per_q = [x["orig"] / x["kept"] if x["kept"] else math.inf for x in qm]
    nan = float("nan")
    return {
        "method": method,
        "keep ratio": ratio,
        "compression": orig / kept if kept else math.inf,
        "min compression": float(min(per_q)) if per_q else nan,
        "sent recall (labelled)": float(np.mean([x["sent_recall"] for x in lab])) if lab else nan,
        "all gold sents kept": float(np.mean([x["sent_all"] for x in lab])) if lab else nan,
        "para recall (labelled)": float(np.mean([x["para_recall"] for x in lab])) if lab else nan,
        "para recall (others)": float(np.mean([x["para_recall"] for x in oth])) if oth else nan,
        "n labelled": len(lab),
        "n others": len(oth),
        "empty selections": sum(1 for x in qm if not x["kept"]),
    }


def at_target(rows: list[dict], methods: list[str]) -> list[dict]:
    """Per method: the largest keep ratio whose every question is compressed >= 4x."""
    out = []
    for m in methods:
        ok = [r for r in rows if r["method"] == m and r["min compression"] >= TARGET_COMPRESSION - 1e-9]
        if not ok:
            out.append({"method": m, "keep ratio": "none >= 4x"})
            continue
        best = max(ok, key=lambda r: r["keep ratio"])
        s, p = best["sent recall (labelled)"], best["para recall (others)"]
        out.append(
            {
                "method": m,
                "keep ratio": best["keep ratio"],
                "compression": best["compression"],
                "sent recall (labelled)": s,
                "para recall (others)": p,
                ">= 90% sentence recall": "—" if s != s else ("yes" if s >= TARGET_RECALL else "no"),
                ">= 90% paragraph recall": "—" if p != p else ("yes" if p >= TARGET_RECALL else "no"),
            }
        )
    return out


# -- LLMLingua-2 ------------------------------------------------------------------------------------
def llmlingua2_status() -> str:
    import importlib.util
    import os

    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE") or home / "hub")
    local = [m for m in LLMLINGUA2_MODELS if (hub / ("models--" + m.replace("/", "--"))).is_dir()]
    pkg = importlib.util.find_spec("llmlingua") is not None
    if not local:
        return (
            "not run: LLMLingua-2 needs a hub model (" + " or ".join(LLMLINGUA2_MODELS) + "), not in the "
            f"local Hugging Face cache and not downloadable offline; package llmlingua "
            f"{'installed' if pkg else 'not installed (it is on PyPI, 0.2.2)'}"
        )
    return f"not run: model {local[0]} is cached locally but this script does not wire LLMLingua-2 in yet"


# -- output -----------------------------------------------------------------------------------------
def markdown(rows, target, timing, questions, args, env, lingua, png) -> str:
    n_lab = sum(q["labelled"] for q in questions)
    fmt = {"keep ratio": ".2f", "compression": ".2f", "min compression": ".2f"}
    cols = [
        "method",
        "keep ratio",
        "compression",
        "min compression",
        "sent recall (labelled)",
        "all gold sents kept",
        "para recall (labelled)",
        "para recall (others)",
        "empty selections",
    ]
    out = [
        "# Context pruning: supporting-fact recall vs compression (HotpotQA distractor dev)",
        "",
        f"{len(questions)} questions ({n_lab} with official sentence-level supporting facts, "
        f"{len(questions) - n_lab} paragraph-level only), each question's own paragraphs as the context; "
        f"model {args.model_id} ({args.model_fp[:12]}, {args.dtype_name}), heads {args.heads or 'all'}, "
        f"{args.attention} attention; random averaged over "
        f"{args.seeds} seeds. Selection = attnrank.prune.context.select (greedy by score, misfits skipped) at "
        "budget floor(ratio × sentence tokens); tokens are the default model's, sentence tokens only. "
        "Compression is pooled (Σ sentence tokens / Σ kept); min compression is the smallest per question.",
        "",
        md_table(rows, cols, fmt),
        "",
        f"## At >= {TARGET_COMPRESSION:.0f}x compression (largest keep ratio with every question >= 4x)",
        "",
        md_table(
            target,
            [
                "method",
                "keep ratio",
                "compression",
                "sent recall (labelled)",
                "para recall (others)",
                ">= 90% sentence recall",
                ">= 90% paragraph recall",
            ],
            fmt,
        ),
        "",
        "## Scoring time per question (s, mean)",
        "",
        md_table([timing], list(timing), {k: ".3f" for k in timing}),
        "",
        f"LLMLingua-2: {lingua}.",
        "",
    ]
    if png:
        out += [f"![recall vs compression]({png.name})", ""]
    out += [f"Environment: {json.dumps(env)}; wall time {args.wall:.0f} s.", ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument(
        "--questions", type=non_negative_int, default=0, help="first N questions, sentence-labelled first (0 = all 400)"
    )
    ap.add_argument("--ratios", default=DEFAULT_RATIOS)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=f"from {','.join(ALL_METHODS)}")
    ap.add_argument("--seeds", type=positive_int, default=5, help="random-baseline draws averaged (>= 3)")
    ap.add_argument("--heads", default=None, help="pruner heads: 'all' (default), 'l-h,...' or a JSON file")
    ap.add_argument("--cache-dir", default=str(REPO / "indexes" / "bench-cache"), help="'' = no score cache")
    ap.add_argument("--out-dir", default=str(OUT))
    ap.add_argument("--folds", type=fold_count, default=5, help="probe cross-fitting folds over labelled questions")
    ap.add_argument(
        "--l2", default="1,10,100,1000", help="probe L2 penalties, chosen by inner CV on training questions"
    )
    ap.add_argument("--ship", action="store_true", help="register the probe trained on all labelled questions")
    ap.add_argument("--dtype", default="auto", help="LLM dtype (auto: bfloat16 on AMX CPUs, else float32)")
    ap.add_argument("--attention", default="full", choices=["full", "block"], help="the pruner's attention mode")
    ap.add_argument("--name", default="prune", help="output name: docs/results/<name>.{json,md}")
    args = ap.parse_args()
    if args.ship and args.attention != "full":
        ap.error("--ship registers a full-attention probe; drop --attention")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("attnrank").setLevel(logging.WARNING)
    set_torch_threads()
    start = time.perf_counter()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = set(methods) - set(ALL_METHODS)
    if bad:
        raise SystemExit(f"unknown methods {sorted(bad)}; choose from {ALL_METHODS}")
    ratios = [float(x) for x in args.ratios.split(",")]
    questions = load_questions(data_root(args.data, default=REPO.parent / "shared" / "data"), args.questions or None)
    scorers = Scorers(methods, args.heads, args.dtype, args.attention)
    args.model_id, args.model_fp = scorers.llm.model_id, scorers.llm.fingerprint
    args.dtype_name = str(scorers.llm.dtype).removeprefix("torch.")
    recs = []
    for i, q in enumerate(questions, 1):
        recs.append(score_question(scorers, q, methods, args.cache_dir, args.heads))
        if i % 10 == 0 or i == len(questions):
            log.info("scored %d/%d questions (%.0f s)", i, len(questions), time.perf_counter() - start)
    pruner = scorers.pruners["query"]
    heads = pruner.heads or [(l, h) for l in range(pruner.llm.num_layers) for h in range(pruner.llm.num_heads)]
    from attnrank.prune.probe import probe_capture

    probes = probe_scores(
        questions,
        recs,
        methods,
        heads,
        args,
        probe_capture(scorers.pruners["query"].config, scorers.pruners["query"].llm.adapter),
    )
    if args.ship and "probe" in probes:
        probes["probe"].save(args.model_id, args.model_fp, root=REPO / "attnrank" / "heads" / "data")
    rows, per_q = evaluate(questions, recs, methods, ratios, args.seeds)
    target = at_target(rows, methods)
    timing = {
        m: float(np.mean([r["seconds"][m] for r in recs]))
        for m in ["plan"] + methods
        if m != "random" and all(m in r["seconds"] for r in recs)
    }
    if "query" in timing:  # the probes read the query method's forward pass
        timing.update({m: timing["query"] for m in probes})
    lingua = llmlingua2_status()
    out_dir = Path(args.out_dir)
    # (where it went: beside a PNG there that is not attnrank's, which the page must not link)
    png = recall_curves(
        rows,
        methods,
        out_dir / f"{args.name}_recall.png",
        solid=ATTENTION + tuple(PROBES),
        target=(TARGET_COMPRESSION, TARGET_RECALL),
    )
    args.wall = time.perf_counter() - start
    env = environment()
    payload = {
        "environment": env,
        "model": args.model_id,
        "fingerprint": args.model_fp,
        "heads": args.heads or "all",
        "dtype": args.dtype_name,
        "attention": args.attention,
        "questions": len(questions),
        "labelled": sum(q["labelled"] for q in questions),
        "ratios": ratios,
        "methods": methods,
        "seeds": args.seeds,
        "rows": rows,
        "at_4x": target,
        "scoring_seconds": timing,
        "llmlingua2": lingua,
        "wall_s": args.wall,
    }
    if args.cache_dir:  # per-question rows are MBs: kept beside the score cache, not in docs/results
        tag = "" if out_dir.resolve() == OUT.resolve() and args.name == "prune" else f"_{out_dir.name}_{args.name}"
        side = Path(args.cache_dir) / f"prune_per_question{tag}.json"
        side.parent.mkdir(parents=True, exist_ok=True)
        side.write_text(json.dumps(per_q))
    md = markdown(rows, target, timing, questions, args, env, lingua, png)
    write_outputs(args.name, payload, md, out_dir)
    print(md)


if __name__ == "__main__":
    main()
