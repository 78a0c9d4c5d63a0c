"""``attnrank train``: train a preset's fusion weights on your own labelled queries, report them
held out, then register them for the model.

- ``--preset likelihood`` (the default preset): weights over the candidates' BM25, dense cosine,
  first-stage rank and the LLM's query likelihood given each (UPR). Registered, they replace the
  preset's untrained equal weights over BM25, dense and the likelihood, but only if they did not
  score below those in the k-fold report (a tie registers them; else nothing is registered and the
  report says so). The report estimates the gain; it does not guarantee it (docs/benchmarks.md:
  nested in-domain, this rule lost 0.3 nDCG@10 points on SciFact and gained up to 1.3 elsewhere).
- ``--preset signals``: weights over BM25, dense and rank alone, by the same rule against the
  preset's equal weights over BM25 and dense; no LLM is loaded or run (the model names which
  model's registry entry they go to; ``--device``/``--dtype`` set the candidates' embedder, as
  the preset's reranker sets it).
- ``--preset fused``: the attention score (the chosen heads, calibrated) with BM25, dense and
  rank; ``--preset fused`` reads them, and the preset ``signals``, unless it has weights of its
  own, reads their model without attention (``base_weights``, trained alongside), where one was
  kept and it did not score below equal weights in the report (else equal weights).

Candidates and labels come as for ``heads train``: BEIR/TREC qrels with queries and a corpus
(candidates from a TREC run, else BM25 top-``--depth``), or a shared data set; or, here, an index
(``--index``/``--index-dir``): its own search's top ``--depth`` hits, as ``search --rerank``
reranks them. Per query the LLM score (likelihood or attention, where the preset has one) and the
candidates' BM25, dense cosine and first-stage rank are computed once; the report is k-fold over
queries (trained on the training folds, tested on the held-out fold), against each first-stage
signal alone and the untrained equal weights, with per-query wins/losses and a sign test. The registered weights are then trained on all queries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from ..config import check_precision_names
from ..errors import InputError
from ..llm.prompts import DEFAULT_MAX_DOC_WORDS
from ..registry import load_artifact
from ..rerank.config import ATTENTION_PRESET, AUTO_OR_ALL, DEFAULT_PRESET, LIKELIHOOD_PRESET, SIGNALS_PRESET
from ..rerank.fused import ATTENTION, LIKELIHOOD, SignalsWeights
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
    Save,
    SkipInvalid,
    TrainRun,
    Verbose,
    _check_heads,
    _index_path,
    _setup,
    app,
    option_errors,
)
from .labelled import LabelledSource, check_labelled, check_saveable, check_training, labelled_set
from .options import INDEX_NAME_HELP, Dtype, check_model_readable

METRICS = ("nDCG@10", "RR@10")
PRESETS = (LIKELIHOOD_PRESET, SIGNALS_PRESET, ATTENTION_PRESET)  # the presets whose weights train fits
FEW_QUERIES = 80  # below this, the report warns (bench_likelihood's curve: up to -2.7 points below 80)
# Said wherever a report's figures also chose between trained and equal weights: the choice read
# the same held-out folds (on synthetic sets, the weights kept for a +0.96 held-out gain lost 0.45
# points on new queries), so the chosen figure is not a clean estimate.
CHOSEN_ON_THESE = (
    "The choice between trained and equal weights was made on these same held-out figures, which flatters "
    "the one chosen; a few hundred queries keep that small."
)


@app.command("train")
def train(
    model: Optional[str] = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    preset: str = typer.Option(
        DEFAULT_PRESET,
        "--preset",
        help="likelihood (the default preset: BM25, dense, rank and the LLM's query likelihood) | signals (BM25, "
        "dense and rank; no LLM run) | fused (attention with BM25, dense and rank).",
    ),
    heads: Optional[str] = typer.Option(
        None,
        "--heads",
        help="--preset fused: heads of the attention feature: auto-or-all (default: those preset fused reads: its "
        "weights', else the registered set), all, 'l-h,...'.",
    ),
    data: Optional[Path] = Data,
    dataset: Optional[str] = Dataset,
    queries: Optional[Path] = Queries,
    qrels: Optional[Path] = Qrels,
    corpus: Optional[Path] = Corpus,
    skip_invalid: bool = SkipInvalid,
    run: Optional[Path] = TrainRun,
    index_name: Optional[str] = typer.Option(
        None,
        "--index",
        "-n",
        help=f"{INDEX_NAME_HELP}: its search's top --depth hits are the candidates (with --run: the run's, "
        "their texts the index's).",
    ),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Explicit index folder instead of --index."),
    depth: int = typer.Option(20, "--depth", help="Candidates per query (the reranking depth)."),
    max_queries: int = typer.Option(0, "--max-queries", help="Labelled queries used (0: all)."),
    rel: Optional[int] = Rel,
    learner: str = typer.Option(
        "pointwise",
        "--learner",
        help="pointwise (logistic regression) | pairwise (RankNet) | listwise (nDCG@10 over a weight grid) "
        "| equal (weight 1 on every feature, rank included; with --preset fused only the confidence gate is "
        "chosen).",
    ),
    l2: Optional[float] = typer.Option(
        None, "--l2", help="L2 penalty λ of pointwise and pairwise (sklearn C = 1/λ; default 1)."
    ),
    gate: Optional[bool] = typer.Option(
        None,
        "--gate/--no-gate",
        help="--preset fused: fall back to the first-stage signals where attention is not confident (default on).",
    ),
    folds: int = Folds,
    seed: int = FoldSeed,
    max_doc_words: Optional[int] = typer.Option(
        None, "--max-doc-words", min=1, help="Words kept per passage in the LLM's prompt (default 300)."
    ),
    device: str = Device,
    dtype: str = Dtype,
    save: bool = Save,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
) -> None:
    """Train a preset's fusion weights on labelled queries; print a held-out report, then register them."""
    from ..errors import require
    from ..rerank.fused_training import LEARNERS, fusion_examples

    progress = _setup(quiet, verbose)
    require("sklearn", "train", "attnrank train")  # before any model is loaded
    preset = _check_preset(preset, heads, gate, max_doc_words)
    # (with --preset signals no LLM runs; they set the candidates' embedder, as the preset's reranker's)
    with option_errors():  # (found by load_llm, after the labelled set was read and searched)
        check_precision_names(device, dtype)
    max_doc_words = max_doc_words or DEFAULT_MAX_DOC_WORDS
    l2 = check_training(learner, LEARNERS, l2, folds, depth, default_l2=1.0)
    _check_heads(heads, model=model)
    index = None if index_name is None and index_dir is None else _index_path(index_name, index_dir)
    check_model_readable(model)  # (before the labelled set is read: a mistyped --model named at once)
    from ..rerank.fused_resolve import current_label, likelihood_weights, signals_only
    from ..rerank.resolve import check_registered_heads

    def check_registry() -> None:  # what the save and a registered head set need (hashing the model's weights)
        check_saveable(model, save)
        if preset == ATTENTION_PRESET:  # a registered set named
            check_registered_heads(model, heads)

    if index is not None:  # the labelled set loads the index's embedder and searches every query: checked first
        check_registry()
    qs, cands, qr, rel, desc = labelled_set(
        LabelledSource(dataset, data, queries, qrels, corpus, run, depth, max_queries, rel, skip_invalid, index)
    )
    check_labelled(qs, cands, qr, rel, folds, seed, depth)
    if index is None:  # (after the labelled set's own checks, as before: nothing hashed for a refused input)
        check_registry()

    if preset == ATTENTION_PRESET:
        rr = _attention_alone(model, heads or AUTO_OR_ALL, max_doc_words, device, dtype)
        key = (rr.llm.model_id, rr.llm.fingerprint)
        # before the long part: what preset signals reads now (empty: its own SignalsWeights, which
        # these weights never replace, loadable or not)
        own = load_artifact(SignalsWeights.KIND, *key, user_only=True) is not None
        current = "" if own else current_label(signals_only, *key)
        # (the candidates' dense signal embedded as the reranker embeds it: bfloat16 where its model runs so)
        examples = fusion_examples(
            {ATTENTION: rr.score}, qs, cands, qr, rel=rel, group=desc, signals=rr.signals, progress=progress
        )
        report, weights = _report_and_fit(
            examples, learner, l2, gate is not False, folds, seed, desc, rr, current, heads or AUTO_OR_ALL
        )
    else:  # the presets whose untrained model is equal weights: likelihood (an LLM feature) and signals
        scorers, key, adapter, signals = _llm_scorers(preset, model, max_doc_words, device, dtype)
        current = current_label(likelihood_weights if scorers else signals_only, *key)
        examples = fusion_examples(scorers, qs, cands, qr, rel=rel, group=desc, signals=signals, progress=progress)
        report, weights = _fit_unless_worse(examples, preset, learner, l2, folds, seed, desc, key[0], current, adapter)
    if save and weights is not None:  # (all 0: the report reads as if they were registered, then the save failed)
        try:
            weights.check_informative()
        except InputError as e:
            typer.echo(report)
            raise InputError(f"not registered: {e}") from None
    typer.echo(report)
    if weights is not None and weights.uses_llm:
        weights.max_doc_words = max_doc_words  # the cut their LLM feature was read with
    if save and weights is not None:
        typer.echo(f"saved to {weights.save(*key)}")


