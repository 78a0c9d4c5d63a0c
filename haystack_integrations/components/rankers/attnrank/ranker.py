"""``AttnrankRanker``: rerank Haystack documents with an LLM, via :class:`attnrank.AttentionReranker`:
by default (preset ``likelihood``) the candidates' BM25 and dense scores fused with the LLM's query
likelihood (UPR, Sachan et al. EMNLP 2022); with an attention preset by the attention the LLM pays
them (ICR, Chen et al. ICLR 2025; QRHead, Zhang et al. EMNLP 2025)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from attnrank.errors import require

require("haystack", "haystack", "the attnrank Haystack ranker")  # before haystack: name the extra

from haystack import Document, component, default_from_dict, default_to_dict

from attnrank.integrations.documents import framework_documents, rank_text_first, without_scores
from attnrank.integrations.haystack import (
    check_top_k,
    legacy_scorer,
    reranker_settings,
    to_attnrank,
    to_haystack,
)
from attnrank.integrations.shared import model_lock, shared_reranker, stored_settings


@component
class AttnrankRanker:
    """Rerank ``documents`` for ``query``; the best ``top_k`` come back, best first, with
    ``Document.score`` = the reranker's score (fused with the default preset, the calibrated
    attention score with an attention-only one; higher is better) and ``meta`` gaining
    ``relevance_score``, ``rank`` and ``stage_scores``.

    ``model``: an HF id, a local folder or .gguf, or None (the packaged SmolLM2-135M); ``heads``:
    None (the preset's: the default ``likelihood`` reads no attention; an attention preset its
    registered set, else all heads), "all", "auto", "l-h,l-h" or ``[[layer, head], ...]`` (given
    without a preset, they choose ``fused``, as ``AttentionReranker(heads=...)`` does); ``scorer``:
    None (the preset's), "sum" or "learned";
    ``reranker_kwargs``: further :class:`attnrank.AttentionReranker` keyword arguments (basic
    types; ``reweight`` as a dict of :class:`attnrank.rerank.reweight.Reweighting` fields). The
    model loads in :meth:`warm_up` (shared by components with the same settings).
    """

    def __init__(
        self,
        model: str | None = None,
        heads: str | list | None = None,
        scorer: str | None = None,
        top_k: int | None = 10,
        reranker_kwargs: dict[str, Any] | None = None,
    ):
        check_top_k(top_k)
        # (a NumPy integer count, accepted, is kept as an int: Haystack serialises the component)
        self.model, self.heads, self.scorer = model, heads, scorer
        self.top_k = None if top_k is None else int(top_k)
        self.reranker_kwargs = dict(reranker_kwargs or {})
        self._settings = reranker_settings(model, heads, scorer, self.reranker_kwargs)
        self._reranker: Any = None

    def warm_up(self) -> None:
        """Load the model (once per process for the same settings)."""
        if self._reranker is None:
            self._reranker = shared_reranker(**self._settings)

    async def warm_up_async(self) -> None:
        """:meth:`warm_up` in a worker thread: an async pipeline warms its components up on its
        event loop, which loading the model would stall for every other coroutine."""
        await asyncio.to_thread(self.warm_up)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self,
            model=self.model,
            # (tuples as lists: pairs given as tuples were dumped as !!python/tuple, which safe YAML refuses)
            heads=stored_settings({"heads": self.heads})["heads"],
            scorer=self.scorer,
            top_k=self.top_k,
            reranker_kwargs=stored_settings(self.reranker_kwargs),
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttnrankRanker:
        return default_from_dict(cls, legacy_scorer(data))

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        """Rerank ``documents``; ``top_k`` overrides the init value for this call."""
        check_top_k(top_k)
        k = self.top_k if top_k is None else top_k
        documents = framework_documents(documents, Document, "Haystack Document")  # (read once: any iterable)
        if not documents:
            return {"documents": []}
        self.warm_up()
        with model_lock(self._reranker):
            res, empty = rank_text_first(self._reranker, query, to_attnrank(documents), k, "top_k")
        # (no text: after the ranked ones, without an earlier stage's scores; Haystack keeps meta=None as None)
        unscored = [replace(documents[i], score=None, meta=without_scores(documents[i].meta or {})) for i in empty]
        return {"documents": to_haystack(res, documents) + unscored}
