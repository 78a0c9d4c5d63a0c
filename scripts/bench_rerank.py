"""Attention reranking benchmark (issue: ICR/QRHead reranker).

Quality (nDCG@10, trec_eval linear gain via ir-measures) on DL19 (Pyserini BM25 top-20 / top-50)
and SciFact train (our hybrid RRF top-20, a seeded query sample), all with the same LLM:
first stage; ICR all heads calibrated / uncalibrated / without the μ−2σ filter; a head list
chosen on the *other* dataset (top-16 heads by their own nDCG@10, QRHead's BEIR selection);
baselines: pointwise yes/no logits, RankGPT listwise (window 20, step 10), MiniLM cosine.
Speed: our capture vs a naive implementation (eager attention, output_attentions=True, two full
forward passes) for K = 10/20/50 passages of ~100 words: latency and peak RSS, each measured in
a fresh process.

    python scripts/bench_rerank.py [--data DIR] [--scifact-queries 50] [--skip-speed]

Writes docs/results/rerank.{json,md}.

Block attention (``--blocks``; issue 15): seconds per query and peak memory of the full-prompt
capture, block mode cold and block mode warm at K = 10/20/50/100 on DL19 passages and SciFact
abstracts (300-word cap), per dtype (``--blocks-dtypes bfloat16,float32,int8``), each cell in a fresh process
and resumable (build/blocks/cells.json); the three modes timed in turn on each query in one process
for the first dtype (the targets' record: a shared machine's rate drifts between cells;
build/blocks/interleaved.json); and nDCG@10 of full vs block attention (shared and
sequential positions) on DL19, HotpotQA and SciFact with the default preset. Writes
docs/results/rerank_blocks.{json,md}.

    python scripts/bench_rerank.py --blocks [--blocks-dtypes bfloat16,float32,int8] [--blocks-skip-quality]

``--int8``: only the precision comparison (``dtype="int8"``, attnrank.llm.quantize): the default
preset on DL19 BM25 top-K, every precision of ``--int8-dtypes`` scoring each query in turn (same
process, interleaved, so load changes hit all alike): s/query, nDCG@10, and the Spearman rank
correlation of each precision's scores with the first's. Writes docs/results/rerank_int8.{json,md}.

    python scripts/bench_rerank.py --int8 [--int8-k 20] [--int8-dtypes float32,int8,bfloat16] [--dl19-queries N]

``--kernels``: the attention layers of the capture's suffix and block passes computed by CPU SDPA
(flash kernel) and by attnrank's bfloat16 few-rows kernel (attnrank.llm.kernels), each query scored
by both in turn, full prompt and block attention, on DL19 BM25 top-20 (all topics), SciFact BM25
top-20 and HotpotQA: s/query, nDCG@10 and the Spearman correlation of the two kernels' scores.
Writes docs/results/rerank_kernels.{json,md}.

    python scripts/bench_rerank.py --kernels [--blocks-scifact 20] [--blocks-hotpot 60]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import non_negative_int, positive_int, positive_ints

from attnrank.benchmarks import dl19_sets, head_quality, icr_scores, scifact_set
from attnrank.config import set_torch_threads
from attnrank.errors import InputError
from attnrank.eval import evaluate, evaluate_per_query, wins_losses
from attnrank.eval.datasets import data_root, scifact
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.eval.rows import capture_all, first_stage_run, run_of
from attnrank.eval.timing import timed_peak
from attnrank.llm.blocks import check_positions
from attnrank.llm.rows import document_scores, token_scores
from attnrank.rerank.config import RERANK_PRESETS, RerankConfig

log = logging.getLogger("bench_rerank")
REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results"
CACHE = REPO / "indexes" / "bench-cache"  # the row cache (git-ignored)
SCIFACT_INDEX = REPO / "indexes" / "bench-scifact"


def cosine_scores(queries: dict, cands: dict) -> tuple[dict, float]:
    from attnrank.index.embed import encode, load_embedder

    m = load_embedder(None)
    t = time.perf_counter()
    out = {}
    for q, text in queries.items():
        qe = encode(m, [text])
        de = encode(m, [d.full_text for d in cands[q]])
        out[q] = (de @ qe[0]).tolist()
    return out, (time.perf_counter() - t) / len(queries)


def generative_scores(reranker, queries: dict, cands: dict) -> tuple[dict, float]:
    t = time.perf_counter()
    out = {}
    for q, text in queries.items():
        res = reranker.rank(text, cands[q])
        by_id = {r.id: r.score for r in res}
        out[q] = [by_id[d.id] for d in cands[q]]
    return out, (time.perf_counter() - t) / len(queries)


def quality(setups, reranker, args) -> tuple[list[dict], dict]:
    from attnrank.rerank.generative import ListwiseReranker, PointwiseReranker

    cache = Path(args.cache_dir) if args.cache_dir else None
    captured = {name: capture_all(reranker, name, ds.queries, cands, cache) for name, ds, cands in setups}
    head_nd = {name: head_quality(captured[name], cands, ds.qrels, ds.rel, reranker) for name, ds, cands in setups}
    heads = reranker.head_list
    rows, selections = [], {}
    pointwise, listwise = PointwiseReranker(reranker.llm), ListwiseReranker(reranker.llm)
    for name, ds, cands in setups:
        cap, qs = captured[name], ds.queries
        icr_s = float(np.mean([c["seconds"] for c in cap.values()]))
        other = [n for n in head_nd if n.split()[0] != name.split()[0]]
        entries = [("first stage", first_stage_run(cands), 0.0)]
        for label, kw in [
            ("ICR all heads, calibrated", {}),
            ("ICR all heads, uncalibrated", {"calibrate": False}),
            ("ICR all heads, calibrated, no μ−2σ filter", {"use_filter": False}),
        ]:
            entries.append(
                (label, run_of(cands, {q: icr_scores(cap[q]["windows"], len(cands[q]), **kw) for q in qs}), icr_s)
            )
        if other:
            top = np.argsort(-head_nd[other[0]])[:16]
            selections[name] = {"chosen_on": other[0], "heads": [list(heads[i]) for i in top]}
            entries.append(
                (
                    f"head list (top-16 by nDCG on {other[0].split()[0]})",
                    run_of(cands, {q: icr_scores(cap[q]["windows"], len(cands[q]), head_idx=top) for q in qs}),
                    float("nan"),
                )
            )
        cos, cos_s = cosine_scores(qs, cands)
        entries.append(("MiniLM-L6 bi-encoder cosine", run_of(cands, cos), cos_s))
        if not args.skip_baselines:
            pw, pw_s = generative_scores(pointwise, qs, cands)
            entries.append(("pointwise yes/no logits (same LLM)", run_of(cands, pw), pw_s))
            # RankGPT needs the whole window in one prompt: skipped where that exceeds the model context
            if len(next(iter(cands.values()))) <= args.listwise_max_k and name.split()[0] in args.listwise_on.split(
                ","
            ):
                lw, lw_s = generative_scores(listwise, qs, cands)
                entries.append(("RankGPT listwise w=20 s=10 (same LLM)", run_of(cands, lw), lw_s))
        base_pq = evaluate_per_query(entries[0][1], ds.qrels, ["nDCG@10"], rel=ds.rel)
        for label, run, secs in entries:
            pq = evaluate_per_query(run, ds.qrels, ["nDCG@10"], rel=ds.rel)
            diff = [pq[q]["nDCG@10"] - base_pq[q]["nDCG@10"] for q in pq]
            rows.append(
                {
                    "setting": name,
                    "method": label,
                    "nDCG@10": evaluate(run, ds.qrels, ["nDCG@10"], rel=ds.rel)["nDCG@10"],
                    "wins/losses vs first stage": "{}/{}".format(*wins_losses(diff)),
                    "s/query": secs,
                }
            )
        log.info("%s done", name)
    best_heads = {n: [list(heads[i]) for i in np.argsort(-v)[:16]] for n, v in head_nd.items()}
    return rows, {
        "llm_dtype": str(reranker.llm.dtype).removeprefix("torch."),  # as loaded (dtype="auto": by CPU)
        "head_selections": selections,
        "top16_by_dataset": best_heads,
        "per_head_ndcg": {n: v.round(4).tolist() for n, v in head_nd.items()},
    }


# -- speed: ours vs naive, each in a fresh process for a clean peak-RSS reading -----------------
def speed_worker(impl: str, k: int, n_queries: int, heads: str | None) -> dict:
    import torch

    from attnrank.llm.attention import naive_attention_rows
    from attnrank.llm.prompts import build_rerank_prompts
    from attnrank.rerank.attention import AttentionReranker

    set_torch_threads()
    root = data_root(None, default=REPO.parent / "shared" / "data")
    ds = scifact(root)
    rr = AttentionReranker(None, heads, max_doc_words=100, signals=None)
    qids = sorted(ds.queries)[:n_queries]
    docs = ds.docs
    rng = random.Random(1)

    def naive(query, cand):
        real = build_rerank_prompts(rr.llm.tokenizer, query, cand, max_doc_words=100)
        rows = []
        for p in (real.real, real.calibration):
            ids = torch.tensor([p.input_ids])
            rows.append(naive_attention_rows(rr.llm.model, ids, p.query_start, rr.heads)[:, : p.query_start])
        tok = token_scores((rows[0] - rows[1]).double().numpy())
        return document_scores(tok, real.doc_spans)

    def ours(query, cand):
        return rr.score(query, cand)

    @torch.inference_mode()
    def prefill(query, cand):  # the floor: one plain SDPA forward of the real prompt, no capture
        p = build_rerank_prompts(rr.llm.tokenizer, query, cand, max_doc_words=100).real
        rr.llm.model(torch.tensor([p.input_ids]), logits_to_keep=1)

    fn = {"naive": naive, "ours": ours, "prefill": prefill}[impl]
    fn("warm up", docs[:2])
    times, peaks, tokens = [], [], []
    for q in qids:
        cand = rng.sample(docs, k)
        tokens.append(
            len(build_rerank_prompts(rr.llm.tokenizer, ds.queries[q], cand, max_doc_words=100).real.input_ids)
        )
        secs, peak = timed_peak(functools.partial(fn, ds.queries[q], cand))
        times.append(secs)
        peaks.append(peak)
    return {
        "impl": impl,
        "K": k,
        "heads": heads or "all",
        "dtype": str(rr.llm.dtype).removeprefix("torch."),
        "prompt tokens": float(np.mean(tokens)),
        "s/query": float(np.mean(times)),
        "peak extra MB": float(np.max(peaks)),
    }


def speed(args) -> list[dict]:
    rows = []
    for k in args.speed_ks:
        for impl, heads in [("prefill", None), ("ours", None), ("ours", args.speed_heads), ("naive", None)]:
            if impl == "ours" and heads is not None and not heads:
                continue
            est_gb = 30 * 9 * (k * 140 + 150) ** 2 * 4 / 2**30  # SmolLM2: 30 layers x 9 heads x T^2 fp32
            if impl == "naive" and est_gb > args.naive_max_gb:
                rows.append(
                    {
                        "impl": impl,
                        "K": k,
                        "heads": "all",
                        "error": f"not run: output_attentions would hold ~{est_gb:.0f} GB of attention maps",
                    }
                )
                continue
            cmd = [sys.executable, __file__, "--speed-worker", impl, str(k), "--speed-queries", str(args.speed_queries)]
            if heads:
                cmd += ["--speed-heads", heads]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
            if p.returncode != 0:
                tail = (p.stderr.strip().splitlines() or ["?"])[-1]
                rows.append({"impl": impl, "K": k, "heads": heads or "all", "error": tail[:120]})
            else:
                rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            log.info("speed %s", rows[-1])
    return rows


# -- precision: float32 vs dynamic int8 (and others), same queries, interleaved ----------------
def spearman(a, b) -> float:
    """Spearman's rank correlation (ties broken by position; scores are continuous)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def precision_compare(root: Path, args) -> tuple[list[dict], dict]:
    from attnrank.rerank.attention import AttentionReranker

    name, ds, cands = dl19_sets(root, [args.int8_k], args.dl19_queries)[0]
    rerankers, loads = {}, {}
    for dtype in args.int8_dtypes:
        t = time.perf_counter()
        alone = {"signals": None} if RERANK_PRESETS[args.int8_preset].uses_attention else {}  # attention alone
        rerankers[dtype] = AttentionReranker(config=args.int8_preset, dtype=dtype, **alone)
        loads[dtype] = time.perf_counter() - t
        rerankers[dtype].score("warm up", next(iter(cands.values()))[:2])
    scores: dict[str, dict[str, list[float]]] = {d: {} for d in args.int8_dtypes}
    secs: dict[str, list[float]] = {d: [] for d in args.int8_dtypes}
    for i, (q, text) in enumerate(ds.queries.items(), 1):
        turns = list(rerankers.items())  # (in turn, the order reversed each query: no arm always first)
        for dtype, rr in turns if i % 2 else turns[::-1]:
            t = time.perf_counter()
            scores[dtype][q] = rr.score(text, cands[q]).tolist()
            secs[dtype].append(time.perf_counter() - t)
        log.info("precision %d/%d %s", i, len(ds.queries), {d: round(v[-1], 2) for d, v in secs.items()})
    ref = args.int8_dtypes[0]
    rows = []
    for dtype in args.int8_dtypes:
        rho = [spearman(scores[dtype][q], scores[ref][q]) for q in ds.queries]
        rows.append(
            {
                "dtype": dtype,
                "load s": loads[dtype],
                "s/query": float(np.mean(secs[dtype])),
                f"speed-up vs {ref}": float(np.mean(secs[ref]) / np.mean(secs[dtype])),
                "nDCG@10": evaluate(run_of(cands, scores[dtype]), ds.qrels, ["nDCG@10"], rel=ds.rel)["nDCG@10"],
                f"Spearman vs {ref} (mean)": float(np.mean(rho)),
                f"Spearman vs {ref} (min)": float(np.min(rho)),
            }
        )
        log.info("precision %s", rows[-1])
    heads = rerankers[ref].head_list
    return rows, {"setting": name, "queries": len(ds.queries), "preset": args.int8_preset, "heads": len(heads)}


