"""Offline batch search + rerank on Ray Data (extra ``ray``): see :mod:`attnrank.batch.runner`."""

from .config import BatchConfig, Resources
from .runner import run_batch

__all__ = ["BatchConfig", "Resources", "run_batch"]