def _check_preset(preset: str, heads: str | None, gate: bool | None, max_doc_words: int | None) -> str:
    """The preset (any case), refused unless train fits it, or with an attention option given for
    a preset that computes no attention (likelihood, signals), or a passage cut for the one that
    runs no LLM (signals)."""
    chosen = preset.strip().lower()
    if chosen not in PRESETS:
        raise typer.BadParameter(f"--preset {preset!r} is not one of {', '.join(PRESETS)} (the presets train fits)")
    given = [o for o, v in (("--heads", heads), ("--gate/--no-gate", gate)) if v is not None]
    if chosen == SIGNALS_PRESET and max_doc_words is not None:
        raise typer.BadParameter(
            f"--max-doc-words {max_doc_words} cuts the LLM's prompts, which --preset signals does not run; drop it"
        )
    if chosen != ATTENTION_PRESET and given:
        raise typer.BadParameter(
            f"{', '.join(given)} configure(s) attention, which --preset {chosen} does not compute; "
            "drop them, or train --preset fused"
        )
    return chosen


def _llm_scorers(
    preset: str, model: str | None, max_doc_words: int, device: str, dtype: str
) -> tuple[dict, tuple, str, Any]:
    """({feature: score(query, docs)} of the LLM features ``preset`` fuses, (model id, fingerprint),
    the model's head adapter (``LLM.adapter``, which the weights record), the signals' computer as
    the preset's reranker sets it up: its embedder's device and precision):
    for ``likelihood`` the query likelihood as the preset computes it (its equal weights given, so
    weights registered for the model are not read, or refused, here); for ``signals`` none, and
    no model is loaded (the weights are registered under its id and fingerprint)."""
    from ..llm.models import unloaded_model
    from ..rerank.attention import AttentionReranker
    from ..rerank.fused import LIKELIHOOD_FEATURES, equal_weights
    from ..rerank.signals import SignalComputer, signal_embedder_setup

    if preset == SIGNALS_PRESET:
        return {}, unloaded_model(model), "", SignalComputer(None, *signal_embedder_setup(device, dtype))
    rr = AttentionReranker(
        model,
        config=LIKELIHOOD_PRESET,
        signals=equal_weights(LIKELIHOOD_FEATURES),
        max_doc_words=max_doc_words,
        device=device,
        dtype=dtype,
    )
    return {LIKELIHOOD: rr.likelihood}, (rr.llm.model_id, rr.llm.fingerprint), rr.llm.adapter, rr.signals


