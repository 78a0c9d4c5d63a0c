"""First-stage signals of a candidate list, computed over the candidates themselves.

The fused scorer (:mod:`attnrank.rerank.fused`) combines attention with the first stage's
signals. A TREC run or a plain list of passages brings at most one score, of unknown shape, so
the signals are computed here, the same way at training and at reranking time, from nothing but
the query and the candidate texts:

- ``bm25``: BM25 over the candidate texts (Lucene idf ``log(1 + (N − df + 0.5)/(df + 0.5))``,
  which stays positive when every candidate holds a query term; k1 = 0.9, b = 0.4 as Pyserini;
  Porter stems where PyStemmer is installed; the terms of indexes built before NFKC and the
  script word rule, as every fused weight was fitted: :mod:`attnrank.index.tokenize`), without
  scikit-learn's 318 English stopwords. Why that list and not Lucene's 33
  words, as an index uses: idf from a score of candidates is high for any word only some of them
  hold, so a question's function words ("what", "does", "which") outweighed its content words.
  On the fused scorer's benchmark candidates BM25 alone gained 1.5 to 5.1 nDCG@10 points (DL19
  0.430 -> 0.480, SciFact 0.681 -> 0.697, HotpotQA 0.856 -> 0.879, LoCoMo 0.461 -> 0.494;
  ``docs/results/fusion.md``, "bm25 alone", against its 2026-12-01 version);
- ``dense``: cosine of the query and the passage with the packaged sentence embedder
  (all-MiniLM-L6-v2, the index's default, :func:`attnrank.index.embed.load_embedder`). Candidates
  that come from an index built with the same embedder (same id, same text) are not embedded
  again: their vectors are read back from the index (:meth:`SignalComputer.use_index`), which
  takes the cost of preset ``signals`` from a MiniLM pass over the candidates to one query (20
  SciFact abstracts: 0.025 s per query against 0.89 s embedding them in float32).
  ``backend="torch-bf16"`` runs the embedder in bfloat16, as the reranker does where its dtype
  resolves to bfloat16 (CPUs with AMX or AVX-512 BF16): 1.9x (DL19 BM25 top-20) and 2.6x (SciFact
  hybrid top-20) faster per query, preset ``signals``' nDCG@10 -0.06 and 0.00 points
  (docs/results/rerank_presets.md);
- ``rank``: ``−position`` in the first-stage order (0 = best), so a retriever's order counts
  whatever its score scale.

Each is one value per candidate, in input order; the fused scorer z-scores them per query.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config import cpu_auto_dtype
from ..errors import InputError
from ..index.bm25 import BM25Index, BM25Params
from ..index.embed import check_probe, encode, load_embedder, resolve_embedder_path, role_prompts, uses_roles
from ..index.retriever import HybridRetriever
from ..index.tokenize import TokenizerConfig, resolve_config
from ..types import Document

SIGNALS = ("bm25", "dense", "rank")
# Candidate vectors a SignalComputer keeps (text digest -> unit vector, least recently used dropped): a
# passage that an earlier query brought is not embedded again. 20,000 MiniLM vectors: about 32 MB with their keys.
VECTOR_CACHE = 20_000
# How the signals are computed, as a number that grows with every change that moves their values
# (weights fitted to one version are stale under another; batch checkpoints must not mix them):
# 1: candidate BM25 without Lucene's 33 stopwords (until 2026-12-02); 2: without scikit-learn's 318.
SIGNALS_VERSION = 2
_LUCENE = BM25Params(method="lucene")


def text_key(text: str) -> bytes:
    """What a kept candidate vector is looked up by: a 16-byte digest of its text. Why not the
    text: 20,000 kept server passages of up to 20,000 characters held about 400 MB of keys
    beside 30 MB of vectors, outside every stated budget."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@functools.cache
def candidate_terms() -> TokenizerConfig:
    """How candidate BM25 makes terms (see the module docstring): Porter stems where PyStemmer is
    installed (the ``stem`` extra, with which every preset was measured), else none, warned once
    (a core install reranks too)."""
    return dataclasses.replace(resolve_config("sklearn", "auto"), unicode="none", words="w")


