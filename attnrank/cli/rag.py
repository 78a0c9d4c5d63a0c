"""``attnrank prune`` and ``ask``: attention-guided context pruning and answering."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from ..config import DEFAULT_BUDGET_TOKENS
from ..errors import InputError
from ..prune.config import PruneConfig
from ..rerank.config import RerankConfig
from ..types import check_unicode, is_blank
from . import (
    Quiet,
    SkipInvalid,
    Verbose,
    Verify,
    _check_heads,
    _check_index,
    _load_index,
    _positive,
    _read_corpus,
    _setup,
    app,
)
from .options import (
    INDEX_NAME_HELP,
    check_k_within_depth,
    check_model_readable,
    check_pruner_lookups,
    check_registry_lookups,
    refuse_unread_block_options,
    refuse_when_off,
    rerank_and_prune_options,
)
from .prune_options import check_method, prune_options
from .rag_checks import ask_message, check_before_load, check_prune_window, prune_words
from .rerank_config import SHARED_WITH_PRUNING, pruning_config

ASK_DEPTH = 20  # first-stage hits `ask` reranks by default


def _budget(budget_tokens: Optional[int], keep_ratio: Optional[float], default: Optional[int]):
    """(budget_tokens, keep_ratio) from the two exclusive CLI options."""
    if budget_tokens is not None and keep_ratio is not None:
        raise typer.BadParameter("give --budget-tokens or --keep-ratio, not both")
    if budget_tokens is None and keep_ratio is None:
        if default is None:
            raise typer.BadParameter("give --budget-tokens N (sentence tokens to keep) or --keep-ratio R (0 < R <= 1)")
        budget_tokens = default
    if budget_tokens is not None:
        _positive(budget_tokens, "--budget-tokens", "sentence tokens kept")
    if keep_ratio is not None and not 0 < keep_ratio <= 1:
        raise typer.BadParameter(f"--keep-ratio {keep_ratio} must be in (0, 1] (the fraction of tokens kept)")
    return budget_tokens, keep_ratio


def _no_prune_conflicts(
    budget_tokens: Optional[int],
    keep_ratio: Optional[float],
    method: Optional[str],
    prune_heads: Optional[str],
    neighbours: Optional[int] = None,
) -> None:
    """``--no-prune`` with an option that only configures pruning: the user expects a pruning that will not happen."""
    given = [
        name
        for name, value in (
            ("--budget-tokens", budget_tokens),
            ("--keep-ratio", keep_ratio),
            ("--method", method),
            ("--prune-heads", prune_heads),
            ("--neighbours", neighbours),
        )
        if value is not None
    ]
    refuse_when_off("--no-prune", "pruning", given)


def _compression(pruned) -> str:
    """``12.3x compression``, or what keeping nothing is (it printed "infx"), or that the passages
    had no sentence (titles alone: "nothing kept" beside "kept everything" contradicted itself)."""
    if not pruned.original_tokens:
        return "no sentence to prune"
    return "nothing kept" if not pruned.kept_tokens else f"{pruned.compression:.1f}x compression"


def _print_pruned(pruned) -> None:
    kept = pruned.kept
    typer.echo(
        f"kept {len(kept)} of {len(pruned.sentences)} sentences, {pruned.kept_tokens} of "
        f"{pruned.original_tokens} tokens ({_compression(pruned)}; budget "
        f"{pruned.budget_tokens} tokens from {pruned.budget_source}, {pruned.chunks} prompt(s))"
    )
    for note in pruned.notes:
        typer.echo(f"note: {note}")
    # the passages the pruned context holds (PrunedContext.documents, which ask answers from): a
    # passage of a title alone is one of them, and was left out here
    shown = {d.id for d in pruned.documents()}
    for i, doc in enumerate(pruned.docs):
        mine = [s for s in kept if s.doc_index == i]
        if not mine and doc.id not in shown:
            continue
        typer.echo(f"\n[{doc.id}] {doc.title}".rstrip())
        if not mine:
            typer.echo("  (its title alone: no sentence to prune)")
        for s in mine:
            score = "    kept" if math.isnan(s.score) else f"{s.score:+.4f}"  # (NaN: everything kept, nothing scored)
            typer.echo(f"  {score} ({s.tokens:>3} tok) #{s.source_index}: {s.text}")


@app.command()
@prune_options
def prune(
    query: str = typer.Argument(..., help="The question the context is pruned for."),
    corpus: Optional[Path] = typer.Option(
        None, "--corpus", help="Passages to prune (any corpus format); all of them, in file order, form the context."
    ),
    skip_invalid: bool = SkipInvalid,
    name: Optional[str] = typer.Option(
        None, "--index", "-n", help="Or an index name: its top -k hits form the context."
    ),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Or an explicit index folder."),
    k: Optional[int] = typer.Option(None, "--top-k", "-k", help="Hits taken from --index (default 5)."),
    budget_tokens: Optional[int] = typer.Option(
        None, "--budget-tokens", help="Sentence tokens to keep (hard cap; titles not counted)."
    ),
    keep_ratio: Optional[float] = typer.Option(
        None, "--keep-ratio", help="Or the fraction of the context's sentence tokens to keep, in (0, 1]."
    ),
    neighbours: int = typer.Option(
        0, "--neighbours", help="Sentences kept on each side of a chosen one (within the budget)."
    ),
    verify: bool = Verify,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
    prune_config: PruneConfig = None,  # type: ignore[assignment]  # filled in by @prune_options
) -> None:
    """Keep the sentences of passages that the LLM's attention marks as relevant to a question."""
    _setup(quiet, verbose)
    budget, ratio = _budget(budget_tokens, keep_ratio, None)
    if corpus is not None and (k is not None or verify):
        given = "-k" if k is not None else "--verify"
        raise typer.BadParameter(f"{given} applies to --index hits; --corpus prunes all of its passages; drop {given}")
    if corpus is None and skip_invalid:  # (it was ignored)
        raise typer.BadParameter("--skip-invalid applies to --corpus; an index holds only valid records; drop it")
    k = _positive(5 if k is None else k, "-k", "hits taken from the index")
    _positive(neighbours, "--neighbours", "sentences kept on each side", minimum=0)
    if is_blank(query):  # (a zero-width space alone was refused after the model load, in reranking words)
        raise typer.BadParameter("the QUERY is empty; give the question the context is pruned for")
    check_unicode([query], "query")  # before the corpus and the model load
    if (corpus is None) == (name is None and index_dir is None):
        raise typer.BadParameter("give either --corpus PATH or --index NAME / --index-dir DIR")
    with prune_words():
        check_pruner_lookups(prune_config)  # before the corpus or index loads, and the model
    if corpus is not None:  # the input first (the corpus; the index's manifest), then the model
        docs = _read_corpus(corpus, skip_invalid)
    else:
        _check_index(name, index_dir)
        check_model_readable(prune_config.model)  # (a mistyped --model: before the index loads and searches)
    check_prune_window(prune_config)
    if corpus is None:
        docs = _load_index(name, index_dir, verify).search(query, k).documents()
    if not docs:  # (the pruner says so too, but after loading the model)
        raise InputError(f"the index found nothing for {query!r}: no passages to prune; try other words")
    from ..prune.precheck import check_budget_fits  # heavy (torch): only once the input is known good
    from ..prune.pruner import ContextPruner

    with prune_words():  # (the library's advice names its arguments: prune's flags instead)
        # (a budget below every sentence: refused before the model loads, with its tokenizer)
        check_budget_fits(prune_config, query, docs, budget_tokens=budget, keep_ratio=ratio)
        pruner = ContextPruner(config=prune_config)
        pruned = pruner.prune(query, docs, budget_tokens=budget, keep_ratio=ratio, neighbours=neighbours)
        pruned.check_kept()  # (an empty context printed with exit 0 read as a pruned one; ask refused it)
    _print_pruned(pruned)