def _attention_alone(model: str | None, heads: str, max_doc_words: int, device: str, dtype: str) -> Any:
    """Preset fused's attention, alone: captured as the preset captures it, from ``heads`` (for
    ``auto-or-all``, the heads its current weights for the model were fitted to, if they record
    them); the weights are fitted to it."""
    from ..llm.models import unloaded_model
    from ..rerank.attention import AttentionReranker
    from ..rerank.fused_resolve import fitted_heads

    chosen: Any = heads
    if heads.strip().lower() == AUTO_OR_ALL:
        try:
            chosen = fitted_heads(*unloaded_model(model)) or heads
        except InputError as e:  # registered weights that no longer load: training replaces them
            typer.echo(f"The fused weights registered for the model do not load ({e}); reading {heads} instead.")
    return AttentionReranker(
        model, chosen, config="fused", signals=None, max_doc_words=max_doc_words, device=device, dtype=dtype
    )


def _table(rows: list[dict[str, Any]], header: str) -> list[str]:
    from ..eval.report import md_table

    return [
        header,
        "",
        md_table(rows, ["method", *METRICS, "Δ", "wins", "losses", "p"], {"Δ": "+.1f", "p": ".3f"}),
        "",
        f"Δ: nDCG@10 points against the best first-stage signal ({rows[0]['best first stage']}); "
        "wins/losses per query against it; p: two-sided sign test.",
        "",
    ]


