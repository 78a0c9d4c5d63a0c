"""Bounded load test of `attnrank serve` on loopback: throughput, latency percentiles, errors.

Starts the real server (attnrank.serve.create_app under uvicorn, 127.0.0.1, a free port) with
the given model, then for each concurrency level sends a fixed number of TEI-shaped rerank
requests (POST /rerank) from that many client threads (httpx), each request the same kind of
query and candidate list drawn from the packaged demo corpus (passages cut to --doc-chars).
Every level stops sending after --requests requests or --max-seconds, whichever comes first
(requests in flight then finish).
Baseline, same run and inputs: AttentionReranker.rank called in-process, sequentially on one
worker thread (as the server runs it), before and after the load: the cost of the model alone,
without HTTP, queueing or JSON (measured twice because a shared machine's load drifts).

    python scripts/bench_serve.py                       # default model, 16 requests per level
    python scripts/bench_serve.py --model DIR --requests 300 --name serve_tiny   # a tiny model: server overhead

Writes docs/results/NAME.json and NAME.md (NAME: --name, default serve).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from _common import positive_int, positive_ints

from attnrank.corpus import load_corpus
from attnrank.demo import demo_corpus_path, demo_queries
from attnrank.eval.report import command_line, environment, write_outputs
from attnrank.llm.models import load_llm
from attnrank.rerank.attention import AttentionReranker
from attnrank.serve.app import create_app
from attnrank.serve.background import background_server
from attnrank.serve.engine import Engine

OUT = Path(__file__).resolve().parent.parent / "docs" / "results"


def workload(n_docs: int, doc_chars: int) -> list[dict]:
    """One request body per demo question: its query and n_docs demo passages (cut to doc_chars)."""
    docs = load_corpus(demo_corpus_path())[0]
    bodies = []
    for qi, q in enumerate(demo_queries()):
        pick = [docs[(qi * n_docs + j) % len(docs)] for j in range(n_docs)]
        bodies.append({"query": q["text"], "texts": [d.text[:doc_chars] for d in pick]})
    return bodies


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    a = np.array(values)
    return {
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)),
        "mean": float(a.mean()),
    }


def run_level(url: str, bodies: list[dict], clients: int, requests: int, max_seconds: float) -> dict:
    """``requests`` POST /rerank from ``clients`` threads; stops early at ``max_seconds``."""
    lock = threading.Lock()
    issued = [0]
    latencies: list[float] = []
    statuses: Counter = Counter()
    start = time.perf_counter()

    def client() -> None:
        # a request sent just before the cap may wait behind every other client's: no client timeout
        # short of that (the server itself never hangs: it answers 503 when its queue is full)
        with httpx.Client(timeout=httpx.Timeout(10.0, read=max(600.0, 4 * max_seconds))) as http:
            while True:
                with lock:
                    if issued[0] >= requests or time.perf_counter() - start > max_seconds:
                        return
                    i = issued[0]
                    issued[0] += 1
                t = time.perf_counter()
                try:
                    r = http.post(f"{url}/rerank", json=bodies[i % len(bodies)])
                    code = str(r.status_code)
                except httpx.HTTPError as e:
                    code = type(e).__name__
                with lock:
                    statuses[code] += 1
                    if code == "200":
                        latencies.append(time.perf_counter() - t)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - start
    ok = statuses.get("200", 0)
    return {
        "clients": clients,
        "requests_sent": sum(statuses.values()),
        "ok": ok,
        "rejected_503": statuses.get("503", 0),
        "errors": sum(v for k, v in statuses.items() if k not in ("200", "503")),
        "statuses": dict(statuses),
        "wall_seconds": wall,
        "throughput_rps": ok / wall if wall else 0.0,
        "stopped_by_time_cap": sum(statuses.values()) < requests,
        **percentiles(latencies),
    }


def baseline(reranker: AttentionReranker, bodies: list[dict], n: int) -> dict:
    """``n`` sequential ``rank`` calls on one worker thread (where the server runs the model too)."""

    def calls() -> list[float]:
        lat = []
        for i in range(n):
            b = bodies[i % len(bodies)]
            t = time.perf_counter()
            reranker.rank(b["query"], b["texts"])
            lat.append(time.perf_counter() - t)
        return lat

    with ThreadPoolExecutor(1) as pool:
        lat = pool.submit(calls).result()
    return {"calls": n, "throughput_rps": n / sum(lat), **percentiles(lat)}


def markdown(result: dict) -> str:
    s, env = result["settings"], result["environment"]
    answered = ", ".join(f"{lv['ok']} at {lv['clients']} client(s)" for lv in result["levels"])
    lines = [
        "# attnrank serve: loopback load test",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Run {env['date']} on {env['cpu']} ({env['cpus']} CPUs available; Python {env['python']}, torch {env['torch']}).",
        "",
        (
            f"Model `{s['model']}` on {s['cpus']} CPU thread(s) ({s['machine']}); POST /rerank (TEI shape) with "
            f"{s['docs']} demo passages of at most {s['doc_chars']} characters per request; queue of "
            f"{s['max_queued']}; at most {s['requests']} requests or {s['max_seconds']} s per level. "
            f"Machine: {s['cores']} cores, 1-minute load average {s['loadavg_1m_before_after'][0]} before and "
            f"{s['loadavg_1m_before_after'][1]} after the run (other jobs share it)."
        ),
        "",
        "| clients | sent | ok | 503 | other errors | throughput (req/s) | p50 (s) | p95 (s) | p99 (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for when, b in result["baseline"].items():
        lines.append(
            f"| in-process `rank`, {when} the load (baseline) | {b['calls']} | {b['calls']} | – | – | "
            f"{b['throughput_rps']:.2f} | {b['p50']:.3f} | {b['p95']:.3f} | {b['p99']:.3f} |"
        )

    def f(v: float | None) -> str:
        return "–" if v is None else f"{v:.3f}"

    for lv in result["levels"]:
        lines.append(
            f"| {lv['clients']} | {lv['requests_sent']} | {lv['ok']} | {lv['rejected_503']} | {lv['errors']} | "
            f"{lv['throughput_rps']:.2f} | {f(lv['p50'])} | {f(lv['p95'])} | {f(lv['p99'])} |"
        )
    lines += [
        "",
        (
            "Latency is per request as the client sees it (queue wait included), over each level's answered "
            f"requests (status 200: {answered}). "
            "One model serves all requests one at a time, so throughput stays at the model's rate and latency "
            "grows with the number of clients waiting; 503s would only appear with more clients than "
            "queue places (+1 running)."
        ),
    ]
    capped = [lv["clients"] for lv in result["levels"] if lv["stopped_by_time_cap"]]
    if capped:
        lines.append(f"\nStopped by the time cap before all requests were sent: {capped} clients.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="LLM (default: packaged SmolLM2-135M)")
    ap.add_argument("--levels", type=positive_ints, default="1,4,16", help="concurrent clients per level")
    ap.add_argument("--requests", type=positive_int, default=16, help="requests per level")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="time cap per level (requests in flight finish)")
    ap.add_argument("--docs", type=positive_int, default=4, help="candidates per request")
    ap.add_argument("--doc-chars", type=positive_int, default=150, help="characters kept of each passage")
    ap.add_argument("--max-queued", type=positive_int, default=16)
    ap.add_argument("--baseline-calls", type=positive_int, default=4)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--name", default="serve", help="result file stem (NAME.json, NAME.md)")
    args = ap.parse_args()
    levels = args.levels
    if args.requests > 2000 or max(levels) > 64 or not 0 < args.max_seconds <= 1200:
        sys.exit(
            f"bounded load only (--requests {args.requests}, --levels {','.join(map(str, levels))}, --max-seconds "
            f"{args.max_seconds:g}): give --requests 1 to 2000, at most 64 clients a level, --max-seconds in (0, 1200]"
        )
    import torch

    llm = load_llm(args.model)
    reranker = AttentionReranker(llm, signals=None)
    bodies = workload(args.docs, args.doc_chars)
    load_before = os.getloadavg()
    baseline(reranker, bodies, 1)  # warm-up
    half = max(1, args.baseline_calls // 2)  # before and after the load: the machine's load may drift
    before = baseline(reranker, bodies, half)
    out_levels = []
    with background_server(create_app(Engine(reranker, model_name=llm.model_id), max_queued=args.max_queued)) as url:
        for c in levels:
            out_levels.append(run_level(url, bodies, c, args.requests, args.max_seconds))
            print(json.dumps(out_levels[-1]), flush=True)
    after = baseline(reranker, bodies, half)
    load_after = os.getloadavg()
    base = {"before": before, "after": after}
    result = {
        "command": command_line(),
        "environment": environment(),
        "settings": {
            "model": llm.model_id,
            "levels": levels,
            "requests": args.requests,
            "max_seconds": args.max_seconds,
            "docs": args.docs,
            "doc_chars": args.doc_chars,
            "max_queued": args.max_queued,
            "cpus": torch.get_num_threads(),
            "machine": platform.machine() + ", " + platform.python_version(),
            "loadavg_1m_before_after": [round(load_before[0], 2), round(load_after[0], 2)],
            "cores": os.cpu_count(),
        },
        "baseline": base,
        "levels": out_levels,
        "prompt_tokens_mean": statistics.mean(
            len(llm.tokenizer(b["query"] + " ".join(b["texts"]))["input_ids"]) for b in bodies
        ),
    }
    write_outputs(args.name, result, markdown(result), args.out)  # (it replaces only a record it wrote)
    print(markdown(result))


if __name__ == "__main__":
    main()
