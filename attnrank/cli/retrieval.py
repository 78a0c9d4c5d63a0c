"""``attnrank index``, ``search`` and ``eval``: the first stage and its evaluation."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from ..errors import AttnrankError, InputError
from ..files import RUN_GUARD
from ..rerank.config import RerankConfig
from ..types import check_unicode
from . import (
    OldName,
    Quiet,
    SkipInvalid,
    Verbose,
    Verify,
    _check_heads,
    _check_output,
    _check_rerank_prompts,
    _index_name,
    _index_path,
    _load_index,
    _positive,
    _print_results,
    _read_corpus,
    _rerank_heads,
    _setup,
    app,
    option_errors,
)
from .options import (
    INDEX_NAME_HELP,
    check_model_readable,
    check_queries_fit,
    check_registry_lookups,
    refuse_without_rerank,
    rerank_options,
)
from .states import (
    PASSAGE_STATES,
    STATES_DTYPE,
    STATES_HEADS,
    STATES_MODEL,
    STATES_PRESET,
    STATES_TOKENS,
    STATES_WORDS,
    check_storage,
    state_writer,
    states_config,
)

logger = logging.getLogger(__name__)


@app.command()
def index(
    corpus: Path = typer.Argument(
        ...,
        help="BEIR folder, .jsonl, .csv/.tsv (records: id or _id/doc_id/docid, text or contents/body/passage, "
        "optional title), or a folder of .txt/.md files (one such file alone: one document).",
    ),
    name: Optional[str] = typer.Option(
        None, "--index", "-n", help="Index name (stored in ./indexes/NAME, or $ATTNRANK_INDEX_DIR/NAME)."
    ),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Explicit index folder instead of --index."),
    dense_index: str = typer.Option("flat", help="FAISS index type: flat | hnsw | ivf."),
    embedder: Optional[str] = typer.Option(
        None, help="sentence-transformers model id or path (default: packaged all-MiniLM-L6-v2)."
    ),
    embed_backend: str = typer.Option(
        "torch",
        "--embed-backend",
        help="How the embedder runs: torch | torch-bf16 | onnx | onnx-int8 (extra 'onnx') | openvino | "
        "openvino-bf16 (extra 'openvino'); "
        "exported once and cached, recorded in the index so queries are embedded the same way.",
    ),
    stemmer: str = typer.Option("auto", help="BM25 stemming: porter | none | auto (porter if PyStemmer is installed)."),
    stopwords: str = typer.Option("lucene", help="BM25 stopwords: lucene | sklearn | none."),
    fusion: Optional[str] = typer.Option(
        None,
        help="Hybrid fusion the index searches with: convex (default: alpha 0.45, zscore; tuned on SciFact and "
        "HotpotQA, +2.8/+3.4 nDCG@10 over RRF) | rrf (k=60).",
    ),
    alpha: Optional[float] = typer.Option(
        None, help="Convex fusion weight of the dense scores, in [0, 1] (default 0.45)."
    ),
    norm: Optional[str] = typer.Option(None, help="Convex fusion normalisation: minmax | zscore (default) | none."),
    skip_invalid: bool = SkipInvalid,
    force: bool = typer.Option(
        False,
        "--force",
        help="Also replace an existing non-empty folder that is not an "
        "attnrank index (never one holding the corpus or the working directory, nor one inside a folder "
        "corpus that holds files of its own).",
    ),
    shards: int = typer.Option(
        0, "--shards", help="Build N shards with global BM25 statistics (0 = one ordinary index)."
    ),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", help="With --shards: Ray cluster address, or 'local'."
    ),
    num_cpus: Optional[int] = typer.Option(
        None, "--num-cpus", help="With --ray-address local: CPUs of the local Ray (default: all)."
    ),
    passage_states: Optional[str] = PASSAGE_STATES,
    preset: Optional[str] = STATES_PRESET,
    model: Optional[str] = STATES_MODEL,
    max_doc_words: Optional[int] = STATES_WORDS,
    max_doc_tokens: Optional[int] = STATES_TOKENS,
    dtype: Optional[str] = STATES_DTYPE,
    heads: Optional[str] = STATES_HEADS,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
    old_name: Optional[str] = OldName,
) -> None:
    """Build a BM25 + dense index over a corpus (written atomically).

    Replaces only an existing attnrank index or an empty folder (``--force``: any other folder,
    except one holding the corpus or the working directory, or one inside a folder corpus that
    holds files of its own). The fusion settings are stored in
    the index; ``search`` uses them unless told otherwise."""
    from ..eval.data import unrunnable_ids
    from ..index.embed_export import BACKENDS
    from ..index.folders import Protected, check_target, embedder_paths, model_paths
    from ..index.retriever import HybridRetriever

    if embed_backend not in BACKENDS:
        raise typer.BadParameter(f"{embed_backend!r} is not one of {', '.join(BACKENDS)}", param_hint="--embed-backend")
    progress = _setup(quiet, verbose)
    target = _index_path(_index_name(name, old_name), index_dir)
    check_storage(passage_states)
    given = [f for f, v in (("--preset", preset), ("--model", model), ("--max-doc-words", max_doc_words),
                            ("--max-doc-tokens", max_doc_tokens), ("--dtype", dtype), ("--heads", heads))
             if v is not None]  # fmt: skip
    if passage_states is None and given:
        raise typer.BadParameter(f"{', '.join(given)} configure(s) --passage-states; add --passage-states")
    states = (
        None if passage_states is None else states_config(preset, model, max_doc_words, max_doc_tokens, dtype, heads)
    )
    if states is not None:  # a head list outside the model, or an `auto` set not registered: before the corpus is read
        _check_heads(heads, model=states.model)
        check_registry_lookups(states)
    if ray_address is not None and not shards:
        raise typer.BadParameter("--ray-address runs a sharded build; add --shards N (or drop --ray-address)")
    if num_cpus is not None and ray_address != "local":  # (a cluster's CPUs are its own)
        raise typer.BadParameter("--num-cpus sizes the local Ray of --ray-address local; add it or drop --num-cpus")
    if num_cpus is not None:
        _positive(num_cpus, "--num-cpus", "CPUs of the local Ray")
    if passage_states is not None and shards:
        raise typer.BadParameter("--passage-states is not supported with --shards yet; build one index")
    with option_errors():  # --dense-index, --stopwords or --stemmer outside their values
        r = HybridRetriever(
            embedder=embedder,
            dense_index=dense_index,
            stemmer=stemmer,
            stopwords=stopwords,
            embed_backend=embed_backend,
        )
    _check_fusion_options(None, fusion, alpha, norm)
    _set_fusion(r, None, fusion, alpha, norm, what="index")
    _positive(shards, "--shards", "0 = one ordinary index", minimum=0)
    if shards:  # (before the corpus is read: ShardedIndexer would refuse it after)
        from ..index.sharded.build import SHARDED_DENSE

        if r.dense_kind not in SHARDED_DENSE:
            raise typer.BadParameter(
                f"--dense-index {r.dense_kind} is not one a sharded build takes ({', '.join(SHARDED_DENSE)}): HNSW "
                "graphs cannot be shared between shards; use --dense-index flat or ivf"
            )
    from ..index.embed import check_embedder

    check_embedder(embedder, "cpu", embed_backend)  # (a missing folder or extra: before the corpus and the LLM)
    # (the states' model too: --force replaced the folder of the model it had just encoded them with)
    protect: list[Protected] = [corpus, *model_paths(None if states is None else states.model)]
    check_target(target, force=force, protect=[*protect, *embedder_paths(r.embedder_folder())])  # before any work
    docs = _read_corpus(corpus, skip_invalid)
    spaced = unrunnable_ids(d.id for d in docs)
    if spaced:  # (indexed, then refused by search -o after the index loaded, and never matched by rerank --corpus)
        typer.echo(
            f"warning: {len(spaced)} document id(s) hold whitespace (e.g. {spaced[0]!r}), which a TREC run cannot "
            "hold: search -o refuses them and a run cannot name them; rename them (a folder corpus: its files)"
        )
    if shards:  # issue 17: sharded build (attnrank.cli.batch)
        from .batch import build_sharded

        typer.echo(
            build_sharded(
                docs,
                target,
                shards,
                r,
                ray_address,
                force=force,
                protect=[corpus],
                num_cpus=num_cpus,
                progress=progress,
            )
        )
        return
    writer = None
    if passage_states is not None and states is not None:  # the model loads (and fails) before the index is built
        writer = state_writer(docs, passage_states, states, progress)
    r.index(docs, show_progress=progress).save(target, force=force, protect=protect, extra=writer)
    typer.echo(f"indexed {r.num_docs} documents into {target}")


@app.command()
@rerank_options
def search(
    query: Optional[str] = typer.Argument(None, help="One query (or use --queries FILE)."),
    name: Optional[str] = typer.Option(None, "--index", "-n", help=f"{INDEX_NAME_HELP}."),
    index_dir: Optional[Path] = typer.Option(None, "--index-dir", help="Explicit index folder."),
    queries: Optional[Path] = typer.Option(None, "--queries", help="BEIR queries.jsonl or TSV id<TAB>text."),
    k: int = typer.Option(10, "--top-k", "-k", help="Results per query."),
    mode: Optional[str] = typer.Option(None, help="bm25 | dense | hybrid (default: the index's setting, hybrid)."),
    fusion: Optional[str] = typer.Option(None, help="convex | rrf (default: the index's setting)."),
    alpha: Optional[float] = typer.Option(
        None, help="Convex fusion weight of the dense scores, in [0, 1] (default: the index's)."
    ),
    norm: Optional[str] = typer.Option(None, help="Convex fusion normalisation: minmax | zscore | none."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write a TREC run file."),
    rerank: int = typer.Option(0, "--rerank", help="Rerank the top K hits (--preset; default likelihood; 0 = off)."),
    verify: bool = Verify,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
    old_name: Optional[str] = OldName,
    rerank_config: RerankConfig = None,  # type: ignore[assignment]  # filled in by @rerank_options
    rerank_given: frozenset[str] = frozenset(),  # filled in by @rerank_options
) -> None:
    """Search an index with one query (printed) or a queries file (TREC run file)."""
    from ..eval import check_run_ids, write_run
    from ..index.settings import check_queries
    from ..queries import load_queries

    progress = _setup(quiet, verbose)
    if (query is None) == (queries is None):
        raise typer.BadParameter("give either one QUERY or --queries FILE")
    _positive(k, "-k", "results per query")
    _positive(rerank, "--rerank", "hits reranked; 0 turns reranking off", minimum=0)
    if rerank == 0:
        refuse_without_rerank(rerank_given)
    _check_output(output, {"--queries": queries})
    qs = {"q1": query} if queries is None else load_queries(queries, run_ids=output is not None)
    if query is not None:  # the QUERY argument: a usage error (exit 2), as prune's, ask's, explain's
        with option_errors():
            check_queries([query])
            check_unicode([query], "QUERY")  # (undecodable bytes: refused after the index loaded, exit 1)
    if queries is not None:  # (the QUERY argument was checked above)
        check_queries(list(qs.values()))  # said before the index loads
    name = _index_name(name, old_name)
    if rerank > 0:  # what the reranker reads from the head registry: before the index and the model load
        # (every preset: signals reads the model's registered weights, keyed by its id and fingerprint)
        check_model_readable(rerank_config.model)
        check_registry_lookups(rerank_config)
    _check_fusion_options(mode, fusion, alpha, norm)  # before the index loads (and --verify hashes it)
    if rerank > 0:  # (the tokenizer's, before the index and the model load)
        check_queries_fit(rerank_config, {q: t for q, t in qs.items() if t is not None})
    r = _load_index(name, index_dir, verify)
    _set_fusion(r, mode, fusion, alpha, norm)
    if output is not None:  # before searching: write_run would refuse them after all the work
        check_run_ids(
            "document",
            (d.id for d in r.docs),
            "a TREC run cannot hold it: rename the document (for a folder corpus, its file) and index again, "
            "or search without -o",
        )
    results = r.search_batch(qs, max(k, rerank), mode=mode, show_progress=progress and len(qs) > 1)
    if rerank > 0:
        _check_rerank_prompts(rerank_config, results, rerank)  # (the tokenizer's, before the model)
        from ..rerank.over_index import index_reranker  # heavy (torch): only once the input is known good

        reranker = index_reranker(rerank_config, _index_path(name, index_dir), r)
        results = [res.top_k(k) for res in _rerank_heads(reranker, results, rerank, progress)]
    if output is not None and not any(len(x) for x in results):
        # (an empty run file, which eval and rerank refuse as empty: nothing is written)
        raise InputError(f"no query had a hit, so nothing was written to {output}; check the queries and the index")
    if output is not None:
        # the run's tag says what ranked it: the reranking preset (as `attnrank rerank` writes), else the first stage
        tag = f"attnrank-{rerank_config.name}" if rerank else f"attnrank-{mode or r.mode}"
        write_run(results, output, tag=tag, guard=RUN_GUARD)
        hit = sum(1 for x in results if len(x))
        typer.echo(f"wrote {sum(len(x) for x in results)} results for {hit} queries to {output}")
        if hit < len(results):  # (a run holds no line for them: counted, they read as if written; as batch says)
            missed = [x.query_id for x in results if not len(x)]
            typer.echo(
                f"warning: {len(missed)} of {len(results)} queries had no hit (no line in a TREC run), e.g. {missed[0]!r}",
                err=True,
            )
    elif query is not None:
        _print_results(results[0])
    else:
        for res in results:
            typer.echo(f"# {res.query_id}: {res.query}")
            _print_results(res)


def _check_fusion_options(mode, fusion, alpha, norm) -> None:
    """--mode, --fusion, --alpha and --norm each on its own, before an index loads (and verifies)."""
    from ..index.settings import FUSIONS, MODES, check_fusion

    if mode is not None and mode not in MODES:
        raise typer.BadParameter(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    if fusion is not None and fusion not in FUSIONS:
        raise typer.BadParameter(f"--fusion {fusion!r} is not one of {', '.join(FUSIONS)}")
    with option_errors():  # an option's value (--alpha 1.5, --norm foo)
        check_fusion(fusion, alpha, norm)


def _set_fusion(r, mode, fusion, alpha, norm, what: str = "search") -> None:
    """Apply --fusion/--alpha/--norm (each checked on its own by :func:`_check_fusion_options`
    first); an option that the search (or index) would ignore is an error.

    ``--fusion convex`` alone keeps the retriever's alpha and norm: for a loaded index the ones its
    manifest records (an index built before convex became the default records 0.5, minmax)."""
    if not (fusion or alpha is not None or norm):
        return
    if (mode or r.mode) != "hybrid":
        raise typer.BadParameter(f"--fusion/--alpha/--norm apply to hybrid search only, not --mode {mode or r.mode}")
    if (fusion or r.fusion) == "rrf" and (alpha is not None or norm):
        given = f"--alpha {alpha}" if alpha is not None else f"--norm {norm}"
        raise typer.BadParameter(
            f"{given} applies to convex fusion only, and this {what} fuses with rrf; add --fusion convex"
        )
    with option_errors():  # an option's value (--alpha 1.5, --norm foo)
        r.set_fusion(fusion or r.fusion, alpha=alpha, norm=norm)


@app.command("eval")
def eval_cmd(
    run: Path = typer.Argument(..., help="TREC run file."),
    qrels: Path = typer.Argument(..., help="TREC qrels or BEIR qrels .tsv (or a BEIR folder)."),
    metrics: str = typer.Option("nDCG@10,R@20,R@100,RR@10", help="Comma-separated ir-measures names."),
    rel: int = typer.Option(1, help="Minimum label counted relevant by binary metrics (2 for TREC DL)."),
) -> None:
    """Evaluate a run file against qrels (ir-measures)."""
    from ..eval import evaluate, read_qrels, read_run
    from ..eval.data import check_relevance_level
    from ..eval.metrics import coverage_notes, reads_rel

    _setup(True)
    _positive(rel, "--rel", "the lowest label a binary metric counts as relevant")
    names = _check_metrics(metrics)
    first, judged = read_run(run), read_qrels(qrels)
    if reads_rel(names):  # (nDCG alone reads graded labels: any --rel gives its figure)
        check_relevance_level(judged, rel)
    if not first.keys() & judged.keys():
        raise AttnrankError(
            f"none of the {len(first)} queries of {run} has judgments in {qrels} ({len(judged)} judged queries); "
            "give the qrels of the run's queries"
        )
    for note in coverage_notes(first, judged):  # (what moves the means unseen; said, not refused: a run that
        typer.echo(f"{run}: {note}", err=True)  # found no judged document scores 0 too)
    for m, v in evaluate(first, judged, names, rel=rel, warn=False).items():
        typer.echo(f"{m}\t{v:.4f}")


def _check_metrics(text: str) -> list[str]:
    """The ``--metrics`` names, each one ir-measures can compute here (checked before any file is read)."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise typer.BadParameter(f"--metrics {text!r} names no metric; give e.g. nDCG@10,R@100")
    for name in names:
        problem = _metric_problem(name)
        if problem:
            raise typer.BadParameter(f"--metrics: {name!r} {problem}")
    return names


def _metric_problem(name: str) -> str | None:
    """Why ``name`` cannot be evaluated as given, or None."""
    from ..errors import require
    from ..eval import evaluate

    irm = require("ir_measures", "eval", "Evaluation metrics")
    unknown = (
        "is not a metric ir-measures computes here; use names such as nDCG@10, R@100, RR@10, P@5 or AP "
        "(cutoffs are integers >= 1)"
    )
    try:
        params = irm.parse_measure(name).params
        cutoff = params.get("cutoff")
        # trec_eval aborts the process (not an exception) on a cutoff below 1
        if cutoff is not None and (not isinstance(cutoff, int) or cutoff < 1):
            return unknown
        # evaluate() names metrics without rel= and applies --rel to them (NumRelRet's rel is ir-measures'
        # alias for NumRet(rel=1), not the user's: refused, trec_eval's num_rel_ret had no spelling here)
        if "rel" in params and "rel=" in name.replace(" ", ""):
            return f"sets rel itself; give the metric without it and the threshold as --rel {params['rel']}"
        evaluate({"q": {"d": 1.0}}, {"q": {"d": 1}}, [name])  # an unsupported measure raises here
    except Exception:
        return unknown
    return None
