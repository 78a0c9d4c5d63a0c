"""Answering benchmark (issues: context pruning; reordering for generation): HotpotQA answer
EM/F1 of the default LLM with no / full / pruned / reranked / reordered context, context tokens
and per-stage latency of the ask path.

Per question (default: the 83 with sentence-level supporting facts), the context is the
question's own (up to 10) paragraphs; the first stage is BM25 (attnrank's :class:`BM25Index`)
over those paragraphs (title + text). One model (the default LLM) reranks, prunes and answers
(greedy, ``--max-new-tokens``). Arms:

- ``none``: the question alone;
- ``full``: every paragraph in first-stage (BM25) order;
- ``pruned``: the full context pruned by :class:`ContextPruner` (``--prune-method``, default
  "query"; all heads unless ``--heads``) to
  ``--prune-ratio`` (default 0.25, i.e. budget = full sentence tokens / 4), the dataset's
  sentence split passed in, kept sentences in reading order;
- ``pipeline``: :class:`attnrank.pipeline.Pipeline` end to end — BM25 → attention rerank
  (:class:`AttentionReranker`, ICR defaults) keeping the top ``--rerank-k`` → prune to
  ``--pipeline-budget`` tokens (the pipeline's default 300; the pipeline does not pass the
  dataset's sentences, so the pruner segments automatically) → generate; its stage timings give
  the end-to-end latency and stage shares;
- ``topk-first-stage``: the pipeline's reranked top-k passages (unpruned) in first-stage order;
- ``topk-reordered``: the same passages placed by :func:`reorder_for_generation` with the
  model's registered slot profile of ``--rerank-k`` slots (head registry, artifact
  ``slot-profiles``); if none is registered it is measured here with
  :func:`measure_slot_profile` on paragraphs of questions not evaluated (said so in the
  output), and ``--ship`` registers it in the package.

Metrics: HotpotQA's official answer EM/F1 (lowercase, punctuation and articles removed,
whitespace collapsed; yes/no/noanswer F1 only on exact match), max over gold answers; also
"contains" (normalised gold inside the normalised prediction: the 135M model is verbose);
context tokens = prompt tokens − the no-context prompt's tokens; supporting paragraphs present in
the context; per-stage wall time.

    python scripts/bench_ask.py [--data DIR] [--questions N] [--rerank-k 5] [--max-new-tokens 32]

Writes docs/results/ask.{json,md} (``--out-dir`` to put them elsewhere). Per-question results
are cached under ``indexes/bench-cache/ask_*`` keyed by everything that changes them, so a
larger ``--questions`` only runs the new questions (``--cache-dir ''`` disables).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
from _common import measured_on, non_negative_int, positive_int, timing_sources

from attnrank.config import set_torch_threads
from attnrank.eval.datasets import data_root, hotpotqa_rows
from attnrank.eval.qa import answer_metrics
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.eval.rows import file_stem
from attnrank.registry import registry_digest
from attnrank.types import Document, RankedResults, ScoredDocument

log = logging.getLogger("bench_ask")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"

ARMS = ("none", "full", "pruned", "pipeline", "topk-first-stage", "topk-reordered")
STAGES = ("retrieve", "rerank", "prune", "generate")


# -- data and first stage ---------------------------------------------------------------------------
def load_questions(
    root: Path, n: int | None, include_unlabelled: bool, skip: int = 0
) -> tuple[list[dict], list[Document]]:
    """Evaluated questions (sentence-labelled first, the first ``skip`` left out) and a pool of
    paragraphs from the others."""
    rows = hotpotqa_rows(root)
    lab = [r for r in rows if r.get("has_sentence_level_sf")]
    rest = [r for r in rows if not r.get("has_sentence_level_sf")]
    chosen = (lab + rest if include_unlabelled else lab)[skip:]
    chosen = chosen[:n] if n else chosen
    ids = {r["id"] for r in chosen}
    out = []
    for r in chosen:
        docs, sents, support = [], {}, set()
        for p in r["paragraphs"]:
            s = [x.strip() for x in p["sentences"] if x.strip()]
            d = Document(f"{r['id']}_{p['pid']}", " ".join(s) or p["text"], p["title"])
            docs.append(d)
            sents[d.id] = s
            if p["is_supporting"]:
                support.add(d.id)
        out.append(
            {
                "id": r["id"],
                "question": r["question"],
                "answers": r["answers"],
                "docs": docs,
                "sentences": sents,
                "support": support,
            }
        )
    pool = [
        Document(f"{r['id']}_{p['pid']}", p["text"], p["title"])
        for r in rows
        if r["id"] not in ids
        for p in r["paragraphs"]
    ]
    return out, pool


def probe_overlap(trained_on: str, skip: int) -> str | None:
    """Why the sentence probe (its registry record's ``trained_on``) may not be evaluated after the
    first ``skip`` questions, or None. bench_prune trains it on the first sentence-labelled
    questions in file order ("83 HotpotQA distractor dev questions ..."), the order evaluated here:
    a smaller ``skip`` scores it on questions it was trained on."""
    if "hotpotqa" not in trained_on.lower():
        return None  # trained on other data: every question here is held out
    m = re.match(r"\s*(\d+) HotpotQA", trained_on, re.IGNORECASE)
    if m is None:
        return (
            f"--prune-method probe: the registered probe was trained on HotpotQA ({trained_on!r}) but its record "
            "does not say how many questions; retrain it with scripts/bench_prune.py --ship or use --prune-method query"
        )
    n = int(m[1])
    if skip < n:
        return (
            f"--prune-method probe with --skip {skip}: the registered probe was trained on the first {n} labelled "
            f"HotpotQA questions, which would be evaluated; give --skip {n} or more (with --include-unlabelled)"
        )
    return None


class QuestionBM25:
    """First stage for one question: BM25 over its own paragraphs (title + text)."""

    def __init__(self, docs: list[Document]):
        self.docs = docs

    def search(self, query: str, k: int = 10, query_id: str | None = None) -> RankedResults:
        from attnrank.index.bm25 import BM25Index, top_k

        scores = BM25Index().index([d.full_text for d in self.docs]).get_scores(query)
        idx, vals = top_k(scores, k)
        return RankedResults(
            query,
            [
                ScoredDocument(self.docs[i].id, float(s), r, self.docs[i].text, self.docs[i].title, {"bm25": float(s)})
                for r, (i, s) in enumerate(zip(idx, vals), 1)
            ],
            query_id,
            stage="bm25",
        )


# -- slot profile ---------------------------------------------------------------------------------
def slot_profile(llm, pool: list[Document], k: int, trials: int, ship: bool) -> tuple[object, str]:
    """The model's raw-attention profile at ``k`` slots (the basin reorder_for_generation reads):
    registered, else measured here (every head, uncalibrated, unfiltered, as bench_slot_profiles.py)."""
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.position import load_stored_profile, store_profile
    from attnrank.rerank.profile import measure_slot_profile

    try:
        p = load_stored_profile(llm.model_id, llm.fingerprint, n_slots=k, calibrated=False)
        if p.n_slots == k:
            return p, f"registered raw-attention profile (n_slots={p.n_slots}, {p.n_trials} trials, measured {p.date})"
    except Exception as e:
        log.info("no registered slot profile: %s", e)
    t = time.perf_counter()
    raw = AttentionReranker(llm, config="icr", calibrate=False, token_filter=False)
    p = measure_slot_profile(raw, pool, n_slots=k, n_trials=trials, seed=0)
    note = (
        f"no registered {k}-slot raw-attention profile for this model: measured here with measure_slot_profile "
        f"(n_slots={k}, {trials} trials, paragraphs of non-evaluated questions, {time.perf_counter() - t:.0f} s)"
    )
    if ship:
        store_profile(p, root=REPO / "attnrank" / "heads" / "data")
        note += "; registered in attnrank/heads/data"
    return p, note


def cache_file(args, llm, profile, qid: str) -> Path | None:
    """Per-question result file, keyed by the model, every argument that changes answers and what
    the registry holds for the model (the probe and head sets the pruner and reranker read: a
    retrained probe was served the answers of the old one)."""
    if not args.cache_dir:
        return None
    key = json.dumps(
        [
            llm.fingerprint,
            registry_digest(llm.model_id, llm.fingerprint),
            args.heads,
            args.rerank_k,
            args.prune_ratio,
            args.pipeline_budget,
            args.max_new_tokens,
            args.prune_method,
            profile.mean_score,
        ],
        sort_keys=True,
    )
    tag = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(args.cache_dir) / f"ask_{llm.short_key}_{tag}" / f"{file_stem(qid)}.json"


# -- one question ---------------------------------------------------------------------------------
def run_question(q: dict, pipe, gen, pruner, profile, args) -> dict:
    from attnrank.rerank.position import reorder_for_generation

    question, golds = q["question"], q["answers"]
    retriever = QuestionBM25(q["docs"])
    arms: dict[str, dict] = {}

    def record(arm: str, answer, context: list, timings: dict) -> None:
        ids = [d.id for d in context]
        arms[arm] = {
            "answer": answer.text,
            **answer_metrics(answer.text, golds),
            "prompt_tokens": answer.prompt_tokens,
            "generated_tokens": answer.tokens,
            "support_in_context": len(q["support"] & set(ids)) / max(len(q["support"]), 1),
            "context_ids": ids,
            "timings": timings,
        }

    t = time.perf_counter()
    first = retriever.search(question, len(q["docs"]))
    t_retrieve = time.perf_counter() - t
    full = first.documents()

    t = time.perf_counter()
    a = gen.answer(question, [])
    record("none", a, [], {"generate": time.perf_counter() - t})

    t = time.perf_counter()
    a = gen.answer(question, full)
    record("full", a, full, {"retrieve": t_retrieve, "generate": time.perf_counter() - t})

    t = time.perf_counter()
    pruned = pruner.prune(question, full, keep_ratio=args.prune_ratio, sentences=[q["sentences"][d.id] for d in full])
    t_prune = time.perf_counter() - t
    ctx = pruned.documents()
    t = time.perf_counter()
    a = gen.answer(question, ctx)
    record("pruned", a, ctx, {"retrieve": t_retrieve, "prune": t_prune, "generate": time.perf_counter() - t})
    arms["pruned"].update(
        sentence_tokens=pruned.original_tokens, kept_tokens=pruned.kept_tokens, compression=pruned.compression
    )

    t = time.perf_counter()
    searched = retriever.search(question, pipe.depth)  # (timed here: the pipeline is handed its result)
    t_search = time.perf_counter() - t
    res = pipe.run(question, searched)
    stages = {"retrieve": t_search, **{k: v for k, v in res.timings.items() if k != "total"}}
    record("pipeline", res.answer, res.context, stages)
    arms["pipeline"].update(
        sentence_tokens=res.pruned.original_tokens,
        kept_tokens=res.pruned.kept_tokens,
        compression=res.pruned.compression,
    )

    rank = {d.id: i for i, d in enumerate(first.results)}
    best_first = res.reranked.documents()  # the pipeline's reranked top-k, best first
    in_first = sorted(best_first, key=lambda d: rank[d.id])
    t = time.perf_counter()
    a = gen.answer(question, in_first)
    record(
        "topk-first-stage",
        a,
        in_first,
        {"retrieve": t_search, "rerank": res.timings["rerank"], "generate": time.perf_counter() - t},
    )
    t = time.perf_counter()
    reordered = reorder_for_generation(best_first, profile)
    t_reorder = time.perf_counter() - t
    t = time.perf_counter()
    a = gen.answer(question, reordered)
    record(
        "topk-reordered",
        a,
        reordered,
        {
            "retrieve": t_search,
            "rerank": res.timings["rerank"] + t_reorder,
            "generate": time.perf_counter() - t,
        },
    )
    base = arms["none"]["prompt_tokens"]
    for arm in arms.values():
        arm["context_tokens"] = arm["prompt_tokens"] - base
        arm["timings"]["total"] = sum(arm["timings"].values())
    return {
        "id": q["id"],
        "question": question,
        "answers": golds,
        "first_stage": [d.id for d in full],
        "support": sorted(q["support"]),
        "reranked": [d.id for d in best_first],
        "arms": arms,
    }


# -- report -------------------------------------------------------------------------------------
def summarise(results: list[dict]) -> tuple[list[dict], list[dict]]:
    quality, latency = [], []
    for arm in ARMS:
        xs = [r["arms"][arm] for r in results]
        row = {
            "context": arm,
            "EM": float(np.mean([x["em"] for x in xs])),
            "F1": float(np.mean([x["f1"] for x in xs])),
            "contains gold": float(np.mean([x["contains"] for x in xs])),
            "context tokens": float(np.mean([x["context_tokens"] for x in xs])),
            "support in context": float(np.mean([x["support_in_context"] for x in xs])),
            "answer tokens": float(np.mean([x["generated_tokens"] for x in xs])),
        }
        full = [r["arms"]["full"]["context_tokens"] for r in results]
        row["tokens saved vs full"] = float(1 - np.sum([x["context_tokens"] for x in xs]) / max(np.sum(full), 1))
        quality.append(row)
        total = float(np.mean([x["timings"]["total"] for x in xs]))
        lat = {"context": arm, "total s": total}
        for s in STAGES:
            v = float(np.mean([x["timings"].get(s, 0.0) for x in xs]))
            lat[f"{s} s"] = v
            lat[f"{s} %"] = 100 * v / total if total else float("nan")
        latency.append(lat)
    return quality, latency


def markdown(quality, latency, results, args, env, profile_note, model) -> str:
    qfmt = {
        "EM": ".3f",
        "F1": ".3f",
        "contains gold": ".3f",
        "context tokens": ".0f",
        "support in context": ".3f",
        "answer tokens": ".1f",
        "tokens saved vs full": ".1%",
    }
    lcols = ["context", "total s"] + [f"{s} s" for s in STAGES] + [f"{s} %" for s in STAGES]
    lfmt = {c: ".2f" for c in lcols if c.endswith(" s")} | {c: ".0f" for c in lcols if c.endswith(" %")}
    f1 = {r["context"]: r["F1"] for r in quality}
    paired = [r["arms"]["topk-reordered"]["f1"] - r["arms"]["topk-first-stage"]["f1"] for r in results]
    same = sum(r["arms"]["topk-reordered"]["context_ids"] == r["reranked"] for r in results)
    same_first = sum(
        r["arms"]["topk-reordered"]["context_ids"] == r["arms"]["topk-first-stage"]["context_ids"] for r in results
    )
    out = [
        "# Answering: no / full / pruned / reranked / reordered context (HotpotQA distractor dev)",
        "",
        f"{len(results)} questions (dev file order, sentence-labelled first, first {args.skip} skipped); model {model}, greedy, max_new_tokens={args.max_new_tokens}; first stage BM25 "
        f"over each question's paragraphs; pruned = ContextPruner method '{args.prune_method}' at keep_ratio={args.prune_ratio} of the "
        f"full context (dataset sentences); pipeline = BM25 → attention rerank top-{args.rerank_k} → prune to "
        f"{args.pipeline_budget} tokens (automatic sentence split) → generate; top-k arms = the pipeline's "
        f"reranked top-{args.rerank_k}, unpruned. EM/F1: HotpotQA official normalisation. Context tokens = "
        "prompt tokens − the no-context prompt's. A 135M model answers poorly: read the relative changes.",
        "",
        md_table(
            quality,
            [
                "context",
                "EM",
                "F1",
                "contains gold",
                "context tokens",
                "tokens saved vs full",
                "support in context",
                "answer tokens",
            ],
            qfmt,
        ),
        "",
        f"Pruned vs full F1: {f1['pruned'] - f1['full']:+.3f}; reordered vs first-stage order F1 (same passages): "
        f"{np.mean(paired):+.3f} (F1 changed on {sum(1 for p in paired if p)} of {len(paired)} questions).",
        "",
        f"Slot profile: {profile_note}; curve at k={args.rerank_k} (slot 0 = first in the prompt): "
        f"{[round(float(x), 4) for x in args.profile_curve]}. The reordered list equals the reranked best-first "
        f"order on {same} of {len(results)} questions and the first-stage order of the same passages on "
        f"{same_first} (they can coincide).",
        "",
        "## Latency per question (s, mean) and stage shares",
        "",
        "Each arm's end-to-end time is the sum of the stages it uses (retrieve = BM25 over the question's "
        "paragraphs; the top-k arms reuse the pipeline's rerank); `pipeline` is attnrank.Pipeline's own timing. "
        f"Threads: {env['threads']} of {env['cpus']} CPUs. {args.timing_sources}",
        "",
        md_table(latency, lcols, lfmt),
        "",
        f"Environment: {json.dumps(env)}; wall time {args.wall:.0f} s "
        f"({args.wall / max(len(results), 1):.1f} s/question "
        "including model loads).",
        "",
    ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument(
        "--questions", type=non_negative_int, default=0, help="first N sentence-labelled questions (0 = all 83)"
    )
    ap.add_argument("--include-unlabelled", action="store_true", help="continue with the 317 paragraph-level questions")
    ap.add_argument(
        "--skip",
        type=non_negative_int,
        default=0,
        help="leave out the first N questions (e.g. 83: the probe's training questions, with --include-unlabelled)",
    )
    ap.add_argument("--heads", default=None, help="reranker/pruner heads: 'all' (default), 'l-h,...' or a JSON file")
    ap.add_argument("--rerank-k", type=positive_int, default=5)
    ap.add_argument("--prune-ratio", type=float, default=0.25)
    ap.add_argument(
        "--pipeline-budget", type=positive_int, default=None, help="pipeline prune budget (default: Pipeline's 300)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--profile-trials", type=int, default=24, help="trials if the slot profile has to be measured")
    ap.add_argument("--prune-method", default="query", help="pruner of the pruned/pipeline arms: query | focus | probe")
    ap.add_argument("--ship", action="store_true", help="register a slot profile measured here in the package")
    ap.add_argument("--cache-dir", default=str(REPO / "indexes" / "bench-cache"), help="'' = no per-question cache")
    ap.add_argument("--out-dir", default=str(OUT))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("attnrank").setLevel(logging.WARNING)
    set_torch_threads()
    start = time.perf_counter()

    from attnrank.generate import Generator
    from attnrank.llm.models import load_llm
    from attnrank.pipeline import DEFAULT_BUDGET_TOKENS, Pipeline
    from attnrank.prune.pruner import ContextPruner
    from attnrank.rerank.attention import AttentionReranker

    args.pipeline_budget = args.pipeline_budget or DEFAULT_BUDGET_TOKENS
    questions, pool = load_questions(
        data_root(args.data, default=REPO.parent / "shared" / "data"),
        args.questions or None,
        args.include_unlabelled,
        args.skip,
    )
    if not questions:
        raise SystemExit(
            f"--skip {args.skip} leaves no question to evaluate; give a smaller --skip or add --include-unlabelled"
        )
    llm = load_llm(None)
    reranker = AttentionReranker(llm, args.heads, signals=None)
    # a probe scores with its own heads (given heads would be refused)
    pruner = ContextPruner(llm, None if args.prune_method == "probe" else args.heads, method=args.prune_method)
    if pruner.probe is not None:
        refusal = probe_overlap(pruner.probe.trained_on, args.skip)
        if refusal:
            raise SystemExit(refusal)
    gen = Generator(llm, args.max_new_tokens)
    pipe = Pipeline(None, reranker, pruner, gen, depth=10, top_k=args.rerank_k, budget_tokens=args.pipeline_budget)
    profile, profile_note = slot_profile(llm, pool, args.rerank_k, args.profile_trials, args.ship)
    args.profile_curve = profile.curve(args.rerank_k).tolist()
    log.info("slot profile: %s; curve %s", profile_note, np.round(args.profile_curve, 5).tolist())
    results = []
    now, timed = measured_on(environment()), Counter()  # (the run that timed each question's seconds)
    for i, q in enumerate(questions, 1):
        path = cache_file(args, llm, profile, q["id"])
        if path is not None and path.exists():
            results.append(json.loads(path.read_text()))
        else:
            results.append({**run_question(q, pipe, gen, pruner, profile, args), "measured": now})
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.with_suffix(".tmp").write_text(json.dumps(results[-1]))
                path.with_suffix(".tmp").replace(path)
        timed[results[-1].get("measured", "")] += 1
        if i % 5 == 0 or i == len(questions):
            log.info("%d/%d questions (%.0f s)", i, len(questions), time.perf_counter() - start)
    args.timing_sources = timing_sources(timed, now, "questions")
    quality, latency = summarise(results)
    args.wall = time.perf_counter() - start
    env = environment()
    model = f"{llm.model_id} ({llm.fingerprint[:12]})"
    payload = {
        "environment": env,
        "model": model,
        "heads": args.heads or "all",
        "args": dict(vars(args)),
        "slot_profile": {
            "note": profile_note,
            "n_slots": profile.n_slots,
            "mean_score": profile.mean_score,
            "std": profile.std,
            "n_trials": profile.n_trials,
        },
        "quality": quality,
        "latency": latency,
        "per_question": results,
    }
    md = markdown(quality, latency, results, args, env, profile_note, model)
    write_outputs("ask", payload, md, Path(args.out_dir))
    print(md)


if __name__ == "__main__":
    main()
