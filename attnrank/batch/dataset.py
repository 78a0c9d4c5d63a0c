"""The Ray Data dataset of a batch run (:func:`attnrank.batch.runner.run_batch`): retrieval
actors then reranking actors (:func:`build_dataset`), Ray Data's settings for the run, and the
driver's loop that commits the rows as they come (:func:`drain`), a stage's error as one line."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..llm.headspec import parse_heads
from ..rerank.signals import candidate_terms
from .config import BatchConfig, Resources
from .sink import CheckpointSink
from .stages import DriverModel, RerankStage, RetrievalStage, StageError

logger = logging.getLogger("attnrank.batch.runner")  # (the run's own logger, as before the split)


@contextlib.contextmanager
def ray_data_settings(ray: Any, progress: bool) -> Iterator[None]:
    """Ray Data's process-wide settings for one run, put back after it (a notebook's or a caller's
    own Ray Data work kept them): its logger at WARNING unless ``progress`` (it logs each dataset's
    plan and progress at INFO), progress bars as ``progress``, and a stage's error raised as itself."""
    log = logging.getLogger("ray.data")
    ctx = ray.data.DataContext.get_current()
    before = (log.level, ctx.enable_progress_bars, ctx.raise_original_map_exception)
    if not progress:
        log.setLevel(logging.WARNING)
    ctx.enable_progress_bars = progress
    ctx.raise_original_map_exception = True  # a stage's StageError reaches the driver (else a bare UserCodeException)
    try:
        yield
    finally:
        log.setLevel(before[0])
        ctx.enable_progress_bars, ctx.raise_original_map_exception = before[1], before[2]


def _check_placeable(ray: Any, res: Resources, rerank: bool, local: bool) -> None:
    """Ray queues an actor until a node offers what it declares. A local Ray (``local``) never
    gains a node, so an actor it cannot place now is refused (the run waited for ever: the CLI
    checked it, ``run_batch`` did not); on a cluster that lacks it now (a GPU, enough CPUs) the run
    waits for nodes to join (autoscaling), which is said."""
    have = ray.cluster_resources()
    needs = [("CPU", res.retrieval_cpus)]
    if rerank:
        needs += [("CPU", res.rerank_cpus), ("GPU", res.rerank_gpus)]
    for kind, amount in needs:
        if amount > have.get(kind, 0.0) and local:
            raise InputError(
                f"an actor needs {amount} {kind} and the local Ray has {have.get(kind, 0.0)}; it would wait for ever: "
                "give Resources with fewer CPUs per actor (--actor-cpus), device='cpu' without a GPU, or the "
                "address of a Ray cluster that has them"
            )
        if amount > have.get(kind, 0.0):
            logger.warning(
                "the Ray cluster offers %s %s now and an actor needs %s; the run waits until a node with "
                "them joins (lower --actor-cpus, or --device cpu, if none will)",
                have.get(kind, 0.0),
                kind,
                amount,
            )


def drain(
    ds: Any, sink: CheckpointSink, total: int, resumed: int, on_commit: Callable[[int, int], None] | None
) -> float:
    """Commit the dataset's rows as they come; returns the seconds it took."""
    t1 = time.perf_counter()
    done = resumed  # (this run's queries: the checkpoint may hold others, of an earlier queries file)
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            done += sink.add(batch.to_pylist())  # (the rows it kept: a batch Ray retried brings duplicates)
            if on_commit is not None:
                on_commit(done, total)
            logger.info(
                "batch: %d/%d queries, %.2f q/s", done, total, (done - resumed) / max(time.perf_counter() - t1, 1e-9)
            )
    except Exception as e:
        line = _stage_line(e)
        if line is not None:  # one line naming the query (or the model, the index), not Ray's traceback
            raise StageError(line) from None
        raise
    return time.perf_counter() - t1


_RAISED_IN_ACTOR = re.compile(rf"^{re.escape(f'{StageError.__module__}.{StageError.__qualname__}')}: (.+)$", re.M)


def _stage_line(e: BaseException) -> str | None:
    """The :class:`StageError` a stage raised, as Ray hands it to the driver: a task's error carries
    it as ``cause``; an actor that died in its constructor (the model or index it loaded is not the
    run's) reaches the driver as an ``ActorDiedError`` whose message ends with the error's line."""
    cause = getattr(e, "cause", e)
    if isinstance(cause, StageError):
        return cause.line
    message = getattr(e, "error_msg", None)
    found = _RAISED_IN_ACTOR.findall(message) if isinstance(message, str) else []
    return found[-1] if found else None


def build_dataset(
    ray,
    rows: list[dict[str, str]],
    config: BatchConfig,
    res: Resources,
    index_tag: str | None,
    *,
    model: DriverModel | None = None,
    local: bool = False,
):
    """The Ray Data dataset: retrieval actors, then (if ``rerank``) reranking actors (``ray.data``
    imported by :func:`run_batch`'s check of the extra); ``model``: :func:`~attnrank.batch.runner.driver_model`'s;
    ``local``: a Ray started in this process (:func:`_check_placeable`)."""
    _check_placeable(ray, res, config.rerank > 0, local)
    ds = ray.data.from_items(rows, override_num_blocks=max(1, len(rows) // res.retrieval_batch))
    depth = max(config.k, config.rerank)
    ds = ds.map_batches(
        RetrievalStage,
        fn_constructor_args=(str(Path(config.index).absolute()), depth),  # (a worker runs in its own folder)
        fn_constructor_kwargs={
            "mode": config.mode,
            "keep_text": config.rerank > 0,
            "index_tag": index_tag,
            "threads": res.retrieval_threads,
        },
        batch_size=res.retrieval_batch,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=res.retrieval_actors),
        num_cpus=res.retrieval_cpus,
    )
    if config.rerank > 0:
        threads = res.rerank_threads
        ds = ds.map_batches(
            RerankStage,
            fn_constructor_args=(config.rerank, config.k),
            fn_constructor_kwargs=rerank_stage_kwargs(config, threads, index_tag, model=model),
            batch_size=res.rerank_batch,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=res.rerank_actors),
            num_cpus=res.rerank_cpus,
            num_gpus=res.rerank_gpus or None,
        )
    return ds


def rerank_stage_kwargs(
    config: BatchConfig, threads: int, index_tag: str | None, *, model: DriverModel | None = None
) -> dict[str, Any]:
    """The keyword arguments every :class:`RerankStage` actor is made with: the reranker's
    configuration, the index it checks, its threads, the driver's candidate BM25 stemmer, which
    the checkpoint records (where candidate BM25 runs at all: None for attention alone), and the
    model's fingerprint and registry digest the checkpoint records (``model``: :func:`~attnrank.batch.runner.driver_model`'s)."""
    rerank = config.rerank_config()
    if isinstance(rerank.heads, str) and rerank.heads.endswith(".json"):  # parse_heads' rule, as _settings reads it
        # read here, once: each actor read the file itself, from its own folder and whenever Ray
        # (re)started it, so an edit during a run, or another node's file, mixed two head sets
        rerank = replace(rerank, heads=parse_heads(rerank.heads))
    if isinstance(rerank.model, str) and not Path(rerank.model).is_absolute() and Path(rerank.model).exists():
        # a model folder or file named relative to the driver's folder: each worker runs in its own
        rerank = replace(rerank, model=str(Path(rerank.model).absolute()))
    return {
        "config": rerank,
        "index": str(Path(config.index).absolute()),  # (not resolved: a link may name it on every node)
        "threads": threads,
        "index_tag": index_tag,
        "stemmer": candidate_terms().stemmer if rerank.signals is not None else None,
        "model": model,
    }
