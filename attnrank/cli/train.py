"""``attnrank train``: train the fused scorer on your own labelled queries, report it held out,
then register it: ``--preset fused`` reads it, and the default
``signals`` preset reads its model without attention (``base_weights``, trained alongside) in place
of its untrained equal weights. The report shows all three, "fused with attention", "fused without
attention" and "equal weights, no attention (untrained)", and says what registering replaces.

Candidates and labels come as for ``heads train``: BEIR/TREC qrels with queries and a corpus
(candidates from a TREC run, else BM25 top-``--depth``), or a shared data set. Per query the
reranker's attention score (the chosen heads, calibrated) and the candidates' BM25, dense cosine
and first-stage rank are computed once; the report is k-fold over queries (trained on the
training folds, tested on the held-out fold), against each first-stage signal alone, with
per-query wins/losses and a sign test. The registered weights are then trained on all queries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

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
    _check_heads,
    _setup,
    app,
)
from .heads import _qr_set, check_folds, check_training
from .options import Dtype

METRICS = ("nDCG@10", "RR@10")


@app.command("train")
def train(
    model: Optional[str] = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    heads: str = typer.Option(
        "auto-or-all",
        "--heads",
        help="Heads of the attention feature: auto-or-all (those preset fused reads: its weights', else the "
        "registered set), all, 'l-h,...'.",
    ),
    data: Optional[Path] = Data,
    dataset: Optional[str] = Dataset,
    queries: Optional[Path] = Queries,
    qrels: Optional[Path] = Qrels,
    corpus: Optional[Path] = Corpus,
    skip_invalid: bool = SkipInvalid,
    run: Optional[Path] = Run,
    depth: int = typer.Option(20, "--depth", help="Candidates per query (the reranking depth)."),
    max_queries: int = typer.Option(0, "--max-queries", help="Labelled queries used (0: all)."),
    rel: Optional[int] = Rel,
    kind: str = typer.Option(
        "pointwise",
        "--kind",
        help="pointwise (logistic regression) | pairwise (RankNet) | listwise (nDCG@10 over a weight grid) "
        "| equal (weight 1 on every feature; only the confidence gate is chosen).",
    ),
    l2: float = typer.Option(1.0, "--l2", help="L2 penalty λ (sklearn C = 1/λ)."),
    gate: bool = typer.Option(
        True, "--gate/--no-gate", help="Fall back to the first-stage signals where attention is not confident."
    ),
    folds: int = Folds,
    seed: int = FoldSeed,
    max_doc_words: int = typer.Option(300, "--max-doc-words", min=1, help="Words kept per passage in the prompt."),
    device: str = Device,
    dtype: str = Dtype,
    save: bool = Save,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
) -> None:
    """Train the fused scorer on labelled queries; print a held-out report, then register it."""
    from ..errors import require
    from ..rerank.fused_training import MODELS

    progress = _setup(quiet, verbose)
    require("sklearn", "train", "attnrank train")  # before any model is loaded
    check_training(kind, MODELS, l2, folds, depth)
    _check_heads(heads, model=model)
    qs, cands, qr, rel, desc = _qr_set(
        dataset, data, queries, qrels, corpus, run, depth, max_queries, rel, skip_invalid
    )
    check_folds(len(qs), folds)
    from ..rerank.fused_training import fusion_examples

    rr = _attention_alone(model, heads, max_doc_words, device, dtype)
    examples = fusion_examples(rr.score, qs, cands, qr, rel=rel, group=desc, progress=progress)
    report, weights = _report_and_fit(examples, kind, l2, gate, folds, seed, desc, rr)
    typer.echo(report)
    if save:
        typer.echo(f"saved to {weights.save(rr.llm.model_id, rr.llm.fingerprint)}")


def _attention_alone(model: str | None, heads: str, max_doc_words: int, device: str, dtype: str) -> Any:
    """Preset fused's attention, alone: captured as the preset captures it, from ``heads`` (for
    ``auto-or-all``, the heads its current weights for the model were fitted to, if they record
    them); the weights are fitted to it."""
    from ..llm.models import unloaded_model
    from ..rerank.attention import AttentionReranker
    from ..rerank.config import AUTO_OR_ALL
    from ..rerank.fused import fitted_heads

    chosen: Any = heads
    if heads.strip().lower() == AUTO_OR_ALL:
        chosen = fitted_heads(*unloaded_model(model)) or heads
    return AttentionReranker(
        model, chosen, config="fused", signals=None, max_doc_words=max_doc_words, device=device, dtype=dtype
    )


def _report_and_fit(examples, kind, l2, gate, folds, seed, desc, rr) -> tuple[str, Any]:
    """(the held-out report text, the weights trained on all ``examples``)."""
    from ..eval.crossval import kfold_splits
    from ..eval.report import md_table
    from ..rerank.fused_training import train_fused
    from ..rerank.fusion_eval import compare, heldout_scores

    scores = heldout_scores(kfold_splits(examples, folds, seed=seed), model=kind, l2=l2, gate=gate)
    rows = compare(examples, scores, METRICS)
    heads = "all" if rr.heads is None else len(rr.heads)
    text = [
        f"held-out {folds}-fold over {len(examples)} queries ({desc}); trained on the training folds only; "
        f"attention: {heads} heads of {rr.llm.model_id}",
        "",
        md_table(rows, ["method", *METRICS, "Δ", "wins", "losses", "p"], {"Δ": "+.1f", "p": ".3f"}),
        "",
        f"Δ: nDCG@10 points against the best first-stage signal ({rows[0]['best first stage']}); "
        "wins/losses per query against it; p: two-sided sign test.",
        "",
        _what_registering_changes({r["method"]: r["nDCG@10"] for r in rows}, rr.llm.model_id, rr.llm.fingerprint),
    ]
    weights = train_fused(
        examples, model=kind, l2=l2, gate=gate, trained_on=desc, heads=rr.heads or "all", capture=rr.config.capture
    )
    weights.metrics = {"heldout": {r["method"]: {m: r[m] for m in METRICS} for r in rows}, "folds": folds}
    return "\n".join(text), weights


def _what_registering_changes(ndcg: dict[str, float], model_id: str, fingerprint: str) -> str:
    """The presets these weights take over once registered, with their held-out nDCG@10."""
    from ..rerank.fused import signals_only
    from ..rerank.fusion_eval import EQUAL, NO_ATTENTION, WITH_ATTENTION

    now = signals_only(model_id, fingerprint)
    current = "equal weights" if now.model == "equal" else f"registered weights (trained on {now.trained_on})"
    return (
        f"Registered, these weights replace preset signals' current {current} (equal weights: held "
        f"out {ndcg[EQUAL]:.4f}) with their model without attention ({ndcg[NO_ATTENTION]:.4f}), and preset fused "
        f"uses them with attention ({ndcg[WITH_ATTENTION]:.4f}); --no-save keeps what is registered."
    )
