"""Dense index: sentence-transformers embeddings in FAISS, cosine similarity.

Embeddings are L2-normalised, so inner product equals cosine. Index types (FAISS factory
strings): ``flat`` (exact, the default), ``hnsw`` (``HNSW32,Flat``; approximate, no training),
``ivf`` (``IVF{nlist},Flat``, trained on the corpus; ``nprobe`` 16, an argument of
:class:`DenseIndex` and its ``load``, not of the retriever or the CLI). ``backend``: how the
embedder runs (``torch``, ``onnx``, ``onnx-int8``, ``openvino``; :mod:`attnrank.index.embed`). Saved as
``index.faiss`` and loaded memory-mapped where FAISS allows it (``IO_FLAG_MMAP_IFC`` for flat
codes, ``IO_FLAG_MMAP`` for IVF lists).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError, InputError, ModelError
from ..files import check_new_folder
from ..types import is_count
from .bm25 import check_k
from .embed import check_probe, check_prompts, embedder_probe, encode, load_embedder, role_prompts
from .embed_export import check_backend

logger = logging.getLogger(__name__)

INDEX_TYPES = ("flat", "hnsw", "ivf")


def check_nprobe(nprobe: object) -> None:
    """``nprobe`` (IVF lists searched per query) an integer >= 1: 0 built the index after the whole
    corpus was embedded and failed in every search inside FAISS, -1 overflowed."""
    if not is_count(nprobe):
        raise InputError(f"nprobe={nprobe!r} must be an integer >= 1 (IVF lists searched per query; default 16)")


def _build_faiss(emb: np.ndarray, kind: str, nprobe: int):
    import faiss

    n, dim = emb.shape
    index: Any
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.index_factory(dim, "HNSW32,Flat", faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 128
    elif kind == "ivf":
        # ~sqrt(N) lists, and at least 39 training points per list as FAISS recommends
        nlist = max(1, min(int(math.sqrt(n)), n // 39))
        index = faiss.index_factory(dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
        index.train(emb)
        index.nprobe = min(nprobe, nlist)
    else:
        raise InputError(f"dense index type {kind!r} is not one of {INDEX_TYPES}")
    index.add(emb)
    return index


def check_positions(positions: np.ndarray, n: int) -> None:
    """Raise unless every document position is in ``[0, n)``."""
    bad = positions[(positions < 0) | (positions >= n)]
    if bad.size:
        raise InputError(f"document position {int(bad[0])} is outside the index's {n} documents (0 to {n - 1})")


def check_index_type(kind: str) -> None:
    if kind not in INDEX_TYPES:
        raise InputError(f"dense index type {kind!r} is not one of {', '.join(INDEX_TYPES)}")


class DenseIndex:
    """Embeddings of a list of texts in FAISS. Verbs: :meth:`index`, :meth:`retrieve`, :meth:`save`, :meth:`load`."""

    def __init__(
        self,
        model: str | None = None,
        kind: str = "flat",
        *,
        nprobe: int = 16,
        batch_size: int = 64,
        device: str = "cpu",
        backend: str = "torch",
    ):
        check_index_type(kind)
        check_nprobe(nprobe)
        self.model_name, self.kind, self.nprobe = model, kind, nprobe
        self.batch_size, self.device, self.backend = batch_size, device, check_backend(backend)
        self.faiss_index: Any = None
        self.dim = 0
        # the embedding of embed.PROBE_TEXT at build; checked against the encoder at the first query
        self.probe: list[float] | None = None
        self._probe_checked = False
        self.built_with = self.backend  # the backend that embedded the stored vectors (load: the manifest's)
        # the role prompts the documents were embedded with (embed.role_prompts), queries then with
        # the query's; None for an index built before roles were applied: bare queries, as its documents
        self.prompts: dict[str, str | None] | None = None
        # the file a memory-mapped IVF index reads its lists from, and how it stood at the load
        # (its identity): FAISS writes such an index as offsets into that file alone (see save)
        self._lists_file: tuple[Path, tuple[int, int, int]] | None = None

    @property
    def encoder(self):
        return load_embedder(self.model_name, self.device, self.backend)

    def index(self, texts: Sequence[str], show_progress: bool = False) -> DenseIndex:
        if len(texts) == 0:
            raise InputError("cannot build a dense index over 0 documents; give a non-empty corpus")
        probe = embedder_probe(self.encoder)  # (first: a model that cannot embed it fails before the corpus)
        emb = encode(
            self.encoder, list(texts), role="document", batch_size=self.batch_size, show_progress=show_progress
        )
        bad = np.flatnonzero(~np.isfinite(emb).all(axis=1))
        if bad.size:  # (indexed, such a vector is left out of every search: its document never found)
            raise ModelError(
                f"the embedder {self.model_name} gave {bad.size} document vector(s) that are not finite (first: "
                f"document #{int(bad[0])}); check its files or its precision (float16 on CPU overflows)"
            )
        self.dim = emb.shape[1]
        self.prompts = role_prompts(self.encoder)
        self.faiss_index = _build_faiss(emb, self.kind, self.nprobe)
        self.probe, self._probe_checked = probe, True
        return self

    @property
    def num_docs(self) -> int:
        return 0 if self.faiss_index is None else int(self.faiss_index.ntotal)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        if not self._probe_checked:
            check_probe(self.encoder, self.probe, self.model_name, self.prompts)
            check_prompts(self.encoder, self.prompts, self.model_name)
            self._probe_checked = True
        return encode(self.encoder, list(queries), role=self.query_role, batch_size=self.batch_size)

    @property
    def query_role(self) -> str | None:
        """How queries are embedded: ``"query"`` where the documents took the document prompt."""
        return None if self.prompts is None else "query"

    def retrieve(
        self, queries: Sequence[str], k: int = 10, *, query_embeddings: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` positions and cosine scores per query, shape (n_queries, min(k, N))."""
        if self.faiss_index is None:
            raise InputError("the dense index is empty; call index(texts) or DenseIndex.load(path) first")
        check_k(k)
        q = self.encode_queries(queries) if query_embeddings is None else query_embeddings
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise IndexFormatError(
                f"the embedder gives {q.shape[-1]}-dimensional vectors, the dense index holds "
                f"{self.dim}-dimensional ones; use the embedder the index was built with"
            )
        if not np.all(np.isfinite(q)):  # (FAISS found nothing for them: "no hits", exit 0)
            raise ModelError(
                f"the embedder {self.model_name} gave query vectors that are not finite; check its files "
                "(or its precision: float16 on CPU overflows) and search again"
            )
        k = min(int(k), self.num_docs)  # FAISS takes a Python int, not a NumPy one
        scores, idx = self.faiss_index.search(q, k)
        # unit vectors: a cosine outside [-1, 1] (or NaN) means damaged vectors, never a result
        if not np.all(np.abs(np.nan_to_num(scores[idx >= 0], nan=np.inf)) <= 1.001):
            raise IndexFormatError(
                "the dense index returned cosine scores outside [-1, 1]: its vectors are "
                "corrupted; rebuild the index with `attnrank index`"
            )
        # an exact index returns k hits of every query; FAISS leaves out a vector whose cosine is NaN
        # (a corrupted one), so a short list read as "no hits" with exit 0 (a hybrid one: BM25's alone)
        if self.kind == "flat" and np.any(idx < 0):
            raise IndexFormatError(
                "the dense index left documents out of an exact search: its vectors are corrupted (not finite); "
                "rebuild the index with `attnrank index`"
            )
        # approximate indexes may return fewer than k hits (-1); keep arrays rectangular
        idx = np.where(idx < 0, -1, idx).astype(np.int64)
        scores = scores.astype(np.float32)
        # ties by id ascending, as a sharded index merges them (FAISS's heap leaves them in another
        # order; RRF fuses ranks, so tied duplicates ranked the two indexes' hybrid results apart)
        order = np.lexsort((np.where(idx < 0, np.iinfo(np.int64).max, idx), -np.nan_to_num(scores, nan=-np.inf)))
        return np.take_along_axis(idx, order, axis=1), np.take_along_axis(scores, order, axis=1)

    def vectors(self, positions: Sequence[int]) -> np.ndarray | None:
        """The stored unit vectors of the documents at ``positions``, shape (len(positions), dim),
        or None where the index cannot give them back (IVF keeps no map from position to vector)
        or they are int8 approximations (``onnx-int8``: ~2e-2 from float32) that would not stand
        in for an embedding. A position outside ``[0, num_docs)`` is refused: FAISS would read
        another array's memory for a negative one (and -1 is its "no hit" id)."""
        if self.faiss_index is None or self.kind == "ivf" or self.built_with == "onnx-int8":
            return None
        at = np.asarray(positions, dtype=np.int64)
        check_positions(at, self.num_docs)
        try:
            vecs = self.faiss_index.reconstruct_batch(at)
        except RuntimeError:  # a FAISS index type that does not reconstruct
            return None
        return np.asarray(vecs, dtype=np.float32).reshape(len(positions), self.dim)

    def save(self, path: str | Path) -> None:
        """Write the FAISS index into ``path``, a new or empty folder (:func:`attnrank.files.check_new_folder`)."""
        import faiss

        path = Path(path)
        check_new_folder(path, "DenseIndex.save")
        path.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self._writable(), str(path / "index.faiss"))

    def _writable(self) -> Any:
        """The FAISS index to write. A memory-mapped IVF index reads its lists from its file
        (``OnDiskInvertedLists``), and FAISS writes it as offsets into that file, no vector: saved
        (over itself, after the swap removed the file), the index was a stub of a few hundred bytes
        that crashed the next search. Its file is read in whole instead, as loaded, and kept in
        memory from then on (a save over itself replaces that file)."""
        if self._lists_file is None:
            return self.faiss_index
        import faiss

        source, identity = self._lists_file
        try:
            now = _identity(source)
        except OSError:
            now = None
        if now != identity:
            raise IndexFormatError(
                f"the IVF index was read from {source}, which changed or went away since: its vectors are no longer "
                "there to save; load the index again (or with mmap=False) and save that"
            )
        whole = faiss.read_index(str(source))
        faiss.extract_index_ivf(whole).nprobe = self.nprobe
        self.faiss_index, self._lists_file = whole, None
        return whole

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        model: str | None,
        kind: str,
        nprobe: int | None = None,
        mmap: bool = True,
        device: str = "cpu",
        backend: str = "torch",
        probe: list[float] | None = None,
        built_with: str | None = None,
        prompts: dict[str, str | None] | None = None,
    ) -> DenseIndex:
        """``probe``: the build's embedding of the probe text (from the manifest), checked
        against the embedder at the first query; None skips the check. ``built_with``: the
        backend the manifest says embedded the documents (None: ``backend``). ``prompts``: the role
        prompts they were embedded with (the manifest's; None before it was recorded: none). ``nprobe``: the
        IVF lists searched (None: the value saved in the index; 16 overrode a saved 1)."""
        import faiss

        self = cls(model, kind, nprobe=16 if nprobe is None else nprobe, device=device, backend=backend)
        self.probe, self.built_with, self.prompts = probe, built_with or backend, prompts
        if self.built_with != backend:  # allowed (the probe check bounds the difference), but said
            logger.warning(
                "the documents of %s were embedded with backend %s; its queries are embedded with %s",
                path,
                self.built_with,
                backend,
            )
        file = Path(path) / "index.faiss"
        flags = 0
        if mmap:
            flags = (
                faiss.IO_FLAG_MMAP_IFC
                if kind in ("flat", "hnsw") and hasattr(faiss, "IO_FLAG_MMAP_IFC")
                else faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY
            )
        try:
            self.faiss_index = faiss.read_index(str(file), flags)
        except RuntimeError as e:
            raise IndexFormatError(
                f"dense index {file} cannot be read ({str(e).splitlines()[0]}); rebuild it"
            ) from None
        found = faiss_kind(self.faiss_index)
        if found != kind:
            raise IndexFormatError(
                f"dense index {file} is a {found} index, the manifest says {kind}; the index is corrupted, rebuild it"
            )
        if kind == "ivf":
            ivf = faiss.extract_index_ivf(self.faiss_index)
            if nprobe is not None:
                check_nprobe(nprobe)
                ivf.nprobe = nprobe
            self.nprobe = int(ivf.nprobe)
            if flags & faiss.IO_FLAG_MMAP:
                self._lists_file = (file.resolve(), _identity(file))
        elif kind == "hnsw":
            self.faiss_index.hnsw.efSearch = 128
        self.dim = self.faiss_index.d
        return self

    def check(self, path: str | Path, *, num_docs: int, dim: int) -> None:
        """Cheap structural checks on load: vector count, dimension and metric as recorded at build,
        and an IVF index's stored ids (its lists name each vector's document: a damaged list of the
        right size returned other documents, or failed past the last one)."""
        import faiss

        ix = self.faiss_index
        if ix.ntotal != num_docs or ix.d != dim or ix.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise IndexFormatError(
                f"dense index {Path(path) / 'index.faiss'} holds {ix.ntotal} vectors of dimension "
                f"{ix.d}, the manifest says {num_docs} of dimension {dim} (inner product); "
                "the index is corrupted, rebuild it"
            )
        if faiss_kind(ix) == "ivf" and not _each_once(_list_ids(ix), num_docs):
            raise IndexFormatError(
                f"dense index {Path(path) / 'index.faiss'}: its vector ids are not the documents 0..{num_docs - 1}; "
                "the index is corrupted, rebuild it"
            )


