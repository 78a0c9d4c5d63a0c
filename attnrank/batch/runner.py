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
same checkpoint folder and settings resumes where the last one stopped; a checkpoint is refused when
its settings, its index (rebuilt since) or a query's text differ, when it is in use by another run,
and when the folder is not an attnrank checkpoint (it is never written into); a rerank actor refuses
a model whose weights or registered heads differ from those the checkpoint records (where the driver
could read the model: a path only the workers have is recorded by its name).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import InputError, require
from ..eval.data import check_run_ids
from ..files import check_file_target, is_attnrank_run, is_batch_parquet, refuse_replacing
from ..index.settings import RETRIEVAL_VERSION
from ..index.sharded.executor import RayExecutor
from ..index.sharded.layout import is_sharded, read_sharded
from ..index.store import manifest_tag, read_doc_ids
from ..llm.fingerprint import model_fingerprint, name_fingerprint
from ..llm.headspec import format_heads, parse_heads
from ..llm.models import readable_model
from ..registry import registry_digest
from ..rerank.config import RerankConfig
from ..rerank.fused import SIGNALS_AUTO, SIGNALS_LIKELIHOOD, SIGNALS_ONLY
from ..rerank.fused_resolve import likelihood_weights, signals_only
from ..rerank.precheck import check_queries_before_load
from ..rerank.signals import SIGNALS_VERSION, candidate_terms
from ..rerank.versions import SCORING_VERSION
from ..types import encodable, is_blank
from .checkpoint import check_checkpoint, check_folder, locked_checkpoint
from .config import BatchConfig, Resources, check_device
from .dataset import build_dataset, drain, ray_data_settings
from .rows import read_queries
from .sink import CheckpointSink
from .stages import DriverModel

logger = logging.getLogger(__name__)


def _check_outputs(output: Path | None, parquet: Path | None, queries: str | Path | dict[str, str]) -> None:
    """Refuse outputs that could not be written or would replace an input, before any work."""
    if output is None and parquet is None:
        raise InputError("give an output: -o RUN.trec and/or --parquet FILE")
    if output is not None and parquet is not None and Path(output).resolve() == Path(parquet).resolve():
        raise InputError(f"-o and --parquet are both {output}; give two different files")
    for flag, p in (("-o", output), ("--parquet", parquet)):
        if p is None:
            continue
        if not isinstance(queries, dict) and Path(p).resolve() == Path(queries).resolve():
            raise InputError(f"{flag} {p} is the queries file; give another output path")
        check_file_target(p, flag)
    if output is not None:
        refuse_replacing(output, is_attnrank_run, "a TREC run", "-o")
    if parquet is not None:
        refuse_replacing(parquet, is_batch_parquet, "a batch Parquet file", "--parquet")


def _check_parts_dir(
    parts_dir: Path, output: Path | None, parquet: Path | None, queries: str | Path | dict[str, str]
) -> None:
    """Refuse a checkpoint folder that is one of the run's files (found only at the end, or never)."""
    files = [("-o", output), ("--parquet", parquet)]
    if not isinstance(queries, dict):
        files.append(("the queries file", Path(queries)))
    for what, p in files:
        if p is not None and Path(parts_dir).resolve() == Path(p).resolve():
            raise InputError(f"--checkpoint {parts_dir} is {what}; give the checkpoint its own folder")


def index_doc_ids(root: Path) -> Iterator[str]:
    """The document ids of the index folder ``root`` (a sharded one's shard by shard, its manifest
    checked as a load checks it), streamed from ``docs.jsonl`` without loading the index."""
    if not is_sharded(root):
        return read_doc_ids(root / "docs.jsonl")
    manifest, _ = read_sharded(root)
    return (i for s in manifest["shards"] for i in read_doc_ids(root / s["name"] / "docs.jsonl"))


def _model(config: BatchConfig) -> tuple[str | None, str | None]:
    """(model id, fingerprint) of the reranker's model as the driver sees it (None, None without reranking)."""
    return model_fingerprint(config.model) if config.rerank else (None, None)


