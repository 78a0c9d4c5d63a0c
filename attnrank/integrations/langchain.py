"""LangChain (``langchain-core`` >= 1.0) adapters: a retriever over an attnrank index, a reranking
compressor and a pruning compressor. Extra: ``pip install 'attnrank[langchain]'``.

Only ``langchain_core`` is imported (``BaseRetriever``, ``BaseDocumentCompressor``,
``Document``); the compressors plug into ``langchain_classic``'s
``ContextualCompressionRetriever`` / ``DocumentCompressorPipeline`` (LangChain 1.x moved them
there), or a chain through ``RunnableLambda(compressor.compress_documents)``: a compressor is no
runnable itself (the retriever is). Reranked documents carry ``metadata["relevance_score"]`` (the
reranker's score: the fused score with the default preset, the calibrated attention score of
ICR, Chen et al. ICLR 2025, with an attention-only one; higher is better), ``metadata["rank"]``
(1-based) and ``metadata["stage_scores"]`` (every stage's score by name, ``attention`` among them
when attention ran).

Settings: pass a built :class:`~attnrank.rerank.attention.AttentionReranker` /
:class:`~attnrank.prune.pruner.ContextPruner` (``reranker=`` / ``pruner=``) or its constructor's
keyword arguments (``model=``, ``heads=``, ``scorer=``, ...); adapters built with the same
arguments share one object and one loaded model (:mod:`attnrank.integrations.shared`).

Counts, in LangChain's own names where it has them:

- ``AttnrankRetriever(k=4, depth=20)``: ``k`` results returned (LangChain retrievers' ``k``;
  also per call, ``invoke(query, k=8)``, with ``depth``), out of ``depth`` first-stage candidates (attnrank's ``depth``, as in ``Pipeline`` and the
  CLI; the old name ``first_stage_k`` still works, with a DeprecationWarning);
- ``AttnrankReranker(top_n=3)``: documents kept (``top_n``, as LangChain's reranking
  compressors, e.g. ``CrossEncoderReranker``, name it); attnrank's ``top_k``.

Every adapter here pickles (a chain sent to a worker process): the copy loads its index and builds its
reranker or pruner again from the folder and the settings it was made from. One made around an
object the caller built is refused, in one line, when pickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import DEFAULT_BUDGET_TOKENS
from ..errors import InputError, require

require("langchain_core", "langchain", "attnrank.integrations.langchain")

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    Callbacks,
)
from langchain_core.documents import BaseDocumentCompressor
from langchain_core.documents import Document as LCDocument
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict, Field, PrivateAttr

from ..prune.context import check_budget, check_neighbours
from ..types import Document, ScoredDocument, has_text
from .documents import (
    DEPTH,
    check_depth,
    check_top_n,
    framework_documents,
    keep_stages,
    meta_title,
    rank_text_first,
    renamed,
    score_fields,
    without_scores,
)
from .shared import (
    PICKLED_STAGES,
    check_count_name,
    check_reranker_settings,
    model_lock,
    retriever_sources,
    retriever_stages,
    shared_index,
    shared_pruner,
    shared_reranker,
)

__all__ = ["AttnrankPruner", "AttnrankReranker", "AttnrankRetriever", "to_attnrank", "to_langchain"]


def _source_id(doc: LCDocument, position: int) -> str:
    return str(doc.id or doc.metadata.get("id") or position)


def to_attnrank(docs: Sequence[LCDocument]) -> list[Document] | list[ScoredDocument]:
    """LangChain documents -> attnrank documents, keyed by their input position (``"0"``, ``"1"``,
    ...; :func:`to_langchain` given the source gives a result back its ``id`` and metadata).
    ``metadata["title"]`` becomes the title; documents
    from :class:`AttnrankRetriever` keep their earlier stages' scores (:func:`keep_stages`)."""
    docs = framework_documents(docs, LCDocument, "LangChain Document")
    plain = [Document(str(i), d.page_content, meta_title(d.metadata), dict(d.metadata)) for i, d in enumerate(docs)]
    return keep_stages(plain, [d.metadata for d in docs])


