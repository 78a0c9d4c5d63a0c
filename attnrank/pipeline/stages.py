"""What :class:`~attnrank.pipeline.Pipeline` chains and returns: the protocols of its stages
(:class:`Retriever`, :class:`Reranker`, :class:`Pruner`), which any object with the method fits,
and :class:`PipelineResult`, every stage's typed output for one question with its wall time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..generate import Answer
from ..prune.context import PrunedContext
from ..types import Document, RankedResults


@dataclass
class PipelineResult:
    """Every stage's typed output for one question, and each stage's wall time in seconds
    (``timings`` keys: ``retrieve``, ``rerank``, ``prune``, ``generate`` for the stages that
    ran, and ``total``). ``context`` is what the generator read (or would read)."""

    question: str
    first_stage: RankedResults
    reranked: RankedResults | None
    pruned: PrunedContext | None
    answer: Answer | None
    context: list[Document]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def sources(self) -> list[str]:
        """Ids of the passages given to the generator, in the order it read them."""
        return [d.id for d in self.context]


class Retriever(Protocol):
    """First stage: anything with ``search(query, k, *, query_id=None) -> RankedResults``."""

    def search(self, query: str, k: int = ..., *, query_id: str | None = ...) -> RankedResults: ...


class Reranker(Protocol):
    """Second stage: ``rank(query, candidates, k) -> RankedResults`` (best first)."""

    def rank(self, query: str, docs: Any, k: int | None = ..., *, query_id: str | None = ...) -> RankedResults: ...


class Pruner(Protocol):
    """Third stage: keeps the useful sentences of the passages within a budget."""

    def prune(
        self,
        query: str,
        docs: Any,
        *,
        budget_tokens: int | None = ...,
        keep_ratio: float | None = ...,
        neighbours: int = ...,
    ) -> PrunedContext: ...
