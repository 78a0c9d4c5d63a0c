"""Evaluation: TREC/BEIR readers and writers, and metrics through ir-measures."""

from .data import read_qrels, read_run, results_to_run, write_run
from .metrics import DEFAULT_METRICS, evaluate, evaluate_per_query

__all__ = ["read_qrels", "read_run", "write_run", "results_to_run", "evaluate", "evaluate_per_query", "DEFAULT_METRICS"]
