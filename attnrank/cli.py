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
    rerank: int = typer.Option(0, "--rerank", help="Rerank the top K hits with the attention reranker (0 = off)."),
    model: Optional[str] = typer.Option(None, help="LLM for --rerank: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    heads: Optional[str] = typer.Option(None, help="Heads for --rerank: 'all', 'l-h,l-h', or a JSON file."),
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
    results = r.search_batch(qs, max(k, rerank), mode=mode, show_progress=progress and len(qs) > 1)
    if rerank > 0:
        from .rerank.attention import AttentionReranker

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


def _rerank_head(reranker, res, depth: int):
    """Rerank the top ``depth`` of ``res``; the rest keeps its order below them."""
    from .types import RankedResults

    head = reranker.rank(res.query, res.results[:depth], query_id=res.query_id)
    from dataclasses import replace

    floor = min(head.scores, default=0.0)
    # keep the tail below the reranked head, in its first-stage order
    tail = [replace(d, score=floor - i) for i, d in enumerate(res.results[depth:], start=1)]
    return RankedResults(res.query, head.results + tail, res.query_id, stage="attention")


@app.command()
def rerank(
    run: Path = typer.Option(..., "--run", help="First-stage TREC run file to rerank."),
    queries: Path = typer.Option(..., "--queries", help="BEIR queries.jsonl or TSV id<TAB>text."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="Corpus with the run's documents (any supported format)."),
    name: Optional[str] = typer.Option(None, "--index", "-n", help="Or an index name whose documents to use."),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Or an explicit index folder."),
    depth: int = typer.Option(20, "--depth", "-k", help="Rerank the top K of each query (the rest keeps its order below)."),
    model: Optional[str] = typer.Option(None, help="HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    heads: Optional[str] = typer.Option(None, help="'all' (ICR), 'l-h,l-h' or a JSON head file (QRHead)."),
    calibrate: bool = typer.Option(True, "--calibrate/--no-calibrate", help="Content-free N/A calibration."),
    instruction: str = typer.Option("ie", help="Late instruction: ie | qa | custom text."),
    output: Path = typer.Option(..., "--output", "-o", help="Reranked TREC run file."),
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Rerank a TREC run with the attention reranker and write a TREC run file."""
    from .corpus import load_corpus, load_queries
    from .eval import read_run, write_run
    from .rerank.attention import AttentionReranker
    from .types import RankedResults, ScoredDocument

    progress = _setup(quiet, verbose)
    if depth < 1:
        raise typer.BadParameter(f"--depth {depth} must be at least 1")
    if corpus is not None:
        docs = {d.id: d for d in load_corpus(corpus)[0]}
    else:
        from .index.retriever import HybridRetriever

        docs = {d.id: d for d in HybridRetriever.load(_index_path(name, index_dir)).docs}
    qs, first = load_queries(queries), read_run(run)
    reranker = AttentionReranker(model, heads, calibrate=calibrate, instruction=instruction)
    out = []
    items = list(first.items())
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="rerank", unit="q")
    for qid, ranking in items:
        if qid not in qs:
            raise AttnrankError(f"query {qid!r} of the run is not in {queries}; give the matching queries file")
        missing = [d for d in ranking if d not in docs]
        if missing:
            raise AttnrankError(f"document {missing[0]!r} of the run is not in the corpus/index; give the matching one")
        ordered = sorted(ranking.items(), key=lambda kv: (-kv[1], kv[0]))
        res = RankedResults(qs[qid], [ScoredDocument(d, s, r, docs[d].text, docs[d].title, {"first_stage": s})
                                      for r, (d, s) in enumerate(ordered, start=1)], qid)
        out.append(_rerank_head(reranker, res, depth))
    write_run(out, output, tag="attnrank-attention")
    typer.echo(f"reranked the top {depth} of {len(out)} queries into {output}")


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
    depth: int = typer.Option(10, "--depth", help="First-stage hits reranked by attention."),
    model: Optional[str] = typer.Option(None, help="LLM (default: packaged SmolLM2-135M)."),
    no_rerank: bool = typer.Option(False, "--no-rerank", help="Stop after the first stage."),
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Run the pipeline on the embedded demo corpus (80 Wikipedia paragraphs, 8 questions)."""
    from .config import index_root
    from .demo import demo_corpus_path, demo_queries
    from .index.retriever import HybridRetriever

    progress = _setup(quiet, verbose)
    target = index_root() / "demo"
    r = HybridRetriever().index(demo_corpus_path(), show_progress=progress)
    r.save(target)
    typer.echo(f"[index] {r.num_docs} passages -> {target}")
    reranker = None
    if not no_rerank:
        from .rerank.attention import AttentionReranker

        reranker = AttentionReranker(model)
        typer.echo(f"[rerank] {reranker!r}")
    hits = {"first stage": 0, "attention rerank": 0}
    questions = demo_queries()
    for q in questions:
        res = r.search(q["text"], depth, query_id=q["_id"])
        gold = set(q["supporting"])
        hits["first stage"] += len(gold & set(res.ids[:2]))
        typer.echo(f"\nQ: {q['text']}\n   gold passages: {', '.join(q['supporting'])}")
        if reranker is not None:
            res = reranker.rank(q["text"], res)
            hits["attention rerank"] += len(gold & set(res.ids[:2]))
        _print_results(res.top_k(k))
    total = 2 * len(questions)
    typer.echo("\n[summary] gold passages in the top 2: " + ", ".join(
        f"{name} {n}/{total}" for name, n in hits.items() if name == "first stage" or reranker is not None))


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
