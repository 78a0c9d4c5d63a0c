"""Attention-guided context pruning before generation (seeds: AttentionRAG, Sentinel; EHPC's head choice only).

- :mod:`attnrank.prune.segment`: sentences with exact character spans.
- :mod:`attnrank.prune.pruner`: :class:`ContextPruner` (loads torch on first use).
- :mod:`attnrank.prune.context`: :class:`PrunedContext`, budgets and selection.
"""

from __future__ import annotations

from .context import PrunedContext, ScoredSentence
from .segment import Sentence, locate_sentences, segment, split_sentences


def __getattr__(name: str):
    if name == "ContextPruner":
        from .pruner import ContextPruner

        return ContextPruner
    raise AttributeError(f"module 'attnrank.prune' has no attribute {name!r}")


__all__ = [
    "ContextPruner",
    "PrunedContext",
    "ScoredSentence",
    "Sentence",
    "segment",
    "split_sentences",
    "locate_sentences",
]
