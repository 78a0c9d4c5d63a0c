"""attnrank: retrieval and reranking with a language model's own attention.

Public API (re-exports only):

- first stage: :class:`HybridRetriever`, :func:`load_corpus`, :func:`load_queries`
- reranking: :class:`AttentionReranker` (the default preset: the query likelihood, UPR, fused with
  BM25 and dense scores; attention presets: ICR / QRHead, fused), :class:`PointwiseReranker`,
  :class:`ListwiseReranker` (baselines), :class:`Reweighting`, :class:`LearnedHeadWeights`,
  :class:`SlotProfile` and :func:`reorder_for_generation` (position bias)
- pruning and generation: :class:`ContextPruner`, :class:`PrunedContext`, :class:`Generator`,
  :class:`Pipeline`
- types: :class:`Document`, :class:`ScoredDocument`, :class:`RankedResults`
- models: :func:`load_llm`

Heavy modules (torch, transformers) load on first use of the names that need them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .corpus import load_corpus
from .errors import AttnrankError, IndexFormatError, InputError, MissingExtraError, ModelError
from .queries import load_queries
from .types import Document, RankedResults, ScoredDocument

_LAZY = {
    "HybridRetriever": "attnrank.index.retriever",
    "tune_alpha": "attnrank.index.tuning",
    "AttentionReranker": "attnrank.rerank.attention",
    "PointwiseReranker": "attnrank.rerank.generative",
    "ListwiseReranker": "attnrank.rerank.generative",
    "Reweighting": "attnrank.rerank.reweight",
    "SlotProfile": "attnrank.rerank.position",
    "reorder_for_generation": "attnrank.rerank.position",
    "LearnedHeadWeights": "attnrank.rerank.learned",
    "ContextPruner": "attnrank.prune.pruner",
    "PrunedContext": "attnrank.prune.context",
    "Generator": "attnrank.generate",
    "Pipeline": "attnrank.pipeline",
    "load_llm": "attnrank.llm.models",
}

if TYPE_CHECKING:  # pragma: no cover
    from .generate import Generator
    from .index.retriever import HybridRetriever
    from .index.tuning import tune_alpha
    from .llm.models import load_llm
    from .pipeline import Pipeline
    from .prune.context import PrunedContext
    from .prune.pruner import ContextPruner
    from .rerank.attention import AttentionReranker
    from .rerank.generative import ListwiseReranker, PointwiseReranker
    from .rerank.learned import LearnedHeadWeights
    from .rerank.position import SlotProfile, reorder_for_generation
    from .rerank.reweight import Reweighting


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnrank' has no attribute {name!r}")


__all__ = [
    "Document",
    "ScoredDocument",
    "RankedResults",
    "load_corpus",
    "load_queries",
    "AttnrankError",
    "InputError",
    "IndexFormatError",
    "ModelError",
    "MissingExtraError",
    *_LAZY,
]
