"""The ``attnrank`` command line (Typer).

One module per concern; each registers its commands on :data:`app` when imported:

- :mod:`attnrank.cli.retrieval`: ``index``, ``search``, ``eval``
- :mod:`attnrank.cli.rerank`: ``rerank``
- :mod:`attnrank.cli.demo`: ``demo``
- :mod:`attnrank.cli.rag`: ``prune``, ``ask``
- :mod:`attnrank.cli.heads`: the ``heads`` sub-app (``detect``, ``show``)
- :mod:`attnrank.cli.batch`: ``batch`` (Ray Data) and ``merge-shards``

This module holds the app, the console entry point :func:`main` and the helpers the commands share.
Heavy modules (torch, transformers, FAISS) are imported inside the commands, so ``attnrank --help``
stays fast.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import AttnrankError

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
    from ..config import index_root

    if index_dir is not None:
        return index_dir
    if not name:
        raise typer.BadParameter("give --name NAME (stored under ./indexes) or --index-dir DIR")
    if "/" in name or name.startswith("."):
        raise typer.BadParameter(f"index name {name!r} must be a plain name; use --index-dir for a path")
    return index_root() / name


def _rerank_head(reranker, res, depth: int):
    """Rerank the top ``depth`` of ``res``; the rest keeps its order below them."""
    from dataclasses import replace

    from ..types import RankedResults

    head = reranker.rank(res.query, res.results[:depth], query_id=res.query_id)
    floor = min(head.scores, default=0.0)
    # keep the tail below the reranked head, in its first-stage order
    tail = [replace(d, score=floor - i) for i, d in enumerate(res.results[depth:], start=1)]
    return RankedResults(res.query, head.results + tail, res.query_id, stage="attention")


def _print_results(res) -> None:
    for d in res:
        stages = " ".join(f"{k}={v:.3f}" for k, v in d.stage_scores.items())
        head = (d.title + ": " if d.title else "") + d.text
        typer.echo(f"{d.rank:>3}. {d.id}  {d.score:.4f}  [{stages}]\n     {head[:110]}")


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


# Register the commands (after the shared names above exist: the modules import them from here).
from . import batch, demo, heads, rag, rerank, retrieval  # noqa: E402,F401

# `attnrank --help` lists the commands in workflow order, whatever the import order above (others last)
_ORDER = ("index", "search", "rerank", "eval", "demo", "prune", "ask")


def _order(info) -> int:
    name = info.name or getattr(info.callback, "__name__", "")
    return _ORDER.index(name) if name in _ORDER else len(_ORDER)


app.registered_commands.sort(key=_order)

__all__ = ["app", "main"]
