"""Serving a sharded index: per-shard top-k lists merged into global ones, then fused.

:class:`ShardedRetriever` is a :class:`HybridRetriever` (same ``search`` / ``search_batch`` /
``fuse`` and results) whose candidate lists come from every shard: each shard returns its BM25
top-``depth`` (scores computed with the global statistics, so they are comparable) and its
FAISS top-``depth`` under global ids; the lists are merged by (score descending, global id
ascending), the order a single index uses, so the merged top-k equals the single index's top-k
(global ids are contiguous per shard, so the per-shard order agrees with the global one). The
fusion (RRF or convex) then runs unchanged on the merged lists.
"""

from __future__ import annotations

import bisect
import copy
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...errors import IndexFormatError, InputError
from ...types import Document
from ..bm25 import BM25Index
from ..dense import DenseIndex, check_positions, recorded_probe, recorded_prompts
from ..retriever import HybridRetriever
from ..store import load_unchanged, read_docs
from ..tokenize import TokenizerConfig
from .checks import check_shard
from .layout import read_sharded, retriever_settings

logger = logging.getLogger(__name__)


class ShardDocs(Sequence[Document]):
    """The shards' documents as one sequence indexed by global id."""

    def __init__(self, parts: list[list[Document]]):
        self.parts = parts
        self.starts = list(np.cumsum([0] + [len(p) for p in parts[:-1]]).tolist())
        self._len = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        s = bisect.bisect_right(self.starts, i) - 1
        return self.parts[s][i - self.starts[s]]