@app.command()
@rerank_and_prune_options
def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    name: Optional[str] = typer.Option(None, "--index", "-n", help=f"{INDEX_NAME_HELP}."),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Explicit index folder."),
    depth: Optional[int] = typer.Option(
        None, "--depth", help=f"First-stage hits reranked (default {ASK_DEPTH}; none with --no-rerank)."
    ),
    k: int = typer.Option(5, "--top-k", "-k", help="Passages kept after reranking."),
    budget_tokens: Optional[int] = typer.Option(
        None, "--budget-tokens", help="Sentence tokens kept by pruning (default 300)."
    ),
    keep_ratio: Optional[float] = typer.Option(
        None, "--keep-ratio", help="Or the fraction of sentence tokens kept, in (0, 1]."
    ),
    method: Optional[str] = typer.Option(None, help="Pruning method: query (default) | focus | probe."),
    no_rerank: bool = typer.Option(False, "--no-rerank", help="Keep the first-stage order."),
    no_prune: bool = typer.Option(False, "--no-prune", help="Give the whole passages to the generator."),
    reorder: bool = typer.Option(
        False,
        "--reorder",
        help="Place passages at the model's highest-attention slots (registered raw-attention profile).",
    ),
    generator_model: Optional[str] = typer.Option(
        None, "--generator-model", help="Another LLM for the answer (default: --model)."
    ),
    prune_heads: Optional[str] = typer.Option(
        None, "--prune-heads", help="Heads that score sentences: 'all' (default), 'auto', 'l-h,l-h' or a JSON file."
    ),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Answer length limit in tokens."),
    neighbours: Optional[int] = typer.Option(
        None,
        "--neighbours",
        help="Pruning: sentences kept on each side of a chosen one (within the budget; default 0).",
    ),
    verify: bool = Verify,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
    rerank_config: RerankConfig = None,  # type: ignore[assignment]  # filled in by @rerank_and_prune_options
    rerank_given: frozenset[str] = frozenset(),  # filled in by @rerank_and_prune_options
) -> None:
    """Answer a question: retrieve, rerank, prune sentences by attention, generate (streamed).

    The reranking options configure the reranker alone (given without --preset, an attention option such
    as --no-calibrate chooses an attention preset, as in search); the pruner shares only --model,
    --device, --dtype, --attention, --block-positions and --state-cache-mb, and reads its own
    --method, --prune-heads, --budget-tokens, --keep-ratio and --neighbours."""
    _setup(quiet, verbose)
    if no_prune:
        _no_prune_conflicts(budget_tokens, keep_ratio, method, prune_heads, neighbours)
    neighbours = _positive(
        0 if neighbours is None else neighbours, "--neighbours", "sentences kept on each side", minimum=0
    )
    rerank_only = sorted(rerank_given - set(SHARED_WITH_PRUNING))
    if no_rerank:  # (--depth was ignored: the first stage's top -k is kept)
        refuse_when_off("--no-rerank", "reranking", rerank_only + (["--depth"] if depth is not None else []))
    depth = (max(k, ASK_DEPTH) if no_rerank else ASK_DEPTH) if depth is None else depth  # (the pipeline: k <= depth)
    budget, ratio = _budget(budget_tokens, keep_ratio, DEFAULT_BUDGET_TOKENS)
    _positive(depth, "--depth", "first-stage hits")
    _positive(k, "-k", "passages kept after reranking")
    check_k_within_depth(k, depth, "kept")
    _positive(max_new_tokens, "--max-new-tokens", "answer length in tokens")
    from ..generate import check_answer_room  # heavy (torch), as the model checks below

    try:  # under the generator's context, before the index and the models load
        check_answer_room(max_new_tokens, generator_model or rerank_config.model)
    except InputError as e:
        raise typer.BadParameter(str(e).replace("max_new_tokens=", "--max-new-tokens ", 1)) from None
    method = check_method(method or "query", {"--prune-heads": prune_heads})
    _check_heads(prune_heads, "--prune-heads", model=rerank_config.model)
    if is_blank(question):
        raise typer.BadParameter("the QUESTION is empty; give a question")
    check_unicode([question], "question")
    cfg = rerank_config
    # one --attention (--block-positions, --state-cache-mb) for both attention stages where given
    prune_cfg = pruning_config(cfg, rerank_given, method=method, heads=prune_heads or "all")
    if no_rerank:  # only the pruner could read them, and only in block mode
        if no_prune:
            refuse_when_off("--no-rerank --no-prune", "both attention stages", sorted({"--attention"} & rerank_given))
        if no_prune and generator_model is not None and "--model" in rerank_given:  # (answered, --model unread)
            raise typer.BadParameter(
                "--model is read by no stage: --no-rerank and --no-prune leave the answer alone, which "
                "--generator-model gives; drop --model or --generator-model"
            )
        refuse_unread_block_options(rerank_given, not no_prune and prune_cfg.attention == "block")
    elif no_prune and not cfg.uses_attention:  # (a reranker without attention left them to the pruner)
        refuse_when_off("--no-prune", "pruning", sorted({"--attention", "--block-positions"} & rerank_given))
    _check_index(name, index_dir)  # (the input first, then the models, before the index loads)
    # (the shared model runs, or its registered weights are read: preset signals reads them by its id)
    if not no_rerank or not no_prune or generator_model is None:
        check_model_readable(cfg.model)
    if generator_model is not None:
        check_model_readable(generator_model)
    from ..pipeline.checks import check_reorder  # heavy (torch), as the model checks below

    # the generator's model's registered slot profile (generation reads the passages in that order)
    check_reorder(reorder, generator_model or cfg.model, k)
    if not no_prune:
        with prune_words():
            check_pruner_lookups(prune_cfg)
    if not no_rerank:
        check_registry_lookups(cfg)
    retriever = _load_index(name, index_dir, verify)
    searched = check_before_load(
        retriever,
        question,
        cfg,
        prune_cfg,
        depth=depth,
        k=k,
        budget=budget,
        ratio=ratio,
        no_rerank=no_rerank,
        no_prune=no_prune,
    )
    from ..pipeline import Pipeline  # heavy (torch): only once the input is known good

    pipe = Pipeline.from_model(
        retriever,
        cfg.model,
        generator_model=generator_model,
        rerank=False if no_rerank else cfg,
        prune=False if no_prune else prune_cfg,
        reorder=reorder,  # (checked above; each run reads the profile for the passages it keeps)
        max_new_tokens=max_new_tokens,
        depth=depth,
        top_k=k,
        neighbours=neighbours,
        dtype=cfg.dtype,
        device=cfg.device,
    )
    if no_prune:  # the default budget sizes nothing (budget options with --no-prune were refused above)
        budget = ratio = None
    begun: list[bool] = []

    def head() -> None:  # (once the answer begins or the run ends: not before a refusal of its prompt)
        if not begun:
            typer.echo(f"Q: {question}\nA: ", nl=False)
            begun.append(True)

    def stream(piece: str) -> None:
        head()
        typer.echo(piece, nl=False)

    found, retrieve_s = searched or (None, 0.0)
    try:  # (the hits the checks searched for, if any: the first stage is not searched twice)
        res = pipe.run(question, found, budget_tokens=budget, keep_ratio=ratio, stream=stream)
    except InputError as e:  # (named as ask's options: the library's advice names its arguments)
        raise InputError(ask_message(e, no_prune, k)) from None
    timings = res.timings if found is None else {"retrieve": retrieve_s, **res.timings}
    timings["total"] += retrieve_s
    head()
    typer.echo("")
    if res.pruned is not None:
        p = res.pruned
        typer.echo(f"[context] {p.kept_tokens} of {p.original_tokens} sentence tokens kept ({_compression(p)})")
        for note in p.notes:  # (e.g. a top sentence left out for room, which prune prints too)
            typer.echo(f"[note] {note}")
    if res.answer is not None and res.answer.truncated:
        typer.echo(f"[note] the answer reached --max-new-tokens {max_new_tokens} before its end; raise it")
    typer.echo("[sources]")
    for i, d in enumerate(res.context, start=1):
        typer.echo(f"  {i}. {d.id}" + (f" ({d.title})" if d.title else "") + f": {d.text[:100]}")
    typer.echo("[timings] " + ", ".join(f"{k_} {v:.2f} s" for k_, v in timings.items()))