# -- kernels: CPU SDPA vs the bfloat16 few-rows kernel, same queries, interleaved ---------------
def kernels_compare(root: Path, args) -> list[dict]:
    from attnrank.llm.kernels import attention_kernel
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.speed.quality import quality_sets

    llm = AttentionReranker(signals=None, dtype="bfloat16").llm
    rows = []
    for mode, options in {"full prompt": {}, "block": {"attention": "block"}}.items():
        reranker = AttentionReranker(llm, signals=None, **options)
        for setting, ds, cands in quality_sets(root, args.blocks_hotpot, args.blocks_scifact):
            scores: dict[str, dict[str, list[float]]] = {"SDPA": {}, "few rows": {}}
            secs: dict[str, list[float]] = {"SDPA": [], "few rows": []}
            for i, (q, text) in enumerate(ds.queries.items()):
                # (alternating which kernel runs first: the second ran after the first's page-ins)
                for kernel in list(scores)[:: 1 if i % 2 == 0 else -1]:
                    reranker.forget_passages()  # each query cold, as a first visit (its tokenization too)
                    with attention_kernel("sdpa" if kernel == "SDPA" else "few-rows"):
                        t = time.perf_counter()
                        scores[kernel][q] = reranker.score(text, cands[q]).tolist()
                        secs[kernel].append(time.perf_counter() - t)
            rho = [spearman(scores["few rows"][q], scores["SDPA"][q]) for q in ds.queries]
            row: dict = {"mode": mode, "setting": setting}
            for kernel in scores:
                run = run_of(cands, scores[kernel])
                row[f"nDCG@10 {kernel}"] = evaluate(run, ds.qrels, ["nDCG@10"], rel=ds.rel)["nDCG@10"]
                row[f"s/query {kernel}"] = float(np.mean(secs[kernel]))
            row.update({"Spearman (mean)": float(np.mean(rho)), "Spearman (min)": float(np.min(rho))})
            rows.append(row)
            log.info("kernels %s", row)
    return rows


