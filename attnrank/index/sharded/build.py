"""Sharded index build: pass 1 global BM25 statistics, pass 2 one index folder per shard.

Pass 1 (:func:`attnrank.index.sharded.stats.block_stats` per block, merged pairwise) counts
document frequencies, documents and total length over the whole corpus. Pass 2 builds every
shard (:func:`build_shard`) in its own task: BM25 weights with the global idf and average length
(:meth:`BM25Index.index_tokens`, the single index's weight code), and the shard's unit-norm
embeddings in FAISS under their global integer ids: ``flat`` = ``IndexIDMap(IndexFlatIP)``;
``ivf`` = one ``IVF{nlist},Flat`` trained once on a sample of the corpus (nlist ≈ √N, as the
single index) and cloned empty into every shard, which then adds its vectors with ids (so all
shards share one coarse quantizer and can be merged). HNSW graphs are per index and cannot be
shared, so sharded builds take ``flat`` or ``ivf``.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...types import Document, check_indexable, is_count
from ..bm25 import BM25Index
from ..components import dense_settings
from ..embed import embedder_probe, encode, load_embedder, role_prompts
from ..folders import Protected, check_target, embedder_paths
from ..retriever import HybridRetriever, corpus_documents
from ..settings import attnrank_version
from ..store import atomic_dir, check_built, corpus_checksum, write_docs, write_manifest
from ..tokenize import TokenizerConfig, resolve_config, tokenize_all
from .executor import LocalExecutor
from .layout import read_sharded, shard_bounds, shard_name, write_top_manifest
from .stats import CorpusStats, block_stats, merge_stats

logger = logging.getLogger(__name__)

SHARDED_DENSE = ("flat", "ivf")


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux ``ru_maxrss`` is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _block_task(texts: list[str], tokenizer: TokenizerConfig) -> tuple[CorpusStats, float]:
    return block_stats(texts, tokenizer), peak_rss_mb()


def ivf_template(sample: np.ndarray, num_docs: int, nprobe: int = 16):
    """An empty ``IVF{nlist},Flat`` (inner product) trained on ``sample``; nlist ≈ √N, ≥ 39 points/list."""
    import faiss

    nlist = max(1, min(int(math.sqrt(num_docs)), len(sample) // 39))
    index: Any = faiss.index_factory(sample.shape[1], f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(sample)
    index.nprobe = min(nprobe, nlist)
    return faiss.serialize_index(index)


def dense_shard_index(emb: np.ndarray, ids: np.ndarray, kind: str, template: np.ndarray | None):
    """FAISS index of one shard's vectors under their global ids."""
    import faiss

    index: Any
    if kind == "flat":
        index = faiss.IndexIDMap(faiss.IndexFlatIP(emb.shape[1]))
    else:
        if template is None:
            raise InputError("an IVF shard needs the trained (empty) IVF index shared by all shards")
        index = faiss.deserialize_index(template)  # an empty trained IVF, the same for every shard
    index.add_with_ids(emb, ids.astype(np.int64))
    return index


def build_shard(
    docs: Sequence[Document],
    start: int,
    shard: int,
    idf: dict[str, float],
    avgdl: float,
    settings: dict[str, Any],
    out: Path,
    embeddings: np.ndarray | None = None,
    template: np.ndarray | None = None,
) -> dict[str, Any]:
    """Build and write one shard folder atomically; returns its entry for the top-level manifest."""
    import faiss

    t0 = time.perf_counter()
    texts = [d.full_text for d in docs]
    tok = TokenizerConfig(**settings["tokenizer"])
    bm25 = BM25Index(settings["bm25_params"], tok).index_tokens(tokenize_all(texts, tok), idf, avgdl)
    t1 = time.perf_counter()
    if embeddings is None:
        embedder = load_embedder(settings["embedder"], settings["device"], settings["embed_backend"])
        embeddings = encode(embedder, texts, role="document")
    dense = dense_shard_index(embeddings, np.arange(start, start + len(docs)), settings["dense_index"], template)
    t2 = time.perf_counter()
    name = shard_name(shard)
    with atomic_dir(out / name) as tmp:
        write_docs(tmp / "docs.jsonl", docs)
        bm25.save(tmp / "bm25")
        (tmp / "dense").mkdir()
        faiss.write_index(dense, str(tmp / "dense" / "index.faiss"))
        write_manifest(
            tmp,
            {
                "shard": {"index": shard, "start": start, "num_docs": len(docs)},
                "num_docs": len(docs),
                "corpus_sha256": corpus_checksum(docs),
                "vocab_size": len(bm25.vocab),
                "dense_dim": int(dense.d),
            },
        )
        check_built(tmp)  # whole, before the swap
    return {
        "name": name,
        "start": start,
        "num_docs": len(docs),
        "bm25_seconds": round(t1 - t0, 3),
        "dense_seconds": round(t2 - t1, 3),
        "write_seconds": round(time.perf_counter() - t2, 3),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }


def global_stats(
    texts: Sequence[str], tokenizer: TokenizerConfig, executor, *, block_size: int = 50_000
) -> tuple[CorpusStats, dict[str, Any]]:
    """Pass 1: statistics per block of ``block_size`` texts, merged pairwise by ``executor``."""
    if block_size < 1:
        raise InputError(f"block_size={block_size} must be at least 1 (documents per statistics block)")
    t0 = time.perf_counter()
    blocks = [(list(texts[i : i + block_size]), tokenizer) for i in range(0, len(texts), block_size)]
    parts = executor.map(_block_task, blocks)
    t1 = time.perf_counter()
    stats = executor.tree_reduce(merge_stats, [p for p, _ in parts])
    info = {
        "blocks": len(blocks),
        "count_seconds": round(t1 - t0, 3),
        "merge_seconds": round(time.perf_counter() - t1, 3),
        "peak_rss_mb_per_task": max(rss for _, rss in parts),
        "vocab_size": len(stats.df),
    }
    return stats, info


class ShardedIndexer:
    """Build a sharded index with the settings of a (not yet built) :class:`HybridRetriever`.

    ``executor`` is a :class:`LocalExecutor` (default) or a :class:`RayExecutor` (each task writes
    its shard into the target's temporary folder: on a multi-node cluster the target must be on
    storage every node shares, else the build is refused once the shards are built). ``embeddings``
    (unit-norm, one row per document) skips the embedding step, e.g. to build a sharded and a
    single index from the same vectors; they must be this embedder's document vectors
    (``embed.encode(model, texts, role="document")``, as an index built since 2026-12-06 stores
    them), since the manifest records its document prompt and queries take its query prompt.
    """

    def __init__(
        self,
        settings: HybridRetriever | None = None,
        *,
        shards: int = 4,
        executor=None,
        block_size: int = 50_000,
        ivf_sample: int = 100_000,
        seed: int = 0,
    ):
        self.r = settings or HybridRetriever()
        if self.r.dense_kind not in SHARDED_DENSE:
            raise InputError(
                f"a sharded build takes dense index {SHARDED_DENSE}, not {self.r.dense_kind!r} "
                "(HNSW graphs cannot be shared between shards); use --dense-index flat or ivf"
            )
        for name, value in (("shards", shards), ("block_size", block_size), ("ivf_sample", ivf_sample)):
            if not is_count(value):  # (ivf_sample=0 failed as an IndexError after the corpus statistics)
                raise InputError(f"{name}={value!r} must be a positive integer")
        self.shards, self.block_size, self.ivf_sample, self.seed = int(shards), int(block_size), int(ivf_sample), seed
        self.executor = executor or LocalExecutor()
        self.build_info: dict[str, Any] = {}

    def build(
        self,
        docs: Sequence[Document] | str | Path,
        target: str | Path,
        *,
        embeddings: np.ndarray | None = None,
        force: bool = False,
        protect: Sequence[str | Path] = (),
        skip_invalid: bool = False,
    ) -> Path:
        """Index ``docs`` (or a corpus path; ``skip_invalid`` as :meth:`HybridRetriever.index`) into
        ``target`` (written atomically); returns ``target``.

        ``target`` follows the rules of :meth:`HybridRetriever.save` (checked before any work):
        an existing index or an empty folder; ``force=True`` any other folder but one that holds
        the working directory or a ``protect`` path (a corpus path given here is protected)."""
        target, guard = Path(target), list[Protected](protect)
        if isinstance(docs, (str, Path)):
            guard.append(Path(docs))
        guard += embedder_paths(self.r.embedder_folder())
        check_target(target, force=force, protect=guard)
        docs = corpus_documents(docs, skip_invalid)[0]
        self._check(docs, embeddings)
        embedder = load_embedder(self.r.embedder, self.r.device, self.r.embed_backend)
        probe = embedder_probe(embedder)  # (first: a model that cannot embed it fails before the corpus)
        if embeddings is not None and embeddings.shape[1] != len(probe):
            raise InputError(
                f"embeddings have {embeddings.shape[1]} dimensions, the index's embedder {len(probe)}; "
                "give its embeddings"
            )
        tok = resolve_config(self.r.stopwords, self.r.stemmer)
        t0 = time.perf_counter()
        stats, pass1 = global_stats([d.full_text for d in docs], tok, self.executor, block_size=self.block_size)
        idf = stats.idf(self.r.bm25_params)
        t1 = time.perf_counter()
        template = self._ivf_template(docs, embeddings) if self.r.dense_kind == "ivf" else None
        settings = {
            "tokenizer": tok.to_dict(),
            "bm25_params": self.r.bm25_params,
            "embedder": self.r.embedder,
            "device": self.r.device,
            "embed_backend": self.r.embed_backend,
            "dense_index": self.r.dense_kind,
        }
        with atomic_dir(target, force=force, protect=guard) as tmp:
            stats.save(tmp / "stats")
            shared = [self.executor.put(x) for x in (idf, settings, template)]
            tasks = [
                (
                    docs[a:b],
                    a,
                    i,
                    shared[0],
                    stats.avgdl,
                    shared[1],
                    tmp.resolve(),  # (a worker runs in its own directory)
                    None if embeddings is None else embeddings[a:b],
                    shared[2],
                )
                for i, (a, b) in enumerate(shard_bounds(len(docs), self.shards))
            ]
            shard_info = self.executor.map(build_shard, tasks)
            missing = [info["name"] for info in shard_info if not (tmp / info["name"]).is_dir()]
            if missing:  # written where the task ran: another node's disk
                raise InputError(
                    f"the shards {missing} were written on the machines that built them, not here: a sharded "
                    f"build on a multi-node Ray cluster needs {target.parent.resolve()} on storage every node "
                    "shares (NFS, a cluster file system); build on one machine, or index onto shared storage"
                )
            t2 = time.perf_counter()
            self.build_info = {
                "executor": self.executor.name,
                "shards": self.shards,
                "pass1": pass1,
                "pass1_seconds": round(t1 - t0, 3),
                "pass2_seconds": round(t2 - t1, 3),
                "embeddings_given": embeddings is not None,
            }
            write_top_manifest(tmp, self._info(docs, stats, tok, probe, role_prompts(embedder)), shard_info)
            check_built(tmp, read_sharded)  # every shard whole, before the swap
        logger.info("built %d shards over %d documents in %.1fs", self.shards, len(docs), time.perf_counter() - t0)
        return target

    def _check(self, docs: list[Document], embeddings: np.ndarray | None) -> None:
        if not docs:
            raise InputError("cannot index an empty corpus (0 documents); give at least one document")
        if self.shards > len(docs):
            raise InputError(
                f"--shards {self.shards} exceeds the {len(docs)} documents; use at most {len(docs)} shards"
            )
        check_indexable(docs)
        if embeddings is not None:
            self._check_embeddings(embeddings, len(docs))

    def _check_embeddings(self, embeddings: np.ndarray, n_docs: int) -> None:
        """Given embeddings are what the index's embedder would give: one finite unit vector per
        document (scores are inner products; other vectors scored wrongly, silently). Their
        dimension is checked against the embedder's once it is loaded (another dimension failed at
        load, after the build)."""
        if embeddings.ndim != 2 or len(embeddings) != n_docs:
            raise InputError(f"embeddings of shape {embeddings.shape} do not match {n_docs} documents")
        if not np.issubdtype(embeddings.dtype, np.floating) or not np.isfinite(embeddings).all():
            raise InputError("embeddings hold non-finite or non-float values; give finite float32 vectors")
        norms = np.linalg.norm(embeddings.astype(np.float64), axis=1)
        worst = int(np.argmax(np.abs(norms - 1.0)))
        if abs(norms[worst] - 1.0) > 1e-3:
            raise InputError(
                f"embedding {worst} has norm {norms[worst]:.4f}; scores are inner products of unit vectors: "
                "normalise the embeddings (divide each by its norm)"
            )

    def _ivf_template(self, docs: list[Document], embeddings: np.ndarray | None):
        rng = np.random.default_rng(self.seed)
        pick = np.sort(rng.choice(len(docs), size=min(len(docs), self.ivf_sample), replace=False))
        if embeddings is not None:
            sample = embeddings[pick]
        else:
            embedder = load_embedder(self.r.embedder, self.r.device, self.r.embed_backend)
            sample = encode(embedder, [docs[i].full_text for i in pick], role="document")
        return ivf_template(np.ascontiguousarray(sample, dtype=np.float32), len(docs))

    def _info(
        self,
        docs: list[Document],
        stats: CorpusStats,
        tok: TokenizerConfig,
        probe: list[float],
        prompts: dict[str, str | None],
    ) -> dict[str, Any]:
        """The top-level manifest's settings, in the keys of the single index's manifest
        (``probe``: :func:`~attnrank.index.embed.embedder_probe`; ``prompts``: the embedder's role prompts)."""
        r = self.r
        return {
            "attnrank_version": attnrank_version(),
            "num_docs": len(docs),
            "corpus_sha256": corpus_checksum(docs),
            "bm25": {**r.bm25_params.__dict__, "tokenizer": tok.to_dict(), "vocab_size": len(stats.df)},
            "global_stats": {"num_docs": stats.num_docs, "total_len": stats.total_len, "avgdl": stats.avgdl},
            "dense": {
                # (given embeddings: embed.encode(..., role="document") of this embedder, as the docstring asks)
                **dense_settings(
                    embedder=r.embedder,
                    kind=r.dense_kind,
                    backend=r.embed_backend,
                    dim=len(probe),
                    probe=probe,
                    prompts=prompts,
                ),
                "ids": "global: the position in the corpus",
            },
            "fusion": {
                "method": r.fusion,
                "alpha": r.alpha,
                "norm": r.norm,
                "rrf_k": r.rrf_k,
                "depth": r.depth,
                "mode": r.mode,
            },
            "build": self.build_info,
        }
