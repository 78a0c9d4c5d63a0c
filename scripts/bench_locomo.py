"""LoCoMo end to end (issue #14): evidence-turn retrieval of the first stage vs attention
reranking, and the default LLM's answers from the retrieved, reranked and pruned turns.

Questions: a seeded sample of LoCoMo's categories 1–4 (the ids shuffled with
:func:`attnrank.eval.datasets.sample_order`, seed 0, category 5 filtered out: its adversarial
questions mostly have no gold answer, so they take no part in answer F1), taken after the first
``--skip`` (400) ids of that order: ``locomo_set(root, 400)`` — those 400 — is LoCoMo's share of
the fused scorer's training data (``scripts/bench_fusion.py --locomo-questions 400``), so the
evaluated questions are none of them. Candidates:
:func:`attnrank.benchmarks.locomo_set` — per question the BM25 top-``--k`` (20) turns of its
own conversation (BM25 statistics of that conversation's turns); relevant = the question's
evidence turns. One model (the default LLM) reranks, prunes and answers (greedy,
``--max-new-tokens``). Arms:

- ``none``: the question alone;
- ``first-stage``: the BM25 top ``--top`` (5) turns;
- ``all-<k>`` (with ``--all``): every candidate;
- ``rerank-<preset>``: :class:`AttentionReranker` with ``RerankConfig.preset(preset)`` over the
  ``k`` candidates (given in first-stage order, as the candidate set holds them: ``"speaker:
  text"``, no date), its top ``--top``;
- ``rerank-<preset>+pruned``: those turns pruned by :class:`ContextPruner` (the package's default
  :class:`PruneConfig`: method "query", all heads) to ``--keep-ratio`` (0.5) of their sentence
  tokens, given in conversation order (the prompt the generator then reads, not the rank order).

The generator reads every arm's turns alike: in conversation order (arms holding the same turns
get the same prompt), each turn one passage titled ``(<session date_time>) <speaker>`` with the
utterance as its text (LoCoMo questions are often temporal; the pruner keeps titles, so a
pruned turn keeps its date and speaker).

Metrics: evidence R@5 and nDCG@10 of the rankings (ir-measures, the full evidence qrels, so
evidence outside the ``k`` candidates counts as missed); evidence turns in the context; answer
EM / F1 / contains (SQuAD normalisation, :func:`attnrank.eval.qa.answer_metrics`); context
tokens = prompt tokens − the no-context prompt's; per-stage seconds; wins/losses and a sign test
against ``first-stage``.

    python scripts/bench_locomo.py [--data DIR] [--questions 100] [--presets qrhead,fused]

Writes docs/results/locomo.{json,md} (``--out-dir``). Every model result (a ranking, a pruned
context, an answer to one exact prompt) is cached per question under
``indexes/bench-cache/locomo_<model>/`` keyed by what determines it, so a rerun, a larger
``--questions`` or an added preset computes only what is missing (``--cache-dir ''`` disables).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import time
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
from _common import measured_on, non_negative_int, positive_int, timing_sources

from attnrank.config import set_torch_threads
from attnrank.errors import AttnrankError
from attnrank.eval.datasets import data_root, locomo
from attnrank.eval.metrics import evaluate_per_query, sign_test, wins_losses
from attnrank.eval.qa import answer_metrics
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.llm.headspec import format_heads
from attnrank.types import Document

log = logging.getLogger("bench_locomo")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
STAGES = ("retrieve", "rerank", "prune", "generate")
RETRIEVAL = ("R@5", "nDCG@10")


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _settings(config: Any) -> dict[str, Any]:
    """A configuration's fields that differ from their defaults (a cache key that survives new
    fields added with defaults)."""
    return {f.name: getattr(config, f.name) for f in fields(config) if getattr(config, f.name) != f.default}


def dated(doc: Document) -> Document:
    """A turn as the generator reads it: title ``(<session date_time>) <speaker>``, the utterance as text."""
    meta = doc.metadata
    speaker = meta.get("speaker", "")
    text = doc.text[len(speaker) + 2 :] if speaker and doc.text.startswith(f"{speaker}: ") else doc.text
    return Document(doc.id, text, f"({meta.get('date_time', '')}) {speaker}".strip(), dict(meta))


# -- data -----------------------------------------------------------------------------------------
def load(root: Path, n: int, k: int, skip: int) -> tuple[list[dict], float]:
    """The sampled questions of categories 1–4 (after the first ``skip`` of the seeded order) with
    their candidates, and the first stage's seconds per question (the candidate sets of all the
    questions the loader reads built, divided by their count)."""
    from attnrank.benchmarks import locomo_set

    category = {q: c for c in (1, 2, 3, 4) for q in locomo(root, categories=[c]).queries}
    t = time.perf_counter()
    _, ds, cands = locomo_set(root, None, k=k)
    per_question = (time.perf_counter() - t) / len(ds.queries)
    qids = [q for q in list(ds.queries)[skip:] if q in category and ds.answers.get(q)][:n]
    out = []
    for q in qids:
        order = {d: i for i, d in enumerate(ds.candidates[q])}  # conversation order
        out.append(
            {
                "id": q,
                "question": ds.queries[q],
                "category": category[q],
                "answers": ds.answers[q],
                "evidence": sorted(ds.qrels[q]),
                "candidates": cands[q],
                "order": order,
            }
        )
    return out, per_question


# -- one question ---------------------------------------------------------------------------------
class Runner:
    """Runs (or reads from the cache) every model result of one question."""

    def __init__(self, llm, rerankers: dict, pruner, gen, args, retrieve_s: float):
        self.llm, self.rerankers, self.pruner, self.gen, self.args = llm, rerankers, pruner, gen, args
        self.retrieve_s = retrieve_s
        self.now = measured_on(environment())  # (stored in each result timed here)
        self.timed: Counter[str] = Counter()  # model results used, by the run that timed them
        self.rerank_id = {
            p: _key(_settings(r.config), format_heads(r.heads) if r.heads else "all", repr(getattr(r, "fused", None)))
            for p, r in rerankers.items()
        }
        self.prune_id = _key(_settings(pruner.config), format_heads(pruner.heads) if pruner.heads else "all")

    def cache_path(self, qid: str) -> Path | None:
        if not self.args.cache_dir:
            return None
        return Path(self.args.cache_dir) / f"locomo_{self.llm.short_key}" / f"{re.sub(r'[^A-Za-z0-9]+', '_', qid)}.json"

    def run(self, q: dict) -> dict:
        path = self.cache_path(q["id"])
        cache: dict[str, Any] = json.loads(path.read_text()) if path is not None and path.exists() else {}
        before = len(cache)
        result = self._question(q, cache)
        if path is not None and len(cache) > before:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".tmp").write_text(json.dumps(cache))
            path.with_suffix(".tmp").replace(path)
        return result

    def _answer(self, question: str, docs: list[Document], cache: dict) -> dict:
        prompt = self.gen.prompt(question, docs)
        key = "gen:" + _key(prompt, self.gen.max_new_tokens)
        if key not in cache:
            t = time.perf_counter()
            a = self.gen.answer(question, docs)
            cache[key] = {
                "answer": a.text,
                "prompt_tokens": a.prompt_tokens,
                "generated_tokens": a.tokens,
                "seconds": time.perf_counter() - t,
                "measured": self.now,
            }
        return self._used(cache[key])

    def _used(self, entry: dict) -> dict:
        """``entry`` (a cached model result), counted by the run that timed it."""
        self.timed[entry.get("measured", "")] += 1
        return entry

    def _rerank(self, preset: str, q: dict, cache: dict) -> dict:
        key = f"rerank:{preset}:" + _key(self.rerank_id[preset], [d.id for d in q["candidates"]])
        if key not in cache:
            t = time.perf_counter()
            res = self.rerankers[preset].rank(q["question"], q["candidates"], query_id=q["id"])
            cache[key] = {
                "ids": res.ids,
                "scores": res.scores,
                "seconds": time.perf_counter() - t,
                "measured": self.now,
            }
        return self._used(cache[key])

    def _prune(self, q: dict, docs: list[Document], cache: dict) -> dict:
        # (the ratio too: a run with another --keep-ratio read the pruned contexts of the first)
        key = "prune:" + _key(self.prune_id, self.args.keep_ratio, [(d.id, d.title, d.text) for d in docs])
        if key not in cache:
            t = time.perf_counter()
            p = self.pruner.prune(q["question"], docs, keep_ratio=self.args.keep_ratio)
            cache[key] = {
                "docs": [[d.id, d.title, d.text] for d in p.documents()],
                "sentence_tokens": p.original_tokens,
                "kept_tokens": p.kept_tokens,
                "budget_tokens": p.budget_tokens,
                "seconds": time.perf_counter() - t,
                "measured": self.now,
            }
        return self._used(cache[key])

    def _question(self, q: dict, cache: dict) -> dict:
        args, question = self.args, q["question"]
        by_id = {d.id: d for d in q["candidates"]}
        evidence = set(q["evidence"])
        arms: dict[str, dict] = {}
        rankings: dict[str, list[str]] = {"first-stage": [d.id for d in q["candidates"]]}

        def record(arm: str, docs: list[Document], timings: dict[str, float]) -> None:
            docs = sorted(docs, key=lambda d: q["order"][d.id])
            g = self._answer(question, docs, cache)
            ids = [d.id for d in docs]
            arms[arm] = {
                "answer": g["answer"],
                **answer_metrics(g["answer"], q["answers"], yes_no=False),  # (LoCoMo: plain SQuAD F1)
                "prompt_tokens": g["prompt_tokens"],
                "generated_tokens": g["generated_tokens"],
                "evidence_in_context": len(evidence & set(ids)) / len(evidence),
                "context_ids": ids,
                "timings": {**timings, "generate": g["seconds"]},
            }

        record("none", [], {})
        first = [dated(d) for d in q["candidates"]]
        record("first-stage", first[: args.top], {"retrieve": self.retrieve_s})
        if args.all:
            record(f"all-{args.k}", first, {"retrieve": self.retrieve_s})
        pruned_info = {}
        for preset in self.rerankers:
            r = self._rerank(preset, q, cache)
            rankings[f"rerank-{preset}"] = r["ids"]
            top = [dated(by_id[i]) for i in r["ids"][: args.top]]
            record(f"rerank-{preset}", top, {"retrieve": self.retrieve_s, "rerank": r["seconds"]})
            top = sorted(top, key=lambda d: q["order"][d.id])
            p = self._prune(q, top, cache)
            kept = [Document(i, text, title) for i, title, text in p["docs"]]
            arm = f"rerank-{preset}+pruned"
            record(arm, kept, {"retrieve": self.retrieve_s, "rerank": r["seconds"], "prune": p["seconds"]})
            pruned_info[arm] = {x: p[x] for x in ("sentence_tokens", "kept_tokens", "budget_tokens")}
            arms[arm].update(pruned_info[arm])
        base = arms["none"]["prompt_tokens"]
        for a in arms.values():
            a["context_tokens"] = a["prompt_tokens"] - base
            a["timings"]["total"] = sum(a["timings"].values())
        return {
            "id": q["id"],
            "question": question,
            "category": q["category"],
            "answers": q["answers"],
            "evidence": q["evidence"],
            "rankings": rankings,
            "arms": arms,
        }


# -- report -------------------------------------------------------------------------------------
def retrieval(results: list[dict], k: int) -> dict[str, dict[str, dict[str, float]]]:
    """``{ranking: {qid: {metric: value}}}`` against the full evidence qrels (``R@k``: recall of
    the ``k`` candidates, the ceiling of every ranking)."""
    qrels = {r["id"]: {d: 1 for d in r["evidence"]} for r in results}
    out = {}
    for name in results[0]["rankings"]:
        run = {
            r["id"]: {d: float(len(r["rankings"][name]) - i) for i, d in enumerate(r["rankings"][name])}
            for r in results
        }
        out[name] = evaluate_per_query(run, qrels, list(dict.fromkeys([*RETRIEVAL, f"R@{k}"])))
    return out


def summarise(results: list[dict], args) -> dict[str, Any]:
    per = retrieval(results, args.k)
    arms = list(results[0]["arms"])
    fs_f1 = np.array([r["arms"]["first-stage"]["f1"] for r in results])
    quality, latency, tests = [], [], []
    for arm in arms:
        xs = [r["arms"][arm] for r in results]
        row: dict[str, Any] = {"arm": arm}
        ranking = arm if arm in per else None
        for m in RETRIEVAL:
            row[m] = float(np.mean([per[ranking][r["id"]][m] for r in results])) if ranking else float("nan")
        row["evidence in context"] = float(np.mean([x["evidence_in_context"] for x in xs]))
        for m, name in (("em", "EM"), ("f1", "F1"), ("contains", "contains")):
            row[name] = float(np.mean([x[m] for x in xs]))
        row["F1 vs first-stage"] = (row["F1"] - fs_f1.mean()) / fs_f1.mean() if fs_f1.mean() else float("nan")
        row["context tokens"] = float(np.mean([x["context_tokens"] for x in xs]))
        if arm.endswith("+pruned"):
            unpruned = [r["arms"][arm.removesuffix("+pruned")]["context_tokens"] for r in results]
            row["tokens saved vs unpruned"] = 1 - sum(x["context_tokens"] for x in xs) / max(sum(unpruned), 1)
            row["sentence tokens kept"] = sum(x["kept_tokens"] for x in xs) / max(
                sum(x["sentence_tokens"] for x in xs), 1
            )
        else:
            row["tokens saved vs unpruned"] = float("nan")
            row["sentence tokens kept"] = float("nan")
        quality.append(row)
        lat: dict[str, Any] = {"arm": arm}
        for s in (*STAGES, "total"):
            lat[f"{s} s"] = float(np.mean([x["timings"].get(s, 0.0) for x in xs]))
        latency.append(lat)
        if arm.startswith("rerank-"):
            t: dict[str, Any] = {"arm vs first-stage": arm}
            d_f1 = np.array([x["f1"] for x in xs]) - fs_f1
            if ranking:
                d_r = [per[ranking][r["id"]]["R@5"] - per["first-stage"][r["id"]]["R@5"] for r in results]
                w, lo = wins_losses(d_r)
                t.update({"R@5 W/L": f"{w}/{lo}", "R@5 p": sign_test(w, lo)})
            else:
                t.update({"R@5 W/L": "", "R@5 p": float("nan")})
            w, lo = wins_losses(d_f1)
            t.update({"F1 Δ": float(d_f1.mean()), "F1 W/L": f"{w}/{lo}", "F1 p": sign_test(w, lo)})
            tests.append(t)
    by_cat = []
    for arm in arms:
        row = {"arm": arm}
        for c in (1, 2, 3, 4):
            f = [r["arms"][arm]["f1"] for r in results if r["category"] == c]
            row[f"cat {c} (n={len(f)})"] = float(np.mean(f)) if f else float("nan")
        by_cat.append(row)
    ceiling = float(np.mean([per["first-stage"][r["id"]][f"R@{args.k}"] for r in results]))
    return {
        "quality": quality,
        "latency": latency,
        "tests": tests,
        "by_category": by_cat,
        f"R@{args.k} of candidates": ceiling,
    }


def markdown(s: dict, results: list[dict], args, env, model: str, notes: list[str]) -> str:
    qcols = [
        "arm",
        *RETRIEVAL,
        "evidence in context",
        "EM",
        "F1",
        "contains",
        "F1 vs first-stage",
        "context tokens",
        "tokens saved vs unpruned",
    ]
    qfmt = {"EM": ".3f", "F1": ".3f", "contains": ".3f", "evidence in context": ".3f", "context tokens": ".0f"}
    qfmt |= {"F1 vs first-stage": "+.1%", "tokens saved vs unpruned": ".1%"}
    lcols = ["arm", *(f"{x} s" for x in (*STAGES, "total"))]
    cat_cols = list(s["by_category"][0])
    out = [
        "# LoCoMo end to end: evidence-turn retrieval and answers (issue #14)",
        "",
        f"{len(results)} questions: a seeded sample (seed 0) of LoCoMo categories 1–4 (category 5, adversarial, "
        f"left out: its gold answer is usually absent), after the first {args.skip} ids of the seeded order "
        "(LoCoMo's training share of the fused scorer). Candidates: each question's BM25 top-"
        f"{args.k} turns of its own conversation (`attnrank.benchmarks.locomo_set`); evidence R@{args.k} of "
        f"the candidates = {s[f'R@{args.k} of candidates']:.3f} (the ceiling of every ranking). Model {model} reranks, "
        f"prunes and answers (greedy, max_new_tokens={args.max_new_tokens}). `first-stage` = BM25 top-{args.top}; "
        f"`rerank-P` = `AttentionReranker(config=RerankConfig.preset(P))` over the {args.k} candidates, top-{args.top}; "
        f"`+pruned` = those turns pruned by `ContextPruner` (default PruneConfig: method 'query', all heads) to "
        f"keep_ratio={args.keep_ratio} of their sentence tokens. The generator sees every arm's turns in "
        "conversation order as `[i] (<session date>) <speaker>` + utterance. R@5 / nDCG@10: ir-measures "
        "against all evidence turns (rankings of the candidates; — = not a ranking). EM/F1/contains: SQuAD "
        "normalisation, max over gold answers (LoCoMo's own scorer stems and splits multi-answer golds: "
        "figures are not comparable to published LoCoMo F1). Context tokens = prompt tokens − the "
        "no-context prompt's (the date/speaker titles included). **A 135M model answers poorly: read the "
        "relative changes, not the absolute F1.**",
        "",
        md_table(s["quality"], qcols, qfmt),
        "",
        "## Against first-stage, per question (wins/losses, two-sided sign test; ties dropped)",
        "",
        md_table(
            s["tests"],
            ["arm vs first-stage", "R@5 W/L", "R@5 p", "F1 Δ", "F1 W/L", "F1 p"],
            {"F1 Δ": "+.3f", "R@5 p": ".3g", "F1 p": ".3g"},
        ),
        "",
        "## Answer F1 by category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop)",
        "",
        md_table(s["by_category"], cat_cols, {c: ".3f" for c in cat_cols[1:]}),
        "",
        "## Seconds per question by stage (mean)",
        "",
        "retrieve = building the BM25 candidate sets of all the questions the loader reads (JSON load included) divided by "
        "their number; rerank = one `rank` call over the candidates; prune = one `prune` call; generate = one "
        "greedy generation. Arms whose prompt is identical to another's (same turns) reuse that answer and "
        f"its measured time. Threads: {env['threads']} of {env['cpus']} CPUs.",
        "",
        md_table(s["latency"], lcols, {c: ".3f" for c in lcols[1:]}),
        "",
        *(f"- {n}" for n in notes),
        "",
        f"Environment: {json.dumps(env)}; wall time of this run {args.wall:.0f} s (model loads and cached "
        "results included).",
        "",
    ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--questions", type=positive_int, default=100, help="sampled questions of categories 1-4")
    ap.add_argument(
        "--skip",
        type=non_negative_int,
        default=400,
        help="leave out the first N ids of the seeded order (the fused scorer's training)",
    )
    ap.add_argument("--k", type=positive_int, default=20, help="first-stage candidates per question")
    ap.add_argument("--top", type=positive_int, default=5, help="turns given to the generator")
    ap.add_argument("--presets", default="qrhead,fused", help="reranker presets, comma-separated")
    ap.add_argument("--keep-ratio", type=float, default=0.5, help="pruned arms: fraction of sentence tokens kept")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--all", action="store_true", help="add the all-k arm (every candidate)")
    ap.add_argument(
        "--max-seconds", type=float, default=0, help="start no new question after this many seconds (0 = no limit)"
    )
    ap.add_argument("--cache-dir", default=str(REPO / "indexes" / "bench-cache"), help="'' = no cache")
    ap.add_argument("--out-dir", default=str(OUT))
    args = ap.parse_args()
    if args.top > args.k:
        ap.error(f"--top {args.top} is more than the --k {args.k} candidates; give --top at most {args.k}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("attnrank").setLevel(logging.WARNING)
    set_torch_threads()
    start = time.perf_counter()

    from attnrank.errors import InputError
    from attnrank.generate import Generator
    from attnrank.llm.models import load_llm
    from attnrank.prune.config import PruneConfig
    from attnrank.prune.pruner import ContextPruner
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.config import RerankConfig, preset_for

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    for name in presets:  # (refused by the reranker, it was a note: the record was written without that arm)
        try:
            preset_for(name, {})
        except InputError as e:
            ap.error(f"--presets: {e}")
    root = data_root(args.data, default=REPO.parent / "shared" / "data")
    questions, retrieve_s = load(root, args.questions, args.k, args.skip)
    llm = load_llm(None)
    notes: list[str] = []
    rerankers = {}
    for preset in presets:
        try:
            rerankers[preset] = AttentionReranker(llm, config=RerankConfig.preset(preset))
            notes.append(f"rerank-{preset}: {rerankers[preset]!r}")
            fused = getattr(rerankers[preset], "fused", None)
            if fused is not None:
                notes.append(
                    f"rerank-{preset} fused weights: features {fused.features}, weights "
                    f"{[round(w, 3) for w in fused.weights]}, gate {fused.gate}, trained on {fused.trained_on!r} "
                    f"({fused.date})"
                )
        except AttnrankError as e:
            notes.append(f"rerank-{preset} not run: {e}")
            log.warning("preset %s not run: %s", preset, e)
    pruner = ContextPruner(llm, config=PruneConfig())
    gen = Generator(llm, args.max_new_tokens)
    notes.append(f"pruner: {pruner!r}")
    runner = Runner(llm, rerankers, pruner, gen, args, retrieve_s)
    results = []
    for i, q in enumerate(questions, 1):
        if args.max_seconds and time.perf_counter() - start > args.max_seconds:
            notes.append(f"stopped by --max-seconds {args.max_seconds:g} after {i - 1} of {len(questions)} questions")
            log.warning(notes[-1])
            break
        results.append(runner.run(q))
        if i % 5 == 0 or i == len(questions):
            log.info("%d/%d questions (%.0f s)", i, len(questions), time.perf_counter() - start)
    notes.append(timing_sources(runner.timed, runner.now))
    summary = summarise(results, args)
    args.wall = time.perf_counter() - start
    env = environment()
    model = f"{llm.model_id} ({llm.fingerprint[:12]})"
    payload = {"environment": env, "model": model, "args": dict(vars(args)), "notes": notes, **summary}
    payload["per_question"] = results
    md = markdown(summary, results, args, env, model, notes)
    write_outputs("locomo", payload, md, Path(args.out_dir))
    print(md)


if __name__ == "__main__":
    main()