def kernel_environment() -> dict:
    """The run's environment with this CPU's default bfloat16 attention kernel (both reports name it)."""
    from attnrank.llm.kernels import default_kernel

    return {**environment(), "attention kernel": default_kernel()}


def kernels_markdown(rows, env, args) -> str:
    return (
        "\n".join(
            [
                f"# Attention kernels: CPU SDPA vs few rows ({env['date']}, {env['cpus']} CPUs, torch {env['torch']})",
                "",
                f"CPU: {env.get('cpu', 'not recorded')}. SmolLM2-135M-Instruct in bfloat16, the default preset's attention alone "
                "(its registered heads; first-stage signals off), "
                "every query cold (no cached passage states) and scored by both kernels in turn in one process. "
                "SDPA: every attention layer by torch's SDPA (flash kernel, float32 accumulation). Few rows: the "
                "suffix passes (and block attention's packed blocks) by two matrix products with bfloat16 logits "
                "and probabilities, as transformers' eager attention computes them (attnrank.llm.kernels). "
                "Spearman: rank correlation of a query's candidate scores under the two kernels. "
                f"This CPU's default: {env.get('attention kernel', 'not recorded')} (attnrank.llm.kernels.default_kernel).",
                "",
                md_table(rows, list(rows[0]), {k: ".4f" if "nDCG" in k or "Spearman" in k else ".2f" for k in rows[0]}),
                "",
                f"    python scripts/bench_rerank.py --kernels --blocks-scifact {args.blocks_scifact} "
                f"--blocks-hotpot {args.blocks_hotpot}" + (f" --name {args.name}" if args.name else ""),
            ]
        )
        + "\n"
    )


