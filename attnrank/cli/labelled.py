"""What the commands that learn from labelled queries share (``heads detect --method qr``,
``heads train``, ``train``): the labelled set (queries, candidates, qrels; from files, a shared
data set or an index) and the checks of it and of the training options, all before a model loads."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import typer

from ..errors import AttnrankError
from . import _read_corpus

# The learners that read --l2 (the listwise grid search and equal weights fit nothing penalised).
PENALISED = ("pointwise", "pairwise")


def check_training(
    learner: str, learners: tuple[str, ...], l2: float | None, folds: int, depth: int, default_l2: float
) -> float:
    """The options every ``train`` command shares, checked before any model is loaded; returns the
    L2 penalty (``default_l2`` where ``--l2`` was not given)."""
    if learner not in learners:
        raise typer.BadParameter(f"--learner {learner!r} is not one of {', '.join(learners)}")
    if l2 is not None and learner not in PENALISED:
        raise typer.BadParameter(
            f"--l2 {l2} is not read by --learner {learner} (only {' and '.join(PENALISED)}); drop it"
        )
    if l2 is not None and not 0 < l2 < math.inf:  # (NaN failed inside sklearn, after the capture)
        raise typer.BadParameter(f"--l2 {l2} must be a finite number > 0 (the L2 penalty)")
    if folds < 2 or depth < 2:
        raise typer.BadParameter(f"--folds {folds} and --depth {depth} must each be >= 2")
    return default_l2 if l2 is None else l2


def check_folds(n_queries: int, folds: int) -> None:
    if n_queries < folds:
        raise typer.BadParameter(
            f"{n_queries} labelled queries with candidates are fewer than --folds {folds}; "
            "give more labelled queries or lower --folds"
        )


def check_labelled(queries: dict, cands: dict, qrels: dict, rel: int, folds: int, seed: int, depth: int) -> None:
    """Before any model is loaded: enough labelled queries for ``folds`` folds, and in every
    training part (the folds :func:`~attnrank.eval.crossval.labelled_splits` makes of ``queries`` in
    this order, as the reports do) at least one query whose candidates hold both a relevant
    (label >= ``rel``) and a non-relevant document. A query without both cannot tell any weights
    apart: trained on none, the report ties every method at the same score and would register
    whatever was fitted."""
    from ..eval.crossval import labelled_splits, qrels_links

    check_folds(len(queries), folds)

    useful = {q for q in queries if 0 < sum(flags := relevant(q, cands, qrels, rel)) < len(flags)}

    links = qrels_links(qrels, rel)  # (the reports' relevant_links over the same judgements: the same folds)
    starved = [
        s.name for s in labelled_splits(list(queries), folds, seed=seed, links=links) if not useful & set(s.train)
    ]
    if starved:
        raise typer.BadParameter(
            f"{len(useful)} of {len(queries)} labelled queries have both a relevant and a non-relevant document "
            f"among their top-{depth} candidates, and the training part of fold(s) {', '.join(starved)} of "
            f"--folds {folds} has none, so nothing can be learned there; raise --depth, give a run that retrieves "
            "the judged documents, or more labelled queries"
        )


def relevant(q: str, cands: dict, qrels: dict, rel: int) -> list[bool]:
    """Whether each of query ``q``'s candidates is relevant (label >= ``rel``)."""
    return [qrels.get(q, {}).get(d.id, 0) >= rel for d in cands[q]]


def check_saveable(model: str | None, save: bool) -> None:
    """Before the long part of a train command: the user registry can take what it will save for
    ``model`` (not an unreadable or foreign file there, :func:`attnrank.registry_save.check_saveable`)."""
    if not save:
        return
    from ..errors import InputError
    from ..llm.models import unloaded_model
    from ..registry_save import check_saveable as registry_check

    key = unloaded_model(model)  # a model that cannot load fails here, as loading it would
    try:
        registry_check(*key)
    except InputError as e:  # (a file's fault: exit 1, as the README says of a bad file, not an option's 2)
        raise InputError(f"{e} (or run with --no-save)") from None


@dataclass(frozen=True)
class LabelledSource:
    """Where the labelled queries of ``heads detect``, ``heads train`` and ``train`` come from: a
    named ``dataset`` under ``data``, or ``queries`` + ``qrels`` with candidates from a ``run`` over
    a ``corpus`` (or over an ``index``'s documents, as ``rerank --run`` reads them), BM25 over the
    ``corpus``, or the search of an ``index`` folder (its own mode and fusion, as ``search --rerank``
    reranks); ``depth`` candidates per query, at most ``max_queries``
    queries (0: all), ``rel`` the lowest label counted relevant (None: the dataset's)."""

    dataset: str | None
    data: Path | None
    queries: Path | None
    qrels: Path | None
    corpus: Path | None
    run: Path | None
    depth: int
    max_queries: int
    rel: int | None
    skip_invalid: bool = False
    index: Path | None = None


