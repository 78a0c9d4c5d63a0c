"""What the server runs: one loaded LLM shared by the reranker, the pruner and the generator,
and optionally an index (:class:`Engine`, :func:`build_engine`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..pipeline.checks import check_shared_model
from ..prune.config import PruneConfig
from ..rerank.config import RerankConfig


@dataclass
class Engine:
    """A reranker (``rank(query, docs, k, return_evidence=)``) and, optionally, a pruner, a
    generator and an index (``search(query, k)``); ``model_name`` is reported by the routes."""

    reranker: Any
    pruner: Any | None = None
    generator: Any | None = None
    index: Any | None = None
    model_name: str = ""


def build_engine(
    rerank: RerankConfig | None = None,
    *,
    index: str | Path | None = None,
    prune: PruneConfig | bool = True,
    generate: bool = True,
    max_new_tokens: int = 64,
) -> Engine:
    """Load the model once (``rerank``'s model, dtype and device; None: the default preset) and
    build every part on it; the index (a folder) if given. ``prune``: the pruner's configuration
    (``attnrank serve`` builds it as ``attnrank ask`` does), True for the default one on the same
    model (every head, as :class:`~attnrank.pipeline.Pipeline` prunes), or False for none; the generator is only built with an index
    (``/v1/ask`` answers over it)."""
    from ..generate import Generator, check_answer_room
    from ..llm.models import load_llm
    from ..prune.lookups import check_pruner_before_load
    from ..prune.pruner import ContextPruner
    from ..rerank.attention import AttentionReranker
    from ..rerank.over_index import index_reranker
    from ..rerank.resolve import check_before_load

    config = rerank or RerankConfig.preset()
    check_shared_model(config.model, config.dtype, config.device, prune, where="build_engine's RerankConfig")
    retriever = None
    if index is not None:  # load (and validate) the index before the model
        from ..index.retriever import HybridRetriever

        retriever = HybridRetriever.load(index)
    # what the stages read from the registry, their heads and windows: before the model loads, as the CLI checks them
    if generate and index is not None:  # (the answer's length against the model's context, as Pipeline.from_model)
        check_answer_room(max_new_tokens, config.model)
    if config.uses_llm:
        check_before_load(config, None)
    if prune:
        check_pruner_before_load((PruneConfig() if prune is True else prune).with_options(model=config.model))
    # preset signals reranks without the model: loaded only for a pruner or generator
    needs_model = config.uses_llm or prune or (generate and retriever is not None)
    llm = load_llm(config.model, dtype=config.dtype, device=config.device) if needs_model else None
    # over an index, as search --rerank: its stored passage states, and its vectors for the dense signal
    reranker = AttentionReranker(llm, config=config) if index is None else index_reranker(config, index, retriever, llm)
    if prune is True:
        prune = PruneConfig()
    pruner = ContextPruner(llm, config=prune) if llm is not None and prune else None
    generator = Generator(llm, max_new_tokens) if llm is not None and generate and retriever is not None else None
    return Engine(reranker, pruner, generator, retriever, reranker.model_id)