def precision_markdown(rows, info, env, args) -> str:
    ref = args.int8_dtypes[0]
    return (
        "\n".join(
            [
                f"# Reranking precision: {' vs '.join(args.int8_dtypes)} ({env['date']}, {env['cpus']} CPUs, "
                f"torch {env['torch']})",
                "",
                f"CPU: {env.get('cpu', 'not recorded')}.",
                "",
                f"SmolLM2-135M-Instruct, preset `{info['preset']}` "
                + (f"({info['heads']} heads), " if info["heads"] else "(no attention: its fused score), ")
                + f"{info['setting']}, "
                f"{info['queries']} queries; each query scored by every precision in turn in one process. "
                "int8 = the decoder's linear layers in dynamic int8 (attnrank.llm.quantize); Spearman = rank "
                f"correlation of a query's {args.int8_k} candidate scores with the {ref} scores.",
                "",
                md_table(
                    rows,
                    list(rows[0]),
                    {k: ".4f" if "Spearman" in k or k == "nDCG@10" else ".2f" for k in rows[0] if k != "dtype"},
                ),
                "",
                f"    python scripts/bench_rerank.py --int8 --int8-k {args.int8_k} --int8-dtypes {','.join(args.int8_dtypes)}"
                + (f" --dl19-queries {args.dl19_queries}" if args.dl19_queries else "")
                + (f" --int8-preset {args.int8_preset}" if args.int8_preset != "qrhead" else "")
                + (f" --int8-name {args.int8_name}" if args.int8_name != "rerank_int8" else ""),
            ]
        )
        + "\n"
    )