def to_langchain(d: ScoredDocument, source: LCDocument | None = None) -> LCDocument:
    """A ranked attnrank document as a LangChain document (the source's id and metadata kept)."""
    if source is None:
        meta = {"id": d.id, **d.metadata, "title": d.title}  # (a corpus's own "id" field stays)
        return LCDocument(page_content=d.text, id=d.id, metadata={**meta, **score_fields(d)})
    return LCDocument(page_content=source.page_content, id=source.id, metadata={**source.metadata, **score_fields(d)})


def _split_settings(cls: type, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pydantic fields, the rest: the reranker's/pruner's constructor arguments)."""
    fields = {k: v for k, v in kwargs.items() if k in cls.model_fields}  # type: ignore[attr-defined]
    return fields, {k: v for k, v in kwargs.items() if k not in fields}


def _without_stage(adapter: Any, state: dict[Any, Any], kind: str) -> dict[Any, Any]:
    """A compressor's pickled ``state`` without its ``kind`` object ("reranker" or "pruner"), which
    holds locks and a model: the copy rebuilds it from the settings it was built from (shared, as
    any adapter of those settings). One built around a given object is refused. Why: pickling
    failed on a lock inside ("cannot pickle '_thread.lock' object"), so a chain holding one could
    not be sent to a worker process."""
    private = dict(state.get("__pydantic_private__") or {})
    if private.get("_settings") is None:
        raise InputError(
            f"{type(adapter).__name__} built around a given {kind} object cannot be pickled (the {kind} and its model "
            f"hold locks); build it from the {kind}'s settings (model=..., ...), which a copy rebuilds"
        )
    private[f"_{kind}"] = None
    return {**state, "__pydantic_private__": private}


class AttnrankReranker(BaseDocumentCompressor):
    """Rerank documents with attnrank's reranker (the default preset: BM25, dense and the LLM's query
    likelihood, fused) and keep the best ``top_n`` (None: all), best first.

    ``AttnrankReranker(top_n=3, model="smollm2-135m", heads="auto")`` or
    ``AttnrankReranker(reranker=my_attention_reranker, top_n=3)``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    top_n: int | None = 3
    _reranker: Any = PrivateAttr()
    _settings: dict[str, Any] | None = PrivateAttr(default=None)  # (None: built around a given object)

    def __init__(self, *, reranker: Any = None, **kwargs: Any):
        fields, settings = _split_settings(type(self), kwargs)
        check_count_name(settings, "AttnrankReranker", "top_n")
        check_top_n(fields.get("top_n", 3))
        super().__init__(**fields)
        self._reranker = shared_reranker(reranker, **settings)
        self._settings = None if reranker is not None else settings

    def __getstate__(self) -> dict[Any, Any]:
        return _without_stage(self, super().__getstate__(), "reranker")

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._reranker = shared_reranker(**(self._settings or {}))

    @property
    def reranker(self) -> Any:
        return self._reranker

    def compress_documents(
        self, documents: Sequence[LCDocument], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[LCDocument]:
        documents = framework_documents(documents, LCDocument, "LangChain Document")  # (read once: any iterable)
        if not documents:
            return []
        with model_lock(self._reranker):
            res, empty = rank_text_first(self._reranker, query, to_attnrank(documents), self.top_n)
        unscored = [documents[i].model_copy(update={"metadata": without_scores(documents[i].metadata)}) for i in empty]
        return [to_langchain(r, documents[int(r.id)]) for r in res] + unscored


class AttnrankPruner(BaseDocumentCompressor):
    """Keep the sentences the LLM's attention marks as relevant (:class:`ContextPruner`).

    Returns new documents holding only the kept sentences (reading order, the source's id and
    metadata kept, plus ``kept_sentences``, ``pruned`` and ``sentence_scores``, the kept
    sentences' attention scores); a document with no kept sentence is left out, except one of a
    title and no text (nothing to prune), which comes back with its title, no kept sentence and
    ``pruned`` True. Budget:
    ``budget_tokens`` (sentence tokens kept over all documents, hard cap) or ``keep_ratio``
    (fraction of them). A budget covering the whole context keeps everything without running the
    model, so ``sentence_scores`` is left out then.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    budget_tokens: int | None = DEFAULT_BUDGET_TOKENS
    keep_ratio: float | None = None
    neighbours: int = 0
    _pruner: Any = PrivateAttr()
    _settings: dict[str, Any] | None = PrivateAttr(default=None)  # (None: built around a given object)

    def __init__(self, *, pruner: Any = None, **kwargs: Any):
        fields, settings = _split_settings(type(self), kwargs)
        if fields.get("keep_ratio") is not None and "budget_tokens" not in fields:
            fields["budget_tokens"] = None  # a ratio alone replaces the default token budget
        # the values as given (else refused only at the first query): pydantic would coerce
        # budget_tokens=True to 1, "300" to 300, keep_ratio=True to 1.0, as the other adapters refuse
        defaults = type(self).model_fields
        check_budget(fields.get("budget_tokens", defaults["budget_tokens"].default), fields.get("keep_ratio"))
        check_neighbours(fields.get("neighbours", defaults["neighbours"].default))
        super().__init__(**fields)
        self._pruner = shared_pruner(pruner, **settings)
        self._settings = None if pruner is not None else settings

    def __getstate__(self) -> dict[Any, Any]:
        return _without_stage(self, super().__getstate__(), "pruner")

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._pruner = shared_pruner(**(self._settings or {}))

    @property
    def pruner(self) -> Any:
        return self._pruner

    def compress_documents(
        self, documents: Sequence[LCDocument], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[LCDocument]:
        if not documents:
            return []
        # (metadata: the pruner reads a corpus's pre-split "sentences" from it, as attnrank ask does)
        documents = framework_documents(documents, LCDocument, "LangChain Document")
        docs = [
            Document(str(i), d.page_content, meta_title(d.metadata), metadata=dict(d.metadata))
            for i, d in enumerate(documents)
        ]
        if not any(map(has_text, docs)):  # (nothing to prune or return, as an empty one beside others; not an error)
            return []
        with model_lock(self._pruner):
            pruned = self._pruner.prune(
                query, docs, budget_tokens=self.budget_tokens, keep_ratio=self.keep_ratio, neighbours=self.neighbours
            )
        pruned.check_kept()  # (no sentence fits: an empty context, answered from as if pruned, raised as the CLI does)
        out = []
        for d in pruned.documents():
            i = int(d.id)
            src = documents[i]
            # (source_id: where the source has none of its own; a user's, e.g. "chunk-7 of report.pdf", stays)
            meta = {
                "source_id": _source_id(src, i),
                **src.metadata,
                "pruned": True,
                "kept_sentences": d.metadata["kept_sentences"],
            }
            if (
                "sentences" in d.metadata
            ):  # the split kept_sentences numbers (the pruner's own, where the corpus's was unusable)
                meta["sentences"] = d.metadata["sentences"]
            if not pruned.kept_all:  # kept_all: the model did not run, every score is NaN
                meta["sentence_scores"] = [s.score for s in pruned.kept if s.doc_index == i]
            out.append(LCDocument(page_content=d.text, id=src.id, metadata=meta))
        return out


# keywords of BaseRetriever.invoke that LangChain reads itself and passes on to the retriever too
_LANGCHAIN_KEYWORDS = ("verbose",)


class AttnrankRetriever(BaseRetriever):
    """Retrieve from an attnrank index (hybrid BM25 + dense), then rerank with attnrank's reranker.

    ``index``: an index folder (as written by ``attnrank index``) or a
    :class:`~attnrank.index.retriever.HybridRetriever`. The first stage returns
    ``depth`` passages; with ``rerank=True`` the reranker keeps the best ``k``
    (else the first-stage top ``k``). Other keyword arguments configure the reranker.
    ``.index`` and ``.reranker`` hold the loaded objects.

    ``rerank`` is read at each query, so it may be set later or made configurable
    (``configurable_fields(rerank=ConfigurableField(id="rerank"))``): a ``rerank=False`` query
    returns the first-stage top ``k`` and leaves a given reranker unused. ``.reranker`` is None
    when made with ``rerank=False`` and no reranker object, until a query reranks (then the
    default one is built). Reranker settings with ``rerank=False`` are refused: nothing would
    read them.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    k: int = 4
    depth: int = DEPTH
    rerank: bool = True
    # The loaded index and reranker are fields (not private attributes) because LangChain
    # rebuilds a runnable from its fields alone (``configurable_fields``, ``with_config``).
    index: Any = Field(default=None, exclude=True, repr=False)
    reranker: Any = Field(default=None, exclude=True, repr=False)

    def __init__(self, *, index: Any, reranker: Any = None, **kwargs: Any):
        kwargs["depth"] = renamed(
            kwargs,
            "first_stage_k",
            "depth",
            "AttnrankRetriever",
            kwargs.get("depth", DEPTH),
            DEPTH,
            given="depth" in kwargs,
        )
        fields, settings = _split_settings(type(self), kwargs)
        check_count_name(settings, "AttnrankRetriever", "k")
        check_depth(fields.get("k", 4), fields.get("depth", DEPTH), "k")
        super().__init__(**fields)
        if not self.rerank and settings:
            # nothing would read them: a misspelt count (top_n=) would silently be ignored
            raise InputError(f"rerank=False but reranker settings were given ({sorted(settings)})")
        if self.rerank or reranker is not None:
            check_reranker_settings(reranker, **settings)  # (before the index loads)
        self.index = shared_index(index)
        # a reranker object given with rerank=False is kept: LangChain rebuilds a configured
        # retriever with it (configurable_fields), and rerank may be switched on later
        if self.rerank or reranker is not None:
            self.reranker = shared_reranker(reranker, index=self.index, **settings)

    def __getstate__(self) -> dict[Any, Any]:
        """The fields but the loaded index and reranker, which a copy loads again (:func:`retriever_sources`)."""
        state = super().__getstate__()
        stages = retriever_sources(type(self).__name__, self.index, self.reranker)
        return {**state, "__dict__": {**state["__dict__"], "index": None, "reranker": None}, PICKLED_STAGES: stages}

    def __setstate__(self, state: dict[Any, Any]) -> None:
        state = dict(state)
        stages = state.pop(PICKLED_STAGES)
        super().__setstate__(state)
        self.index, self.reranker = retriever_stages(stages)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **counts: Any
    ) -> list[LCDocument]:
        """``counts``: ``k`` and ``depth`` for this call (``retriever.invoke(query, k=8)``, as
        LangChain's vector-store retrievers take ``k``); the fields' otherwise."""
        unknown = sorted(set(counts) - {"k", "depth", *_LANGCHAIN_KEYWORDS})
        if unknown:  # (LangChain passes every keyword of invoke: a misspelt one would be ignored)
            raise InputError(f"AttnrankRetriever takes k and depth per call, not {unknown}")
        k, depth = counts.get("k", self.k), counts.get("depth", self.depth)
        check_depth(k, depth, "k")  # (again: fields may be set after construction)
        first = self.index.search(query, depth)
        if not self.rerank:  # read here: it may be set, or configured, after construction
            return [to_langchain(r) for r in first.top_k(k)]
        if self.reranker is None:  # made with rerank=False, switched on since: the default reranker
            self.reranker = shared_reranker(index=self.index)
        with model_lock(self.reranker):
            res = self.reranker.rank(query, first, k=k)
        return [to_langchain(r) for r in res]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **counts: Any
    ) -> list[LCDocument]:
        """:meth:`_get_relevant_documents` off the event loop (LangChain's default passes no ``counts``)."""
        return await run_in_executor(
            None, self._get_relevant_documents, query, run_manager=run_manager.get_sync(), **counts
        )
