"""The checks :class:`~attnrank.pipeline.Pipeline` makes of its options when it is made, before
any model loads or any stage runs: its counts and budget (:func:`check_counts`), and that every
stage's configuration asks for the one model :meth:`~attnrank.pipeline.Pipeline.from_model` (and
the server) loads for all of them (:func:`check_shared_model`); that each stage object has the
method the pipeline calls (:func:`check_stages`), and returns what it reads (:func:`check_stage_result`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ..config import DEFAULT_BUDGET_TOKENS
from ..errors import InputError, ModelError
from ..llm.models import LLM, unloaded_model, warn_if_configured_otherwise
from ..llm.tokenizers import checked_model_id
from ..prune.config import PruneConfig
from ..prune.context import check_budget, check_neighbours
from ..rerank.config import RerankConfig
from ..rerank.position import SlotProfile, check_basin, load_profile
from ..types import RankedResults, is_count


def check_counts(depth: Any, top_k: Any, budget_tokens: Any, neighbours: Any, pruning: bool) -> None:
    """The pipeline's counts: ``depth`` and ``top_k`` integers >= 1, ``top_k <= depth``; with a
    pruner, its budget (None: every run gives one) and ``neighbours`` (found here, not by run()
    after the retrieval and the reranking)."""
    for name, value in (("depth", depth), ("top_k", top_k)):
        if not is_count(value):
            raise InputError(f"{name}={value!r} must be an integer >= 1")
    if top_k > depth:
        raise InputError(
            f"top_k={top_k} exceeds depth={depth}; the reranker can only keep passages the "
            "first stage found: lower top_k or raise depth"
        )
    if pruning:
        if budget_tokens is not None:
            check_budget(budget_tokens, None)
        check_neighbours(neighbours)
        return
    given = [
        f"{n}={v!r}"
        for n, v, d in (("budget_tokens", budget_tokens, DEFAULT_BUDGET_TOKENS), ("neighbours", neighbours, 0))
        if v is not None and v != d  # (budget None: no budget, nothing given)
    ]
    if given:  # (dropped without a word, though run() refuses a budget without a pruner)
        raise InputError(
            f"{', '.join(given)} size(s) the pruned context, but this pipeline has no pruner; drop it, or add a pruner"
        )


def check_shared_model(
    model: str | LLM | None, dtype: str, device: str, *configs: Any, where: str = "Pipeline.from_model"
) -> None:
    """:meth:`Pipeline.from_model` (and the server's :func:`~attnrank.serve.engine.build_engine`)
    loads one model for every stage, from its own ``model``, ``dtype`` and ``device``: a stage
    config asking for another would be silently overridden (a loaded :class:`LLM` given as
    ``model`` is used as it is)."""
    if isinstance(model, LLM):  # used as it is (each stage warns of a config naming another model)
        # and so are the device and precision it was loaded in: set otherwise here, they are warned of
        given = SimpleNamespace(model=None, device=None if device == "cpu" else device, dtype=dtype)
        warn_if_configured_otherwise(model, given, where)
        return
    for cfg in configs:
        if not isinstance(cfg, (RerankConfig, PruneConfig)):
            continue
        what = type(cfg).__name__
        # (compared as load_llm names them: None and "" the offline default, a path expanded)
        if cfg.model is not None and checked_model_id(cfg.model) != checked_model_id(model):
            raise InputError(
                f"{what}(model={cfg.model!r}) but the pipeline's model is {model!r}: {where} loads one model "
                f"for every stage; pass model={cfg.model!r} to {where}"
            )
        for key, value in (("device", device), ("dtype", dtype)):  # a config's default defers to the shared one
            if getattr(cfg, key) not in (value, getattr(type(cfg)(), key)):
                raise InputError(
                    f"{what}({key}={getattr(cfg, key)!r}) but {where}({key}={value!r}) loads the "
                    f"model every stage shares; pass {key}={getattr(cfg, key)!r} to {where}"
                )


def check_reorder(reorder: Any, model: Any = None, top_k: int = 5) -> None:
    """``reorder``: True, False or a :class:`SlotProfile` (its basin checked); with True and
    ``model`` a name (None: the default), its registered slot profile of ``top_k`` slots is looked up
    without loading the model (a path, or nothing registered, failed after every stage was built).
    A model whose config cannot be read here is left to its load."""
    if isinstance(reorder, SlotProfile):
        check_basin(reorder)  # (else refused at the first run, after every stage had run)
        return
    if not isinstance(reorder, bool):  # (a path failed at the first run, after every stage had run)
        raise InputError(
            f"reorder={reorder!r} is not True, False or a SlotProfile; for a profile file pass SlotProfile.load(path)"
        )
    if reorder and not isinstance(model, LLM):
        try:
            key = unloaded_model(model)
        except ModelError:
            return
        load_profile("auto", *key, n_slots=top_k, calibrated=False)


# What each stage object must have, and how one is made (a str path as the retriever, or a
# PruneConfig as the pruner, was an AttributeError at the first run, after the model had loaded).
_STAGES = {
    "retriever": ("search", "HybridRetriever.load(path), or None with candidates= to run()"),
    "reranker": ("rank", "AttentionReranker(...), or Pipeline.from_model(rerank=...)"),
    "pruner": ("prune", "ContextPruner(llm, config=...), or Pipeline.from_model(prune=...)"),
    "generator": ("answer", "Generator(llm), or Pipeline.from_model(generate=True)"),
}


def check_stages(**stages: Any) -> None:
    """Each stage object given (``retriever=``, ``reranker=``, ``pruner=``, ``generator=``) has the
    method the pipeline calls, or None."""
    for name, stage in stages.items():
        if stage is not None:
            check_stage(name, stage, *_STAGES[name])


def check_stage(label: str, stage: Any, method: str, fix: str) -> None:
    """``stage`` (named ``label`` in the message) has the callable ``method`` its caller calls (the
    pipeline, a framework adapter), else an :class:`InputError` advising ``fix``."""
    if not callable(getattr(stage, method, None)):
        raise InputError(f"{label} is a {type(stage).__name__}, which has no {method}(); pass {fix}")


def check_stage_result(result: Any, call: str) -> None:
    """What a stage's ``call`` (e.g. ``"retriever.search()"``) returned is a RankedResults."""
    if not isinstance(result, RankedResults):
        raise InputError(
            f"{call} returned a {type(result).__name__}, not RankedResults; a custom stage must return "
            "RankedResults(query, [ScoredDocument(...), ...])"
        )
