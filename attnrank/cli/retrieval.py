"""``attnrank index``, ``search`` and ``eval``: the first stage and its evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import Quiet, Verbose, _index_path, _print_results, _rerank_head, _setup, app


@app.command()
def index(
    corpus: Path = typer.Argument(..., help="BEIR folder, .jsonl, .csv/.tsv, or a folder of .txt/.md files."),
    name: Optional[str] = typer.Option(None, "--name", "-n", help="Index name (stored in ./indexes/NAME)."),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Explicit index folder instead of --name."),
    dense_index: str = typer.Option("flat", help="FAISS index type: flat | hnsw | ivf."),
    embedder: Optional[str] = typer.Option(None, help="sentence-transformers model id or path (default: packaged all-MiniLM-L6-v2)."),
    stemmer: str = typer.Option("auto", help="BM25 stemming: porter | none | auto (porter if PyStemmer is installed)."),
    stopwords: str = typer.Option("lucene", help="BM25 stopwords: lucene | sklearn | none."),
    skip_invalid: bool = typer.Option(False, "--skip-invalid", help="Skip bad records (reported) instead of failing."),
    shards: int = typer.Option(0, "--shards", help="Build N shards with global BM25 statistics (0 = one ordinary index)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="With --shards: Ray cluster address, or 'local'."),
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Build a BM25 + dense index over a corpus (written atomically)."""
    from ..corpus import load_corpus
    from ..index.retriever import HybridRetriever

    progress = _setup(quiet, verbose)
    target = _index_path(name, index_dir)
    docs, report = load_corpus(corpus, skip_invalid=skip_invalid)
    if report.skipped:
        typer.echo(f"skipped {len(report.skipped)} invalid record(s):", err=True)
        for where, why in report.skipped[:20]:
            typer.echo(f"  {where}: {why}", err=True)
    r = HybridRetriever(embedder=embedder, dense_index=dense_index, stemmer=stemmer, stopwords=stopwords)
    if shards:  # issue 17: sharded build (attnrank.cli.batch)
        from .batch import build_sharded

        typer.echo(build_sharded(docs, target, shards, r, ray_address))
        return
    r.index(docs, show_progress=progress).save(target)
    typer.echo(f"indexed {r.num_docs} documents into {target}")


@app.command()
def search(
    query: Optional[str] = typer.Argument(None, help="One query (or use --queries FILE)."),
    name: Optional[str] = typer.Option(None, "--index", "--name", "-n", help="Index name under ./indexes."),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Explicit index folder."),
    queries: Optional[Path] = typer.Option(None, "--queries", help="BEIR queries.jsonl or TSV id<TAB>text."),
    k: int = typer.Option(10, "--k", "-k", help="Results per query."),
    mode: Optional[str] = typer.Option(None, help="bm25 | dense | hybrid (default: the index's setting, hybrid)."),
    fusion: Optional[str] = typer.Option(None, help="rrf | convex."),
    alpha: Optional[float] = typer.Option(None, help="Convex fusion weight of the dense scores, in [0, 1]."),
    norm: Optional[str] = typer.Option(None, help="Convex fusion normalisation: minmax | zscore | none."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write a TREC run file."),
    rerank: int = typer.Option(0, "--rerank", help="Rerank the top K hits with the attention reranker (0 = off)."),
    model: Optional[str] = typer.Option(None, help="LLM for --rerank: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    heads: Optional[str] = typer.Option(None, help="Heads for --rerank: 'all', 'l-h,l-h', or a JSON file."),
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Search an index with one query (printed) or a queries file (TREC run file)."""
    from ..corpus import load_queries
    from ..eval import write_run
    from ..index.retriever import HybridRetriever

    progress = _setup(quiet, verbose)
    if (query is None) == (queries is None):
        raise typer.BadParameter("give either one QUERY or --queries FILE")
    r = HybridRetriever.load(_index_path(name, index_dir))
    if fusion or alpha is not None or norm:
        r.set_fusion(fusion or r.fusion, alpha=alpha, norm=norm)
    qs = {"q1": query} if query is not None else load_queries(queries)
    results = r.search_batch(qs, max(k, rerank), mode=mode, show_progress=progress and len(qs) > 1)
    if rerank > 0:
        from ..rerank.attention import AttentionReranker

        reranker = AttentionReranker(model, heads, show_progress=progress and len(qs) > 1)
        results = [_rerank_head(reranker, res, rerank).top_k(k) for res in results]
    if output is not None:
        write_run(results, output, tag=f"attnrank-{mode or r.mode}")
        typer.echo(f"wrote {sum(len(x) for x in results)} results for {len(results)} queries to {output}")
    elif query is not None:
        _print_results(results[0])
    else:
        for res in results:
            typer.echo(f"# {res.query_id}: {res.query}")
            _print_results(res)


@app.command("eval")
def eval_cmd(
    run: Path = typer.Argument(..., help="TREC run file."),
    qrels: Path = typer.Argument(..., help="TREC qrels or BEIR qrels .tsv (or a BEIR folder)."),
    metrics: str = typer.Option("nDCG@10,R@20,R@100,RR@10", help="Comma-separated ir-measures names."),
    rel: int = typer.Option(1, help="Minimum label counted relevant by binary metrics (2 for TREC DL)."),
) -> None:
    """Evaluate a run file against qrels (ir-measures)."""
    from ..eval import evaluate, read_qrels, read_run

    _setup(True)
    values = evaluate(read_run(run), read_qrels(qrels), [m.strip() for m in metrics.split(",") if m.strip()], rel=rel)
    for m, v in values.items():
        typer.echo(f"{m}\t{v:.4f}")
