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
    answers: int = typer.Option(2, "--answers", help="Questions pruned and answered at the end (0 = none)."),
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
    reranked = []
    questions = demo_queries()
    for q in questions:
        res = r.search(q["text"], depth, query_id=q["_id"])
        gold = set(q["supporting"])
        hits["first stage"] += len(gold & set(res.ids[:2]))
        typer.echo(f"\nQ: {q['text']}\n   gold passages: {', '.join(q['supporting'])}")
        if reranker is not None:
            res = reranker.rank(q["text"], res)
            hits["attention rerank"] += len(gold & set(res.ids[:2]))
            reranked.append((q, res))
        _print_results(res.top_k(k))
    total = 2 * len(questions)
    typer.echo("\n[summary] gold passages in the top 2: " + ", ".join(
        f"{name} {n}/{total}" for name, n in hits.items() if name == "first stage" or reranker is not None))
    if reranker is not None and answers > 0:
        _demo_answers(reranker.llm, reranked[:answers], k)


def _budget(budget_tokens: Optional[int], keep_ratio: Optional[float], default: Optional[int]):
    """(budget_tokens, keep_ratio) from the two exclusive CLI options."""
    if budget_tokens is not None and keep_ratio is not None:
        raise typer.BadParameter("give --budget-tokens or --keep-ratio, not both")
    if budget_tokens is None and keep_ratio is None:
        if default is None:
            raise typer.BadParameter("give --budget-tokens N (sentence tokens to keep) or --keep-ratio R (0 < R <= 1)")
        budget_tokens = default
    return budget_tokens, keep_ratio


def _print_pruned(pruned) -> None:
    kept = pruned.kept
    typer.echo(f"kept {len(kept)} of {len(pruned.sentences)} sentences, {pruned.kept_tokens} of "
               f"{pruned.original_tokens} tokens ({pruned.compression:.1f}x compression; budget "
               f"{pruned.budget_tokens} tokens from {pruned.budget_source}, {pruned.chunks} prompt(s))")
    for note in pruned.notes:
        typer.echo(f"note: {note}")
    last = None
    for s in kept:
        if s.doc_index != last:
            doc = pruned.docs[s.doc_index]
            typer.echo(f"\n[{s.doc_id}] {doc.title}".rstrip())
            last = s.doc_index
        typer.echo(f"  {s.score:+.4f} ({s.tokens:>3} tok) #{s.sentence_index}: {s.text}")


