"""``attnrank rerank``: rerank a first-stage TREC run with attnrank's reranker (the default preset
fuses BM25, dense and the LLM's query likelihood)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import AttnrankError
from ..files import RUN_GUARD
from ..rerank.config import RerankConfig
from ..types import Document
from . import (
    Quiet,
    SkipInvalid,
    Verbose,
    Verify,
    _check_output,
    _check_rerank_prompts,
    _index_path,
    _load_index,
    _positive,
    _read_corpus,
    _rerank_heads,
    _setup,
    app,
)
from .options import check_model_readable, check_queries_fit, check_registry_lookups, rerank_options


@app.command()
@rerank_options
def rerank(
    run: Path = typer.Option(..., "--run", help="First-stage TREC run file to rerank."),
    queries: Path = typer.Option(..., "--queries", help="BEIR queries.jsonl or TSV id<TAB>text."),
    corpus: Optional[Path] = typer.Option(
        None, "--corpus", help="Corpus with the run's documents (any supported format)."
    ),
    name: Optional[str] = typer.Option(None, "--index", "-n", help="Or an index name whose documents to use."),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Or an explicit index folder."),
    skip_invalid: bool = SkipInvalid,
    depth: int = typer.Option(20, "--depth", help="Rerank the top K of each query (the rest keeps its order below)."),
    output: Path = typer.Option(..., "--output", "-o", help="Reranked TREC run file."),
    verify: bool = Verify,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
    rerank_config: RerankConfig = None,  # type: ignore[assignment]  # filled in by @rerank_options
) -> None:
    """Rerank a TREC run (default preset: BM25, dense and the LLM's query likelihood) and write a TREC run."""
    from ..eval import read_run, trec_order, write_run
    from ..queries import load_queries
    from ..types import RankedResults, ScoredDocument

    progress = _setup(quiet, verbose)
    _positive(depth, "--depth", "passages reranked per query")
    _check_output(output, {"--run": run, "--queries": queries, "--corpus": corpus})
    if corpus is not None and (name is not None or index_dir is not None):
        raise typer.BadParameter("give --corpus PATH or --index NAME / --index-dir DIR, not both")
    if corpus is None and name is None and index_dir is None:  # (the message named the index options alone)
        raise typer.BadParameter("give the run's documents: --corpus PATH, or --index NAME / --index-dir DIR")
    unread = (
        "--verify" if corpus is not None and verify else "--skip-invalid" if corpus is None and skip_invalid else ""
    )
    if unread:  # (each was ignored: --verify checks an index, --skip-invalid reads a corpus file)
        raise typer.BadParameter(f"{unread} applies to {'an index' if unread == '--verify' else '--corpus'}; drop it")
    check_registry_lookups(rerank_config)  # what the reranker reads from the head registry: before any load
    qs, first = load_queries(queries), read_run(run)
    index = None
    if corpus is not None:
        docs = {d.id: d for d in _read_corpus(corpus, skip_invalid)}
    else:
        check_model_readable(rerank_config.model)  # (a mistyped --model: named before the index loads)
        index = _load_index(name, index_dir, verify)
        docs = {d.id: d for d in index.docs}
    # the first-stage order trec_eval scores for this run
    ordered_runs = {qid: trec_order(ranking) for qid, ranking in first.items()}
    _check_run(ordered_runs, qs, docs, queries, depth)  # every query and reranked document, before the model loads
    if index is None:  # (over an index it was checked before the index loaded)
        check_model_readable(rerank_config.model)  # (after the input files, as every command checks them first)
    check_queries_fit(rerank_config, {qid: qs[qid] for qid in ordered_runs})  # (the tokenizer's, before the model)
    runs = [
        RankedResults(
            qs[qid],
            [  # (below --depth only the id and score are written: a document there may be missing)
                ScoredDocument(d, s, r, *_text(docs.get(d)), {"first_stage": s})
                for r, (d, s) in enumerate(ordered, start=1)
            ],
            qid,
        )
        for qid, ordered in ordered_runs.items()
    ]
    _check_rerank_prompts(rerank_config, runs, depth)  # (the tokenizer's, before the model)
    from ..rerank.attention import AttentionReranker
    from ..rerank.over_index import index_reranker

    # over an index, as search --rerank: its stored passage states and its vectors for the dense signal
    reranker = (
        AttentionReranker(config=rerank_config)
        if index is None
        else index_reranker(rerank_config, _index_path(name, index_dir), index)
    )
    out = _rerank_heads(reranker, runs, depth, progress)
    # the run's tag names the preset that ranked it; the guard checks -o again, as it is replaced
    write_run(out, output, tag=f"attnrank-{rerank_config.name}", guard=RUN_GUARD)
    deepest = max((min(depth, len(r)) for r in first.values()), default=0)
    typer.echo(f"reranked up to the top {deepest} of each of {len(out)} queries into {output}")


def _text(doc: Document | None) -> tuple[str, str]:
    return ("", "") if doc is None else (doc.text, doc.title)


def _check_run(ordered: dict, qs: dict, docs: dict, queries: Path, depth: int) -> None:
    """Every query of the run (``ordered``: each query's ``(doc id, score)`` in rank order) must be
    in the queries file, and every document of its top ``depth`` (those reranked; the rest keeps
    its place by id and score) in the corpus/index."""
    for qid, ranking in ordered.items():
        if qid not in qs:
            raise AttnrankError(f"query {qid!r} of the run is not in {queries}; give the matching queries file")
        missing = [d for d, _ in ranking[:depth] if d not in docs]
        if missing:
            raise AttnrankError(
                f"document {missing[0]!r} (query {qid!r}) of the run is not in the corpus/index; give the matching one"
            )
