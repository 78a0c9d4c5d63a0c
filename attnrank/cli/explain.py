"""``attnrank explain``: why each passage ranked where it did (HTML heat-map page + PNG)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import typer

from ..errors import InputError
from ..types import check_unicode
from . import Quiet, Verbose, _check_heads, _index_path, _setup, app, option_errors
from .options import INDEX_NAME_HELP, Dtype, check_model_readable, check_registry_lookups

logger = logging.getLogger(__name__)


@app.command()
def explain(
    query: str = typer.Argument(..., help="The query to retrieve, rerank and explain."),
    name: str | None = typer.Option(None, "--index", "-n", help=f"{INDEX_NAME_HELP}."),
    index_dir: Path | None = typer.Option(None, "--index-dir", help="Or an explicit index folder."),
    k: int = typer.Option(5, "--top-k", "-k", help="First-stage hits reranked and explained."),
    model: str | None = typer.Option(None, help="LLM: HF id, local path or .gguf (default: packaged SmolLM2-135M)."),
    heads: str | None = typer.Option(
        None,
        help="'all', 'auto' (registered set), 'l-h,l-h' or a JSON head file (default: the heads preset fused "
        "reads, those its weights were fitted to).",
    ),
    output: Path = typer.Option(Path("explain"), "--output", "-o", help="Folder for explain.html and explain.png."),
    png: bool = typer.Option(True, "--png/--no-png", help="Also write the PNG (needs the 'plot' extra)."),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda | cuda:N | auto."),
    dtype: str = Dtype,
    quiet: bool = Quiet,
    verbose: bool = Verbose,
) -> None:
    """Rerank the top K hits with preset fused and show the per-token attention behind each
    attention score (HTML + PNG).

    Writes explain.html (a self-contained heat map over each passage) and explain.png; the
    counted token scores of a passage add up to its attention score (which the fused score
    combines with the first-stage signals)."""
    import numpy as np

    from ..explain import explain_results
    from ..explain.render import write_html, write_png
    from ..index.retriever import HybridRetriever
    from ..rerank.config import RerankConfig
    from ..rerank.fused import ATTENTION
    from ..rerank.over_index import index_reranker

    _setup(quiet, verbose)
    if k < 1:
        raise typer.BadParameter(f"-k {k} must be at least 1 (hits explained)")
    if not query.strip():
        raise typer.BadParameter("the query is empty; give the query text")
    with option_errors():  # (undecodable bytes: refused after the index loaded, exit 1)
        check_unicode([query], "QUERY")
    if png:
        from ..errors import require

        require("matplotlib", "plot", "explain --png")
    _check_folder(output, png)
    _check_heads(heads, model=model)
    # attention evidence: a preset that computes it (block attention; its weights' heads unless given)
    given: dict[str, Any] = {"heads": heads} if heads else {}
    with option_errors():  # an option value it refuses (a dtype, a device)
        config = RerankConfig.preset("fused", model=model, device=device, dtype=dtype, **given)
    check_model_readable(config.model)  # before the index loads
    check_registry_lookups(config)  # the fused weights and heads, before the index and the model load
    retriever = HybridRetriever.load(_index_path(name, index_dir))
    first = retriever.search(query, k)
    if not first.results:  # an empty page, exit 0 (and the image refused after the page replaced the last)
        raise InputError(
            f"no passage was retrieved for {query!r} (a keyword-only index and no query word in it?); "
            "rephrase the query or search a dense or hybrid index"
        )
    # as search --rerank ranks them: the index's stored passage states and its vectors for the dense signal
    reranker = index_reranker(config, _index_path(name, index_dir), retriever)
    res = reranker.rank(query, first, return_evidence=True)
    explanations = explain_results(reranker, res)
    from ..files import replace_guard
    from .outputs import is_explain_page, is_explain_png

    # checked again as they are replaced: the folder was checked before the index and the model loaded
    guard = replace_guard(is_explain_page, "an explain page", "--output")
    fused = reranker.fused
    # (gated weights rank a query whose attention is not confident by the first-stage signals alone)
    set_aside = fused is not None and fused.confident({ATTENTION: np.array([e.score for e in explanations])}) is False
    page = write_html(
        output / "explain.html",
        query,
        explanations,
        model=reranker.llm.model_id,
        fused=fused is not None,
        set_aside=set_aside,
        guard=guard,
    )
    if set_aside:
        typer.echo(
            "attention was set aside for this query (confidence below the gate): ranked by the first-stage signals"
        )
    for e in explanations:
        top = ", ".join(repr(t.text.strip()) for t in e.top_tokens(3))
        typer.echo(
            f"{e.rank:>3}. {e.id}  attention {e.score:+.5f} = sum of {len(e.tokens) - e.filtered} token scores "
            f"({e.filtered} filtered); top: {top}"
        )
    typer.echo(f"wrote {page}")
    if png:
        png_guard = replace_guard(is_explain_png, "an explain image", "--output")
        typer.echo(f"wrote {write_png(output / 'explain.png', query, explanations, guard=png_guard)}")
    elif is_explain_png(output / "explain.png"):  # (an earlier run's image of another query, beside this page)
        logger.warning(
            "%s is an earlier run's image, not this page's; remove it or run without --no-png", output / "explain.png"
        )  # (a file of the name that attnrank did not write is the user's: said nothing of, as the page is)


def _check_folder(output: Path, png: bool) -> None:
    """Before any work: ``--output`` can be a folder, and the files written there are new, empty or
    attnrank's (the explain page; the PNG beside the page attnrank wrote)."""
    from .outputs import check_output_path, check_replaceable, is_explain_page, is_explain_png

    if output.exists() and not output.is_dir():
        raise typer.BadParameter(f"--output {output} is a file; give a folder for explain.html and explain.png")
    if not output.exists() and output.suffix.lower() in (".html", ".htm", ".png"):  # (made a folder page.html/)
        raise typer.BadParameter(
            f"--output {output} names a file, but explain writes a folder (explain.html, explain.png in it); "
            f"give a folder, e.g. --output {output.with_suffix('')}"
        )
    blocker = next((p for p in output.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise typer.BadParameter(f"--output {output}: {blocker} is a file, not a folder; choose another path")
    page = output / "explain.html"
    # (a folder, pipe or device there failed at the rename, after all the work)
    check_output_path(page)
    if png:
        check_output_path(output / "explain.png")
    check_replaceable(page, is_explain_page, "an explain page")
    if png:
        check_replaceable(output / "explain.png", is_explain_png, "an explain image")