def markdown(q_rows, s_rows, extra, env, args) -> str:
    # the precision each LLM actually ran in (dtype="auto": bfloat16 on AMX / AVX-512 BF16 CPUs, else float32)
    dtypes = sorted({d for d in [extra.get("llm_dtype"), *(r.get("dtype") for r in s_rows)] if d})
    out = [
        f"# Attention reranking benchmark ({env['date']}, {env['cpus']} CPUs, torch {env['torch']})",
        "",
        f"LLM: SmolLM2-135M-Instruct (packaged GGUF, de-quantized, {' and '.join(dtypes) or 'not loaded'}) for "
        "every LLM method. "
        "nDCG@10 with trec_eval linear gain (ir-measures); wins/losses = queries whose nDCG@10 rose/fell "
        "against the first stage. s/query is wall time on this CPU.",
        "",
        md_table(q_rows, ["setting", "method", "nDCG@10", "wins/losses vs first stage", "s/query"], {"s/query": ".2f"}),
        "",
    ]
    for name, sel in extra.get("head_selections", {}).items():
        out.append(
            f"- Head list for *{name}* (chosen on {sel['chosen_on']}): "
            + ", ".join(f"{l}-{h}" for l, h in sel["heads"])
        )
    if s_rows:
        out += [
            "",
            "## Speed: our capture vs naive (eager attention, output_attentions=True, two full passes)",
            "",
            f"SciFact abstracts cut to 100 words, {args.speed_queries} queries per cell, fresh process per cell; "
            "peak extra MB = peak RSS growth over the loaded model.",
            "",
            md_table(
                s_rows,
                ["impl", "heads", "K", "prompt tokens", "s/query", "peak extra MB", "error"],
                {"prompt tokens": ".0f", "s/query": ".2f", "peak extra MB": ".0f"},
            ),
        ]
        for k in args.speed_ks:
            o = next(
                (r for r in s_rows if r["K"] == k and r["impl"] == "ours" and r["heads"] == "all" and "s/query" in r),
                None,
            )
            n = next((r for r in s_rows if r["K"] == k and r["impl"] == "naive" and "s/query" in r), None)
            pf = next((r for r in s_rows if r["K"] == k and r["impl"] == "prefill" and "s/query" in r), None)
            if o and pf:
                out.append(
                    f"\nK={k}: ours (all heads, two query passes over one cached prefill) costs "
                    f"{o['s/query'] / pf['s/query']:.2f}x a single plain prefill of the prompt."
                )
            if o and n:
                out.append(
                    f"K={k}: ours is {n['s/query'] / o['s/query']:.1f}x faster and uses "
                    f"{n['peak extra MB'] / max(o['peak extra MB'], 1):.1f}x less peak memory than naive."
                )
    return "\n".join(out) + "\n"


