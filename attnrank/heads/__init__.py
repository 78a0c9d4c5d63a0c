"""Retrieval-head sets: parsing, detection (:mod:`attnrank.heads.detect`) and the per-model registry."""

from .registry import load_artifact, load_head_sets, resolve_heads, save_artifact, save_head_set
from .spec import format_heads, parse_heads

__all__ = ["parse_heads", "format_heads", "load_head_sets", "save_head_set", "resolve_heads",
           "save_artifact", "load_artifact"]
