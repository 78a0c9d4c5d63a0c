"""Retrieve → rerank → prune → answer, with the typed result and the wall time of every stage.

:class:`Pipeline` chains a first-stage :class:`Retriever` (e.g.
:class:`~attnrank.index.retriever.HybridRetriever`), an optional :class:`Reranker` (e.g.
:class:`~attnrank.rerank.attention.AttentionReranker`), an optional :class:`Pruner` (e.g.
:class:`~attnrank.prune.pruner.ContextPruner`) and an optional :class:`~attnrank.generate.Generator`;
each stage has its own configuration (:class:`RerankConfig`, :class:`PruneConfig`).
When stages use the same LLM object it is loaded once (:meth:`Pipeline.from_model` does that;
:func:`~attnrank.llm.models.load_llm` also caches per process). With ``reorder`` (a
:class:`~attnrank.rerank.position.SlotProfile`) the kept passages are placed for generation by
:func:`~attnrank.rerank.position.reorder_for_generation` (Attention Basin: the best passage at
the slot the model attends to most) instead of best-first.

- :mod:`attnrank.pipeline.stages`: the stages' protocols and :class:`PipelineResult` (both
  importable from here).
- :mod:`attnrank.pipeline.checks`: the checks of the pipeline's counts and shared model, made
  before any model loads.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..config import DEFAULT_BUDGET_TOKENS
from ..errors import InputError
from ..generate import Generator, StreamCallback, check_answer_room, check_max_new_tokens
from ..index.retriever import HybridRetriever
from ..llm.models import LLM, check_model_arg, check_prompt_budget, load_llm, unloaded_model
from ..prune.config import PruneConfig
from ..prune.context import check_budget
from ..prune.lookups import check_pruner_before_load
from ..prune.pruner import ContextPruner
from ..rerank.attention import AttentionReranker
from ..rerank.config import RerankConfig
from ..rerank.inputs import check_unique_ids
from ..rerank.position import SlotProfile, load_profile, reorder_for_generation
from ..rerank.resolve import check_before_load
from ..types import RankedResults, ScoredDocument, as_documents, check_unicode, is_blank
from .checks import check_counts, check_reorder, check_shared_model, check_stage_result, check_stages
from .stages import PipelineResult, Pruner, Reranker, Retriever

logger = logging.getLogger(__name__)

CONSTRUCTOR_OPTIONS = ("depth", "top_k", "budget_tokens", "neighbours", "reorder")  # what from_model passes on


class Pipeline:
    """Retrieve ``depth`` passages, rerank them and keep ``top_k`` (the first-stage top ``top_k``
    without a reranker), prune them to a budget, answer from what is left.

    ``reorder``: a raw-attention :class:`~attnrank.rerank.position.SlotProfile` (stretched to the
    passages a run keeps), or True for the generator model's registered ones (each run reads the
    one whose number of slots is closest to the passages it keeps; Attention Basin placement), or False."""

    def __init__(
        self,
        retriever: Retriever | None,
        reranker: Reranker | None = None,
        pruner: Pruner | None = None,
        generator: Generator | None = None,
        *,
        depth: int = 20,
        top_k: int = 5,
        budget_tokens: int | None = DEFAULT_BUDGET_TOKENS,
        neighbours: int = 0,
        reorder: SlotProfile | bool = False,
    ):
        check_stages(retriever=retriever, reranker=reranker, pruner=pruner, generator=generator)
        check_counts(depth, top_k, budget_tokens, neighbours, pruner is not None)
        self.retriever, self.reranker, self.pruner, self.generator = retriever, reranker, pruner, generator
        self.depth, self.top_k = depth, top_k
        self.budget_tokens, self.neighbours = budget_tokens, neighbours
        self._profiles_of: tuple[str, str] | None = None  # (model id, fingerprint) of reorder=True
        self._profiles: dict[int, SlotProfile] = {}
        self.reorder = self._profile(reorder)

    def _profile(self, reorder: SlotProfile | bool) -> SlotProfile | None:
        check_reorder(reorder)
        if isinstance(reorder, SlotProfile):
            gen = getattr(self.generator, "llm", None)
            if isinstance(gen, LLM) and reorder.fingerprint != gen.fingerprint:
                # (placement follows the attention of the model that reads the passages: the generator's)
                logger.warning(
                    "the reorder profile was measured on %s (fingerprint %s); the generator is %s (%s), whose "
                    "attention may favour other slots; measure one on the generator's model",
                    reorder.model_id,
                    reorder.fingerprint[:12],
                    gen.model_id,
                    gen.fingerprint[:12],
                )
            return reorder
        if not reorder:
            return None
        stages = (self.generator, self.reranker, self.pruner)  # not a reranker that runs no model: it loads none
        models = (getattr(s, "llm", None) for s in stages if getattr(s, "uses_llm", True))
        llm = next((m for m in models if isinstance(m, LLM)), None)
        if llm is None:
            raise InputError(
                "reorder=True reads the generator model's registered slot profile, but no stage "
                "has a model; pass a SlotProfile or build the pipeline with Pipeline.from_model"
            )
        self._profiles_of = (llm.model_id, llm.fingerprint)  # looked up again for the passages a run keeps
        return load_profile("auto", llm.model_id, llm.fingerprint, n_slots=self.top_k, calibrated=False)

    def _profile_for(self, n: int) -> SlotProfile:
        """The reordering profile for ``n`` passages: with ``reorder=True`` the registered one with
        the number of slots closest to ``n`` (pruning leaves out passages with no kept sentence,
        and the first stage may find fewer than ``top_k``: a profile of ``top_k`` slots stretched
        over them placed the best passage where a profile measured for ``n`` puts the worst);
        a profile given is stretched to any ``n``."""
        assert self.reorder is not None
        if self._profiles_of is None or n == self.reorder.n_slots:
            return self.reorder
        if n not in self._profiles:
            self._profiles[n] = load_profile("auto", *self._profiles_of, n_slots=n, calibrated=False)
        return self._profiles[n]

    @classmethod
    def from_model(
        cls,
        retriever: Retriever | None,
        model: str | os.PathLike[str] | LLM | None = None,
        *,
        rerank: RerankConfig | str | bool = True,
        prune: PruneConfig | bool = True,
        generate: bool = True,
        generator_model: str | LLM | None = None,
        max_new_tokens: int = 64,
        dtype: str = "auto",
        device: str = "cpu",
        **kw: Any,
    ) -> Pipeline:
        """A pipeline whose reranker, pruner and generator share one loaded LLM (``model``).

        ``rerank``: a :class:`RerankConfig` (``RerankConfig.preset(...)`` for the default preset with
        options: a bare ``RerankConfig(...)`` computes attention alone), a preset name, True (the
        default preset) or False;
        ``prune``: a :class:`PruneConfig`, True (its defaults) or False; ``generator_model`` gives
        the generator another model; a config's ``model``, ``device`` and ``dtype`` (when set) must be
        the ones given here, which load the shared model (a loaded :class:`LLM` given as ``model`` is
        used as it is: a ``device`` other than the default ``"cpu"`` or a ``dtype`` other than
        ``"auto"`` that differs from its own is warned of). ``kw`` go to the constructor (``depth``, ``top_k``,
        ``budget_tokens``, ``neighbours``, ``reorder``)."""
        check_model_arg(model)
        check_model_arg(generator_model)
        check_stages(retriever=retriever)  # (before the model loads)
        if not isinstance(generate, bool):  # ("no" generated; None read as False)
            raise InputError(f"generate={generate!r} is not True or False")
        if isinstance(model, os.PathLike):  # a model folder given as a Path
            model = os.fspath(model)
        unknown = sorted(set(kw) - set(CONSTRUCTOR_OPTIONS))
        if unknown:  # (else a TypeError from the constructor, after the model loaded)
            raise InputError(f"unknown Pipeline option(s) {unknown}; the options are {', '.join(CONSTRUCTOR_OPTIONS)}")
        if not isinstance(rerank, (bool, str, RerankConfig)):  # (None, 0, {}: each built the default reranker)
            raise InputError(
                f"rerank={rerank!r} is not True, False, a preset name or a RerankConfig; e.g. rerank=False for "
                "none, rerank='signals'"
            )
        if not isinstance(prune, (bool, PruneConfig)):  # (None, "focus", a dict: each built the default pruner)
            raise InputError(
                f"prune={prune!r} is not True, False or a PruneConfig; e.g. prune=False for none, "
                "prune=PruneConfig(method='focus')"
            )
        llm = model if isinstance(model, LLM) else None
        check_shared_model(model, dtype, device, rerank, prune)
        # the constructor's checks, before the model loads and every stage is built
        counts = {k: kw.get(k, v) for k, v in (("depth", 20), ("top_k", 5), ("neighbours", 0))}
        check_counts(**counts, budget_tokens=kw.get("budget_tokens", DEFAULT_BUDGET_TOKENS), pruning=prune is not False)
        if generate:  # the generator's model as a name (a loaded one's context is checked at the answer)
            named = generator_model if generator_model is not None else model
            if isinstance(named, LLM):
                check_max_new_tokens(max_new_tokens)
            else:
                check_answer_room(max_new_tokens, os.fspath(named) if named is not None else None)
        elif max_new_tokens != 64:  # (dropped without a word)
            raise InputError(
                f"max_new_tokens={max_new_tokens!r} sizes the answer, but generate=False; drop one of them"
            )
        if generator_model is not None and not generate:
            raise InputError("generator_model is given but generate=False; drop one of them")
        if isinstance(generator_model, (str, os.PathLike)):
            unloaded_model(generator_model)  # a model that cannot load is named before the shared one loads
        # the reorder profile: the generator's model's, else the shared one's (the stages' order in _profile)
        reads = generator_model if generate and generator_model is not None else model
        check_reorder(kw.get("reorder", False), os.fspath(reads) if isinstance(reads, os.PathLike) else reads,
                      counts["top_k"])  # fmt: skip
        config = None
        if rerank is not False:
            config = (
                rerank if isinstance(rerank, RerankConfig) else RerankConfig.preset("" if rerank is True else rerank)
            )
        # the shared model loads only where a stage runs it (preset signals runs none)
        needed = (
            (config is not None and config.uses_llm) or prune is not False or (generate and generator_model is None)
        )
        if llm is None and config is not None and config.uses_llm:  # what the registry lacks, before the load
            # (and heads outside the model, a window no prompt fits: the reranker, given the loaded model, skips them)
            check_before_load(config.with_options(model=model) if isinstance(model, str) else config, None)
        if llm is None and isinstance(prune, PruneConfig):  # and the pruner's (the pruner is built on the loaded model)
            check_pruner_before_load(prune.with_options(model=model) if isinstance(model, str) else prune)
        if llm is None and needed:  # each stage's prompt window, checked against the model's config first
            windows = [config.max_prompt_tokens] if config is not None and config.uses_llm else []
            windows += [prune.max_prompt_tokens] if isinstance(prune, PruneConfig) else []
            for window in windows:
                check_prompt_budget(window, model)
            llm = load_llm(model if isinstance(model, str) else None, dtype=dtype, device=device)
        reranker = pruner = generator = None
        if config is not None:
            if llm is None:  # no shared model: the reranker's own embedder reads these, its registry the model's
                own = {"model": model} if isinstance(model, str) else {}
                config = config.with_options(dtype=dtype, device=device, **own)
            reranker = AttentionReranker(llm, config=config)
            if isinstance(retriever, HybridRetriever):  # the hits' dense signal: read back, not embedded again
                reranker.use_index(retriever)
        if prune is not False:
            pruner = ContextPruner(llm, config=prune if isinstance(prune, PruneConfig) else None)
        if generate:
            gen_llm = llm if generator_model is None else generator_model
            generator = Generator(gen_llm, max_new_tokens, dtype=dtype, device=device)
        return cls(retriever, reranker, pruner, generator, **kw)

    def run(
        self,
        question: str,
        candidates: RankedResults | Sequence[Any] | None = None,
        *,
        budget_tokens: int | None = None,
        keep_ratio: float | None = None,
        stream: StreamCallback | None = None,
        query_id: str | None = None,
        checkpoint: Callable[[str], object] | None = None,
    ) -> PipelineResult:
        """Run every configured stage for ``question``. ``candidates``: a first-stage list to use
        instead of searching (e.g. a benchmark's fixed candidates; Documents or strings best first,
        ScoredDocuments ordered by their scores, highest first, as a :class:`RankedResults` orders
        them), of which the top ``depth`` are reranked, as a search's would be (the
        result's ``first_stage`` keeps them all). The pruning budget is
        ``budget_tokens``, else ``keep_ratio``, else the pipeline's ``budget_tokens``; ``stream``
        receives the answer's text pieces as they are generated. ``checkpoint`` is called with
        each stage's name (``rerank``, ``prune``, ``generate``) before it runs; whatever it raises
        ends the run there (a server stops the work of a client that has gone)."""
        check = checkpoint or _no_checkpoint
        if not isinstance(question, str):  # (a list was "empty")
            raise InputError(
                f"question {question!r} is a {type(question).__name__}, not a text; pass the question as a string"
            )
        if is_blank(question):
            raise InputError(f"question {question!r} is empty; pass the question to answer")
        check_unicode([question], "question")  # before any stage: the first tokenizer to meet it fails
        if self.pruner is None and (budget_tokens is not None or keep_ratio is not None):
            raise InputError(
                "budget_tokens/keep_ratio size the pruned context, but this pipeline has no pruner; drop them"
            )
        if self.generator is None and stream is not None:  # (it was never called: no text, no error)
            raise InputError("stream= receives the answer's text, but this pipeline has no generator; drop it")
        if budget_tokens is None and keep_ratio is None:  # the run's own budget, else the pipeline's
            budget_tokens = self.budget_tokens
        if self.pruner is not None:  # before the search and the reranking (a missing one too)
            check_budget(budget_tokens, keep_ratio)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        if candidates is None:
            if self.retriever is None:
                raise InputError("this pipeline has no retriever; pass candidates= to run()")
            first = self.retriever.search(question, self.depth, query_id=query_id)
            check_stage_result(first, "retriever.search()")
            timings["retrieve"] = time.perf_counter() - start
        else:  # (no retrieval ran: timing the wrapping of given candidates as "retrieve" misled)
            first = _given(question, candidates, query_id)
        reranked = None
        top = first.top_k(self.top_k)
        if self.reranker is not None:
            check("rerank")
            t = time.perf_counter()
            reranked = self.reranker.rank(question, first.top_k(self.depth), k=self.top_k)
            check_stage_result(reranked, "reranker.rank()")
            top = reranked
            timings["rerank"] = time.perf_counter() - t
        context = top.documents()
        pruned = None
        if self.pruner is not None and context:
            check("prune")
            t = time.perf_counter()
            pruned = self.pruner.prune(
                question, context, budget_tokens=budget_tokens, keep_ratio=keep_ratio, neighbours=self.neighbours
            )
            pruned.check_kept()
            context = pruned.documents()
            timings["prune"] = time.perf_counter() - t
        if self.reorder is not None:  # after pruning, which reads the passages best-first
            context = reorder_for_generation(context, self._profile_for(len(context)))
        answer = None
        if self.generator is not None:
            if not context:  # an answer from no passage would read as one from the corpus
                raise InputError(
                    f"no passage was retrieved for {question!r} to answer from; give candidates, or a query "
                    "the index matches (a BM25-only index returns no document without a query term)"
                )
            check("generate")
            t = time.perf_counter()
            answer = self.generator.answer(question, context, stream)
            timings["generate"] = time.perf_counter() - t
        timings["total"] = time.perf_counter() - start
        logger.info("pipeline: %s", ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
        return PipelineResult(question, first, reranked, pruned, answer, context, timings)


def _no_checkpoint(stage: str) -> None:
    """:meth:`Pipeline.run`'s default checkpoint: nothing stops the run."""