@app.command()
def prune(
    query: str = typer.Argument(..., help="The question the context is pruned for."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="Passages to prune (any corpus format); all of them, in file order, form the context."),
    name: Optional[str] = typer.Option(None, "--index", "-n", help="Or an index name: its top --k hits form the context."),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Or an explicit index folder."),
    k: int = typer.Option(5, "--k", "-k", help="Hits taken from --index."),
    budget_tokens: Optional[int] = typer.Option(None, "--budget-tokens", help="Sentence tokens to keep (hard cap; titles not counted)."),
    keep_ratio: Optional[float] = typer.Option(None, "--keep-ratio", help="Or the fraction of the context's sentence tokens to keep, in (0, 1]."),
    method: str = typer.Option("query", help="query (ICR: query-span attention, N/A-calibrated) | focus (AttentionRAG: answer-hint token)."),
    neighbours: int = typer.Option(0, "--neighbours", help="Sentences kept on each side of a chosen one (within the budget)."),
    model: Optional[str] = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    heads: Optional[str] = typer.Option(None, help="'all' (default), 'l-h,l-h' or a JSON head file."),
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Keep the sentences of passages that the LLM's attention marks as relevant to a question."""
    from .prune.pruner import ContextPruner

    _setup(quiet, verbose)
    budget, ratio = _budget(budget_tokens, keep_ratio, None)
    if (corpus is None) == (name is None and index_dir is None):
        raise typer.BadParameter("give either --corpus PATH or --index NAME / --index-dir DIR")
    if corpus is not None:
        from .corpus import load_corpus

        docs = load_corpus(corpus)[0]
    else:
        from .index.retriever import HybridRetriever

        docs = HybridRetriever.load(_index_path(name, index_dir)).search(query, k).documents()
    pruner = ContextPruner(model, heads, method=method)
    pruned = pruner.prune(query, docs, budget_tokens=budget, keep_ratio=ratio, neighbours=neighbours)
    _print_pruned(pruned)


@app.command()
def ask(
    question: str = typer.Argument(..., help="The question to answer."),
    name: Optional[str] = typer.Option(None, "--index", "-n", help="Index name under ./indexes."),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Explicit index folder."),
    k: int = typer.Option(20, "--k", "-k", help="First-stage hits."),
    rerank_k: int = typer.Option(5, "--rerank-k", help="Passages kept after attention reranking."),
    budget_tokens: Optional[int] = typer.Option(None, "--budget-tokens", help="Sentence tokens kept by pruning (default 300)."),
    keep_ratio: Optional[float] = typer.Option(None, "--keep-ratio", help="Or the fraction of sentence tokens kept, in (0, 1]."),
    method: str = typer.Option("query", help="Pruning method: query | focus."),
    no_rerank: bool = typer.Option(False, "--no-rerank", help="Keep the first-stage order."),
    no_prune: bool = typer.Option(False, "--no-prune", help="Give the whole passages to the generator."),
    model: Optional[str] = typer.Option(None, help="LLM for reranking and pruning (default: packaged SmolLM2-135M)."),
    generator_model: Optional[str] = typer.Option(None, "--generator-model", help="Another LLM for the answer (default: --model)."),
    heads: Optional[str] = typer.Option(None, help="'all' (default), 'l-h,l-h' or a JSON head file."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Answer length limit in tokens."),
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Answer a question: retrieve, rerank by attention, prune sentences, generate (streamed)."""
    from .index.retriever import HybridRetriever
    from .pipeline import DEFAULT_BUDGET_TOKENS, Pipeline

    _setup(quiet, verbose)
    budget, ratio = _budget(budget_tokens, keep_ratio, DEFAULT_BUDGET_TOKENS)
    retriever = HybridRetriever.load(_index_path(name, index_dir))
    pipe = Pipeline.from_model(retriever, model, heads=heads, generator_model=generator_model,
                               rerank=not no_rerank, prune=not no_prune, method=method,
                               max_new_tokens=max_new_tokens, first_stage_k=k, rerank_k=rerank_k)
    typer.echo(f"Q: {question}\nA: ", nl=False)
    res = pipe.run(question, budget_tokens=budget, keep_ratio=ratio, stream=lambda s: typer.echo(s, nl=False))
    typer.echo("")
    if res.pruned is not None:
        p = res.pruned
        typer.echo(f"[context] {p.kept_tokens} of {p.original_tokens} sentence tokens kept ({p.compression:.1f}x)")
    typer.echo("[sources]")
    for i, d in enumerate(res.context, start=1):
        typer.echo(f"  {i}. {d.id}" + (f" ({d.title})" if d.title else "") + f": {d.text[:100]}")
    typer.echo("[timings] " + ", ".join(f"{k_} {v:.2f} s" for k_, v in res.timings.items()))


def _demo_answers(llm, pairs, k: int, budget_tokens: int = 120) -> None:
    """The demo's last step: prune the top ``k`` reranked passages and answer (streamed)."""
    from .generate import Generator
    from .prune.pruner import ContextPruner

    pruner, generator = ContextPruner(llm), Generator(llm, max_new_tokens=24)
    typer.echo(f"\n[answer] top {k} reranked passages pruned to {budget_tokens} sentence tokens, "
               f"answered by {llm.model_id}")
    for q, res in pairs:
        pruned = pruner.prune(q["text"], res.top_k(k), budget_tokens=budget_tokens)
        docs = pruned.documents()
        typer.echo(f"\nQ: {q['text']}\n   kept {pruned.kept_tokens}/{pruned.original_tokens} tokens "
                   f"({pruned.compression:.1f}x) from {', '.join(d.id for d in docs) or 'no passage'}")
        typer.echo("   A: ", nl=False)
        ans = generator.answer(q["text"], docs, stream=lambda s: typer.echo(s, nl=False))
        typer.echo(f"\n   gold: {' | '.join(q.get('answers', []))}  ({ans.tokens} tokens, {ans.seconds:.1f} s)")


# --------------------------------------------------------------------------- heads sub-app
heads_app = typer.Typer(help="Detect, register and inspect retrieval heads (per model and weights).",
                        no_args_is_help=True)
app.add_typer(heads_app, name="heads")


def _int_list(text: str, what: str) -> list:
    try:
        return [float(x) if "." in x else int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} {text!r} must be comma-separated numbers, e.g. 1000,2000") from None


def _qr_set(dataset, data, queries, qrels, corpus, run, depth: int, max_queries: int, rel):
    """(queries, candidate Documents per query, qrels, rel, description) for QR detection."""
    import gzip
    import json
    import random

    from .corpus import load_corpus, load_queries
    from .eval import read_qrels, read_run
    from .types import Document

    cands: dict = {}
    if dataset is not None:
        import os

        if not (data or os.environ.get("ATTNRANK_DATA")):
            raise typer.BadParameter(f"--dataset {dataset} needs --data DIR (the shared data folder) or ATTNRANK_DATA")
        root = Path(data or os.environ["ATTNRANK_DATA"])
        if dataset == "scifact":
            docs = load_corpus(root / "scifact" / "corpus.jsonl.gz")[0]
            qs, qr, rel = load_queries(root / "scifact" / "queries.jsonl"), read_qrels(root / "scifact" / "qrels" / "train.tsv"), rel or 1
        elif dataset == "dl19":
            d = root / "trec_dl"
            with gzip.open(d / "dl19_bm25_top100_passages.jsonl.gz", "rt", encoding="utf-8") as f:
                docs = [Document(p["_id"], p["text"], p.get("title", "")) for p in map(json.loads, f)]
            with gzip.open(d / "dl19_bm25_top100.jsonl.gz", "rt", encoding="utf-8") as f:
                rows = [json.loads(line) for line in f]
            qs, qr, rel = {r["qid"]: r["query"] for r in rows}, read_qrels(d / "qrels.dl19-passage.txt"), rel or 2
            cands = {r["qid"]: [c["docid"] for c in sorted(r["candidates"], key=lambda c: c["rank"])] for r in rows}
        else:
            raise typer.BadParameter(f"--dataset {dataset!r} is not scifact or dl19")
    else:
        if queries is None or qrels is None or corpus is None:
            raise typer.BadParameter("give --dataset scifact|dl19 (with --data DIR), or --queries, --qrels and --corpus")
        docs, qs, qr, rel = load_corpus(corpus)[0], load_queries(queries), read_qrels(qrels), rel or 1
    if run is not None:
        cands = {q: sorted(r, key=lambda d: -r[d]) for q, r in read_run(run).items()}
    qids = sorted(q for q in qs if any(v >= rel for v in qr.get(q, {}).values()))
    random.Random(42).shuffle(qids)  # QRHead samples its detection queries with seed 42
    qids = sorted(qids[:max_queries])
    by_id = {d.id: d for d in docs}
    if not cands:
        from .index.bm25 import BM25Index

        bm25 = BM25Index().index([d.full_text for d in docs])
        idx, _ = bm25.retrieve([qs[q] for q in qids], depth)
        cands = {q: [docs[i].id for i in row] for q, row in zip(qids, idx)}
    out = {q: [by_id[d] for d in cands.get(q, [])[:depth] if d in by_id] for q in qids}
    desc = f"{dataset or Path(queries).name}: {len(qids)} queries with relevant labels >= {rel}, top-{depth} candidates"
    return {q: qs[q] for q in qids if out[q]}, out, qr, rel, desc


@heads_app.command("detect")
def heads_detect(
    method: str = typer.Option("qr", "--method", help="qr (QRHead QRScore + per-head nDCG@10 + CoRe contrastive) | copy (Wu et al. NIAH copy-paste)."),
    model: Optional[str] = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    data: Optional[Path] = typer.Option(None, "--data", help="Shared data folder (niah/, scifact/, trec_dl/); default $ATTNRANK_DATA."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="qr: scifact (train qrels) | dl19 (NIST qrels, BM25 top-100)."),
    queries: Optional[Path] = typer.Option(None, "--queries", help="qr: queries file (instead of --dataset)."),
    qrels: Optional[Path] = typer.Option(None, "--qrels", help="qr: qrels file (instead of --dataset)."),
    corpus: Optional[Path] = typer.Option(None, "--corpus", help="qr: corpus (instead of --dataset)."),
    run: Optional[Path] = typer.Option(None, "--run", help="qr: TREC run giving the candidates (default: BM25 over the corpus)."),
    depth: int = typer.Option(20, "--depth", help="qr: candidates per query."),
    max_queries: int = typer.Option(128, "--max-queries", help="qr: labelled queries used (QRHead: 128)."),
    rel: Optional[int] = typer.Option(None, "--rel", help="qr: minimum relevant label (default 1; 2 for dl19)."),
    top: int = typer.Option(16, "--top", help="Heads registered per method."),
    lengths: str = typer.Option("1000,2000,4000", "--lengths", help="copy: context lengths in tokens."),
    depths: str = typer.Option("0,25,50,75,100", "--depths", help="copy: needle depths in % of the haystack."),
    haystack: str = typer.Option("book", "--haystack", help="copy: book (Retrieval_Head haystacks) | essays (Paul Graham)."),
    max_new_tokens: int = typer.Option(50, "--max-new-tokens", help="copy: greedy answer length limit."),
    device: str = typer.Option("cpu", help="cpu | cuda | cuda:N | auto."),
    dtype: str = typer.Option("auto", help="auto | float32 | bfloat16 | float16."),
    save: bool = typer.Option(True, "--save/--no-save", help="Register the result in the user registry."),
    quiet: bool = Quiet, verbose: bool = Verbose,
) -> None:
    """Detect retrieval heads of a model and register them (used by --heads auto)."""
    from .heads.detect import RETRIEVAL_THRESHOLD, detect_copy_heads, detect_query_focused
    from .heads.spec import format_heads
    from .llm.models import load_llm

    progress = _setup(quiet, verbose)
    if method not in ("qr", "copy"):
        raise typer.BadParameter(f"--method {method!r} is not qr or copy")
    llm = load_llm(model, dtype=dtype, device=device)
    if method == "copy":
        result = detect_copy_heads(llm, data=data, lengths=_int_list(lengths, "--lengths"),
                                   depths=_int_list(depths, "--depths"), haystack=haystack, max_new_tokens=max_new_tokens)
        typer.echo(f"copy-paste detection: {result.data} ({result.seconds:.1f} s)")
        if result.note:
            raise AttnrankError(result.note)
        typer.echo(f"heads with score > {RETRIEVAL_THRESHOLD}: {format_heads(result.above()) or 'none'}")
        results = {"copy": result}
    else:
        from .rerank.attention import AttentionReranker

        qs, cands, qr, rel, desc = _qr_set(dataset, data, queries, qrels, corpus, run, depth, max_queries, rel)
        reranker = AttentionReranker(llm, None)
        results = detect_query_focused(reranker, qs, cands, qr, rel=rel, data=desc, show_progress=progress)
    for name, res in results.items():
        ranked = ", ".join(f"{l}-{h} {v:.3f}" for (l, h), v in res.ranked()[:top])
        typer.echo(f"{name}: {ranked or res.note}")
        if save and res.n_used:
            typer.echo(f"  saved top {top} to {res.save(top)}")


@heads_app.command("show")
def heads_show(
    model: Optional[str] = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    png: Optional[Path] = typer.Option(None, "--png", help="Write a layer x head heat map of the best scored set (needs attnrank[plot])."),
) -> None:
    """List the head sets registered for a model (user registry first, then shipped sets)."""
    from .heads.registry import load_head_sets, model_fingerprint

    _setup(True)
    model_id, fingerprint = model_fingerprint(model)
    sets = load_head_sets(model_id, fingerprint)
    typer.echo(f"{model_id} (fingerprint {fingerprint[:12]}): {len(sets)} head set(s), preferred first")
    for i, s in enumerate(sets, start=1):
        typer.echo(f"{i:>2}. {s.name} [{s.method}, {s.source}] {len(s.heads)} heads, {s.date}: {','.join(s.heads)}\n"
                   f"    data: {s.data}")
    if png is not None:
        scored = next((s for s in sets if s.scores), None)
        if scored is None:
            raise AttnrankError(f"no registered head set of {model_id} has a score matrix to plot; "
                                "detect one with `attnrank heads detect`")
        _heat_map(scored, png)
        typer.echo(f"wrote {png}")


def _heat_map(head_set, path: Path) -> None:
    from .errors import require

    require("matplotlib", "plot", "The head heat map")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    m = np.array([[np.nan if v is None else v for v in row] for row in head_set.scores], dtype=float)
    fig, ax = plt.subplots(figsize=(max(4, m.shape[1] * 0.3), max(3, m.shape[0] * 0.25)))
    im = ax.imshow(m, aspect="auto", cmap="viridis", origin="lower")
    ax.set(xlabel="head", ylabel="layer", title=f"{head_set.model_id}: {head_set.method} ({head_set.name})")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