def _each_once(ids: np.ndarray, n: int) -> bool:
    """Whether ``ids`` holds each of 0..n-1 exactly once (linear: no sort of a large index's ids)."""
    return ids.size == n and bool(((ids >= 0) & (ids < n)).all()) and bool((np.bincount(ids, minlength=n) == 1).all())


def _list_ids(index: Any) -> np.ndarray:
    """The ids an IVF index's lists hold, in list order."""
    import faiss

    invlists: Any = faiss.extract_index_ivf(index).invlists
    parts = [np.empty(0, dtype=np.int64)]
    for lst in range(invlists.nlist):
        size = invlists.list_size(lst)
        if size:
            ptr = invlists.get_ids(lst)
            parts.append(faiss.rev_swig_ptr(ptr, size).astype(np.int64))
            invlists.release_ids(lst, ptr)
    return np.concatenate(parts)


def stored_ids(index: Any) -> np.ndarray:
    """The ids a shard's FAISS index returns: its ``IndexIDMap``'s in vector order (flat), or the
    IVF lists' ids, sorted."""
    import faiss

    if hasattr(index, "id_map"):
        return faiss.vector_to_array(index.id_map).astype(np.int64)
    return np.sort(_list_ids(index))


def faiss_kind(index: Any) -> str:
    """Which of :data:`INDEX_TYPES` a FAISS index is (seen through an ``IndexIDMap``)."""
    import faiss

    inner = index
    if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        inner = faiss.downcast_index(index.index)
    if isinstance(inner, faiss.IndexHNSW):
        return "hnsw"
    try:
        faiss.extract_index_ivf(inner)
    except RuntimeError:
        return "flat"
    return "ivf"