def blocks_section(args, root: Path) -> None:
    from attnrank.eval.speed_report import blocks_markdown
    from attnrank.speed.quality import compare_modes, quality_sets
    from attnrank.speed.timing import in_grid_order, run_cells, speed_cells

    cells = speed_cells(args.blocks_dtypes.split(","))
    results = REPO / "build" / "blocks" / "cells.json"
    if args.blocks_skip_speed:
        speed_rows = in_grid_order(json.loads(results.read_text()) if results.exists() else [], cells)
    else:
        speed_rows = run_cells(cells, root, results)
    store_path = REPO / "build" / "blocks" / "stores.json"
    if not args.blocks_skip_speed and not store_path.exists():
        from attnrank.speed.stores import build_store, store_sizes

        built = [build_store(root, REPO / "build" / "blocks" / f"states-{s}", s) for s in ("float16", "int8")]
        store_path.write_text(json.dumps({"sizes": store_sizes(root), "built": built}, indent=1))
    stores = json.loads(store_path.read_text()) if store_path.exists() else {}
    quality_path = REPO / "build" / "blocks" / "quality.json"
    if args.blocks_skip_quality:
        q_rows = json.loads(quality_path.read_text()) if quality_path.exists() else []
    else:
        from attnrank.rerank.attention import AttentionReranker

        modes = {
            "full": {},
            "block (shared positions)": {"attention": "block", "block_positions": "shared"},
            "block (rotated positions)": {"attention": "block", "block_positions": "rotated"},
            "block (sequential positions)": {"attention": "block", "block_positions": "sequential"},
        }
        sets = quality_sets(root, args.blocks_hotpot, args.blocks_scifact)
        runs = REPO / "build" / "blocks" / "quality_runs.json"
        q_rows = compare_modes(sets, modes, AttentionReranker(signals=None).llm, runs)
        quality_path.write_text(json.dumps(q_rows, indent=1))
    interleaved_path = REPO / "build" / "blocks" / "interleaved.json"
    if args.blocks_skip_interleaved:
        interleaved = json.loads(interleaved_path.read_text()) if interleaved_path.exists() else []
    else:
        from attnrank.speed.timing import run_interleaved

        dtype = args.blocks_dtypes.split(",")[0]
        for positions in args.blocks_positions.split(","):
            interleaved = run_interleaved(root, interleaved_path, dtype, positions)
    env = kernel_environment()
    md = blocks_markdown(speed_rows, q_rows, stores, env, interleaved)
    payload = {"environment": env, "speed": speed_rows, "interleaved": interleaved, "quality": q_rows, "stores": stores}
    write_outputs(args.name or "rerank_blocks", payload, md, OUT)
    print(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None)
    ap.add_argument("--dl19-depths", type=positive_ints, default="20,50")
    ap.add_argument(
        "--dl19-queries", type=non_negative_int, default=0, help="limit DL19 queries (0 = all 43; for smoke runs)"
    )
    ap.add_argument(
        "--scifact-queries", type=non_negative_int, default=50, help="seeded SciFact sample (0 = no SciFact)"
    )
    ap.add_argument("--listwise-max-k", type=int, default=20, help="RankGPT only on candidate lists up to this size")
    ap.add_argument("--listwise-on", default="DL19", help="datasets (first word of the setting) to run RankGPT on")
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument(
        "--cache-dir", default=str(CACHE), help="where per-query attention rows are cached for reuse ('' = no cache)"
    )
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--speed-ks", default="10,20,50")
    ap.add_argument("--speed-queries", type=positive_int, default=3)
    ap.add_argument("--speed-heads", default="")
    ap.add_argument("--speed-worker", nargs=2, default=None)
    ap.add_argument("--naive-max-gb", type=float, default=12.0, help="skip naive runs whose attention maps exceed this")
    ap.add_argument("--blocks", action="store_true", help="only the block-attention section (issue 15)")
    ap.add_argument(
        "--blocks-dtypes", default="bfloat16,float32,int8", help="LLM dtypes of the speed cells (the first: every cell)"
    )
    ap.add_argument("--blocks-skip-quality", action="store_true")
    ap.add_argument("--blocks-skip-speed", action="store_true")
    ap.add_argument(
        "--blocks-skip-interleaved",
        action="store_true",
        help="no interleaved timing (the modes in turn on each query, one process; the targets' record)",
    )
    ap.add_argument(
        "--blocks-positions",
        default=RerankConfig.block_positions,
        help="block positions of the interleaved timing, comma-separated (the preset fused reads 'shared')",
    )
    ap.add_argument(
        "--blocks-hotpot", type=positive_int, default=60, help="HotpotQA questions in the quality comparison"
    )
    ap.add_argument("--blocks-scifact", type=positive_int, default=12, help="SciFact queries in the quality comparison")
    ap.add_argument("--kernels", action="store_true", help="only SDPA vs the few-rows kernel (rerank_kernels.*)")
    ap.add_argument(
        "--name", default="", help="output name for --blocks or --kernels (docs/results/NAME.*; default: the section's)"
    )
    ap.add_argument("--int8", action="store_true", help="only the precision comparison (docs/results/rerank_int8.*)")
    ap.add_argument("--int8-k", type=positive_int, default=20, help="DL19 BM25 candidates per query for --int8")
    ap.add_argument("--int8-dtypes", default="float32,int8", help="precisions for --int8; the first is the reference")
    ap.add_argument("--int8-preset", default="qrhead")
    ap.add_argument("--int8-name", default="rerank_int8", help="output name for --int8 (docs/results/NAME.*)")
    args = ap.parse_args()
    for positions in args.blocks_positions.split(","):  # before any model loads
        try:
            check_positions(positions)
        except InputError as e:
            ap.error(f"--blocks-positions: {e}")
    if args.blocks:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        set_torch_threads()
        blocks_section(args, data_root(args.data, default=REPO.parent / "shared" / "data"))
        return
    if args.speed_worker:
        impl, k = args.speed_worker
        print(json.dumps(speed_worker(impl, int(k), args.speed_queries, args.speed_heads or None)))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    args.speed_ks = [int(x) for x in args.speed_ks.split(",")]
    root = data_root(args.data, default=REPO.parent / "shared" / "data")
    if args.kernels:
        k_rows, env = kernels_compare(root, args), kernel_environment()
        md = kernels_markdown(k_rows, env, args)
        write_outputs(args.name or "rerank_kernels", {"environment": env, "rows": k_rows}, md, OUT)
        print(md)
        return
    if args.int8:
        args.int8_dtypes = [d.strip() for d in args.int8_dtypes.split(",") if d.strip()]
        p_rows, info = precision_compare(root, args)
        env = environment()
        md = precision_markdown(p_rows, info, env, args)
        write_outputs(args.int8_name, {"environment": env, **info, "rows": p_rows}, md, OUT)
        print(md)
        return
    q_rows, extra = [], {}
    if not args.skip_quality:
        from attnrank.rerank.attention import AttentionReranker

        setups = dl19_sets(root, args.dl19_depths, args.dl19_queries)
        if args.scifact_queries:
            setups.append(scifact_set(root, args.scifact_queries, index_dir=SCIFACT_INDEX))
        q_rows, extra = quality(setups, AttentionReranker(config="icr"), args)
        if not args.speed_heads and extra.get("top16_by_dataset"):
            args.speed_heads = ",".join(f"{l}-{h}" for l, h in next(iter(extra["top16_by_dataset"].values())))
    s_rows = [] if args.skip_speed else speed(args)
    env = environment()
    md = markdown(q_rows, s_rows, extra, env, args)
    write_outputs("rerank", {"environment": env, "quality": q_rows, "speed": s_rows, **extra}, md, OUT)
    print(md)


if __name__ == "__main__":
    main()