def candidate_bm25(query: str, texts: Sequence[str]) -> np.ndarray:
    """BM25 of ``query`` against each text, with statistics of ``texts`` alone (0 for all if
    every text is empty after tokenization)."""
    try:
        return np.asarray(BM25Index(_LUCENE, candidate_terms()).index(list(texts)).get_scores(query), dtype=np.float64)
    except InputError:  # nothing to index (all stopwords/punctuation): no lexical signal
        return np.zeros(len(texts))


def candidate_vectors(
    query: str, texts: Sequence[str], embedder: Any, stored: Sequence[np.ndarray | None] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The query's unit vector and the texts' (``[n, dim]``): ``stored[i]`` where given, else
    embedded: as a query and as documents where the embedder has roles
    (:func:`~attnrank.index.embed.uses_roles`: e5's prompts), else bare (the packaged MiniLM).

    The query is embedded alone, never in one batch with the texts: in bfloat16 its vector moves
    with the batch's padding (about 1e-3 in a cosine), so a repeated request, whose texts were
    kept from the first, scored otherwise than the first (a server's ``/v1/rerank``)."""
    todo = [i for i in range(len(texts)) if stored is None or stored[i] is None]
    roles = uses_roles(embedder)
    query_vec = encode(embedder, [query], role="query" if roles else None)[0]
    todo_texts = [texts[i] for i in todo]
    fresh = encode(embedder, todo_texts, role="document" if roles else None) if todo else np.empty((0, len(query_vec)))
    docs = np.empty((len(texts), len(query_vec)), dtype=np.float32)
    docs[todo] = fresh
    for i, vec in enumerate(stored or ()):
        if vec is not None:
            docs[i] = vec
    return query_vec, docs


def rank_signal(n: int) -> np.ndarray:
    """``−position`` of each of ``n`` candidates in first-stage order (0 = best)."""
    return -np.arange(n, dtype=np.float64)


class IndexVectors:
    """The stored dense vectors of an index's documents, found by document id and used only for a
    candidate whose text is the indexed one (a caller may pass other text under a known id)."""

    def __init__(self, retriever: HybridRetriever):
        self.retriever = retriever
        self._mapped = self._map()

    def _map(self) -> tuple[list[Document], dict[str, int]]:
        docs = self.retriever.docs
        return docs, {d.id: i for i, d in enumerate(docs)}

    def lookup(self, ids: Sequence[str], texts: Sequence[str]) -> list[np.ndarray | None]:
        """One stored vector per candidate, None where the index does not hold that text."""
        docs, positions = self._mapped  # (one pair: another thread may map again meanwhile)
        if self.retriever.docs is not docs:  # re-indexed or re-loaded: positions moved
            self._mapped = docs, positions = self._map()
        pos = [positions.get(i) for i in ids]
        pos = [p if p is not None and docs[p].full_text == t else None for p, t in zip(pos, texts)]
        found = [p for p in pos if p is not None]
        vecs = self.retriever.stored_vectors(found) if found else None
        if vecs is None:
            return [None] * len(ids)
        rows = iter(vecs)
        return [None if p is None else next(rows) for p in pos]


def signal_embedder_setup(device: str, dtype: str) -> tuple[str, str]:
    """``(device, backend)`` of the candidates' embedder for a reranker that runs on ``device`` in
    ``dtype``: bfloat16 on a CPU where ``dtype`` resolves to it (``"auto"`` on a CPU with AMX or
    AVX-512 BF16, :func:`attnrank.config.cpu_auto_dtype`, or ``"bfloat16"``), else float32; a
    reranker on ``"auto"`` embeds on the CPU, one on a given GPU there."""
    if device not in ("cpu", "auto"):
        return device, "torch"
    name = dtype.strip().lower()
    return "cpu", "torch-bf16" if (cpu_auto_dtype() if name == "auto" else name) == "bfloat16" else "torch"


class SignalComputer:
    """Computes :data:`SIGNALS` for candidate lists; the embedder (``embedder``: a model name or
    folder, None = the packaged MiniLM; ``backend``: how it runs, ``"torch"`` or ``"torch-bf16"``,
    :func:`attnrank.index.embed.load_embedder`) is loaded on first use. The vectors of the last
    ``cache_vectors`` candidate texts it embedded are kept (:attr:`vectors`, :func:`text_key` of
    the text -> unit vector) and reused (0: none)."""

    def __init__(
        self,
        embedder: str | None = None,
        device: str = "cpu",
        backend: str = "torch",
        cache_vectors: int = VECTOR_CACHE,
    ):
        if cache_vectors < 0:
            raise InputError(f"cache_vectors={cache_vectors} must be >= 0 (0: keep no vectors)")
        self.embedder_name, self.device, self.backend = embedder, device, backend
        self._embedder: Any = None
        self.index: IndexVectors | None = None
        self.cache_vectors = cache_vectors
        self.vectors: OrderedDict[bytes, np.ndarray] = OrderedDict()  # text_key(text) -> unit vector
        # one reranker serves a server's or a framework's threads: the kept vectors (looked up,
        # moved, evicted) and the lazy embedder load are guarded
        self._lock = threading.RLock()

    def forget(self) -> None:
        """Forget the candidates' vectors kept from earlier calls."""
        with self._lock:
            self.vectors.clear()

    @property
    def embedder(self) -> Any:
        with self._lock:
            if self._embedder is None:
                self._embedder = load_embedder(self.embedder_name, device=self.device, backend=self.backend)
            return self._embedder

    def use_index(self, retriever: HybridRetriever) -> bool:
        """Read the ``dense`` signal of candidates from ``retriever``'s corpus (same id and text)
        from its stored vectors instead of embedding them; only when its dense index was built with
        this embedder and can return float vectors (flat or HNSW, or a flat sharded index; not IVF, not built by
        ``onnx-int8``). True when it will. Scores then agree with embedding the candidates to the
        embedder's precision (stored float32 vectors against bfloat16 ones: ~5e-3 in a cosine).
        Any other object with ``search`` is left alone (False). An embedder that no longer embeds the
        index's probe text as at its build (a model replaced at the same path) is refused."""
        if not isinstance(retriever, HybridRetriever) or not retriever.docs:
            return False
        if retriever.stored_vectors([0]) is None:
            return False
        if resolve_embedder_path(retriever.embedder) != resolve_embedder_path(self.embedder_name):
            return False
        built = None if retriever.dense is None else retriever.dense.prompts
        if built != role_prompts(self.embedder) and (built is not None or uses_roles(self.embedder)):
            return False  # (documents embedded with other prompts, or bare before roles: not this signal's)
        # the model at that path must still be the one that wrote the vectors (else the cosines of
        # its query vectors with them mean nothing): checked as a dense search checks it
        recorded = getattr(retriever, "probe", None) or getattr(retriever.dense, "probe", None)
        check_probe(self.embedder, recorded, retriever.embedder, built)
        self.index = IndexVectors(retriever)
        return True

    def __call__(
        self,
        query: str,
        texts: Sequence[str],
        names: Sequence[str] = SIGNALS,
        *,
        ids: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """``{name: values in input order}`` for each of ``names``; ``ids``: the candidates'
        document ids, to find their vectors in the index given to :meth:`use_index`."""
        unknown = [n for n in names if n not in SIGNALS]
        if unknown:
            raise InputError(f"signal(s) {unknown} are not among {SIGNALS}")
        out: dict[str, np.ndarray] = {}
        if "bm25" in names:
            out["bm25"] = candidate_bm25(query, texts)
        if "dense" in names:
            out["dense"] = self._cosine(query, texts, ids)
        if "rank" in names:
            out["rank"] = rank_signal(len(texts))
        return out

    def _cosine(self, query: str, texts: Sequence[str], ids: Sequence[str] | None) -> np.ndarray:
        """The dense signal: vectors from the index, else kept from before, else embedded (and kept)."""
        stored: list[np.ndarray | None] = (
            [None] * len(texts) if self.index is None or ids is None else self.index.lookup(ids, texts)
        )
        keys = [text_key(t) for t in texts]
        with self._lock:
            for i, key in enumerate(keys):
                if stored[i] is None and (kept := self.vectors.get(key)) is not None:
                    self.vectors.move_to_end(key)
                    stored[i] = kept
        fresh = [i for i, v in enumerate(stored) if v is None]
        query_vec, docs = candidate_vectors(query, texts, self.embedder, stored)
        if self.cache_vectors:
            with self._lock:
                for i in fresh:
                    self.vectors[keys[i]] = docs[i].copy()
                while len(self.vectors) > self.cache_vectors:
                    self.vectors.popitem(last=False)
        return np.asarray(docs @ query_vec, dtype=np.float64)
