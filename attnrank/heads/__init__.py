"""Retrieval-head sets: parsing, detection (:mod:`attnrank.heads.copypaste`, :mod:`attnrank.heads.queryfocused`, both
returning :class:`attnrank.heads.scores.HeadScores`) and the per-model registry."""

from ..llm.headspec import format_heads, parse_heads
from ..registry import load_artifact, load_head_sets, resolve_heads
from ..registry_save import save_artifact, save_head_set

__all__ = [
    "parse_heads",
    "format_heads",
    "load_head_sets",
    "save_head_set",
    "resolve_heads",
    "save_artifact",
    "load_artifact",
]