def _settings(
    config: BatchConfig, model: tuple[str | None, str | None] | None = None, res: Resources | None = None
) -> dict[str, Any]:
    """What a resume must match: the run's options, the index build and (when reranking) the
    model's weights, the heads in a ``--heads`` file and what the head registry holds for the
    model (registered heads, fused weights), so new weights at the same ``--model`` path, new
    heads in the same file, or newly registered heads or weights are never mixed with old rows;
    and the torch threads of each stage's actors (``res``). ``model``: :func:`_model`'s
    (computed here when not given)."""
    res = res or Resources()
    model_id, weights = _model(config) if model is None else model
    rerank = config.rerank_config() if config.rerank else None
    registry = registry_digest(model_id, weights) if model_id is not None and weights is not None else None
    in_file = None
    if config.rerank and isinstance(config.heads, str) and config.heads.endswith(".json"):  # parse_heads' rule
        in_file = format_heads(parse_heads(config.heads) or [])
    options = asdict(config)
    options["index"] = str(Path(config.index).resolve())  # one folder, however the command spells it
    if not config.rerank:  # nothing runs in it: "auto" resolved on this CPU would refuse a resume on another
        del options["dtype"]
    return {
        **options,
        # The preset the reranker resolves to, not just the one asked for: with none asked for, the
        # default changed (fused -> signals, 2026-12-02), so a checkpoint that lacks this key was
        # reranked by another scorer and is refused, never resumed with rows of the new one.
        "rerank_preset": rerank.name if rerank is not None else None,
        # Since 2026-12-03 the rerank actors read the candidates' dense signal from the index's
        # vectors instead of embedding them in the reranker's dtype (scores move by up to ~3e-3 on
        # a bfloat16 CPU): a checkpoint without this key is refused for a rerank run, not mixed.
        "dense_signal": "index" if config.rerank else None,
        # Since 2026-12-03 the preset `signals` sums the z-scores with equal weights, not the shipped
        # trained ones (both per query): a signals checkpoint without this key is refused, not mixed.
        "signals_model": _signals_model(rerank, model_id, weights),
        # Since 2026-12-04 the default preset may score by a user's trained query-likelihood weights
        # (before, always equal ones, so a checkpoint without this key resumes).
        "likelihood_model": _signals_model(rerank, model_id, weights, SIGNALS_LIKELIHOOD),
        # How the first-stage signals are computed: a later change of it must not mix old rows with new.
        "signals_version": SIGNALS_VERSION if rerank is not None and rerank.signals is not None else None,
        # Candidate BM25 stems only where PyStemmer is installed (2026-12-05): rows of both never mix.
        "candidate_stemmer": candidate_terms().stemmer if rerank is not None and rerank.signals is not None else None,
        # How attention is captured (preset fused: full attention until 2026-12-03, block attention at
        # shared positions since): a checkpoint without this key is refused for an attention run.
        "attention_capture": rerank.capture if rerank is not None and rerank.uses_attention else None,
        "index_tag": manifest_tag(Path(config.index)),
        # How the first stage turns the index into results (2026-12-05: BM25 and convex fusion changed);
        # not in _LATER: a checkpoint without it holds rows of the first stage before, and is refused.
        "retrieval_version": RETRIEVAL_VERSION,
        # How the reranker turns its passes into scores (SCORING_VERSION, since 2026-12-06).
        "scoring_version": SCORING_VERSION if rerank is not None else None,
        # The torch threads each stage's actors run (--actor-cpus): bfloat16 products sum in another
        # order on 1 thread than on 2, and the default preset's scores moved by up to 0.05 between them.
        "torch_threads": {
            "retrieval": res.retrieval_threads,
            "rerank": res.rerank_threads if config.rerank else None,
        },
        "model_fingerprint": weights,
        "heads_in_file": in_file,
        "registry": registry,
    }


def driver_model(model: tuple[str | None, str | None], settings: dict[str, Any]) -> DriverModel | None:
    """What every rerank actor checks its loaded model against: the fingerprint and registry digest
    the checkpoint records (``settings``), when the driver read the model's weights. A model the
    driver cannot read (a path only the workers have) is fingerprinted by the SHA-256 of its name
    (:func:`~attnrank.llm.fingerprint.name_fingerprint`), which no loaded model has: None then,
    nothing to check against."""
    model_id, weights = model
    if model_id is None or weights is None or weights == name_fingerprint(model_id):
        return None
    return DriverModel(model_id, weights, settings.get("registry"))


def _signals_model(
    rerank: RerankConfig | None, model_id: str | None, fingerprint: str | None, setting: str = SIGNALS_ONLY
) -> dict[str, Any] | None:
    """The features and weights that the preset of ``signals=setting`` (``signals`` or
    ``likelihood``) scores by, registered or untrained (None: another preset, or no rerank)."""
    if rerank is None or model_id is None or fingerprint is None or rerank.signals != setting:
        return None
    fused = (signals_only if setting == SIGNALS_ONLY else likelihood_weights)(model_id, fingerprint)
    return {"features": fused.features, "weights": fused.weights}


