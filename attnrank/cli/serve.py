"""``attnrank serve``: the HTTP server (extra ``serve``; see :mod:`attnrank.serve`)."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from ..rerank.config import RerankConfig
from . import Quiet, Verbose, _index_path, _setup, app
from .options import (
    INDEX_NAME_HELP,
    check_model_readable,
    check_pruner_lookups,
    check_registry_lookups,
    rerank_and_prune_options,
)
from .rerank_config import pruning_config

logger = logging.getLogger(__name__)


@app.command()
@rerank_and_prune_options
def serve(
    name: str | None = typer.Option(
        None,
        "--index",
        "-n",
        help=f"{INDEX_NAME_HELP} (enables /v1/search, /v1/prune over it, /v1/ask).",
    ),
    index_dir: Path | None = typer.Option(None, "--index-dir", help="Or an explicit index folder."),
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind (loopback by default; 0.0.0.0 or :: exposes the server to the network)."
    ),
    port: int = typer.Option(8000, help="TCP port."),
    max_queued: int = typer.Option(16, "--max-queued", help="Requests waiting for the model before 503."),
    max_documents: int = typer.Option(256, "--max-documents", help="Documents per request (413 above)."),
    max_document_chars: int = typer.Option(20_000, "--max-document-chars", help="Characters per document (413 above)."),
    max_total_tokens: int = typer.Option(65_536, "--max-total-tokens", help="Tokens of query + documents (413 above)."),
    quiet: bool = Quiet,
    verbose: bool = Verbose,
    rerank_config: RerankConfig = None,  # type: ignore[assignment]  # filled in by @rerank_and_prune_options
    rerank_given: frozenset[str] = frozenset(),  # filled in by @rerank_and_prune_options
) -> None:
    """Serve reranking (Cohere v2 and TEI shapes), search, pruning and streamed answers over HTTP."""
    from ..errors import require

    if not host.strip():  # (bind(("", port)) listens on every interface)
        raise typer.BadParameter(
            f"--host {host!r} is empty; give an address (127.0.0.1, the default, or 0.0.0.0 to listen on every interface)"
        )
    for opt, value, low in (
        ("--port", port, 0),
        ("--max-queued", max_queued, 1),
        ("--max-documents", max_documents, 1),
        ("--max-document-chars", max_document_chars, 1),
        ("--max-total-tokens", max_total_tokens, 1),
    ):
        if value < low or (opt == "--port" and value > 65535):
            limit = "0-65535 (0: a free port)" if opt == "--port" else f"at least {low}"
            raise typer.BadParameter(f"{opt} {value} is out of range ({limit})")
    require("uvicorn", "serve", "attnrank serve")
    from ..serve.app import create_app
    from ..serve.background import allowed_hosts, bound_socket, url_host, uvicorn_server
    from ..serve.engine import build_engine
    from ..serve.schemas import Limits

    _setup(quiet=quiet, verbose=verbose)
    if not quiet:  # one line per request, --verbose or not (--quiet: no info logs, no bars, as every command)
        logging.getLogger("attnrank.serve.access").setLevel(logging.INFO)
    index = _index_path(name, index_dir) if name is not None or index_dir is not None else None
    if index is not None and index.exists() and not index.is_dir():
        raise typer.BadParameter(f"index folder {index} is a file; give the folder `attnrank index` built")
    if index is not None and not index.is_dir():
        raise typer.BadParameter(f"index folder {index} does not exist; build it with `attnrank index`")
    # the pruner as `attnrank ask` builds it: --attention, --block-positions, --state-cache-mb reach it where given
    prune = pruning_config(rerank_config, rerank_given, heads="all")  # (ask: --prune-heads, default all)
    check_model_readable(rerank_config.model)  # (the one model of every stage) before the index loads
    check_registry_lookups(rerank_config)  # what both stages read from the head registry, before any load
    check_pruner_lookups(prune)
    # bound before the index and the model load (a port in use was found minutes later), so that the
    # address is printed whatever uvicorn logs (with --port 0, the port it got)
    try:
        sock = bound_socket(host, port)
    except OSError as e:
        raise typer.BadParameter(f"cannot listen on {host}:{port} ({e.strerror}); give another --host/--port") from None
    with sock:
        engine = build_engine(rerank_config, index=index, prune=prune)
        limits = Limits(
            max_documents=max_documents, max_document_chars=max_document_chars, max_total_tokens=max_total_tokens
        )
        hosts = allowed_hosts(host)
        if hosts is None:
            logger.warning(
                "serving on %s: every route answers anyone who reaches this address, without authentication; "
                "bind 127.0.0.1 (the default), or put the server behind a proxy that authenticates",
                host,
            )
        app = create_app(engine, limits=limits, max_queued=max_queued, allowed_hosts=hosts)
        # (a job still running when a shutdown began is given this long; the queued ones are answered 503 at once)
        server = uvicorn_server(
            app, log_level="info" if verbose else "warning", access_log=False, timeout_graceful_shutdown=30
        )
        typer.echo(f"attnrank serving on http://{url_host(host)}:{sock.getsockname()[1]}")
        server.run(sockets=[sock])
