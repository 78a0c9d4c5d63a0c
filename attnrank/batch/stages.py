"""The batch pipeline's stateful stages: one index or one model per Ray actor.

Ray Data constructs each class once per actor (the index is memory-mapped, the model loaded
once) and calls it on batches of rows (a ``pyarrow.Table``, one row per query). The classes are
plain callables, so they run unchanged without Ray (the tests compare both ways).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import AttnrankError
from ..index.retriever import HybridRetriever
from ..index.sharded import ShardedRetriever, is_sharded
from ..index.store import manifest_tag
from ..registry import registry_digest
from ..rerank.config import RerankConfig
from ..types import RankedResults
from .rows import results_to_row, row_to_results

logger = logging.getLogger(__name__)


class StageError(AttnrankError):
    """An attnrank error in a stage, naming the query (or queries) it hit. ``line`` keeps the
    message as raised: Ray appends its retry notes to the arguments on the way to the driver."""

    def __init__(self, message: str):
        super().__init__(message)
        self.line = message


@contextmanager
def _loading(what: str) -> Iterator[None]:
    """An attnrank error while an actor loads ``what`` as a :class:`StageError`: the driver shows
    its one line (:func:`~attnrank.batch.dataset.drain`), not the traceback of the actor that died."""
    try:
        yield
    except StageError:
        raise
    except AttnrankError as e:
        raise StageError(f"loading {what}: {e}") from None
    except OSError as e:  # (a file it may not read: Ray's multi-line actor-death traceback at the driver)
        where = f": {e.filename}" if e.filename else ""
        raise StageError(f"loading {what}: {e.strerror or e}{where}") from None


def load_index(path: str | Path, tag: str | None = None) -> HybridRetriever:
    """An ordinary or a sharded index folder, memory-mapped; ``tag``: the manifest's
    :func:`~attnrank.index.store.manifest_tag` when the run began, which the loaded index must
    still have (an actor Ray restarts after a rebuild would serve rows of the new build beside the
    old one's)."""
    index = ShardedRetriever.load(path) if is_sharded(Path(path)) else HybridRetriever.load(path)
    if tag is not None and manifest_tag(Path(path)) != tag:
        raise StageError(
            f"the index {path} was rebuilt since this batch run began; rerun the command with the checkpoint "
            "removed (or another --checkpoint): one run never mixes two builds' results"
        )
    return index


@dataclass(frozen=True)
class DriverModel:
    """The reranker's model as the driver fingerprinted it when the run began (recorded in the
    checkpoint): ``fingerprint`` of its weights and ``registry``, the digest of what the head
    registry holds for it (:func:`~attnrank.registry.registry_digest`; None: not recorded)."""

    model_id: str
    fingerprint: str
    registry: str | None = None


def check_model(reranker: Any, model: DriverModel | None) -> None:
    """Refuse a loaded reranker whose model is not the one the run's checkpoint records: other
    weights at the same path (replaced on this worker since the run began, or another copy on
    this node) or another head registry would mix two models' rows in one run."""
    if model is None:
        return
    fix = (
        "start a new output (another -o/--parquet, or --checkpoint) or remove the checkpoint to rerun without "
        "resuming, with the same weights and registry on every node: one run never mixes two models' rows"
    )
    if reranker.fingerprint != model.fingerprint:
        raise StageError(
            f"this worker's model {reranker.model_id} has the weights fingerprint {reranker.fingerprint}, the run's "
            f"(recorded when it began) {model.fingerprint}; {fix}"
        )
    if model.registry is None:
        return
    # (the driver's model id: the registry as the checkpoint recorded it, however this worker spells the path)
    digest = registry_digest(model.model_id, reranker.fingerprint)
    if digest != model.registry:
        raise StageError(
            f"this worker's head registry for {model.model_id} has the digest {digest}, the run's (recorded when "
            f"it began) {model.registry}: heads or weights registered since, or another registry on this node; {fix}"
        )


def rerank_head(reranker: Any, res: RankedResults, depth: int) -> RankedResults:
    """Rerank the top ``depth`` of ``res``; the rest keeps its first-stage order below them.

    The same policy as ``attnrank search --rerank`` (``attnrank.cli._rerank_head``), so a batch
    run ranks as the single-process run does, up to rounding: ``search`` keeps states between
    queries and reads an index's stored passage states, batch does neither
    (:meth:`BatchConfig.rerank_config`).
    """
    head = reranker.rank(res.query, res.results[:depth], query_id=res.query_id)
    floor = min(head.scores, default=0.0)
    tail = [replace(d, score=floor - i) for i, d in enumerate(res.results[depth:], start=1)]
    return RankedResults(res.query, head.results + tail, res.query_id, stage=head.stage)


def _table(rows: list[dict[str, Any]]):
    import pyarrow as pa

    return pa.Table.from_pylist(rows)


class RetrievalStage:
    """First stage per actor: each of the batch's queries searched alone, ``k`` candidates each.

    Alone: a query embedded beside others is padded to the longest and computed in other shapes
    (its vector moved by ~1e-7), so the rows of a query would depend on which queries a batch, a
    resume or the actors' split put beside it. ``keep_text`` adds the candidates' titles and texts
    to the rows (the reranker needs them); ``threads`` caps torch's intra-op threads to the CPUs the
    actor declared (loading the embedder sets them to every core); ``index_tag``: as
    :func:`load_index` checks it.
    """

    def __init__(
        self,
        index: str,
        k: int,
        *,
        mode: str | None = None,
        keep_text: bool = True,
        index_tag: str | None = None,
        threads: int | None = None,
    ):
        with _loading("the index"):
            self.retriever = load_index(index, index_tag)
        self.k, self.mode, self.keep_text, self.threads = k, mode, keep_text, threads

    def __call__(self, batch):
        from ..config import set_torch_threads

        qids, texts = batch.column("qid").to_pylist(), batch.column("query").to_pylist()
        results = []
        for qid, text in zip(qids, texts):
            if self.threads:  # (the embedder's first load set torch to every core)
                set_torch_threads(self.threads)
            try:
                results += self.retriever.search_batch([text], self.k, mode=self.mode, query_ids=[qid])
            except AttnrankError as e:
                raise StageError(f"retrieval of query {qid!r}: {e}") from None
        return _table([results_to_row(r, with_text=self.keep_text) for r in results])


class RerankStage:
    """Reranking per actor (``config``: None = the default preset): one model, each row's top
    ``depth`` reranked, ``k`` kept.

    ``index``: the index folder the rows' candidates came from; a reranker with first-stage
    signals reads their dense signal from its stored vectors instead of embedding them (as
    ``attnrank search --rerank`` does). Each such actor loads the index's documents to match ids
    and texts (memory-mapped vectors; the documents and an id map in memory). ``threads`` caps
    torch's intra-op threads to the CPUs the actor declared; ``index_tag``: as :func:`load_index`
    checks it; ``stemmer``: the driver's candidate BM25 stemmer (refused where this worker's differs);
    ``model``: the model's fingerprint and registry digest the run records (refused where the
    loaded model's differ: :func:`check_model`).
    """

    def __init__(
        self,
        depth: int,
        k: int,
        *,
        config: RerankConfig | None = None,
        index: str | None = None,
        threads: int | None = None,
        index_tag: str | None = None,
        stemmer: str | None = None,
        model: DriverModel | None = None,
    ):
        from ..config import set_torch_threads
        from ..rerank.attention import AttentionReranker
        from ..rerank.signals import candidate_terms

        if stemmer is not None and candidate_terms().stemmer != stemmer:  # (a node without PyStemmer, or with)
            raise StageError(
                f"this worker's candidate BM25 stems with {candidate_terms().stemmer!r}, the run's with {stemmer!r}: "
                "install the same extras (attnrank[stem]) on every node; one run never mixes the two"
            )
        with _loading("the reranker"):
            self.reranker = AttentionReranker(config=config)
            check_model(self.reranker, model)
            if index is not None and self.reranker.fused is not None:  # attention alone reads no vectors
                self.reranker.use_index(load_index(index, index_tag))
            self.threads = threads
            if threads:  # loaded now, not at the first query: loading sets torch to every core, then the share
                if self.reranker.uses_llm:
                    self.reranker.llm  # noqa: B018 - the lazy load itself
                if self.reranker.fused is not None:
                    self.reranker.signals.embedder  # noqa: B018
                set_torch_threads(threads)
        self.depth, self.k = depth, k

    def __call__(self, batch):
        from ..config import set_torch_threads

        out = []
        for row in batch.to_pylist():
            if self.threads:  # (anything else that loads resets torch to every core: the share again)
                set_torch_threads(self.threads)
            try:
                res = rerank_head(self.reranker, row_to_results(row), self.depth).top_k(self.k)
            except AttnrankError as e:  # e.g. a candidate without text: name the query
                raise StageError(f"query {row['qid']!r}: {e}") from None
            out.append(results_to_row(res, with_text=False))
        return _table(out)