def recorded_probe(dense: dict[str, Any], dim: int) -> list[float] | None:
    """The probe embedding a manifest's ``dense`` settings record (None for indexes built before
    probes were recorded); ValueError when it is not ``dim`` numbers."""
    probe = dense.get("probe")
    if probe is None:
        return None
    if not isinstance(probe, list) or len(probe) != dim or not all(isinstance(x, (int, float)) for x in probe):
        raise ValueError(f"dense probe is not {dim} numbers")
    return [float(x) for x in probe]


def recorded_prompts(dense: dict[str, Any]) -> dict[str, str | None] | None:
    """A manifest's ``dense.prompts`` (None: an index built before they were recorded, whose
    queries are embedded bare); ValueError when it is not a query and a document prompt."""
    prompts = dense.get("prompts")
    if prompts is None:
        return None
    if not isinstance(prompts, dict) or not all(v is None or isinstance(v, str) for v in prompts.values()):
        raise ValueError(f"dense prompts {prompts!r} are not {{'query': text or null, 'document': text or null}}")
    return {"query": prompts.get("query"), "document": prompts.get("document")}


def _identity(file: Path) -> tuple[int, int, int]:
    """A file's device, inode and modification time (ns): another file, or this one rewritten, differs."""
    st = file.stat()
    return st.st_dev, st.st_ino, st.st_mtime_ns
