"""Offline batch search + rerank on Ray Data (extra ``ray``): see :mod:`attnrank.batch.runner`."""

from .runner import BatchConfig, Resources, run_batch

__all__ = ["BatchConfig", "Resources", "run_batch"]
