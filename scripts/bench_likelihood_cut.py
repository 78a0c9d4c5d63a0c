"""Shorter passages for the default preset's query likelihood: what the cut saves and what it costs.

    python scripts/bench_likelihood_cut.py [--words 150] [--time-queries 30] [--data DIR]
                                           [--scifact-queries 400] [--hotpot-questions 400] [--locomo-questions 400]

The default preset ``likelihood`` runs one prompt per candidate through the whole model, passage
cut to 300 words (``max_doc_words``); its cost grows with the passage. This compares that cut with
``--words`` on the candidate sets of ``scripts/bench_likelihood.py`` (the same cached signals):

- quality: nDCG@10 of the likelihood alone and of the preset at both cuts, and the shorter cut's
  Δ, wins and losses per query and sign test against the default. A dataset whose candidates
  are all within ``--words`` words gets the same prompts at both cuts, so its scores are reused,
  not recomputed;
- cost: the prompt tokens per query at each cut, and the seconds per query of the preset
  (``state_cache_mb=0``: every prompt computed) on the first ``--time-queries`` queries (cut or
  not) of each dataset in which the cut changes a passage, the two cuts alternating query by query
  in one process.

Writes docs/results/likelihood_cut_<words>.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from _common import positive_int
from bench_likelihood import CACHE, METRICS, add_set_arguments, candidate_sets, examples

from attnrank.benchmarks import cached_likelihoods
from attnrank.config import set_torch_threads
from attnrank.eval.datasets import data_root
from attnrank.eval.report import environment, md_table, write_outputs
from attnrank.llm.chat import encode_text
from attnrank.llm.models import load_llm
from attnrank.llm.prompts import DEFAULT_MAX_DOC_WORDS
from attnrank.llm.truncation import truncate_texts
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig
from attnrank.rerank.fused import LIKELIHOOD, LIKELIHOOD_FEATURES, equal_weights
from attnrank.rerank.fusion_eval import compare
from attnrank.rerank.likelihood import passage_prompt

log = logging.getLogger("bench_likelihood_cut")
OUT = Path(__file__).resolve().parents[1] / "docs" / "results"


def prompt_tokens(tok, cands: dict, words: int) -> tuple[float, int]:
    """Mean prompt tokens per query with passages cut to ``words``, and how many passages it cuts."""
    total, cut = 0, 0
    for docs in cands.values():
        texts, cuts = truncate_texts(tok, docs, words, None)
        total += sum(len(encode_text(tok, passage_prompt(d.title, t))) for d, t in zip(docs, texts))
        cut += len(cuts)
    return total / len(cands), cut


def quality(g: str, data_default, data_cut, words: int) -> list[dict]:
    """Rows of the likelihood alone and the preset at both cuts, against the preset at the default."""
    preset = equal_weights(LIKELIHOOD_FEATURES)
    default = f"preset likelihood, {DEFAULT_MAX_DOC_WORDS} words (the default)"
    scores = {
        f"likelihood alone, {DEFAULT_MAX_DOC_WORDS} words": {e.qid: e.signals[LIKELIHOOD] for e in data_default},
        f"likelihood alone, {words} words": {e.qid: e.signals[LIKELIHOOD] for e in data_cut},
        default: {e.qid: preset.score(e.signals) for e in data_default},
        f"preset likelihood, {words} words": {e.qid: preset.score(e.signals) for e in data_cut},
    }
    return [{"dataset": g, **r} for r in compare(data_default, scores, METRICS[g][:1], baselines=(default,))]


def timing(llm, ds, cands: dict, words: int, n: int) -> dict[str, float]:
    """Mean s/query of the preset at both cuts over the first ``n`` queries, alternating."""
    rankers = {
        w: AttentionReranker(llm, config=RerankConfig.preset("likelihood", state_cache_mb=0, max_doc_words=w))
        for w in (DEFAULT_MAX_DOC_WORDS, words)
    }
    qids = list(cands)[:n]
    for r in rankers.values():  # warm-up: embedder, allocator
        r.rank(ds.queries[qids[0]], cands[qids[0]])
    spent = dict.fromkeys(rankers, 0.0)
    for i, q in enumerate(qids):
        for w in sorted(rankers, reverse=bool(i % 2)):  # alternate which cut runs first
            t = time.perf_counter()
            rankers[w].rank(ds.queries[q], cands[q])
            spent[w] += time.perf_counter() - t
    return {w: s / len(qids) for w, s in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--words", type=positive_int, default=150)
    ap.add_argument("--time-queries", type=positive_int, default=30)
    add_set_arguments(ap)
    ap.add_argument("--out", default=None, help="output folder (default docs/results)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root, words = data_root(args.data), args.words
    llm = load_llm(dtype="auto")
    sets = candidate_sets(root, args)
    rows, cost = [], []
    for g, (setting, ds, cands) in sets.items():
        full = cached_likelihoods(llm, setting, ds, cands, CACHE)
        (tokens_full, _), (tokens_cut, n_cut) = (
            prompt_tokens(llm.tokenizer, cands, w) for w in (DEFAULT_MAX_DOC_WORDS, words)
        )
        cut = cached_likelihoods(llm, setting, ds, cands, CACHE, max_doc_words=words) if n_cut else full
        rows += quality(
            g, examples(g, root, setting, ds, cands, full), examples(g, root, setting, ds, cands, cut), words
        )
        seconds = timing(llm, ds, cands, words, args.time_queries) if n_cut else {}
        cost.append(
            {
                "dataset": g,
                "passages cut": f"{n_cut}/{sum(map(len, cands.values()))}",
                f"prompt tokens/query, {DEFAULT_MAX_DOC_WORDS} words": round(tokens_full, 1),
                f"prompt tokens/query, {words} words": round(tokens_cut, 1),
                "token ratio": round(tokens_cut / tokens_full, 3),
                f"s/query, {DEFAULT_MAX_DOC_WORDS} words": seconds.get(DEFAULT_MAX_DOC_WORDS, float("nan")),
                f"s/query, {words} words": seconds.get(words, float("nan")),
                "x faster": seconds[DEFAULT_MAX_DOC_WORDS] / seconds[words] if seconds else float("nan"),
                "timed queries": min(args.time_queries, len(cands)) if seconds else 0,
            }
        )
    payload = {
        "date": time.strftime("%Y-%m-%d"),
        "env": environment(),
        "dtype": str(llm.dtype).removeprefix("torch."),  # as loaded: dtype="auto" is bfloat16 only on some CPUs
        "words": words,
        "rows": rows,
        "cost": cost,
    }
    command = payload["env"]["command"]  # (as this process ran: options a retyped line dropped)
    js, md = write_outputs(f"likelihood_cut_{words}", payload, markdown(payload, command), args.out or OUT)
    log.info("wrote %s and %s", js, md)


def markdown(p: dict, command: str) -> str:
    w = p["words"]
    lines = [
        f"# The default's query likelihood with passages cut to {w} words ({p['date']}, "
        f"{p['env'].get('cpus', '?')} CPUs, {p['env'].get('cpu', '')})",
        "",
        f"Command: `{command}`. SmolLM2-135M-Instruct ({p['dtype']}). The default cuts each passage to "
        f"{DEFAULT_MAX_DOC_WORDS} words before its query-likelihood prompt; this cuts to {w}. Quality: "
        "every query of each set (the candidate sets of bench_likelihood); Δ, wins/losses and p (sign "
        "test) against the default preset. Cost: prompt tokens per query (every query), and s/query "
        "of the preset with nothing reused (`state_cache_mb=0`), the two cuts alternating query by "
        "query on the first queries (cut or not) of each set in which the cut changes a passage.",
        "",
        "## Cost",
        "",
        md_table(
            p["cost"],
            list(p["cost"][0]),
            {c: ".1f" if "tokens" in c else ".3f" for c in p["cost"][0]} | {"x faster": ".2f"},
        ),
        "",
        "## Quality (nDCG@10)",
        "",
        md_table(p["rows"], ["dataset", "method", "nDCG@10", "Δ", "wins", "losses", "p"], {"Δ": "+.2f", "p": ".3g"}),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