def _scores_read(rerank: RerankConfig | None) -> tuple[bool, bool]:
    """Whether the run's scores read attention and the query likelihood (what a checkpoint of another
    scoring version is judged by: :func:`~attnrank.batch.checkpoint.same_scores`). ``"auto"``'s
    weights are resolved by each actor from the registry (a user's may read the likelihood): both,
    so that no resume mixes rows."""
    if rerank is None:
        return False, False
    return rerank.uses_attention, rerank.uses_likelihood or rerank.signals == SIGNALS_AUTO


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
    require("ray.data", "ray", "attnrank batch")  # (before anything is read or made: pyarrow comes with it)
    ray_address = None if ray_address == "local" else ray_address  # (RayExecutor(None): a new local Ray)
    config.check()
    config = config.resolved()
    res = resources or Resources()
    if config.rerank:
        check_device(config.device, ray_address, res.rerank_gpus)
    _check_outputs(output, parquet, queries)
    qs = queries if isinstance(queries, dict) else read_queries(queries, run_ids=output is not None)
    if not qs:
        raise InputError("no queries given; give at least one query")
    for qid in qs:  # (a file's are read so; a dict's " q1" beside "q1" made two rows every reader trims to one)
        if not isinstance(qid, str):
            raise InputError(f"query id {qid!r} is a {type(qid).__name__}, not a string; give ids as strings")
        if qid != qid.strip() or not qid:
            raise InputError(
                f"query id {qid!r} has spaces around it or is empty; give ids as a file reads them, trimmed"
            )
    empty = next((q for q, text in qs.items() if not isinstance(text, str) or is_blank(text)), None)
    if empty is not None:  # read_queries checks a file's; the retrieval stage would name its place in a Ray batch
        raise InputError(f"query {empty!r} is empty; give every query a text")
    bad = next((q for q, text in qs.items() if not encodable(q, text)), None)
    if bad is not None:  # (read_queries checks a file's; a dict's failed in a Ray task, after the checkpoint began)
        raise InputError(
            f"query {bad!r} is not valid Unicode (its id or text holds a lone surrogate, such as a \\ud800 escape); "
            "fix or re-encode it as UTF-8"
        )
    if output is not None:  # the run file is written last: an id it cannot hold would fail after all the work
        check_run_ids("query", qs, "give query ids without spaces, or write --parquet only")
        check_run_ids(  # (the index's every id: found after the run, the hours of work stayed in the checkpoint)
            "document",
            index_doc_ids(Path(config.index)),
            "a TREC run cannot hold it: rename the document and index again, or write --parquet only",
        )
    parts_dir = checkpoint or Path(f"{output or parquet}.parts")
    _check_parts_dir(parts_dir, output, parquet, queries)
    model = _model(config)
    if ray_address is None and model[0] is not None and model[1] == name_fingerprint(model[0]):
        readable_model(model[0])  # (a model this machine cannot read: its actors could not either)
    if config.rerank and ray_address is None:  # (a cluster's model may be on its machines alone)
        # a query too long for the likelihood: refused by its actor, after Ray had started and the checkpoint begun
        check_queries_before_load(config.rerank_config(), qs)
    mine = _settings(config, model, res)
    check_folder(parts_dir)
    with locked_checkpoint(parts_dir):
        check_checkpoint(parts_dir, mine, _scores_read(config.rerank_config() if config.rerank else None))
        sink = CheckpointSink(parts_dir)
        sink.check_queries(qs)
        todo = [q for q in qs if q not in sink.done]
        stats: dict[str, Any] = {"queries": len(qs), "resumed_skipped": len(qs) - len(todo)}
        t0 = time.perf_counter()
        if todo:
            ex = RayExecutor(ray_address, num_cpus=num_cpus, object_store_mb=object_store_mb, quiet=not progress)
            stats["ray_startup_seconds"] = round(ex.startup_seconds, 3)
            try:
                rows = [{"qid": q, "query": qs[q]} for q in todo]
                with _terminate_as_interrupt(), ray_data_settings(ex.ray, progress):
                    ds = build_dataset(
                        ex.ray,
                        rows,
                        config,
                        res,
                        mine["index_tag"],
                        model=driver_model(model, mine),
                        local=ray_address is None,
                    )
                    seconds = drain(ds, sink, len(qs), len(qs) - len(todo), on_commit)
                stats["pipeline_seconds"] = round(seconds, 3)
                stats["queries_per_second"] = round(len(todo) / max(seconds, 1e-9), 4)
            finally:
                try:
                    sink.commit()
                finally:  # (a commit that failed left the local Ray running in this process)
                    ex.close()
        # what ranked the run, as `attnrank search` and `rerank` tag theirs: the preset, else the first stage
        ranked_by = config.rerank_config().name if config.rerank else config.mode or _index_mode(config.index)
        tag = f"attnrank-{ranked_by}"
        stats.update(sink.finish(list(qs), trec=output, parquet=parquet, tag=tag))
    stats["seconds"] = round(time.perf_counter() - t0, 3)
    stats.setdefault("queries_per_second", None)  # None: everything was resumed
    return stats


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM (what SLURM, Kubernetes and ``kill`` send first) ends the run as Ctrl-C does:
    the rows buffered since the last part are committed, not recomputed on resume (up to 64 rows
    or 30 s of work). Only in the main thread, where Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _index_mode(index: str) -> str:
    m = json.loads((Path(index) / "manifest.json").read_text(encoding="utf-8"))
    return m["fusion"]["mode"]