def _given(question: str, candidates: Any, query_id: str | None) -> RankedResults:
    """Fixed candidates as a first-stage result; unscored ones keep their order (score 0), scored
    ones are ordered by score (highest first), as :class:`RankedResults` orders every list."""
    docs, scored = as_documents(candidates)  # (a number or another non-list: one line, not a TypeError)
    check_unique_ids(docs, "candidate")  # (the reranker checks too; without one they reached the answer twice)
    if isinstance(candidates, RankedResults):  # run()'s query_id names them unless it is None
        return candidates if query_id is None else replace(candidates, query_id=query_id)
    results = scored or [
        ScoredDocument(d.id, 0.0, i, d.text, d.title, metadata=d.metadata) for i, d in enumerate(docs, start=1)
    ]
    given = RankedResults(question, results, query_id, stage="given")
    if scored and [d.id for d in sorted(scored, key=lambda d: d.rank)] != given.ids:
        # (as read_run says of a run file: the candidate ranked 1 could be cut by depth without a word)
        logger.warning(
            "the given candidates rank documents in another order by their scores than by their rank field "
            "(first by score: %r; rank 1: %r); they are ordered by score, highest first: give scores that order "
            "them as their ranks do (higher is better), or plain Documents to keep the list's order",
            given.ids[0],
            min(scored, key=lambda d: d.rank).id,
        )
    return given
