"""Batch search + rerank on Ray Data: queries → retrieval actors → reranking actors → run file.

The pipeline (Ray Data streaming execution, Moritz et al., OSDI 2018 for Ray)::

    queries (JSONL/TSV/Parquet, minus those already committed)
      → map_batches(RetrievalStage, R actors, num_cpus=…)            one index per actor
      → map_batches(RerankStage,   M actors, num_cpus/num_gpus=…)  one model per actor
      → the driver commits rows to checkpoint parts (:class:`CheckpointSink`)
      → TREC run and/or Parquet with per-stage scores, in input order

Ray Data restarts a dead actor and retries its batch (``max_restarts=-1``,
``max_task_retries=-1``); the sink drops rows of queries already committed, and the end check
requires exactly one row per query, so a crash neither loses nor duplicates rows. A rerun with the
same checkpoint folder and settings resumes where the last one stopped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, require
from ..index.sharded.executor import RayExecutor
from .rows import read_queries
from .sink import CheckpointSink
from .stages import RerankStage, RetrievalStage

logger = logging.getLogger(__name__)


@dataclass
class BatchConfig:
    """What a batch run computes (recorded in the checkpoint; a resume must match it)."""

    index: str
    k: int = 10
    rerank: int = 0
    mode: str | None = None
    model: str | None = None
    heads: str | None = None
    device: str = "cpu"

    def check(self) -> None:
        if self.k < 1:
            raise InputError(f"--k {self.k} must be at least 1 (results per query)")
        if self.rerank < 0:
            raise InputError(f"--rerank {self.rerank} must be 0 (off) or a positive depth")
        if not Path(self.index).is_dir():
            raise InputError(f"index {self.index!r} is not a folder; build one with `attnrank index` (--shards N)")


@dataclass
class Resources:
    """Actors per stage and what each declares to Ray (CPUs may be fractions)."""

    retrieval_actors: int = 1
    rerank_actors: int = 1
    retrieval_cpus: float = 1.0
    rerank_cpus: float = 1.0
    rerank_gpus: float = 0.0
    retrieval_batch: int = 16
    rerank_batch: int = 4


def _check_checkpoint(parts_dir: Path, config: BatchConfig) -> None:
    """Refuse to resume a checkpoint written with other settings."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    path = parts_dir / "settings.json"
    mine = asdict(config)
    if path.exists():
        theirs = json.loads(path.read_text(encoding="utf-8"))
        if theirs != mine:
            diff = sorted(k for k in mine if mine[k] != theirs.get(k))
            raise InputError(
                f"checkpoint {parts_dir} holds a run with other settings ({', '.join(diff)}); "
                "delete it or give another --checkpoint"
            )
    else:
        path.write_text(json.dumps(mine, indent=1), encoding="utf-8")


def run_batch(
    queries: str | Path | dict[str, str],
    config: BatchConfig,
    *,
    output: Path | None = None,
    parquet: Path | None = None,
    checkpoint: Path | None = None,
    resources: Resources | None = None,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    object_store_mb: int | None = None,
    on_commit: Callable[[int, int], None] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the pipeline; returns counts, timings and throughput (queries/s)."""
    config.check()
    res = resources or Resources()
    if output is None and parquet is None:
        raise InputError("give an output: -o RUN.trec and/or --parquet FILE")
    qs = queries if isinstance(queries, dict) else read_queries(queries)
    parts_dir = checkpoint or Path(f"{output or parquet}.parts")
    _check_checkpoint(parts_dir, config)
    sink = CheckpointSink(parts_dir)
    todo = [q for q in qs if q not in sink.done]
    stats: dict[str, Any] = {"queries": len(qs), "resumed_skipped": len(qs) - len(todo)}
    t0 = time.perf_counter()
    if todo:
        ex = RayExecutor(ray_address, num_cpus=num_cpus, object_store_mb=object_store_mb, quiet=not progress)
        stats["ray_startup_seconds"] = round(ex.startup_seconds, 3)
        try:
            t1 = time.perf_counter()
            ds = _pipeline(ex.ray, [{"qid": q, "query": qs[q]} for q in todo], config, res, progress)
            for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                sink.add(batch.to_pylist())
                done = len(sink.done) + len(sink.buffer)
                if on_commit is not None:
                    on_commit(done, len(qs))
                logger.info(
                    "batch: %d/%d queries, %.2f q/s",
                    done,
                    len(qs),
                    (done - stats["resumed_skipped"]) / max(time.perf_counter() - t1, 1e-9),
                )
            stats["pipeline_seconds"] = round(time.perf_counter() - t1, 3)
        finally:
            sink.commit()
            ex.close()
    tag = f"attnrank-{config.mode or _index_mode(config.index)}"
    stats.update(sink.finish(list(qs), trec=output, parquet=parquet, tag=tag))
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    stats["queries_per_second"] = round(len(todo) / stats["pipeline_seconds"], 4) if todo else None
    return stats


def _pipeline(ray, rows: list[dict[str, str]], config: BatchConfig, res: Resources, progress: bool):
    """The Ray Data dataset: retrieval actors, then (if ``rerank``) reranking actors."""
    require("ray.data", "ray", "batch search and reranking")
    if not progress:  # Ray Data logs each dataset's plan and progress at INFO (set up when it is imported)
        logging.getLogger("ray.data").setLevel(logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress
    ds = ray.data.from_items(rows, override_num_blocks=max(1, len(rows) // res.retrieval_batch))
    depth = max(config.k, config.rerank)
    ds = ds.map_batches(
        RetrievalStage,
        fn_constructor_args=(config.index, depth),
        fn_constructor_kwargs={"mode": config.mode, "keep_text": config.rerank > 0},
        batch_size=res.retrieval_batch,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=res.retrieval_actors),
        num_cpus=res.retrieval_cpus,
    )
    if config.rerank > 0:
        threads = max(1, round(res.rerank_cpus))
        ds = ds.map_batches(
            RerankStage,
            fn_constructor_args=(config.rerank, config.k),
            fn_constructor_kwargs={
                "model": config.model,
                "heads": config.heads,
                "device": config.device,
                "threads": threads,
            },
            batch_size=res.rerank_batch,
            batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=res.rerank_actors),
            num_cpus=res.rerank_cpus,
            num_gpus=res.rerank_gpus or None,
        )
    return ds


def _index_mode(index: str) -> str:
    m = json.loads((Path(index) / "manifest.json").read_text(encoding="utf-8"))
    return m["fusion"]["mode"]
