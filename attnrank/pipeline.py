"""Retrieve → rerank → prune → answer, with the typed result and the wall time of every stage.

:class:`Pipeline` chains a first-stage retriever (:class:`~attnrank.index.retriever.HybridRetriever`
or anything with ``search(query, k, query_id=)``), an optional reranker (``rank(query, docs, k)``,
e.g. :class:`~attnrank.rerank.attention.AttentionReranker`), an optional
:class:`~attnrank.prune.pruner.ContextPruner` and an optional :class:`~attnrank.generate.Generator`.
When stages use the same LLM object it is loaded once (:meth:`Pipeline.from_model` does that;
:func:`~attnrank.llm.models.load_llm` also caches per process). With ``reorder`` (a
:class:`~attnrank.rerank.position.SlotProfile`) the kept passages are placed for generation by
:func:`~attnrank.rerank.position.reorder_for_generation` (Attention Basin: the best passage at
the slot the model attends to most) instead of best-first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .config import DEFAULT_BUDGET_TOKENS
from .errors import InputError
from .generate import Answer, Generator, StreamCallback
from .types import Document, RankedResults

logger = logging.getLogger(__name__)


@dataclass
class PipelineResult:
    """Every stage's typed output for one question, and each stage's wall time in seconds
    (``timings`` keys: ``retrieve``, ``rerank``, ``prune``, ``generate`` for the stages that
    ran, and ``total``). ``context`` is what the generator read (or would read)."""

    question: str
    first_stage: RankedResults
    reranked: RankedResults | None
    pruned: Any | None  # attnrank.prune.PrunedContext
    answer: Answer | None
    context: list[Document]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def sources(self) -> list[str]:
        """Ids of the passages given to the generator, in the order it read them."""
        return [d.id for d in self.context]


class Pipeline:
    """Retrieve ``first_stage_k`` passages, rerank them and keep ``rerank_k`` (the first-stage
    top ``rerank_k`` without a reranker), prune them to a budget, answer from what is left."""

    def __init__(self, retriever: Any, reranker: Any | None = None, pruner: Any | None = None,
                 generator: Generator | None = None, *, first_stage_k: int = 20, rerank_k: int = 5,
                 budget_tokens: int | None = DEFAULT_BUDGET_TOKENS, neighbours: int = 0,
                 reorder: Any | None = None):
        for name, value in (("first_stage_k", first_stage_k), ("rerank_k", rerank_k)):
            if not isinstance(value, int) or value < 1:
                raise InputError(f"{name}={value!r} must be an integer >= 1")
        if rerank_k > first_stage_k:
            raise InputError(f"rerank_k={rerank_k} exceeds first_stage_k={first_stage_k}; the reranker "
                             "can only keep passages the first stage found: lower rerank_k or raise first_stage_k")
        self.retriever, self.reranker, self.pruner, self.generator = retriever, reranker, pruner, generator
        self.first_stage_k, self.rerank_k = first_stage_k, rerank_k
        self.budget_tokens, self.neighbours, self.reorder = budget_tokens, neighbours, reorder

    @classmethod
    def from_model(cls, retriever: Any, model: Any = None, *, heads: Any = None,
                   generator_model: Any = None, rerank: bool = True, prune: bool = True,
                   generate: bool = True, method: str = "query", max_new_tokens: int = 64,
                   reorder: bool = False, dtype: str = "auto", device: str = "cpu", **kw: Any) -> Pipeline:
        """A pipeline whose reranker, pruner and generator share one loaded LLM (``model``);
        ``generator_model`` gives the generator another model. ``reorder=True`` places the
        passages by the generator model's registered slot profile. ``kw`` go to the constructor."""
        from .llm.models import LLM, load_llm

        llm = model if isinstance(model, LLM) else None
        if llm is None and (rerank or prune or (generate and generator_model is None)):
            llm = load_llm(model, dtype=dtype, device=device)
        reranker = pruner = generator = None
        if rerank:
            from .rerank.attention import AttentionReranker

            reranker = AttentionReranker(llm, heads)
        if prune:
            from .prune.pruner import ContextPruner

            pruner = ContextPruner(llm, heads, method=method)
        if generate:
            gen_llm = llm if generator_model is None else generator_model
            generator = Generator(gen_llm, max_new_tokens, dtype=dtype, device=device)
        pipe = cls(retriever, reranker, pruner, generator, **kw)
        if reorder:
            from .rerank.position import load_profile

            target = generator.llm if generator is not None else llm
            pipe.reorder = load_profile("auto", target.model_id, target.fingerprint, n_slots=pipe.rerank_k)
        return pipe

    def run(self, question: str, *, budget_tokens: int | None = None, keep_ratio: float | None = None,
            stream: StreamCallback | None = None, query_id: str | None = None) -> PipelineResult:
        """Run every configured stage for ``question``. The pruning budget is ``budget_tokens``,
        else ``keep_ratio``, else the pipeline's ``budget_tokens``; ``stream`` receives the answer's
        text pieces as they are generated."""
        if not isinstance(question, str) or not question.strip():
            raise InputError(f"question {question!r} is empty; pass the question to answer")
        timings: dict[str, float] = {}
        start = time.perf_counter()
        first = self.retriever.search(question, self.first_stage_k, query_id=query_id)
        timings["retrieve"] = time.perf_counter() - start
        reranked = None
        top = first.top_k(self.rerank_k)
        if self.reranker is not None:
            t = time.perf_counter()
            reranked = self.reranker.rank(question, first, k=self.rerank_k)
            top = reranked
            timings["rerank"] = time.perf_counter() - t
        context = top.documents()
        pruned = None
        if self.pruner is not None and context:
            t = time.perf_counter()
            if budget_tokens is None and keep_ratio is None:
                budget_tokens = self.budget_tokens
            pruned = self.pruner.prune(question, context, budget_tokens=budget_tokens,
                                       keep_ratio=keep_ratio, neighbours=self.neighbours)
            context = pruned.documents()
            timings["prune"] = time.perf_counter() - t
        if self.reorder is not None:  # after pruning, which reads the passages best-first
            from .rerank.position import reorder_for_generation

            context = reorder_for_generation(context, self.reorder)
        answer = None
        if self.generator is not None:
            t = time.perf_counter()
            answer = self.generator.answer(question, context, stream)
            timings["generate"] = time.perf_counter() - t
        timings["total"] = time.perf_counter() - start
        logger.info("pipeline: %s", ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
        return PipelineResult(question, first, reranked, pruned, answer, context, timings)
