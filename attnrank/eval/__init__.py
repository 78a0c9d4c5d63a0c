"""Evaluation: TREC/BEIR readers and writers, and metrics through ir-measures.

Submodules (imported on use): :mod:`.datasets` (benchmark data loaders), :mod:`.qa` (answer
EM/F1), :mod:`.crossval` (k-fold and leave-one-group-out), :mod:`.rows` (the attention-row cache),
:mod:`.report` (JSON + markdown reports), :mod:`.plot` (matplotlib, the ``plot`` extra).
"""

from .data import check_run_ids, read_qrels, read_run, results_to_run, trec_order, write_run
from .metrics import DEFAULT_METRICS, evaluate, evaluate_per_query, sign_test, wins_losses

__all__ = [
    "read_qrels",
    "read_run",
    "write_run",
    "check_run_ids",
    "trec_order",
    "results_to_run",
    "evaluate",
    "evaluate_per_query",
    "wins_losses",
    "sign_test",
    "DEFAULT_METRICS",
]
