"""First-stage retrieval: BM25 + dense FAISS, fused (the four verbs: index, search, save, load)."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

import numpy as np

from ..config import DEFAULT_ALPHA, DEFAULT_FUSION, DEFAULT_NORM, RRF_K, fault_point
from ..corpus import load_corpus
from ..errors import IndexFormatError, InputError
from ..types import Document, RankedResults, ScoredDocument, check_indexable, check_query_id, is_count
from . import hybrid
from .bm25 import BM25Index, BM25Params
from .components import mangled, manifest_info, read_components
from .dense import DenseIndex
from .embed import local_or_hub
from .embed_export import check_backend
from .folders import Protected, embedder_paths
from .settings import (
    FUSIONS,
    INDEX_FILES,
    MODES,
    check_fusion,
    check_queries,
    check_settings,
    manifest_settings,
)
from .store import (
    atomic_dir,
    check_built,
    keep_passage_states,
    load_unchanged,
    read_manifest,
    write_docs,
    write_manifest,
)
from .tokenize import resolve_config

logger = logging.getLogger(__name__)


class HybridRetriever:
    """BM25 (rank-bm25 statistics) and sentence-transformers/FAISS retrieval with fusion.

    ``mode`` picks ``bm25``, ``dense`` or ``hybrid``; hybrid fuses each side's top ``depth``
    with ``fusion="convex"`` (``alpha`` = weight on dense, ``norm`` = ``minmax`` | ``zscore`` |
    ``none``) or ``fusion="rrf"`` (k = ``rrf_k``). The default, convex with alpha 0.45 and z-score
    normalisation, is the setting tuned on SciFact and HotpotQA (:data:`attnrank.config.DEFAULT_FUSION`);
    :meth:`load` restores the fusion an index was saved with. ``embed_backend``: how the embedder
    runs, ``torch`` (default), ``torch-bf16``, ``onnx``, ``onnx-int8``, ``openvino`` or
    ``openvino-bf16`` (:mod:`attnrank.index.embed_export`); recorded in the manifest, and queries of
    a loaded index are embedded the same way.
    """

    def __init__(
        self,
        *,
        embedder: str | None = None,
        dense_index: str = "flat",
        bm25: BM25Params | None = None,
        stopwords: str = "lucene",
        stemmer: str = "auto",
        fusion: str = DEFAULT_FUSION,
        alpha: float = DEFAULT_ALPHA,
        norm: str = DEFAULT_NORM,
        rrf_k: int = RRF_K,
        depth: int = 100,
        mode: str = "hybrid",
        device: str = "cpu",
        embed_backend: str = "torch",
    ):
        check_settings(dense_index, stopwords, stemmer, rrf_k, depth)  # before any document is read or embedded
        self.embedder, self.dense_kind, self.device = local_or_hub(embedder), dense_index, device
        self.embed_backend = check_backend(embed_backend)
        self.bm25_params, self.stopwords, self.stemmer = bm25 or BM25Params(), stopwords, stemmer
        self.rrf_k, self.depth = int(rrf_k), int(depth)  # (NumPy counts failed the save's JSON, after the build)
        self.set_fusion(fusion, alpha=alpha, norm=norm)
        self.mode = self._check_mode(mode)
        self.docs: list[Document] = []
        self.bm25: BM25Index | None = None
        self.dense: DenseIndex | None = None
        self.build_info: dict = {}
        self.corpus_path: Path | None = None  # the file or folder index() read, protected from save()
        self.loaded_from: Path | None = None  # the index folder load() read (its passage states kept by a save over it)

    # -- configuration -----------------------------------------------------------------------
    def set_fusion(
        self, fusion: str, *, alpha: float | None = None, norm: str | None = None, rrf_k: int | None = None
    ) -> None:
        """How searches fuse BM25 and dense (settings not given keep their value)."""
        if fusion not in FUSIONS:  # (check_fusion takes None for "not given"; here it must be given)
            raise InputError(f"fusion {fusion!r} is not one of {FUSIONS}")
        check_fusion(fusion, alpha, norm)
        if rrf_k is not None:
            check_settings(self.dense_kind, self.stopwords, self.stemmer, rrf_k, self.depth)
            self.rrf_k = int(rrf_k)
        self.fusion = fusion
        if alpha is not None:
            self.alpha = float(alpha)
        if norm is not None:
            self.norm = norm

    @staticmethod
    def _check_mode(mode: str) -> str:
        if mode not in MODES:
            raise InputError(f"retrieval mode {mode!r} is not one of {MODES}")
        return mode

    # -- build -------------------------------------------------------------------------------
    def index(
        self, docs: Sequence[Document] | str | Path, *, show_progress: bool = True, skip_invalid: bool = False
    ) -> HybridRetriever:
        """Index documents (or a corpus path, see :func:`attnrank.corpus.load_corpus`; with
        ``skip_invalid`` its bad records are skipped, each logged, as the refusal of one advises). The
        retriever changes only once both indexes are built: a build that fails leaves it as it was
        (BM25 of the new corpus beside the old documents answered with the wrong ones)."""
        docs, corpus_path = corpus_documents(docs, skip_invalid)
        if not docs:
            raise InputError("cannot index an empty corpus (0 documents); give at least one document")
        check_indexable(docs)
        # (the caller's metadata dicts: an edit of their list after indexing changed what searches returned)
        docs = [dataclasses.replace(d, metadata=dict(d.metadata)) for d in docs]
        texts = [d.full_text for d in docs]
        t0 = time.perf_counter()
        bm25 = BM25Index(self.bm25_params, resolve_config(self.stopwords, self.stemmer)).index(texts)
        t1 = time.perf_counter()
        dense = DenseIndex(self.embedder, self.dense_kind, device=self.device, backend=self.embed_backend)
        dense.index(texts, show_progress)
        t2 = time.perf_counter()
        self.bm25, self.dense, self.docs, self.corpus_path = bm25, dense, docs, corpus_path
        self.loaded_from = None
        self.build_info = {"bm25_seconds": round(t1 - t0, 3), "dense_seconds": round(t2 - t1, 3)}
        logger.info("indexed %d documents (BM25 %.1fs, dense %.1fs)", len(docs), t1 - t0, t2 - t1)
        return self

    @property
    def num_docs(self) -> int:
        return len(self.docs)

    # -- search ------------------------------------------------------------------------------
    def search(self, query: str, k: int = 10, *, mode: str | None = None, query_id: str | None = None) -> RankedResults:
        """Top-``k`` documents for one query, best first (``k`` beyond the corpus: every document
        a side retrieves; in ``bm25`` mode only those holding a query term)."""
        return self.search_batch([query], k, mode=mode, query_ids=None if query_id is None else [query_id])[0]

    def search_batch(
        self,
        queries: Sequence[str] | Mapping[str, str],
        k: int = 10,
        *,
        mode: str | None = None,
        query_ids: Sequence[str] | None = None,
        show_progress: bool = False,
    ) -> list[RankedResults]:
        """Search many queries; a mapping ``{query_id: text}`` is accepted too."""
        if isinstance(queries, str):  # (searched one character at a time, exit 0)
            raise InputError("search_batch takes a list of queries, not one string; use search(query) for one")
        if isinstance(queries, Mapping):
            if query_ids is not None:  # (the given ids were dropped for the mapping's keys)
                raise InputError(
                    "the queries are a mapping, whose keys are their ids; give query_ids or a mapping, not both"
                )
            query_ids, queries = list(queries.keys()), list(queries.values())
        queries = list(queries)
        if query_ids is not None and len(query_ids) != len(queries):
            raise InputError(f"{len(queries)} queries but {len(query_ids)} query_ids; give one id per query")
        for given in query_ids or ():
            check_query_id(given)
        self._check_search(queries, k)
        mode = self._check_mode(mode or self.mode)
        if not queries:  # nothing to embed: the embedder would return no vectors at all
            return []
        k_eff = min(k, self.num_docs)
        sparse, dense = self.candidates(queries, k_eff, mode)
        out = []
        for qi, q in enumerate(self._progress(queries, show_progress)):
            qid = query_ids[qi] if query_ids is not None else None
            out.append(self._fuse_one(q, qid, qi, sparse, dense, mode, k_eff))
        return out

    def candidates(self, queries: Sequence[str], k: int, mode: str = "hybrid"):
        """Raw per-side top lists ``(positions, scores)`` (or None), as fused by :meth:`fuse`.

        Hybrid mode fetches ``max(k, depth)`` from each side. Exposed so that tuning can fuse
        the same candidates many times without searching again.
        """
        depth = max(k, min(self.depth, self.num_docs)) if mode == "hybrid" else k
        assert self.bm25 is not None and self.dense is not None, "index() or load() first"
        sparse = self.bm25.retrieve(queries, depth, matched_only=True) if mode in ("bm25", "hybrid") else None
        dense = self.dense.retrieve(queries, depth) if mode in ("dense", "hybrid") else None
        return sparse, dense

    def fuse(
        self, queries: Sequence[str], candidates, k: int, mode: str = "hybrid", query_ids: Sequence[str] | None = None
    ) -> list[RankedResults]:
        """Turn :meth:`candidates` output into results with the current fusion settings."""
        if not is_count(k):  # (a negative k reached the slicing: k=-1 dropped the last result)
            raise InputError(f"k={k!r} must be a positive integer (the number of results per query)")
        sparse, dense = candidates
        return [
            self._fuse_one(q, None if query_ids is None else query_ids[i], i, sparse, dense, mode, k)
            for i, q in enumerate(queries)
        ]

    def _fuse_one(self, query, qid, qi, sparse, dense, mode, k) -> RankedResults:
        stage: dict[str, dict[int, float]] = {}
        if sparse is not None:
            stage["bm25"] = {i: s for i, s in zip(sparse[0][qi].tolist(), sparse[1][qi].tolist()) if i >= 0}
        if dense is not None:
            stage["dense"] = {i: s for i, s in zip(dense[0][qi].tolist(), dense[1][qi].tolist()) if i >= 0}
        if mode == "bm25":  # only documents that hold a query term: fewer than k, or none, is the answer
            keep = sparse[0][qi] >= 0
            ids, scores = sparse[0][qi][keep][:k], sparse[1][qi][keep][:k]
        elif mode == "dense":
            keep = dense[0][qi] >= 0
            ids, scores = dense[0][qi][keep][:k], dense[1][qi][keep][:k]
        else:
            ids, scores = self._hybrid(sparse, dense, qi, k)
        if not np.all(np.isfinite(scores)):
            raise IndexFormatError(
                f"query {query[:40]!r} got non-finite {mode} scores: the index is corrupted; "
                "check it with --verify (HybridRetriever.load(verify=True)) and rebuild it"
            )
        results = []
        for r, (i, s) in enumerate(zip(ids.tolist(), scores.tolist()), start=1):
            d = self.docs[i]
            per_stage = {name: vals[i] for name, vals in stage.items() if i in vals}
            if mode == "hybrid":
                per_stage["hybrid"] = float(s)
            # (a copy: the caller's changes to a result's metadata reached the index, every later
            # query's results and a later save of it)
            meta = copy.deepcopy(d.metadata) if d.metadata else {}
            results.append(ScoredDocument(d.id, float(s), r, d.text, d.title, per_stage, metadata=meta))
        return RankedResults(query, results, qid, stage=mode)

    def _hybrid(self, sparse, dense, qi: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:func:`~attnrank.index.hybrid.fuse_at_depth` of one query's lists by this index's fusion."""
        lists = [(sparse[0][qi], sparse[1][qi]), (dense[0][qi], dense[1][qi])]
        settings = {"rrf_k": self.rrf_k} if self.fusion == "rrf" else {"alpha": self.alpha, "norm": self.norm}
        return hybrid.fuse_at_depth(lists, min(self.depth, self.num_docs), k, self.fusion, **settings)

    def stored_vectors(self, positions: Sequence[int]) -> np.ndarray | None:
        """The dense index's unit vectors of the documents at ``positions`` (None: it cannot give
        them back, as IVF cannot)."""
        return None if self.dense is None else self.dense.vectors(positions)

    def _check_search(self, queries: list[str], k: int) -> None:
        if not self.docs:
            raise InputError("the retriever has no documents; call index(...) or HybridRetriever.load(path) first")
        if not is_count(k):
            raise InputError(f"k={k!r} must be a positive integer (the number of results per query)")
        check_queries(queries)

    @staticmethod
    def _progress(items, show: bool):
        if not show:
            return items
        from tqdm.auto import tqdm

        return tqdm(items, desc="search", unit="q")

    # -- persistence -------------------------------------------------------------------------
    def save(
        self,
        path: str | Path,
        *,
        force: bool = False,
        protect: Sequence[Protected] = (),
        extra: Callable[[Path], object] | None = None,
    ) -> Path:
        """Write the index folder atomically (see :mod:`attnrank.index.store`).

        Replaces only an existing index or an empty folder; ``force=True`` also replaces another
        non-empty folder, never one holding the working directory or a ``protect`` path
        (:mod:`attnrank.index.folders`), nor the corpus file or folder :meth:`index` read.
        ``extra(folder)`` may add files (e.g. passage states)
        inside the same build: the manifest lists and checksums them with the rest. A retriever
        loaded from ``path``, not indexed anew since, and saved over it keeps the index's passage
        states where ``extra`` writes none, the corpus is the same and each listed state file
        passes its checksum (:func:`~attnrank.index.store.keep_passage_states`); any other save
        over an index drops them.
        """
        if not self.docs:
            raise InputError("nothing to save: the retriever has no documents")
        path = Path(path)
        assert self.bm25 is not None and self.dense is not None, "index() before save()"
        protected: list[Protected] = list(protect)
        protected += [self.corpus_path] if self.corpus_path is not None else []
        protected += embedder_paths(self.embedder_folder())
        loaded_here = self._loaded_from(path)  # (such a save keeps the states, or says why it cannot)
        with atomic_dir(path, force=force, protect=protected) as tmp:
            write_docs(tmp / "docs.jsonl", self.docs)
            fault_point("save-in-tmp", tmp / "bm25")
            self.bm25.save(tmp / "bm25")
            self.dense.save(tmp / "dense")
            if extra is not None:
                extra(tmp)
            info = self._manifest_info()
            if loaded_here:  # saved over itself
                keep_passage_states(path, tmp, info["corpus_sha256"])
            write_manifest(tmp, info)
            check_built(tmp)  # whole, before the swap
        logger.info("saved index with %d documents to %s", self.num_docs, path)
        return path

    def embedder_folder(self) -> list[Path]:
        """The embedder's own folder where it is a local one (else none): a save never replaces it,
        as it does the corpus (--force replaced it, and the index recorded a model it had just deleted)."""
        names = {self.embedder, self.dense.model_name if self.dense is not None else None}
        return [f for f in (Path(n).expanduser() for n in sorted(filter(None, names))) if f.exists()]

    def _loaded_from(self, path: Path) -> bool:
        """Whether this retriever was loaded from the folder ``path`` (another spelling of it too:
        a case-insensitive disk, a bind mount) and not indexed anew since."""
        try:
            return self.loaded_from is not None and os.path.samefile(self.loaded_from, path)
        except OSError:  # (either is gone: no states there to keep)
            return False

    def _manifest_info(self) -> dict:
        """What the manifest records of this retriever (:func:`~attnrank.index.components.manifest_info`)."""
        assert self.bm25 is not None and self.dense is not None
        fusion = {
            "method": self.fusion,
            "alpha": self.alpha,
            "norm": self.norm,
            "rrf_k": self.rrf_k,
            "depth": self.depth,
            "mode": self.mode,
        }
        built = {
            "bm25_params": (self.bm25_params, self.bm25.params),
            "embedder": (self.embedder, self.dense.model_name),
            "dense_kind": (self.dense_kind, self.dense.kind),
        }
        changed = [f"{k}={new!r} (built with {old!r})" for k, (new, old) in built.items() if new != old]
        if changed:  # (the manifest recorded them, and the folder then failed to load as corrupted)
            logger.warning(
                "%s changed since the index was built; the save records what it was built with, and they "
                "apply at the next index()",
                ", ".join(changed),
            )
        return manifest_info(self.docs, self.bm25, self.dense, fusion=fusion, build=self.build_info)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        mmap: bool = True,
        verify: bool = False,
        device: str = "cpu",
        embed_backend: str | None = None,
    ) -> HybridRetriever:
        """Load an index folder written by :meth:`save` (arrays memory-mapped).

        Queries are embedded with the backend recorded at build (``torch`` for indexes that
        predate the setting); ``embed_backend`` overrides it (the embeddings agree to ~1e-5
        across ``torch``, ``onnx`` and ``openvino``; ``onnx-int8`` less closely).

        Every load runs cheap structural checks (manifest paths, sizes, BM25 CSC layout and
        weight bounds, FAISS vector count and dimension, document count and corpus checksum);
        ``verify=True`` also recomputes every file's SHA-256. A save that swaps the folder while
        it is read is detected (the manifest changed) and the load starts again, so a reader
        gets the old or the new index, never a mix.
        """
        path = Path(path)
        if embed_backend is not None:  # the caller's value, not the index's: not an IndexFormatError below
            check_backend(embed_backend)
        return load_unchanged(
            path, lambda: cls._load_once(path, mmap=mmap, verify=verify, device=device, embed_backend=embed_backend)
        )

    @classmethod
    def _load_once(
        cls, path: Path, *, mmap: bool, verify: bool, device: str, embed_backend: str | None
    ) -> HybridRetriever:
        m = read_manifest(path, verify=verify, required=INDEX_FILES)
        fault_point("load-after-manifest", path)
        try:
            settings = manifest_settings(m)
            self = cls(**{**settings, "embed_backend": embed_backend or settings["embed_backend"]}, device=device)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise mangled(path, e) from None
        self.docs, self.bm25, self.dense = read_components(
            path, m, model=settings["embedder"], mmap=mmap, backend=self.embed_backend, device=device
        )
        self.build_info = m.get("build", {})
        self.loaded_from = path.resolve()
        return self


def corpus_documents(
    docs: Sequence[Document] | str | Path, skip_invalid: bool = False
) -> tuple[list[Document], Path | None]:
    """The documents to index, and the corpus path they were read from (None: given as objects;
    never replaced by a save, whatever ``force`` says). With ``skip_invalid`` a corpus's bad
    records are skipped, each logged, as the refusal of one advises."""
    if isinstance(docs, (Mapping, AbstractSet)):  # (a dict's keys were read as documents: "document #0 is a str")
        raise InputError(
            f"the documents are a {type(docs).__name__} of {len(docs)}; pass a list of Document objects, e.g. "
            "[Document(i, t) for i, t in d.items()], or a corpus path"
        )
    if not isinstance(docs, (str, Path)):
        if skip_invalid:  # (documents given as objects: there are no records to skip)
            raise InputError("skip_invalid applies to a corpus path; documents given as objects are indexed as given")
        return list(docs), None
    loaded, report = load_corpus(docs, skip_invalid=skip_invalid)
    for where, why in report.skipped:
        logger.warning("skipped an invalid record, %s: %s", where, why)
    return loaded, Path(docs).resolve()