def _fit_unless_worse(examples, preset, learner, l2, folds, seed, desc, model_id, current, adapter) -> tuple[str, Any]:
    """(the held-out report text, the weights trained on all ``examples``, or None where they scored
    below the untrained equal weights held out: the preset keeps what it reads now, ``current``)."""
    from ..rerank.fusion_eval import TRAINED, fit_unless_worse, own_untrained

    feature = LIKELIHOOD if preset == LIKELIHOOD_PRESET else None
    rows, weights = fit_unless_worse(
        examples,
        feature,
        folds=folds,
        seed=seed,
        learner=learner,
        l2=l2,
        trained_on=desc,
        metrics=METRICS,
        adapter=adapter,
    )
    what = f"query likelihood of {model_id}" if feature else f"first-stage signals only (no LLM run; for {model_id})"
    header = f"held-out {folds}-fold over {len(examples)} queries ({desc}); trained on the training folds only; {what}"
    ndcg = {r["method"]: r["nDCG@10"] for r in rows}
    trained, untrained = ndcg[TRAINED[feature][0]], ndcg[own_untrained(feature)[0]]
    if weights is None:
        last = (
            f"Not registered: held out, the trained weights ({trained:.4f}) score below the untrained equal weights "
            f"({untrained:.4f}), so preset {preset} keeps its current {current}."
        )
    else:
        last = (
            f"Registered, these weights replace the current {current} of preset {preset} (equal weights: held out "
            f"{untrained:.4f}) with the trained fusion ({trained:.4f}); --no-save keeps what is registered."
        )
    return "\n".join([*_table(rows, header), *_few_queries(len(examples)), last, CHOSEN_ON_THESE]), weights


def _few_queries(n: int, fused: bool = False) -> list[str]:
    """The report's caveat where ``n`` labelled queries are fewer than :data:`FEW_QUERIES`
    (``fused``: for preset fused, whose weights are registered whatever the report shows)."""
    if n >= FEW_QUERIES:
        return []
    measured = (
        "Measured nested on four datasets (docs/results/likelihood_avx512_bf16.md, by the number of labelled "
        "queries), what the rule of preset likelihood registered with 10-40 queries lost up to 1.4 nDCG@10 points "
        "on held-out queries on average over fold shuffles, 2.7 in the worst; from 80 on, at most 0.2 on "
        "average, 0.3 in the worst."
    )
    if fused:  # (no register-unless-worse rule here: the measurement above is another preset's)
        measured = (
            "Preset fused registers its trained weights whatever this report shows (no rule keeps the untrained "
            "ones): read the held-out rows before keeping them, or pass --no-save."
        )
    return [f"Few labelled queries ({n} < {FEW_QUERIES}): the report is noisy. {measured}", ""]


def _fused_scored_below(ndcg: dict[str, float], n: int) -> list[str]:
    """Where the held-out fusion with attention scored below the same fusion without it or equal
    weights, the report says so and that preset fused registers it all the same (with fewer than
    :data:`FEW_QUERIES` queries :func:`_few_queries` says the latter for every report)."""
    from ..rerank.fusion_eval import EQUAL, NO_ATTENTION, WITH_ATTENTION

    better = max((NO_ATTENTION, EQUAL), key=lambda m: ndcg.get(m, float("-inf")))
    if n < FEW_QUERIES or better not in ndcg or ndcg[WITH_ATTENTION] >= ndcg[better]:
        return []
    return [
        f"Held out, the fusion with attention ({ndcg[WITH_ATTENTION]:.4f}) scored below {better} "
        f"({ndcg[better]:.4f}); preset fused registers its trained weights whatever this report shows (no rule "
        "keeps the current ones): pass --no-save to keep what is registered.",
        "",
    ]


