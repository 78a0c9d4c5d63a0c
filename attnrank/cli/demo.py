"""``attnrank demo``: the whole pipeline on the embedded demo corpus."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..rerank.config import RerankConfig
from . import Quiet, Verbose, _positive, _print_results, _setup, app
from .options import (
    check_k_within_depth,
    check_model_readable,
    check_registry_lookups,
    refuse_when_off,
    rerank_options,
)

DEMO_DEPTH = 10  # first-stage hits the demo reranks by default


@app.command()
@rerank_options
def demo(
    k: int = typer.Option(3, "--top-k", "-k", help="Results shown per question."),
    depth: Optional[int] = typer.Option(
        None, "--depth", help=f"First-stage hits reranked (default {DEMO_DEPTH}; none with --no-rerank)."
    ),
    no_rerank: bool = typer.Option(False, "--no-rerank", help="Stop after the first stage."),
    answers: Optional[int] = typer.Option(
        None, "--answers", help="Questions pruned and answered at the end (0 = none; default 2, none with --no-rerank)."
    ),
    quiet: bool = Quiet,
    verbose: bool = Verbose,
    rerank_config: RerankConfig = None,  # type: ignore[assignment]  # filled in by @rerank_options
    rerank_given: frozenset[str] = frozenset(),  # filled in by @rerank_options
) -> None:
    """Run the pipeline on the embedded demo corpus (80 Wikipedia paragraphs, 8 questions)."""
    from ..config import index_root
    from ..corpus import load_corpus
    from ..demo import demo_corpus_path, demo_queries
    from ..index.retriever import HybridRetriever
    from ..index.store import corpus_checksum

    progress = _setup(quiet, verbose)
    if no_rerank and depth is not None:  # (it was ignored: the first stage's top -k is shown)
        refuse_when_off("--no-rerank", "reranking", ["--depth"])
    depth = (max(k, DEMO_DEPTH) if no_rerank else DEMO_DEPTH) if depth is None else depth
    _positive(k, "-k", "results shown per question")
    _positive(depth, "--depth", "first-stage hits reranked")
    check_k_within_depth(k, depth, "shown")
    answers = (0 if no_rerank else 2) if answers is None else answers
    _positive(answers, "--answers", "questions answered; 0 for none", minimum=0)
    if no_rerank:
        refuse_when_off("--no-rerank", "reranking", rerank_given)
        if answers:  # the answers are made from the reranked passages
            raise typer.BadParameter(f"--answers {answers} answers from reranked passages; drop it or --no-rerank")
    questions = demo_queries()
    if answers > len(questions):
        raise typer.BadParameter(
            f"--answers {answers}: the demo has {len(questions)} questions; give 0 to {len(questions)}"
        )
    if not no_rerank:  # what the reranker reads from the head registry, before indexing and loading it
        # (a mistyped --model was found after the demo index was rebuilt; signals reads its registered weights)
        check_model_readable(rerank_config.model)
        check_registry_lookups(rerank_config)
    target = index_root() / "demo"
    docs, _ = load_corpus(demo_corpus_path())
    _check_demo_folder(target, corpus_checksum(docs))
    r = HybridRetriever().index(docs, show_progress=progress)
    r.save(target)
    typer.echo(f"[index] {r.num_docs} passages -> {target}")
    reranker = None
    if not no_rerank:
        from ..rerank.attention import AttentionReranker

        reranker = AttentionReranker(config=rerank_config)
        reranker.use_index(r)
        typer.echo(f"[rerank] {reranker!r}")
    hits = {"first stage": 0, "reranked": 0}
    reranked = []
    for q in questions:
        res = r.search(q["text"], depth, query_id=q["_id"])
        gold = set(q["supporting"])
        hits["first stage"] += len(gold & set(res.ids[:2]))
        typer.echo(f"\nQ: {q['text']}\n   gold passages: {', '.join(q['supporting'])}")
        if reranker is not None:
            res = reranker.rank(q["text"], res)
            hits["reranked"] += len(gold & set(res.ids[:2]))
            reranked.append((q, res))
        _print_results(res.top_k(k))
    total = 2 * len(questions)
    typer.echo(
        "\n[summary] gold passages in the top 2: "
        + ", ".join(f"{name} {n}/{total}" for name, n in hits.items() if name == "first stage" or reranker is not None)
    )
    if reranker is not None and answers > 0:
        _demo_answers(reranker.llm, reranked[:answers], k)


def _check_demo_folder(target: Path, checksum: str) -> None:
    """The demo rebuilds its index at ``target`` on every run, so it may replace only an index of
    the demo corpus itself (or an empty folder): a user's own index saved under the name ``demo``
    is refused, naming the way out, before anything is built."""
    from ..files import index_manifest

    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return
    manifest = index_manifest(target)
    if manifest is None or manifest.get("corpus_sha256") != checksum:
        what = "an index of another corpus" if manifest is not None else "files that are not the demo's index"
        raise typer.BadParameter(
            f"{target} holds {what}; the demo rebuilds its index there and would replace it: move it away, "
            "or set ATTNRANK_INDEX_DIR to another folder for the demo"
        )


def _demo_answers(llm, pairs, k: int, budget_tokens: int = 120) -> None:
    """The demo's last step: prune the top ``k`` reranked passages and answer (streamed)."""
    from ..generate import Generator
    from ..prune.pruner import ContextPruner

    pruner, generator = ContextPruner(llm), Generator(llm, max_new_tokens=24)
    typer.echo(
        f"\n[answer] top {k} reranked passages pruned to {budget_tokens} sentence tokens, answered by {llm.model_id}"
    )
    for q, res in pairs:
        pruned = pruner.prune(q["text"], res.top_k(k), budget_tokens=budget_tokens)
        docs = pruned.documents()
        typer.echo(
            f"\nQ: {q['text']}\n   kept {pruned.kept_tokens}/{pruned.original_tokens} tokens "
            f"({pruned.compression:.1f}x) from {', '.join(d.id for d in docs) or 'no passage'}"
        )
        typer.echo("   A: ", nl=False)
        ans = generator.answer(q["text"], docs, stream=lambda s: typer.echo(s, nl=False))
        cut = f", cut at the {generator.max_new_tokens}-token limit" if ans.truncated else ""
        typer.echo(f"\n   gold: {' | '.join(q.get('answers', []))}  ({ans.tokens} tokens{cut}, {ans.seconds:.1f} s)")
