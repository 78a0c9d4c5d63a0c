"""Checks run on every load of a shard: what the single index checks, plus the global ids.

:meth:`attnrank.index.retriever.HybridRetriever.load` compares the document, BM25 and vector
counts, the tokenizer and the corpus checksum with the manifest; a shard gets the same checks
against its own manifest, and its FAISS ids must be exactly its global id range (the results
name documents by these ids, so one changed id would return another document).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import IndexFormatError
from ...types import Document
from ..bm25 import BM25Index
from ..dense import DenseIndex, stored_ids
from ..store import corpus_checksum
from ..tokenize import TokenizerConfig


def check_shard(
    folder: Path,
    manifest: dict[str, Any],
    docs: Sequence[Document],
    bm25: BM25Index,
    dense: DenseIndex,
    tokenizer: TokenizerConfig,
) -> None:
    """Raise :class:`IndexFormatError` unless the loaded shard agrees with its ``manifest``."""

    def bad(what: str) -> IndexFormatError:
        return IndexFormatError(f"shard {folder}: {what}; the index is corrupted, rebuild it")

    n, start = manifest["num_docs"], manifest["shard"]["start"]
    if not len(docs) == bm25.num_docs == dense.num_docs == n:
        raise bad(f"{len(docs)} documents, {bm25.num_docs} in BM25, {dense.num_docs} vectors, {n} in its manifest")
    if bm25.tokenizer_config != tokenizer:
        raise bad("its BM25 tokenizer differs from the one the sharded index records")
    _check_vectors(dense, manifest, start, bad)
    if corpus_checksum(docs) != manifest.get("corpus_sha256"):
        raise bad("docs.jsonl does not match the checksum recorded at build time (edited or corrupted)")


def _check_vectors(
    dense: DenseIndex, manifest: dict[str, Any], start: int, bad: Callable[[str], IndexFormatError]
) -> None:
    import faiss

    ix = dense.faiss_index
    if ix.d != manifest.get("dense_dim") or ix.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise bad(f"vectors of dimension {ix.d}, its manifest says {manifest.get('dense_dim')} (inner product)")
    if not np.array_equal(stored_ids(ix), np.arange(start, start + ix.ntotal)):
        raise bad(f"its vector ids are not the global ids {start}..{start + ix.ntotal - 1} in order")