def labelled_set(source: LabelledSource):
    """(queries, candidate Documents per query, qrels, rel, description) of ``source``, for QR
    detection, head-weight training and fused-weight training."""
    import random

    from ..eval import read_qrels, read_run, trec_order
    from ..eval.data import check_relevance_level, qrels_splits
    from ..queries import load_queries

    dataset, data, queries, qrels, corpus, run = (
        source.dataset,
        source.data,
        source.queries,
        source.qrels,
        source.corpus,
        source.run,
    )
    depth, max_queries, rel, skip_invalid, index = (
        source.depth,
        source.max_queries,
        source.rel,
        source.skip_invalid,
        source.index,
    )
    if max_queries < 0:
        raise typer.BadParameter(f"--max-queries {max_queries} must be at least 0 (0: all labelled queries)")
    if rel is not None and rel < 1:
        raise typer.BadParameter(f"--rel {rel} must be at least 1 (the lowest label counted relevant)")
    cands: dict = {}
    if index is not None and corpus is not None:  # (a --run's candidates read the index's texts, as rerank's do)
        raise typer.BadParameter("the index gives the documents, so --corpus would be ignored; drop it, or the index")
    if skip_invalid and corpus is None and (dataset is not None or index is not None):  # (it was ignored)
        why = (
            f"--dataset {dataset} brings its own corpus" if dataset is not None else "an index holds only valid records"
        )
        raise typer.BadParameter(f"--skip-invalid applies to --corpus; {why}; drop it")
    if dataset is not None:
        mixed = [o for o, v in (("--queries", queries), ("--qrels", qrels), ("--corpus", corpus)) if v is not None]
        if mixed:
            raise typer.BadParameter(
                f"--dataset {dataset} brings its own queries, qrels and corpus, so {', '.join(mixed)} would be "
                "ignored; give --dataset or --queries, --qrels and --corpus"
            )
        import os

        from ..eval.datasets import LOADERS, data_root, load_dataset

        if not (data or os.environ.get("ATTNRANK_DATA")):
            raise typer.BadParameter(f"--dataset {dataset} needs --data DIR (the shared data folder) or ATTNRANK_DATA")
        if dataset not in LOADERS:
            raise typer.BadParameter(f"--dataset {dataset!r} is not one of {', '.join(LOADERS)}")
        ds = load_dataset(dataset, data_root(data))
        docs, qs, qr, rel, cands = ds.docs, ds.queries, ds.qrels, rel or ds.rel, ds.candidates
        if dataset in ("hotpotqa", "locomo") and run is None:  # stored in source order: rank them as the benchmarks
            from ..benchmarks.sets import bm25_order

            cands = bm25_order(ds)
    else:
        if data is not None:  # (only --dataset reads it here)
            raise typer.BadParameter(
                f"--data {data} is read with --dataset, and --queries, --qrels and --corpus were given instead; "
                "drop --data, or give --dataset NAME in place of those files"
            )
        if queries is None or qrels is None or (corpus is None and index is None):
            raise typer.BadParameter(
                "give --dataset scifact|dl19|hotpotqa|locomo (with --data DIR), or --queries, --qrels and --corpus "
                "(or an index)"
            )
        splits = qrels_splits(qrels) if qrels.is_dir() else []
        if len(splits) > 1:  # (read_qrels takes test.tsv: trained on the queries an evaluation then scores)
            raise typer.BadParameter(
                f"--qrels {qrels} holds the qrels of {len(splits)} splits ({', '.join(f.name for f in splits)}); "
                f"give the file of the split to train on, e.g. --qrels {qrels / 'qrels' / splits[-1].name}"
            )
        docs = [] if corpus is None else _read_corpus(corpus, skip_invalid)
        if index is not None and run is not None:
            from ..index.retriever import HybridRetriever

            docs = HybridRetriever.load(index).docs
        qs, qr, rel = load_queries(queries), read_qrels(qrels), rel or 1
    check_relevance_level(qr, rel)  # (else: "0 labelled queries ... fewer than --folds", blaming --folds)
    if run is not None:
        cands = {q: [d for d, _ in trec_order(r)] for q, r in read_run(run).items()}
    qids = sorted(q for q in qs if any(v >= rel for v in qr.get(q, {}).values()))
    if not qids and qs and qr and not qs.keys() & qr.keys():  # (else "0 labelled queries ... fewer than --folds")
        raise AttnrankError(
            f"none of the {len(qs)} queries (e.g. {next(iter(qs))!r}) is judged in the qrels, which judge "
            f"{len(qr)} others (e.g. {next(iter(qr))!r}); give the qrels of these queries, with their ids spelled alike"
        )
    random.Random(42).shuffle(qids)  # QRHead samples its detection queries with seed 42
    qids = sorted(qids[: max_queries or None])
    by_id = {d.id: d for d in docs}
    if corpus is not None:
        _check_judged_in_corpus(qids, qr, rel, by_id, corpus, warn=run is None)
    if run is not None:
        _check_run_docs(cands, qids, by_id, run, depth)
    if index is not None and run is None:
        cands, by_id = _index_candidates(index, {q: qs[q] for q in qids}, depth)
    elif not cands:
        from ..index.bm25 import BM25Index
        from ..index.tokenize import resolve_config

        # the terms `attnrank index` makes by default, and hits only: documents sharing no query term
        # had filled a short list in corpus order (and position -1, "no hit", read the last document)
        bm25 = BM25Index(tokenizer=resolve_config()).index([d.full_text for d in docs])
        idx, _ = bm25.retrieve([qs[q] for q in qids], depth, matched_only=True)
        cands = {q: [docs[i].id for i in row if i >= 0] for q, row in zip(qids, idx)}
    out = {q: [by_id[d] for d in cands.get(q, [])[:depth] if d in by_id] for q in qids}
    of_index = f" of the index {Path(index).name}" if index is not None and run is None else ""
    kept = {q: qs[q] for q in qids if out[q]}  # a query without candidates is not trained or reported on
    if len(kept) < len(qids):  # (a run of other queries, or one that spells their ids otherwise)
        lost = [q for q in qids if not out[q]]
        where = "the run" if run is not None else "the index's hits" if index is not None else "the candidates"
        typer.echo(
            f"warning: {len(lost)} of the {len(qids)} labelled queries have no candidates in {where} (e.g. "
            f"{lost[0]!r}) and are left out",
            err=True,
        )
    longest = max((len(v) for v in out.values()), default=0)
    desc = (
        f"{dataset or Path(str(queries)).name}: {len(kept)} queries with relevant labels >= {rel}, "
        f"top-{min(depth, longest)} candidates{of_index}"
    )
    return kept, out, qr, rel, desc


