"""``AttnrankRetriever``: hybrid BM25 + dense retrieval from an attnrank index folder, reranked
with attnrank's reranker (:class:`attnrank.HybridRetriever` + :class:`attnrank.AttentionReranker`)."""

from __future__ import annotations

import asyncio
from typing import Any

from attnrank.errors import InputError, require

require("haystack", "haystack", "the attnrank Haystack retriever")  # before haystack: name the extra

from haystack import Document, component, default_from_dict, default_to_dict

from attnrank.integrations.documents import DEPTH, check_depth, renamed
from attnrank.integrations.haystack import check_top_k, from_index, legacy_scorer, reranker_settings
from attnrank.integrations.shared import model_lock, shared_index, shared_reranker, stored_settings


@component
class AttnrankRetriever:
    """Retrieve ``depth`` passages from the index at ``index_path`` and return the best
    ``top_k`` (reranked with ``rerank=True``, else first-stage order) as Documents with
    ``score`` and ``meta`` (``title``, ``relevance_score``, ``rank``, ``stage_scores``).

    ``top_k`` is Haystack's name for results returned; ``depth`` (default 20; None too) is
    attnrank's (``Pipeline``, the CLI) for first-stage candidates. ``first_stage_k``, its old name, is still
    read (a pipeline saved before the rename loads), with a DeprecationWarning.

    Reranker settings as in :class:`~haystack_integrations.components.rankers.attnrank.AttnrankRanker`.
    The index and the model load in :meth:`warm_up`.
    """

    def __init__(
        self,
        index_path: str,
        top_k: int = 10,
        depth: int | None = None,
        rerank: bool = True,
        model: str | None = None,
        heads: str | list | None = None,
        scorer: str | None = None,
        reranker_kwargs: dict[str, Any] | None = None,
        first_stage_k: int | None = None,
    ):
        # (depth None: not given, 20; an explicit depth=20 beside first_stage_k=10 let the old name win)
        given_depth, depth = depth is not None, DEPTH if depth is None else depth
        if first_stage_k is not None:
            depth = renamed(
                {"first_stage_k": first_stage_k},
                "first_stage_k",
                "depth",
                "AttnrankRetriever",
                depth,
                DEPTH,
                given=given_depth,
            )
        check_depth(top_k, depth, "top_k")
        given = [n for n, v in (("model", model), ("heads", heads), ("reranker_kwargs", reranker_kwargs)) if v]
        if not rerank and (given or scorer is not None):  # nothing would read them (as the other retrievers say)
            raise InputError(f"rerank=False but reranker settings were given ({given or ['scorer']}); drop them")
        # (NumPy integer counts, accepted, are kept as ints: Haystack serialises the component)
        self.index_path, self.top_k, self.depth, self.rerank = str(index_path), int(top_k), int(depth), rerank
        self.model, self.heads, self.scorer = model, heads, scorer
        self.reranker_kwargs = dict(reranker_kwargs or {})
        self._settings = reranker_settings(model, heads, scorer, self.reranker_kwargs)
        self._index: Any = None
        self._reranker: Any = None

    def warm_up(self) -> None:
        """Load the index and (with ``rerank``) the model, once per process for the same settings."""
        if self._index is None:
            self._index = shared_index(self.index_path)
        if self.rerank and self._reranker is None:
            self._reranker = shared_reranker(index=self._index, **self._settings)

    async def warm_up_async(self) -> None:
        """:meth:`warm_up` in a worker thread: an async pipeline warms its components up on its
        event loop, which loading the index and the model would stall for every other coroutine."""
        await asyncio.to_thread(self.warm_up)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            index_path=self.index_path,
            top_k=self.top_k,
            depth=self.depth,
            rerank=self.rerank,
            model=self.model,
            # (tuples as lists: pairs given as tuples were dumped as !!python/tuple, which safe YAML refuses)
            heads=stored_settings({"heads": self.heads})["heads"],
            scorer=self.scorer,
            reranker_kwargs=stored_settings(self.reranker_kwargs),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttnrankRetriever:
        return default_from_dict(cls, legacy_scorer(data))

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None) -> dict[str, list[Document]]:
        """The best ``top_k`` passages for ``query`` (``top_k`` overrides the init value)."""
        check_top_k(top_k)
        k = self.top_k if top_k is None else top_k
        # (with or without reranking, as the constructor checks them and the other frameworks'
        # retrievers do at every query: top_k or depth set to None, 0 or -2 after construction gave
        # a TypeError, nothing, or an error naming a k this component does not have)
        check_depth(k, self.depth, "top_k")
        self.warm_up()
        first = self._index.search(query, max(self.depth, k))
        if not self.rerank:  # (as set now: a reranker loaded before stays loaded, unread)
            return {"documents": from_index(first.top_k(k))}
        with model_lock(self._reranker):
            res = self._reranker.rank(query, first, k=k)
        return {"documents": from_index(res)}
