"""Merge a sharded index into one ordinary index folder (when it fits one machine).

BM25: the shards' column-wise (CSC) weight arrays are re-keyed from each shard's vocabulary to
the union vocabulary (sorted, as a single build sorts it) and interleaved term by term; shards
hold contiguous global id ranges, so appending shard after shard keeps every column sorted by
document, and the arrays equal those of a single build over the whole corpus (the weights were
computed with the global statistics). The copy is vectorised, one shard at a time.
Dense: ``flat`` vectors are reconstructed in global id order into one ``IndexFlatIP``; ``ivf``
shards (one shared trained quantizer) are merged list by list with FAISS ``merge_from``.
The result is written with :meth:`HybridRetriever.save` (atomic, with its manifest).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import IndexFormatError, InputError
from ..bm25 import BM25Index
from ..dense import DenseIndex, recorded_prompts
from ..folders import check_target, contains
from ..retriever import HybridRetriever
from .layout import retriever_settings

logger = logging.getLogger(__name__)


def merge_bm25(shards: list[BM25Index], starts: list[int]) -> BM25Index:
    """One BM25 index whose arrays are the shards' columns joined per term (global vocabulary)."""
    vocab = sorted(set().union(*(s.vocab for s in shards)))
    gpos = {t: i for i, t in enumerate(vocab)}
    maps = [np.array([gpos[t] for t in s.vocab], dtype=np.int64) for s in shards]
    counts = np.zeros(len(vocab), dtype=np.int64)
    for s, m in zip(shards, maps):
        np.add.at(counts, m, np.diff(np.asarray(s.indptr)))
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    data = np.empty(int(indptr[-1]), dtype=np.float32)
    indices = np.empty(int(indptr[-1]), dtype=np.int32)
    filled = indptr[:-1].copy()  # next free slot of every global column
    for s, m, start in zip(shards, maps, starts):
        lengths = np.diff(np.asarray(s.indptr))
        col = np.repeat(np.arange(len(lengths)), lengths)  # local column of every stored weight
        within = np.arange(len(col)) - np.asarray(s.indptr)[col]  # its place inside the column
        dest = filled[m[col]] + within
        data[dest] = s.data
        indices[dest] = np.asarray(s.indices) + start
        filled[m] += lengths
    out: Any = BM25Index(shards[0].params, shards[0].tokenizer_config)  # arrays set below
    out.vocab, out.data, out.indices, out.indptr = gpos, data, indices, indptr
    out.num_docs = sum(s.num_docs for s in shards)
    return out


def merge_dense(shards: list[Any], kind: str):
    """One FAISS index with position = global id, from shards holding contiguous id ranges."""
    import faiss

    if kind == "ivf":
        merged = faiss.clone_index(shards[0])
        for s in shards[1:]:
            merged.merge_from(s, 0)  # keep the stored global ids
        return merged
    merged = faiss.IndexFlatIP(shards[0].d)
    for s in shards:
        ids = faiss.vector_to_array(s.id_map)
        vectors = s.index.reconstruct_n(0, s.ntotal)
        if np.any(np.diff(ids) != 1) or (merged.ntotal and ids[0] != merged.ntotal):
            raise IndexFormatError("shard ids are not contiguous global positions; rebuild the sharded index")
        merged.add(vectors)
    return merged


def merge_shards(src: str | Path, target: str | Path, *, force: bool = False) -> Path:
    """Write the sharded index ``src`` as one ordinary index at ``target`` (loadable by HybridRetriever).

    ``src`` is loaded with every check of :meth:`ShardedRetriever.load`; ``target`` follows the
    rules of :meth:`HybridRetriever.save` and may be neither ``src``, nor inside it, nor hold it.
    """
    from .retriever import ShardedRetriever

    t0 = time.perf_counter()
    src, target = Path(src), Path(target)
    _check_outside(src, target)
    # before the load and merge (the save checks it again)
    check_target(target, force=force, protect=[("the sharded index", src)])
    sr = ShardedRetriever.load(src, mmap=False, verify=True)  # (new checksums must not bless damaged bytes)
    settings = retriever_settings(sr.manifest)
    r = HybridRetriever(**settings)
    r.bm25 = merge_bm25(sr.shard_bm25, [s["start"] for s in sr.manifest["shards"]])
    r.dense = dense_index = DenseIndex(settings["embedder"], settings["dense_index"], backend=settings["embed_backend"])
    dense_index.faiss_index = faiss_index = merge_dense(
        [d.faiss_index for d in sr.shard_dense], settings["dense_index"]
    )
    dense_index.dim = faiss_index.d
    dense_index.probe = sr.manifest["dense"].get("probe")  # checked on load, like every setting
    dense_index.prompts = recorded_prompts(sr.manifest["dense"])  # (how the shards embedded)
    r.docs = list(sr.docs)
    r.build_info = {
        "merged_from": str(src),
        "shards": sr.num_shards,
        "sharded_build": sr.build_info,
        "merge_seconds": round(time.perf_counter() - t0, 3),
    }
    return r.save(target, force=force, protect=[("the sharded index", src)])


def _check_outside(src: Path, target: Path) -> None:
    """Refuse a merge target that is, is inside, or holds the sharded index it is merged from."""
    a, b = Path(os.path.realpath(src)), Path(os.path.realpath(target))
    if contains(a, b) or contains(b, a):
        raise InputError(
            f"refusing to write the merged index at {target}: it is, is inside, or holds the sharded "
            f"index {src} it is merged from; choose a folder outside it"
        )