def _index_candidates(index: Path, queries: dict, depth: int) -> tuple[dict, dict]:
    """({qid: [doc id, ...]}, {doc id: Document}) of the index's top ``depth`` hits per query."""
    from ..index.retriever import HybridRetriever

    results = HybridRetriever.load(index).search_batch(queries, depth)
    by_id = {d.id: d.document for res in results for d in res}
    return {res.query_id: [d.id for d in res] for res in results}, by_id


def _check_judged_in_corpus(qids: list, qrels: dict, rel: int, by_id: dict, corpus: Path, warn: bool) -> None:
    """The relevant documents the qrels judge for the labelled queries ``qids`` are in the corpus:
    none is an error, some a warning with ``warn`` (not beside a run, whose corpus may hold the
    run's documents alone, as TREC DL's passages of a BM25 top-100 do). Why: ids spelt otherwise
    (zero-padded in the qrels) trained and reported those queries as if nothing relevant had been
    retrieved (a user's report read 0.46 for 0.81, and registered its weights), or blamed --depth
    where no depth could help."""
    wanted = sorted({d for q in qids for d, v in qrels.get(q, {}).items() if v >= rel})
    absent = [d for d in wanted if d not in by_id]
    if not absent:
        return
    held = next(iter(by_id), None)
    example = f"e.g. {absent[0]!r}" + (f"; the corpus holds e.g. {held!r}" if held is not None else "")
    if len(absent) == len(wanted):
        raise AttnrankError(
            f"none of the {len(wanted)} relevant documents the qrels judge for these queries is in the corpus "
            f"{corpus} ({example}); give the qrels of this corpus, with ids spelled alike"
        )
    if not warn:
        return
    typer.echo(
        f"warning: {len(absent)} of the {len(wanted)} relevant documents the qrels judge for these queries are not "
        f"in the corpus {corpus} ({example}); their queries train and report as if those were never retrieved: "
        "check that both spell the ids alike (leading zeros)",
        err=True,
    )


def _check_run_docs(cands: dict, qids: list, by_id: dict, run: Path, depth: int) -> None:
    """Every candidate the ``--run`` gives a used query must be in the corpus (else it is another corpus's run)."""
    for q in qids:
        missing = next((d for d in cands.get(q, [])[:depth] if d not in by_id), None)
        if missing is not None:
            raise AttnrankError(
                f"document {missing!r} (query {q!r}) of the run {run} is not in the corpus; give the matching corpus"
            )
