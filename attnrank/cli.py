"""The ``attnrank`` command line: index, search, eval, demo (Typer)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from .errors import AttnrankError

app = typer.Typer(
    name="attnrank",
    help="Retrieve with BM25 + dense embeddings, rerank with an LLM's attention, and evaluate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
logger = logging.getLogger("attnrank")

Quiet = typer.Option(False, "--quiet", "-q", help="No progress bars or info logs.")
Verbose = typer.Option(False, "--verbose", "-v", help="Log at INFO level.")


def _setup(quiet: bool = False, verbose: bool = False) -> bool:
    level = logging.INFO if verbose and not quiet else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("attnrank").setLevel(level)
    if quiet:  # transformers draws its own weight-loading bars
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return not quiet


def _index_path(name: Optional[str], index_dir: Optional[Path]) -> Path:
    from .config import index_root

    if index_dir is not None:
        return index_dir
    if not name:
        raise typer.BadParameter("give --name NAME (stored under ./indexes) or --index-dir DIR")
    if "/" in name or name.startswith("."):
        raise typer.BadParameter(f"index name {name!r} must be a plain name; use --index-dir for a path")
    return index_root() / name


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
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Build a BM25 + dense index over a corpus (written atomically)."""
    from .corpus import load_corpus
    from .index.retriever import HybridRetriever

    progress = _setup(quiet, verbose)
    target = _index_path(name, index_dir)
    docs, report = load_corpus(corpus, skip_invalid=skip_invalid)
    if report.skipped:
        typer.echo(f"skipped {len(report.skipped)} invalid record(s):", err=True)
        for where, why in report.skipped[:20]:
            typer.echo(f"  {where}: {why}", err=True)
    r = HybridRetriever(embedder=embedder, dense_index=dense_index, stemmer=stemmer, stopwords=stopwords)
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
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Search an index with one query (printed) or a queries file (TREC run file)."""
    from .corpus import load_queries
    from .eval import write_run
    from .index.retriever import HybridRetriever

    progress = _setup(quiet, verbose)
    if (query is None) == (queries is None):
        raise typer.BadParameter("give either one QUERY or --queries FILE")
    r = HybridRetriever.load(_index_path(name, index_dir))
    if fusion or alpha is not None or norm:
        r.set_fusion(fusion or r.fusion, alpha=alpha, norm=norm)
    qs = {"q1": query} if query is not None else load_queries(queries)
    results = r.search_batch(qs, k, mode=mode, show_progress=progress and len(qs) > 1)
    if output is not None:
        write_run(results, output, tag=f"attnrank-{mode or r.mode}")
        typer.echo(f"wrote {sum(len(x) for x in results)} results for {len(results)} queries to {output}")
    elif query is not None:
        _print_results(results[0])
    else:
        for res in results:
            typer.echo(f"# {res.query_id}: {res.query}")
            _print_results(res)


def _print_results(res) -> None:
    for d in res:
        stages = " ".join(f"{k}={v:.3f}" for k, v in d.stage_scores.items())
        head = (d.title + ": " if d.title else "") + d.text
        typer.echo(f"{d.rank:>3}. {d.id}  {d.score:.4f}  [{stages}]\n     {head[:110]}")


@app.command("eval")
def eval_cmd(
    run: Path = typer.Argument(..., help="TREC run file."),
    qrels: Path = typer.Argument(..., help="TREC qrels or BEIR qrels .tsv (or a BEIR folder)."),
    metrics: str = typer.Option("nDCG@10,R@20,R@100,RR@10", help="Comma-separated ir-measures names."),
    rel: int = typer.Option(1, help="Minimum label counted relevant by binary metrics (2 for TREC DL)."),
) -> None:
    """Evaluate a run file against qrels (ir-measures)."""
    from .eval import evaluate, read_qrels, read_run

    _setup(True)
    values = evaluate(read_run(run), read_qrels(qrels), [m.strip() for m in metrics.split(",") if m.strip()], rel=rel)
    for m, v in values.items():
        typer.echo(f"{m}\t{v:.4f}")


@app.command()
def demo(
    k: int = typer.Option(3, "--k", "-k", help="Results shown per question."),
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Index the embedded demo corpus (80 Wikipedia paragraphs) and answer its questions' retrieval."""
    from .config import index_root
    from .demo import demo_corpus_path, demo_queries
    from .index.retriever import HybridRetriever

    progress = _setup(quiet, verbose)
    target = index_root() / "demo"
    r = HybridRetriever().index(demo_corpus_path(), show_progress=progress)
    r.save(target)
    typer.echo(f"[index] {r.num_docs} passages -> {target}")
    for q in demo_queries():
        res = r.search(q["text"], k, query_id=q["_id"])
        typer.echo(f"\nQ: {q['text']}\n   gold passages: {', '.join(q['supporting'])}")
        _print_results(res)


def main() -> None:
    """Console entry point: attnrank's own errors become one readable line and exit code 1."""
    try:
        app()
    except AttnrankError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(1)
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
