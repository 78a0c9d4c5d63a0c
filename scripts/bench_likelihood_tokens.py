"""Which of the query's tokens the default's query likelihood should average (an ablation).

    python scripts/bench_likelihood_tokens.py [--data DIR] [--scifact-queries 400]
                                              [--hotpot-questions 400] [--locomo-questions 400]
                                              [--first N]

UPR (Sachan et al. EMNLP 2022) scores a passage by the mean log-probability of all the query's
tokens after it. Many of those tokens ("what", "is", "the", "?") are predictable without any
passage, and their log-probabilities move with a passage's style as much as with its relevance.
Each row below scores a candidate from the same per-token log-probabilities (cached by
attnrank.benchmarks.cached_likelihoods on the candidate sets of scripts/bench_likelihood.py),
nothing trained:

- mean (UPR, the default): the mean over every query token;
- surprisal-weighted mean: tokens weighted by how unexpected they are without a passage,
  −log p(q_t | q_<t, prompt with an empty passage): the information each token carries;
- pointwise mutual information, positive part: the mean of max(0, log p(q_t | passage) −
  log p(q_t | empty passage)), only what the passage makes more likely counting;
- content words: the mean over the tokens of words that are not English stopwords (scikit-learn's
  list, the one the candidate BM25 drops) or punctuation.

Each variant is read alone and in the default preset's place for the likelihood (z(BM25) +
z(dense) + z(variant)); Δ, wins/losses and sign test against the default preset. All variants
were looked at on these four datasets, so the row "variant chosen on the other three" (for each
dataset, the variant whose preset has the best mean Δ on the other three) is the only held-out
figure among them. ``--first N`` reads the first N queries of each set only (the sets and their
cache stay those of bench_likelihood). Writes docs/results/likelihood_tokens.{json,md}.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from _common import positive_int
from bench_likelihood import CACHE, METRICS, add_set_arguments, candidate_sets, chosen_rows, examples, wide_table
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

from attnrank.benchmarks import TOKEN_LIKELIHOOD, TOKEN_PRIOR, cached_likelihoods
from attnrank.config import set_torch_threads
from attnrank.eval.datasets import data_root
from attnrank.eval.report import command_line, environment, md_table, write_outputs
from attnrank.llm.models import load_llm
from attnrank.rerank.fused import LIKELIHOOD, LIKELIHOOD_FEATURES, equal_weights
from attnrank.rerank.fused_features import FusionExample
from attnrank.rerank.fusion_eval import compare
from attnrank.rerank.likelihood import query_ids

log = logging.getLogger("bench_likelihood_tokens")
OUT = Path(__file__).resolve().parents[1] / "docs" / "results"


def content_mask(tok, query: str) -> np.ndarray:
    """True for each query token (:func:`query_ids`) that belongs to a word that is neither an
    English stopword nor punctuation; all True where no token is (a query of stopwords only)."""
    pieces = [tok.decode([i]) for i in query_ids(tok, query)]
    words, owner = [], []
    for p in pieces:  # a piece that starts with a space or is not alphanumeric starts a word
        if not words or p[:1].isspace() or not p.strip().isalnum() or not words[-1].strip().isalnum():
            words.append("")
        words[-1] += p
        owner.append(len(words) - 1)
    keep = [any(c.isalnum() for c in w) and w.strip().lower() not in ENGLISH_STOP_WORDS for w in words]
    mask = np.array([keep[o] for o in owner])
    return mask if mask.any() else np.ones_like(mask)


Variant = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # (tokens, prior, content mask)
DEFAULT = "mean (UPR, the default)"
VARIANTS: dict[str, Variant] = {
    DEFAULT: lambda t, p, m: t.mean(1),
    "surprisal-weighted mean": lambda t, p, m: t @ -p / max(float(-p.sum()), 1e-9),
    "pointwise mutual information, positive part": lambda t, p, m: np.maximum(t - p, 0).mean(1),
    "content words": lambda t, p, m: t[:, m].mean(1),
}
CHOSEN = "variant chosen on the other three datasets"


def with_variant(test: list[FusionExample], scores: dict[str, np.ndarray]) -> list[FusionExample]:
    """``test`` with each query's likelihood replaced by ``scores[qid]``."""
    return [replace(e, signals={**e.signals, LIKELIHOOD: scores[e.qid]}) for e in test]


def rows_for(data: dict[str, list[FusionExample]], tokens: dict[str, dict]) -> list[dict]:
    """Per dataset, each variant alone and in the preset against the default preset, and the
    variant chosen on the other three datasets."""
    preset = equal_weights(LIKELIHOOD_FEATURES)
    base = f"{DEFAULT}, in the preset"
    scores: dict[str, dict[str, dict]] = {}
    per: dict[str, dict[str, dict]] = {}
    for g, test in data.items():
        scores[g] = {}
        for name, variant in VARIANTS.items():
            v = {e.qid: variant(*tokens[g][e.qid]) for e in test}
            scores[g][f"{name}, alone"] = v
            scores[g][f"{name}, in the preset"] = {e.qid: preset.score(e.signals) for e in with_variant(test, v)}
        per[g] = {r["method"]: dict(r, dataset=g) for r in compare(test, scores[g], METRICS[g][:1], baselines=(base,))}
    return chosen_rows(data, per, scores, base, {f"{m}, in the preset": m for m in VARIANTS}, CHOSEN)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_set_arguments(ap)
    ap.add_argument("--first", type=positive_int, default=None, help="only the first N queries of each set")
    ap.add_argument("--out", default=None, help="output folder (default docs/results)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    set_torch_threads()
    root = data_root(args.data)
    llm = load_llm(dtype="auto")
    sets = candidate_sets(root, args)
    data, tokens = {}, {}
    for g, (setting, ds, cands) in sets.items():
        cands = dict(list(cands.items())[: args.first])
        ql = cached_likelihoods(llm, setting, ds, cands, CACHE)
        data[g] = examples(g, root, setting, ds, cands, ql)
        tokens[g] = {
            q: (ql[q][TOKEN_LIKELIHOOD], ql[q][TOKEN_PRIOR], content_mask(llm.tokenizer, ds.queries[q])) for q in cands
        }
    payload = {
        "date": time.strftime("%Y-%m-%d"),
        "env": environment(),
        "model": llm.model_id,
        "dtype": str(llm.dtype).removeprefix("torch."),
        "sizes": ", ".join(f"{g} {len(d)} queries" for g, d in data.items()),
        "rows": rows_for(data, tokens),
    }
    payload["command"] = command_line()  # (as this process ran: the set sizes too)
    js, md = write_outputs("likelihood_tokens", payload, markdown(payload), args.out or OUT)
    log.info("wrote %s and %s", js, md)


def markdown(p: dict) -> str:
    groups = list(dict.fromkeys(r["dataset"] for r in p["rows"]))
    table = wide_table(p["rows"], "method", detail=True)
    doc = (__doc__ or "").split("\n\n")
    lines = [
        f"# Which query tokens the likelihood averages ({p['date']}, {p['env'].get('cpus', '?')} CPUs, "
        f"{p['env'].get('cpu', '')})",
        "",
        f"Command: `{p['command']}`. Model {p['model']} ({p['dtype']}); the candidate sets of "
        f"bench_likelihood, {p['sizes']}. Each cell: nDCG@10, Δ points, wins/losses per query and "
        "sign-test p against the default preset (z(BM25) + z(dense) + z(mean token log-probability)).",
        "",
        " ".join(doc[2].split()),
        "",
        doc[3],
        "",
        md_table(table, ["method", *groups, "mean nDCG@10", "mean Δ"]),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
