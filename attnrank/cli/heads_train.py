"""``attnrank heads train``: learn head weights on your own labelled queries, report them on
held-out folds, and register them (used by ``AttentionReranker(scorer="learned")``) unless they
score below the untrained sum of per-head scores held out, as ``attnrank train`` registers.

The candidates and labels come as for ``heads detect --method qr``: BEIR/TREC qrels with queries
and a corpus (candidates from a TREC run, else BM25 top-``--depth`` over the corpus), or a shared
data set. Every head's attention rows are captured once per query; the report is k-fold over
queries (heads chosen and weights trained on the training folds only, tested on the held-out
fold, pooled over the folds); the registered weights are then trained on all the queries.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import typer

from ..config import DEFAULT_HEAD_L2, check_precision_names
from . import (
    Corpus,
    Data,
    Dataset,
    Device,
    Folds,
    FoldSeed,
    Qrels,
    Queries,
    Quiet,
    Rel,
    Run,
    Save,
    SkipInvalid,
    Verbose,
    _setup,
    option_errors,
)
from .heads import heads_app
from .labelled import LabelledSource, check_labelled, check_saveable, check_training, labelled_set
from .options import Dtype, MaxDocTokens, MaxDocWords, check_model_readable, truncation
from .train import FEW_QUERIES

METRICS = ("nDCG@10", "RR@10")


DEFAULT_TOP = 32


def _top_heads(top: str | None, heads: str | None) -> int | None:
    """The heads the weights read: ``--top N`` (N >= 1, as heads detect --top; ``all``: every head;
    None: :data:`DEFAULT_TOP`), or the old spelling ``--heads all|topN``, which every other command
    reads as a head list (warned of). Returns N, or None for every head."""
    if heads is not None and top is not None:
        raise typer.BadParameter(
            f"--top {top} and --heads {heads} both set it; give --top alone (--heads is its old spelling)"
        )
    if heads is not None:
        m = re.fullmatch(r"top(\d+)", heads.strip())
        if heads.strip() != "all" and (not m or int(m.group(1)) < 1):
            raise typer.BadParameter(f"--heads {heads!r} is not 'all' or 'topN' (N >= 1); give --top N or --top all")
        typer.echo(
            f"warning: --heads {heads} is now --top {m.group(1) if m else 'all'} (--heads names head lists elsewhere)"
        )
        return int(m.group(1)) if m else None
    word = (top or str(DEFAULT_TOP)).strip().lower()
    if word == "all":
        return None
    if not word.isdigit() or int(word) < 1:
        raise typer.BadParameter(f"--top {top!r} is not a count >= 1 or 'all' (every head)")
    return int(word)


def _head_ndcg(feats: list[Any], qrels: dict, rel: int, k: int = 10) -> Any:
    """Per-head nDCG@k of each head's passage scores used alone, mean over ``feats`` (QRHead's
    qr-ndcg selection; the same numbers :func:`~attnrank.heads.queryfocused.query_focused_scores` gives
    from the rows these features were built from). Unlike QRHead's detection (and ``heads detect``),
    the candidates are not shuffled: they sit in the first-stage order the reranker reads them in,
    so a head that attends to the slot nearest the query scores as the first stage does and may be
    chosen for it (the weights are trained, and reported, on that same order)."""
    import numpy as np

    from ..eval.metrics import per_query_ndcg_of_each

    per = per_query_ndcg_of_each(
        {q.qid: q.features.T for q in feats}, {q.qid: q.doc_ids for q in feats}, qrels, rel=rel, k=k
    )
    return np.mean(list(per.values()), axis=0)


def _scores_eval(feats: list[Any], scorer: Any, qrels: dict, rel: int) -> dict[str, float]:
    from ..eval.metrics import evaluate

    run = {q.qid: dict(zip(q.doc_ids, map(float, scorer(q)))) for q in feats}
    return evaluate(run, {q.qid: qrels[q.qid] for q in feats}, METRICS, rel=rel, warn=False)  # (a fold: no run file)


@heads_app.command("train")
def heads_train(
    model: Optional[str] = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    data: Optional[Path] = Data,
    dataset: Optional[str] = Dataset,
    queries: Optional[Path] = Queries,
    qrels: Optional[Path] = Qrels,
    corpus: Optional[Path] = Corpus,
    skip_invalid: bool = SkipInvalid,
    run: Optional[Path] = Run,
    depth: int = typer.Option(20, "--depth", help="Candidates per query (the reranking depth the weights are for)."),
    max_queries: int = typer.Option(0, "--max-queries", help="Labelled queries used (0: all)."),
    rel: Optional[int] = Rel,
    top: Optional[str] = typer.Option(
        None,
        "--top",
        help=f"The N heads with the best nDCG@10 alone on the training folds, as heads detect --top (default "
        f"{DEFAULT_TOP}), or all.",
    ),
    heads: Optional[str] = typer.Option(None, "--heads", hidden=True, help="Old spelling of --top: all | topN."),
    learner: str = typer.Option("pointwise", "--learner", help="pointwise (logistic regression) | pairwise (RankNet)."),
    l2: Optional[float] = typer.Option(
        None, "--l2", help=f"L2 penalty λ (sklearn C = 1/λ; default {DEFAULT_HEAD_L2:g})."
    ),
    first_stage: bool = typer.Option(
        False,
        "--first-stage/--no-first-stage",
        help="Also weight the first-stage rank (then only candidates with a first-stage order can be scored).",
    ),
    max_doc_words: Optional[int] = MaxDocWords,
    max_doc_tokens: Optional[int] = MaxDocTokens,
    folds: int = Folds,
    seed: int = FoldSeed,
    device: str = Device,
    dtype: str = Dtype,
    save: bool = Save,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
) -> None:
    """Train learned head weights on labelled queries; print a held-out report, then register them (unless below
    the heads' untrained sum held out)."""
    from ..errors import require
    from ..rerank.learned import LEARNERS

    progress = _setup(quiet, verbose)
    require("sklearn", "train", "attnrank heads train")  # before any model is loaded
    n_top = _top_heads(top, heads)
    l2 = check_training(learner, LEARNERS, l2, folds, depth, default_l2=DEFAULT_HEAD_L2)
    with option_errors():  # (found by load_llm, after the labelled set was read)
        check_precision_names(device, dtype)
    check_model_readable(model)  # (before the labelled set is read: a mistyped --model named at once)
    qs, cands, qr, rel, desc = labelled_set(
        LabelledSource(dataset, data, queries, qrels, corpus, run, depth, max_queries, rel, skip_invalid)
    )
    check_labelled(qs, cands, qr, rel, folds, seed, depth)
    check_saveable(model, save)
    cut = truncation(max_doc_words, max_doc_tokens)
    feats, llm, prompt = _capture(model, device, dtype, qs, cands, qr, rel, progress, cut)
    report, weights = _train(feats, qr, rel, n_top, learner, l2, first_stage, folds, seed, desc, prompt)
    typer.echo(report)
    if len(feats) < FEW_QUERIES:
        typer.echo(
            f"warning: {len(feats)} labelled queries are fewer than {FEW_QUERIES}; held-out figures over so few move "
            "by points from one fold shuffle to the next (--seed), so read them as a rough guide"
        )
    if save:
        held = weights.metrics["heldout"]
        learned, summed = held["learned nDCG@10"], held["sum of per-head scores nDCG@10"]
        if learned < summed:  # (the rule of attnrank train: never registered below the untrained weights)
            typer.echo(
                f"Not registered: held out, the learned weights ({learned:.4f}) score below the untrained sum of "
                f"per-head scores ({summed:.4f}), so scorer learned (preset learned) keeps what it reads now; "
                "train on more labelled queries, or rank with preset icr, which reads that sum"
            )
        else:
            typer.echo(f"saved to {weights.save(llm.model_id, llm.fingerprint)}")


def _capture(model, device, dtype, qs, cands, qr, rel, progress, cut):
    """Every head's features per query (one forward pass per query over its candidates), the
    model, and the prompt settings they were read with (``cut``: the truncation options given)."""
    from tqdm.auto import tqdm

    from ..llm.models import load_llm
    from ..rerank.attention import AttentionReranker
    from ..rerank.learned import query_features

    llm = load_llm(model, dtype=dtype, device=device)
    rr = AttentionReranker(llm, None, signals=None, **cut)  # all heads, attention alone
    feats = []
    for qid in tqdm(list(qs), desc="capturing attention rows", unit="query", disable=not progress):
        docs = cands[qid]
        feats.append(
            query_features(
                qid,
                rr.windows(qs[qid], docs),
                [d.id for d in docs],
                rr.head_list,
                qr,
                rel=rel,
                first_stage=[float(len(docs) - i) for i in range(len(docs))],
            )
        )
    return feats, llm, rr.config.prompt_settings()


def _train(feats, qr, rel, top, learner, l2, first_stage, folds, seed, desc, prompt):
    """(the held-out report text, the weights trained on all ``feats``, recording ``prompt``, the
    prompt settings the features' attention was read from)."""
    import numpy as np

    from ..eval.crossval import cross_validate, labelled_splits, pool, relevant_links
    from ..rerank.learned import restrict_heads, train_head_weights

    heads_all = feats[0].heads

    def fit(train):
        chosen = heads_all
        if top is not None:
            ndcg = _head_ndcg(train, qr, rel)
            chosen = [heads_all[i] for i in np.argsort(-ndcg, kind="stable")[:top]]
        sub = [restrict_heads(q, chosen) for q in train]
        return chosen, train_head_weights(sub, learner=learner, l2=l2, rel=rel, first_stage=first_stage, prompt=prompt)

    def evaluate(fitted, test):
        chosen, w = fitted
        rows = {f"first stage {m}": v for m, v in _scores_eval(test, lambda q: q.first_stage, qr, rel).items()}
        rows.update(
            {
                f"sum of per-head scores {m}": v
                for m, v in _scores_eval(test, lambda q: q.features.sum(axis=1), qr, rel).items()
            }
        )
        sub = {q.qid: restrict_heads(q, chosen) for q in test}
        rows.update(
            {
                f"learned {m}": v
                for m, v in _scores_eval(
                    test, lambda q: w.score_features(sub[q.qid].features, q.first_stage), qr, rel
                ).items()
            }
        )
        return rows

    held = pool(cross_validate(labelled_splits(feats, folds, seed=seed, links=relevant_links(rel)), fit, evaluate))
    n_heads = len(heads_all)
    label = "all heads" if top is None or top >= n_heads else f"top-{top} heads by nDCG@10 alone"
    lines = [
        (
            f"held-out {folds}-fold over {len(feats)} queries ({desc}); heads chosen and weights trained on "
            "the training folds only:"
        )
    ]
    for who in ("first stage", "sum of per-head scores", "learned"):
        vals = "  ".join(f"{m} {held[f'{who} {m}']:.4f}" for m in METRICS)
        lines.append(f"  {who + (f' ({learner}, {label})' if who == 'learned' else ''):<58} {vals}")
    lines.append(
        "  (sum of per-head scores: every head's features summed, whatever --top the learned weights read, "
        "each head's through its own token filter where it is on; ICR's sum, preset icr, filters the summed "
        "scores once)"
    )
    lines.append(
        f"  learned - first stage: {100 * (held['learned nDCG@10'] - held['first stage nDCG@10']):+.1f} nDCG@10 points"
    )
    chosen, weights = fit(feats)
    listed = top is not None and top < n_heads
    weights.trained_on = f"{desc}; heads: {label}" + (f" ({','.join(f'{l}-{h}' for l, h in chosen)})" if listed else "")
    weights.metrics = {"heldout": held, "folds": folds, "seed": seed, "n_queries": len(feats)}
    return "\n".join(lines), weights
