"""``attnrank batch`` (search + rerank on Ray Data), ``attnrank merge-shards``, and the sharded build
behind ``attnrank index --shards N``."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Optional

import typer

from . import (
    Quiet,
    Verbose,
    _check_heads,
    _check_output,
    _index_path,
    _positive,
    _setup,
    app,
    named_preset,
    option_errors,
)
from .options import INDEX_NAME_HELP, Dtype, refuse_without_rerank
from .rerank_config import check_attention_computed

logger = logging.getLogger(__name__)


def build_sharded(
    docs,
    target: Path,
    shards: int,
    retriever,
    ray_address: str | None,
    *,
    force: bool = False,
    protect=(),
    num_cpus: int | None = None,
    progress: bool = True,
) -> str:
    """Build ``shards`` shards of ``docs`` into ``target`` (Ray tasks when ``ray_address`` is given;
    ``num_cpus``: the CPUs of a local one; without ``progress`` (``--quiet``), Ray's INFO logs off);
    ``force``/``protect`` as for an ordinary index (:func:`attnrank.index.folders.check_target`)."""
    from ..index.sharded import LocalExecutor, RayExecutor, ShardedIndexer

    executor = (
        LocalExecutor()
        if ray_address is None
        else RayExecutor(None if ray_address == "local" else ray_address, num_cpus=num_cpus, quiet=not progress)
    )
    try:
        ShardedIndexer(retriever, shards=shards, executor=executor).build(docs, target, force=force, protect=protect)
    finally:
        executor.close()
    return f"indexed {len(docs)} documents into {shards} shards at {target} ({executor.name})"


@app.command("merge-shards")
def merge_shards_cmd(
    sharded: str = typer.Argument(
        ...,
        help="Sharded index (built with `attnrank index --shards N`): its folder, or the --index name it was built "
        "under (./indexes/NAME, or $ATTNRANK_INDEX_DIR/NAME).",
    ),
    index: Optional[str] = typer.Option(None, "--index", "-n", help=f"{INDEX_NAME_HELP} of the merged index."),
    output: Optional[Path] = typer.Option(None, "--index-dir", "-o", help="Folder of the merged, ordinary index."),
    force: bool = typer.Option(
        False, "--force", help="Replace a non-empty folder that is not an attnrank index (never the source)."
    ),
    quiet: bool = Quiet,
    verbose: bool = Verbose,
) -> None:
    """Merge a sharded index into one ordinary index (same scores, one machine)."""
    from ..index.sharded import merge_shards

    _setup(quiet, verbose)
    target = _index_path(index, output)
    source = _sharded_source(sharded)
    typer.echo(f"merged {source} into {merge_shards(source, target, force=force)}")


def _sharded_source(text: str) -> Path:
    """The sharded index ``text`` names: a folder, else a plain name (no ``/``, not starting with
    ``.``: ``./shn`` is a path) as ``--index`` reads it (``merge-shards shn`` looked for ./shn, not
    for ./indexes/shn, which ``index --index shn --shards 2`` wrote, and said ./shn had no manifest)."""
    from ..config import index_root

    given = Path(text)
    if given.exists() or given.is_symlink():
        return given
    plain = "/" not in text and os.sep not in text and not text.startswith((".", "~"))
    named = index_root() / text if plain else None
    if named is not None and named.is_dir():
        return named
    where = f" nor an index named {text!r} ({named})" if named is not None else ""
    raise typer.BadParameter(
        f"{text} is no folder{where}; give the sharded index's folder, or the --index name it was built under"
    )


def _check_cpus(actor_cpus: float, num_cpus: Optional[int], ray_address: Optional[str]) -> None:
    """Actors a local Ray could never place would wait forever: refuse them before Ray starts."""
    if num_cpus is not None:
        _positive(num_cpus, "--num-cpus", "CPUs of the local Ray")
    if num_cpus is not None and ray_address is not None:  # (a cluster's CPUs are its own; it was ignored)
        raise typer.BadParameter(
            f"--num-cpus {num_cpus} sets the CPUs of a local Ray, not of the cluster at --ray-address "
            f"{ray_address}; drop one of them"
        )
    if not 0 < actor_cpus < math.inf:  # (NaN passed `<= 0`)
        raise typer.BadParameter(f"--actor-cpus {actor_cpus} must be a finite number > 0")
    cpus = num_cpus or os.cpu_count() or 1
    if ray_address is None and actor_cpus > cpus:
        raise typer.BadParameter(
            f"--actor-cpus {actor_cpus} is more than the {cpus} CPUs of the local Ray, so no actor could start; "
            f"give at most {cpus} (or more --num-cpus)"
        )


def _check_device(device: str, ray_address: Optional[str]) -> None:
    """A bad device fails in every rerank actor (retried without end); a local Ray without a GPU
    never places an actor that declares one: refuse both before Ray starts."""
    from ..batch.config import check_actor_device, check_device

    with option_errors():
        check_actor_device(device, "--device ")  # (auto, which BatchConfig reads as cpu, declared no GPU: refused)
        check_device(device, ray_address, 1.0)  # (each rerank actor declares one GPU: batch's Resources)


def _batch_index(name: Optional[str], index_dir: Optional[Path]) -> Path:
    """The index folder of ``--index NAME`` (under ./indexes) or ``--index-dir DIR``, as every other
    command resolves them. ``batch --index`` once took a folder path: a value with a path separator
    that is an existing folder, and no index name, is still taken as one, with a warning."""
    from ..config import index_root

    if name and index_dir is None and ("/" in name or os.sep in name):
        path = Path(name).expanduser()
        if not path.is_absolute() and (index_root() / name).is_dir():
            return _index_path(name, index_dir)  # (refused as a name: it is not a plain one)
        if not path.is_dir():
            raise typer.BadParameter(
                f"index {name!r} is not a folder; build one with `attnrank index` (--index takes an index "
                f"name under {index_root()}; give a folder as --index-dir DIR)"
            )
        logger.warning(
            "--index %s is a folder path, read as one; --index takes an index name under %s: "
            "give the folder as --index-dir %s",
            name,
            index_root(),
            name,
        )
        return path
    target = _index_path(name, index_dir)
    if name and index_dir is None and not target.exists() and Path(name).is_dir():  # (e.g. `--index idx` of old)
        raise typer.BadParameter(
            f"no index named {name!r} under {index_root()}; for the folder {name} give --index-dir {name}"
        )
    return target


def _check_outputs(queries: Path, output: Optional[Path], parquet: Optional[Path]) -> None:
    """Outputs replace only files attnrank wrote (a run, a batch Parquet file), never the queries."""
    from ..files import is_batch_parquet
    from .outputs import check_not_input, check_output_path, check_replaceable

    if output is None and parquet is None:  # (a missing option: a usage error, exit 2)
        raise typer.BadParameter("give an output: -o RUN.trec and/or --parquet FILE")
    _check_output(output, {"queries": queries})
    if parquet is not None:
        check_output_path(parquet, "--parquet")
        check_not_input(parquet, {"queries": queries}, "--parquet")
        check_replaceable(parquet, is_batch_parquet, "a batch Parquet file", "--parquet")


@app.command()
def batch(
    queries: Path = typer.Argument(..., help="Queries: BEIR queries.jsonl, TSV id<TAB>text, or Parquet (id, text)."),
    index_name: Optional[str] = typer.Option(
        None,
        "--index",
        "-n",
        help=f"{INDEX_NAME_HELP} (ordinary or sharded; as `attnrank index --index`).",
    ),
    index_dir: Optional[Path] = typer.Option(
        None, "--index-dir", help="Or an explicit index folder, ordinary or sharded (every Ray worker reads it)."
    ),
    k: int = typer.Option(10, "--top-k", "-k", help="Results per query."),
    rerank: int = typer.Option(0, "--rerank", help="Rerank the top K hits (--preset; default likelihood; 0 = off)."),
    mode: Optional[str] = typer.Option(None, help="bm25 | dense | hybrid (default: the index's setting)."),
    model: Optional[str] = typer.Option(None, help="LLM for --rerank (default: packaged SmolLM2-135M)."),
    preset: Optional[str] = typer.Option(
        None,
        "--preset",
        callback=named_preset,
        help="Reranking preset for --rerank (default: likelihood; 'signals' runs no LLM; 'fused' adds attention).",
    ),
    heads: Optional[str] = typer.Option(
        None, help="Heads for --rerank with a preset that reads attention: 'all', 'l-h,l-h', or a JSON file."
    ),
    device: str = typer.Option("cpu", help="Reranker device: cpu | cuda (cuda declares one GPU per rerank actor)."),
    dtype: str = Dtype,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="TREC run file."),
    parquet: Optional[Path] = typer.Option(
        None, "--parquet", help="Parquet file, one row per query with per-stage scores."
    ),
    checkpoint: Optional[Path] = typer.Option(
        None,
        "--checkpoint",
        help="Checkpoint folder (default: -o's path + .parts, else --parquet's); a rerun with the same folder resumes.",
    ),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", help="Ray cluster ('auto', 'ray://host:10001'); default (or 'local'): a local Ray."
    ),
    num_cpus: Optional[int] = typer.Option(None, "--num-cpus", help="CPUs of the local Ray (default: all)."),
    retrieval_actors: int = typer.Option(1, "--retrieval-actors", help="Retrieval actors (one index each)."),
    rerank_actors: int = typer.Option(1, "--rerank-actors", help="Reranking actors (one model each)."),
    actor_cpus: float = typer.Option(1.0, "--actor-cpus", help="CPUs each actor declares (fractions allowed)."),
    quiet: bool = Quiet,
    verbose: bool = Verbose,
) -> None:
    """Search (and rerank) a queries file on Ray Data; resumable, one row per query."""
    from ..batch import BatchConfig, Resources, run_batch

    progress = _setup(quiet, verbose)
    ray_address = None if ray_address == "local" else ray_address  # (as `index --ray-address local`: a local Ray)
    for name, value in (("--retrieval-actors", retrieval_actors), ("--rerank-actors", rerank_actors)):
        if value < 1:
            raise typer.BadParameter(f"{name} {value} must be at least 1")
    _check_cpus(actor_cpus, num_cpus, ray_address)
    if rerank > 0:
        _check_device(device, ray_address)
        _check_heads(heads, model=model)
    elif rerank == 0:  # options of the reranker, which only --rerank K runs
        given = [
            o
            for o, v in (
                ("--model", model),
                ("--preset", preset),
                ("--heads", heads),
                ("--device", device != "cpu" or None),
                ("--dtype", dtype != "auto" or None),
                ("--rerank-actors", rerank_actors != 1 or None),
            )
            if v
        ]
        refuse_without_rerank(given)
    index = _batch_index(index_name, index_dir)
    _check_outputs(queries, output, parquet)
    config = BatchConfig(
        str(index), k=k, rerank=rerank, mode=mode, model=model, heads=heads, device=device, preset=preset, dtype=dtype
    )
    if rerank > 0:  # attention options on a preset without attention: named flags (run_batch checks the rest)
        check_attention_computed(preset, {"heads": heads} if heads is not None else {})
    with option_errors():  # -k, --mode, --rerank, the index folder, what the preset looks up: before Ray starts
        config.check()
    res = Resources(retrieval_actors, rerank_actors, actor_cpus, actor_cpus, 1.0 if device.startswith("cuda") else 0.0)
    stats = run_batch(
        queries,
        config,
        output=output,
        parquet=parquet,
        checkpoint=checkpoint,
        resources=res,
        ray_address=ray_address,
        num_cpus=num_cpus,
        progress=progress,
    )
    qps = stats["queries_per_second"]
    typer.echo(
        f"wrote {stats['rows']} queries ({stats['resumed_skipped']} resumed) to {output or parquet}"
        + (f"; {qps:.2f} queries/s" if qps else "")
    )
    if stats.get("no_hits"):  # (absent from a TREC run: a query without lines)
        typer.echo(f"warning: {stats['no_hits']} of {stats['rows']} queries had no hit (no line in a TREC run)")
