"""Retrieval-head sets: parsing, (later) detection and the per-model registry."""

from .spec import format_heads, parse_heads

__all__ = ["parse_heads", "format_heads"]
