"""LlamaIndex (``llama-index-core`` 0.13/0.14) adapters: a retriever over an attnrank index, a
reranking node postprocessor and a pruning node postprocessor. Extra:
``pip install 'attnrank[llamaindex]'``.

- :class:`AttnrankRetriever`: ``BaseRetriever._retrieve(query_bundle)``: hybrid first stage,
  then attnrank's reranker (the default preset fuses BM25, dense and the LLM's query likelihood;
  the attention presets follow ICR, Chen et al. ICLR 2025); ``NodeWithScore.score`` is the
  reranker's score.
- :class:`AttnrankRerank`: like LlamaIndex's ``SentenceTransformerRerank`` (``top_n``,
  ``keep_retrieval_score``): the new score goes to ``node.score``, the old one optionally to
  ``metadata["retrieval_score"]``; ``metadata["relevance_score"]``, ``["rank"]`` and
  ``["stage_scores"]`` are set too (kept out of the LLM/embedding text).
- :class:`AttnrankPruner`: the analogue of ``SentenceEmbeddingOptimizer`` / LongLLMLingua's
  postprocessor: each node's text is replaced by its kept sentences
  (:class:`~attnrank.prune.pruner.ContextPruner`; new nodes, same ids and metadata); nodes with
  no kept sentence are dropped, except a node of a title and no text (nothing to prune), which
  comes back with its title, no kept sentence and ``pruned`` True.

The reranker/pruner (and so the model) sits in a private attribute; adapters built with the
same settings share it (:mod:`attnrank.integrations.shared`).

Counts, in LlamaIndex's own names where it has them:

- ``AttnrankRetriever(similarity_top_k=4, depth=20)``: ``similarity_top_k`` nodes returned (as
  LlamaIndex retrievers name it), out of ``depth`` first-stage candidates (attnrank's ``depth``,
  as in ``Pipeline`` and the CLI). The old names ``k`` and ``first_stage_k`` still work, with a
  DeprecationWarning;
- ``AttnrankRerank(top_n=2)``: nodes kept (``top_n``, as LlamaIndex's postprocessors name it);
  attnrank's ``top_k``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..config import DEFAULT_BUDGET_TOKENS
from ..errors import InputError, require

require("llama_index.core", "llamaindex", "attnrank.integrations.llamaindex")

from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_serializer
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from ..llm.models import LLM
from ..prune.context import check_budget, check_neighbours, is_split
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
    built_settings,
    check_count_name,
    check_reranker_settings,
    model_lock,
    retriever_sources,
    retriever_stages,
    shared_index,
    shared_pruner,
    shared_reranker,
    stored_settings,
)

__all__ = ["AttnrankPruner", "AttnrankRerank", "AttnrankRetriever"]

SIMILARITY_TOP_K = 4  # nodes AttnrankRetriever returns by default
_SCORE_KEYS = ["relevance_score", "rank", "stage_scores", "retrieval_score"]
# A corpus's pre-split "sentences" (every sentence of the passage, pruned ones too): kept in the
# metadata for the pruner, never in the text the LLM and the embedder read (a pruned node carried
# every sentence there, a retrieved one its passage twice)
_SENTENCE_KEYS = ["sentences"]
_PRUNE_KEYS = ["pruned", "kept_sentences"]


def _text(n: NodeWithScore) -> str:
    return n.node.get_content(metadata_mode=MetadataMode.NONE)


def _documents(nodes: list[NodeWithScore]) -> list[Document] | list[ScoredDocument]:
    """Nodes -> attnrank documents keyed by input position; ``metadata["title"]`` is the title;
    nodes from :class:`AttnrankRetriever` keep their earlier stages' scores; the metadata goes
    along (the pruner reads a corpus's pre-split ``"sentences"`` from it, as ``attnrank ask`` does)."""
    nodes = framework_documents(nodes, NodeWithScore, "LlamaIndex NodeWithScore")
    docs = [
        Document(str(i), _text(n), meta_title(n.node.metadata), metadata=dict(n.node.metadata))
        for i, n in enumerate(nodes)
    ]
    return keep_stages(docs, [n.node.metadata for n in nodes])


def _hide(node: Any, keys: list[str]) -> None:
    """Keep metadata ``keys`` out of the text the LLM and the embedder read."""
    for key in keys:
        for excluded in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
            if key not in excluded:
                excluded.append(key)


def _hide_scores(node: Any) -> None:
    """Keep attnrank's score fields and a pre-split ``"sentences"`` list out of the text the LLM
    and the embedder read (a loader's own ``"sentences"`` of another kind, a count, stays in it)."""
    _hide(node, _SCORE_KEYS + _split_keys(node))


def _split_keys(node: Any) -> list[str]:
    """The sentence keys of ``node``'s metadata that hold a split (:func:`~attnrank.prune.context.is_split`)."""
    return [k for k in _SENTENCE_KEYS if is_split(node.metadata.get(k))]


def _check_picklable(adapter: Any, kind: str) -> None:
    """Refuse to pickle an adapter built around a given reranker or pruner object: LlamaIndex
    drops the object (its model is not picklable) and the copy came back without it, failing at
    its first query; one built from settings is rebuilt from them."""
    if getattr(adapter, f"custom_{kind}", False):
        raise InputError(
            f"{type(adapter).__name__} built around a given {kind} object cannot be pickled (the {kind} and its model "
            f"are not); build it from the {kind}'s settings (model=..., heads=..., ...), which a copy rebuilds"
        )


def _query(query_bundle: QueryBundle | str | None) -> str:
    """The query of a postprocessor call; a string given where the bundle goes (``postprocess_nodes(nodes,
    "question")``, as the README's examples read) is the query itself (it raised an AttributeError)."""
    if isinstance(query_bundle, str):
        return query_bundle
    if query_bundle is None:
        raise InputError(
            "no query given to the attnrank postprocessor; call postprocess_nodes(nodes, "
            "query_str=...) or use it in a query engine"
        )
    return query_bundle.query_str


def _callbacks(callback_manager: Any) -> dict[str, Any]:
    """The ``callback_manager`` field every LlamaIndex postprocessor takes, where one is given
    (else the base class's default, a fresh CallbackManager)."""
    return {} if callback_manager is None else {"callback_manager": callback_manager}


def _stage_fields(
    owner: str, kind: str, *, given: Any, saved: dict[str, Any] | None, custom: bool, settings: dict[str, Any]
) -> dict[str, Any]:
    """The fields by which ``to_dict``/``from_dict`` rebuild the ``kind`` ("reranker" or "pruner")
    of postprocessor ``owner``: ``{kind}_settings`` (the ``saved`` settings updated by
    ``settings``) and ``custom_{kind}`` (built around the object ``given``). ``custom`` without
    ``given`` (from_dict of a postprocessor saved with its own object, which to_dict cannot hold),
    or saved settings whose model was an :class:`~attnrank.llm.models.LLM` (:func:`_saved_settings`)
    without a model given now, is an :class:`InputError`."""
    if custom and given is None:
        raise InputError(
            f"this {owner} was saved with its own {kind} object, which to_dict cannot hold; "
            f"rebuild it with {owner}.from_dict(data, {kind}=...)"
        )
    merged = {**(saved or {}), **stored_settings(settings)}
    held = [k for k, v in merged.items() if isinstance(v, dict) and _LLM_OBJECT in v]
    if held:
        raise InputError(
            f"this {owner} was saved with a loaded model as {held[0]}= ({merged[held[0]][_LLM_OBJECT]!r}), which "
            f"to_dict cannot hold; rebuild it with {owner}.from_dict(data, {held[0]}=...)"
        )
    return {f"{kind}_settings": merged, f"custom_{kind}": given is not None}


_LLM_OBJECT = "__attnrank_llm__"  # (to_dict's stand-in for a loaded model: its id)


def _saved_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """A stage's settings as ``to_dict`` writes them: a loaded model (``model=llm``) as a stand-in
    naming it, which ``from_dict`` refuses unless given the model again. Why: pydantic wrote the
    LLM's fields as a dict, which ``from_dict`` refused as "model is a dict", and ``to_json``
    failed inside the JSON encoder on its weights."""
    return {k: {_LLM_OBJECT: v.model_id} if isinstance(v, LLM) else v for k, v in settings.items()}


def _to_node(d: ScoredDocument) -> NodeWithScore:
    node = TextNode(id_=d.id, text=d.text, metadata={**d.metadata, "title": d.title, **score_fields(d)})
    _hide_scores(node)
    return NodeWithScore(node=node, score=d.score)


class AttnrankRerank(BaseNodePostprocessor):
    """Rerank nodes with attnrank's reranker and keep the best ``top_n`` (None: all).

    ``AttnrankRerank(top_n=3, model="smollm2-135m", heads="auto")`` or
    ``AttnrankRerank(reranker=my_attention_reranker, top_n=3)``.
    """

    top_n: int | None = Field(default=2, description="Nodes kept, best first (None: all).")
    keep_retrieval_score: bool = Field(default=False, description="Keep the old score in metadata['retrieval_score'].")
    reranker_settings: dict[str, Any] = Field(
        default_factory=dict, description="The reranker's keyword arguments, so to_dict/from_dict rebuild it."
    )
    custom_reranker: bool = Field(default=False, description="Built around a given reranker object.")
    _reranker: Any = PrivateAttr()

    @field_serializer("reranker_settings")
    def _dump_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        return _saved_settings(settings)

    def __init__(
        self,
        *,
        reranker: Any = None,
        top_n: int | None = 2,
        keep_retrieval_score: bool = False,
        reranker_settings: dict[str, Any] | None = None,
        custom_reranker: bool = False,
        callback_manager: Any = None,
        **settings: Any,
    ):
        check_count_name(settings, "AttnrankRerank", "top_n")
        check_top_n(top_n)
        stage = _stage_fields(
            "AttnrankRerank",
            "reranker",
            given=reranker,
            saved=reranker_settings,
            custom=custom_reranker,
            settings=settings,
        )
        super().__init__(  # type: ignore[call-arg]  # pydantic fields
            top_n=top_n, keep_retrieval_score=keep_retrieval_score, **_callbacks(callback_manager), **stage
        )
        self._reranker = shared_reranker(reranker, **built_settings(self.reranker_settings))

    @classmethod
    def class_name(cls) -> str:
        return "AttnrankRerank"

    def __getstate__(self) -> dict[str, Any]:
        _check_picklable(self, "reranker")
        return super().__getstate__()

    @property
    def reranker(self) -> Any:
        return self._reranker

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        nodes = framework_documents(nodes, NodeWithScore, "LlamaIndex NodeWithScore")  # (read once: any iterable)
        if not nodes:
            return []
        payload = {
            EventPayload.NODES: nodes,
            EventPayload.MODEL_NAME: repr(self._reranker),
            EventPayload.QUERY_STR: query,
            EventPayload.TOP_K: self.top_n,
        }
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:  # type: ignore[arg-type]
            with model_lock(self._reranker):
                res, empty = rank_text_first(self._reranker, query, _documents(nodes), self.top_n)
            out = []
            for r in res:
                src = nodes[int(r.id)]
                node = src.node.model_copy(deep=True)
                if self.keep_retrieval_score:
                    node.metadata["retrieval_score"] = src.score
                node.metadata.update(score_fields(r))
                _hide_scores(node)
                out.append(NodeWithScore(node=node, score=r.score))
            for i in empty:  # unscored, without an earlier stage's scores
                node = nodes[i].node.model_copy(deep=True)
                node.metadata = without_scores(node.metadata)
                out.append(NodeWithScore(node=node, score=None))
            event.on_end(payload={EventPayload.NODES: out})
        return out


_DEFAULT_BUDGET: Any = object()  # budget_tokens not given (None given is no budget, refused as LangChain's)


class AttnrankPruner(BaseNodePostprocessor):
    """Replace each node's text by the sentences the LLM's attention marks as relevant.

    Budget over all nodes: ``budget_tokens`` (sentence tokens, hard cap) or ``keep_ratio``.
    Metadata gains ``kept_sentences`` and ``pruned``; scores are left as they were. These and a
    corpus's pre-split ``sentences`` (the removed ones among them) stay in the metadata, out of
    the text the LLM and the embedder read.
    """

    budget_tokens: int | None = Field(default=DEFAULT_BUDGET_TOKENS, description="Sentence tokens kept over all nodes.")
    keep_ratio: float | None = Field(default=None, description="Or the fraction of sentence tokens kept.")
    neighbours: int = Field(default=0, description="Sentences kept on each side of a chosen one.")
    pruner_settings: dict[str, Any] = Field(
        default_factory=dict, description="The pruner's keyword arguments, so to_dict/from_dict rebuild it."
    )
    custom_pruner: bool = Field(default=False, description="Built around a given pruner object.")
    _pruner: Any = PrivateAttr()

    @field_serializer("pruner_settings")
    def _dump_settings(self, settings: dict[str, Any]) -> dict[str, Any]:
        return _saved_settings(settings)

    def __init__(
        self,
        *,
        pruner: Any = None,
        budget_tokens: Any = _DEFAULT_BUDGET,
        keep_ratio: float | None = None,
        neighbours: int = 0,
        pruner_settings: dict[str, Any] | None = None,
        custom_pruner: bool = False,
        callback_manager: Any = None,
        **settings: Any,
    ):
        if budget_tokens is _DEFAULT_BUDGET:  # the default budget; a ratio alone replaces it (None given: refused)
            budget_tokens = DEFAULT_BUDGET_TOKENS if keep_ratio is None else None
        stage = _stage_fields(
            "AttnrankPruner", "pruner", given=pruner, saved=pruner_settings, custom=custom_pruner, settings=settings
        )
        check_budget(budget_tokens, keep_ratio)  # (else refused only at the first query)
        check_neighbours(neighbours)
        super().__init__(  # type: ignore[call-arg]  # pydantic fields
            budget_tokens=budget_tokens,
            keep_ratio=keep_ratio,
            neighbours=neighbours,
            **_callbacks(callback_manager),
            **stage,
        )
        self._pruner = shared_pruner(pruner, **built_settings(self.pruner_settings))

    @property
    def pruner(self) -> Any:
        """The :class:`~attnrank.prune.pruner.ContextPruner` (or given object) this postprocessor prunes with."""
        return self._pruner

    @classmethod
    def class_name(cls) -> str:
        return "AttnrankPruner"

    def __getstate__(self) -> dict[str, Any]:
        _check_picklable(self, "pruner")
        return super().__getstate__()

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = _query(query_bundle)
        nodes = framework_documents(nodes, NodeWithScore, "LlamaIndex NodeWithScore")  # (read once: any iterable)
        docs = _documents(nodes)
        if not any(map(has_text, docs)):  # (nothing to prune or return, as an empty one beside others; not an error)
            return []
        with model_lock(self._pruner):
            pruned = self._pruner.prune(
                query,
                docs,
                budget_tokens=self.budget_tokens,
                keep_ratio=self.keep_ratio,
                neighbours=self.neighbours,
            )
        pruned.check_kept()  # (no sentence fits: an empty context, answered from as if pruned, raised as the CLI does)
        out = []
        for d in pruned.documents():
            src = nodes[int(d.id)]
            node = src.node.model_copy(deep=True)
            node.set_content(d.text)
            node.metadata.update(pruned=True, kept_sentences=d.metadata["kept_sentences"])
            if (
                "sentences" in d.metadata
            ):  # the split kept_sentences numbers (the pruner's own, where the node's was unusable)
                node.metadata["sentences"] = d.metadata["sentences"]
            _hide(node, _PRUNE_KEYS + _split_keys(node))
            out.append(NodeWithScore(node=node, score=src.score))
        return out


class AttnrankRetriever(BaseRetriever):
    """Retrieve ``depth`` (default 20) passages from an attnrank index, rerank them with attnrank's
    reranker and return the best ``similarity_top_k`` (default 4) as nodes (``rerank=False``: the
    first-stage top ``similarity_top_k``). None for either is its default.

    ``index``: an index folder or a :class:`~attnrank.index.retriever.HybridRetriever`; other
    keyword arguments configure the reranker (or pass ``reranker=``).
    """

    def __init__(
        self,
        index: Any,
        *,
        similarity_top_k: int | None = None,
        depth: int | None = None,
        rerank: bool = True,
        reranker: Any = None,
        callback_manager: Any = None,
        **settings: Any,
    ):
        # (None: not given, so the default; a default given explicitly beside the old name let the old name win)
        given_top, given_depth = similarity_top_k is not None, depth is not None
        similarity_top_k = SIMILARITY_TOP_K if similarity_top_k is None else similarity_top_k
        depth = DEPTH if depth is None else depth
        similarity_top_k = renamed(
            settings, "k", "similarity_top_k", "AttnrankRetriever", similarity_top_k, SIMILARITY_TOP_K, given=given_top
        )
        depth = renamed(settings, "first_stage_k", "depth", "AttnrankRetriever", depth, DEPTH, given=given_depth)
        check_count_name(settings, "AttnrankRetriever", "similarity_top_k")
        check_depth(similarity_top_k, depth, "similarity_top_k")
        if not rerank and (reranker is not None or settings):
            # nothing would read them: a misspelt count (top_k=) would silently be ignored
            raise InputError(f"rerank=False but reranker settings were given ({sorted(settings) or 'reranker'})")
        super().__init__(callback_manager=callback_manager)
        self.similarity_top_k, self.depth = similarity_top_k, depth
        if rerank:
            check_reranker_settings(reranker, **settings)  # (before the index loads)
        self._index = shared_index(index)
        self._reranker = shared_reranker(reranker, index=self._index, **settings) if rerank else None

    def __copy__(self) -> AttnrankRetriever:
        """A shallow copy sharing the loaded index and reranker (as before pickling was taught:
        ``copy.copy`` reads :meth:`__getstate__`, which refuses an index object the caller built)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __getstate__(self) -> dict[str, Any]:
        """Its attributes but the loaded index and reranker, which a copy loads again
        (:func:`~attnrank.integrations.shared.retriever_sources`)."""
        stages = retriever_sources(type(self).__name__, self._index, self._reranker)
        return {**self.__dict__, "_index": None, "_reranker": None, PICKLED_STAGES: stages}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        stages = state.pop(PICKLED_STAGES)
        self.__dict__.update(state)
        self._index, self._reranker = retriever_stages(stages)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        query = query_bundle.query_str
        check_depth(self.similarity_top_k, self.depth, "similarity_top_k")  # both may be set after construction
        first = self._index.search(query, self.depth)
        if self._reranker is None:
            return [_to_node(r) for r in first.top_k(self.similarity_top_k)]
        with model_lock(self._reranker):
            res = self._reranker.rank(query, first, k=self.similarity_top_k)
        return [_to_node(r) for r in res]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        # the base class runs _retrieve on the event loop: seconds of search and reranking
        return await asyncio.to_thread(self._retrieve, query_bundle)