def merge_topk(lists: list[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard ``(global ids, scores)`` arrays of shape (n_queries, k_s) into the global top-``k``.

    Order: score descending, then global id ascending (the single index's tie order);
    ``-1`` ids (no hit) are dropped and rows are padded with ``-1`` / ``-inf``.
    """
    ids = np.concatenate([a for a, _ in lists], axis=1)
    scores = np.concatenate([b for _, b in lists], axis=1).astype(np.float32)
    n = ids.shape[0]
    out_i = np.full((n, k), -1, dtype=np.int64)
    out_s = np.full((n, k), -np.inf, dtype=np.float32)
    for q in range(n):
        keep = ids[q] >= 0
        qi, qs = ids[q][keep], scores[q][keep]
        order = np.lexsort((qi, -qs))[:k]
        out_i[q, : len(order)], out_s[q, : len(order)] = qi[order], qs[order]
    return out_i, out_s


def inner_dense(dense: DenseIndex) -> DenseIndex:
    """A ``flat`` shard's :class:`DenseIndex` seen without its ``IndexIDMap``: vectors by position
    in the shard (``dense`` itself for other kinds, whose :meth:`DenseIndex.vectors` gives none).
    Position ``i`` there is global id ``start + i``: :func:`check_shard` verified at load that the
    stored ids are ``start, start + 1, …`` in order."""
    import faiss

    if dense.kind != "flat" or dense.faiss_index is None:
        return dense
    view = copy.copy(dense)
    view.faiss_index = faiss.downcast_index(dense.faiss_index.index)  # the IndexIDMap keeps it alive
    return view


class ShardedRetriever(HybridRetriever):
    """A :class:`HybridRetriever` over a sharded index (build it with :class:`ShardedIndexer`)."""

    manifest: dict
    shard_bm25: list[BM25Index]
    shard_dense: list[DenseIndex]
    _inner: dict[int, DenseIndex]  # per shard: its flat vectors in shard order (stored_vectors)

    def index(self, docs, *, show_progress: bool = True, skip_invalid: bool = False):
        raise InputError(
            "a ShardedRetriever is built with ShardedIndexer(...).build(docs, path) "
            "(or `attnrank index --shards N`), then loaded with ShardedRetriever.load(path)"
        )

    def save(self, path):
        raise InputError("a sharded index is written by its build; use merge_shards(...) for one ordinary index")

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        mmap: bool = True,
        verify: bool = False,
        device: str = "cpu",
        embed_backend: str | None = None,
    ) -> ShardedRetriever:
        """Load a sharded index folder (arrays memory-mapped, every shard checked); ``embed_backend``
        overrides the recorded one as in :meth:`HybridRetriever.load`, and a rebuild that swaps the
        folder meanwhile restarts the load, as there (a mix of two builds' shards, same sizes and
        ids, passed every check)."""
        path = Path(path)
        return load_unchanged(
            path, lambda: cls._load_once(path, mmap=mmap, verify=verify, device=device, embed_backend=embed_backend)
        )

    @classmethod
    def _load_once(
        cls, path: Path, *, mmap: bool, verify: bool, device: str, embed_backend: str | None
    ) -> ShardedRetriever:
        m, shard_manifests = read_sharded(path, verify=verify)
        settings = retriever_settings(m)
        built_with = settings["embed_backend"]  # what embedded the stored vectors, whatever embeds queries
        settings["embed_backend"] = embed_backend or built_with
        self = cls(**settings, device=device)
        self.manifest = m
        tokenizer = _tokenizer(m)
        try:
            prompts = recorded_prompts(m["dense"])
        except ValueError as e:
            raise IndexFormatError(f"{path}/manifest.json: {e}; rebuild the index") from None
        self.shard_bm25, self.shard_dense, parts = [], [], []
        for s, sm in zip(m["shards"], shard_manifests):
            folder = path / s["name"]
            bm25 = BM25Index.load(folder / "bm25", mmap=mmap, corpus_docs=m["num_docs"])  # global idf
            dense = DenseIndex.load(
                folder / "dense",
                model=settings["embedder"],
                kind=settings["dense_index"],
                mmap=mmap,
                device=device,
                backend=settings["embed_backend"],
                built_with=built_with,
                prompts=prompts,
            )
            docs = read_docs(folder / "docs.jsonl")
            check_shard(folder, sm, docs, bm25, dense, tokenizer)
            self.shard_bm25.append(bm25)
            self.shard_dense.append(dense)
            parts.append(docs)
        # a read-only list view over the shards' documents
        self.docs = ShardDocs(parts)  # type: ignore[assignment]
        self.build_info = m.get("build", {})
        self.bm25, self.dense = self.shard_bm25[0], self.shard_dense[0]  # tokenizer and encoder of the index
        try:  # (checked at the first query by the encoder's DenseIndex, as an ordinary index's)
            self.dense.probe = recorded_probe(m["dense"], self.dense.dim)
        except ValueError as e:
            raise IndexFormatError(f"{path}/manifest.json: {e}; rebuild the index") from None
        self._inner = {}
        return self

    @property
    def num_shards(self) -> int:
        return len(self.shard_bm25)

    def candidates(self, queries: Sequence[str], k: int, mode: str = "hybrid"):
        """Per-side global top lists ``(global ids, scores)`` merged over the shards."""
        depth = max(k, min(self.depth, self.num_docs)) if mode == "hybrid" else k
        sparse = dense = None
        if mode in ("bm25", "hybrid"):
            sparse = merge_topk([self._bm25_shard(i, queries, depth) for i in range(self.num_shards)], depth)
        if mode in ("dense", "hybrid"):
            assert self.dense is not None  # (the first shard's, set at the load)
            q = self.dense.encode_queries(queries)
            dense = merge_topk([d.retrieve(queries, depth, query_embeddings=q) for d in self.shard_dense], depth)
        return sparse, dense

    def stored_vectors(self, positions: Sequence[int]) -> np.ndarray | None:
        """The stored unit vectors of the documents at global ``positions``, read from the shard
        that holds each (None where the shards cannot give them back: IVF, or ``onnx-int8``
        vectors, as :meth:`DenseIndex.vectors`). A ``flat`` shard keeps its vectors in an
        ``IndexIDMap`` under global ids; its inner flat index holds them in the shard's order, so
        global position ``p`` is row ``p − start`` there."""
        at = np.asarray(positions, dtype=np.int64).reshape(-1)
        check_positions(at, len(self.docs))
        starts = np.asarray([s["start"] for s in self.manifest["shards"]], dtype=np.int64)
        shard = np.searchsorted(starts, at, side="right") - 1
        out = np.empty((len(at), self.shard_dense[0].dim), dtype=np.float32)
        for i in map(int, np.unique(shard)):
            rows = np.flatnonzero(shard == i)
            if i not in self._inner:
                self._inner[i] = inner_dense(self.shard_dense[i])
            vecs = self._inner[i].vectors((at[rows] - starts[i]).tolist())
            if vecs is None:
                return None
            out[rows] = vecs
        return out

    def _bm25_shard(self, i: int, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        ids, scores = self.shard_bm25[i].retrieve(queries, k, matched_only=True)
        return np.where(ids >= 0, ids + self.manifest["shards"][i]["start"], -1), scores


def _tokenizer(m: dict) -> TokenizerConfig:
    """The BM25 tokenizer a sharded index's top-level manifest records."""
    try:
        return TokenizerConfig(**m["bm25"]["tokenizer"])
    except (KeyError, TypeError, ValueError) as e:
        raise IndexFormatError(f"the sharded index manifest lacks or mangles its tokenizer ({e}); rebuild it") from None