def _report_and_fit(examples, learner, l2, gate, folds, seed, desc, rr, current: str, heads: str) -> tuple[str, Any]:
    """(the held-out report text, the weights trained on all ``examples``); ``heads``: the head
    spec the attention feature was read with."""
    from ..rerank.fused_training import train_fused
    from ..rerank.fusion_eval import kfold_rows, recorded_metrics

    rows = kfold_rows(examples, ATTENTION, folds=folds, seed=seed, learner=learner, l2=l2, gate=gate, metrics=METRICS)
    n_heads = "all" if rr.heads is None else len(rr.heads)
    header = (
        f"held-out {folds}-fold over {len(examples)} queries ({desc}); trained on the training folds only; "
        f"attention: {n_heads} heads of {rr.llm.model_id}"
    )
    if rr.heads is not None and heads.strip().lower().startswith("auto"):
        # (a registered set, or the fused weights' heads, may have been picked on these very queries)
        header += (
            f". The heads ({heads}) were chosen before these folds, on whatever data chose them: where that "
            "data holds these queries, the rows with attention are held out for the weights but not for the heads"
        )
    weights = train_fused(
        examples,
        learner=learner,
        l2=l2,
        gate=gate,
        trained_on=desc,
        heads=rr.heads or "all",
        capture=rr.config.capture,
        adapter=rr.llm.adapter,
        prompt=rr.config.prompt_settings(),
    )
    weights.metrics = recorded_metrics(rows, METRICS, folds, seed=seed, n_queries=len(examples))
    ndcg = {r["method"]: r["nDCG@10"] for r in rows}
    no_base = (
        weights.uses_attention and not weights.base_weights
    )  # (came out all 0: preset signals keeps equal weights)
    text = [*_table(rows, header), *_few_queries(len(examples), fused=True), *_fused_scored_below(ndcg, len(examples))]
    text.append(_what_registering_changes(ndcg, current, weights.base_scored_below_equal(), no_base))
    # (preset signals took the model without attention, or kept equal weights, by these figures)
    if current and not no_base:
        text.append(CHOSEN_ON_THESE)
    return "\n".join(text), weights


def _what_registering_changes(ndcg: dict[str, float], current: str, base_below_equal: bool, no_base: bool) -> str:
    """The presets these weights take over once registered, with their held-out nDCG@10 (``current``:
    what preset signals reads now, empty where it reads its own SignalsWeights, which these leave;
    ``base_below_equal``: their model without attention scored below equal weights, so preset
    signals does not read it, :meth:`~attnrank.rerank.fused.FusedWeights.base_scored_below_equal`;
    ``no_base``: they keep no model without attention (it came out all 0), so preset signals reads
    equal weights)."""
    from ..rerank.fusion_eval import EQUAL, NO_ATTENTION, WITH_ATTENTION

    if not current:
        signals = "leave preset signals its own registered weights (--preset signals), and"
    elif no_base:
        signals = (
            f"keep no model without attention (trained on every query it came out all 0), so preset signals "
            f"uses equal weights (held out {ndcg[EQUAL]:.4f}), and"
        )
    elif base_below_equal:
        signals = (
            f"make preset signals use equal weights (held out {ndcg[EQUAL]:.4f}; their model without attention "
            f"scored {ndcg[NO_ATTENTION]:.4f}, below them), and"
        )
    else:
        signals = (
            f"replace preset signals' current {current} (equal weights: held out {ndcg[EQUAL]:.4f}) with their "
            f"model without attention ({ndcg[NO_ATTENTION]:.4f}), and"
        )
    return (
        f"Registered, these weights {signals} preset fused uses them with attention ({ndcg[WITH_ATTENTION]:.4f}); "
        "the default preset likelihood keeps its weights; --no-save keeps what is registered."
    )
