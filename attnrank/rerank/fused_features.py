"""The fused scorer's per-query features (:mod:`attnrank.rerank.fused`): one query's z-scored
design matrix (:func:`feature_matrix`), how sharply its attention singles out its best candidates
(:func:`attention_confidence`, what the confidence gate reads), and a labelled query's features
for training and evaluation (:class:`FusionExample`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputError
from .learned.features import standardise, varies


def attention_confidence(attention: np.ndarray) -> float:
    """How sharply a query's attention singles out its best candidates: the z-score of the
    highest attention score among the candidates (population std; 0 if all are equal)."""
    a = np.asarray(attention, dtype=np.float64)
    if not np.isfinite(a).all():  # NaN made the std NaN, read as "all equal": the gate then hid it
        raise InputError(f"attention scores {a.tolist()[:5]} hold NaN or inf; check the model's dtype and weights")
    # no candidate (a query without any: a traceback in k-fold evaluation), or all equal up to rounding
    if a.size == 0 or not varies(a):
        return 0.0
    return float((a.max() - a.mean()) / a.std())


@dataclass
class FusionExample:
    """One labelled query for training or evaluating the fused scorer: ``signals[name]`` has one
    value per candidate (input order), graded ``labels`` (0 = unjudged), ``rel`` the minimum
    relevant label, ``group`` the dataset (for leave-one-dataset-out); ``qrels``: all of the query's
    judgements (also of passages outside the candidates) for evaluation, None = ``labels``."""

    qid: str
    doc_ids: list[str]
    signals: dict[str, np.ndarray]
    labels: np.ndarray
    rel: int = 1
    group: str = ""
    qrels: dict[str, int] | None = None
    embedder: str | None = None  # the sentence embedder of the ``dense`` signal (None: the packaged MiniLM)

    def judged(self) -> dict[str, int]:
        """The judgements to evaluate against."""
        return dict(self.qrels) if self.qrels is not None else dict(zip(self.doc_ids, map(int, self.labels)))


def feature_matrix(signals: Mapping[str, Any], features: Sequence[str]) -> np.ndarray:
    """The per-query z-scored design matrix ``[candidates, features]`` of one query's ``signals``
    (one finite value per candidate for each of ``features``), as scoring and training read it."""
    missing = [f for f in features if f not in signals]
    if missing:
        raise InputError(f"the candidates lack the feature(s) {missing}; the fused weights use {list(features)}")
    cols = [np.asarray(signals[f], dtype=np.float64).reshape(-1) for f in features]
    if len({c.size for c in cols}) > 1:
        sizes = {f: c.size for f, c in zip(features, cols)}
        raise InputError(f"the features have different numbers of values {sizes}; give one per candidate for each")
    for f, c in zip(features, cols):  # NaN once became 0 and inf wiped its column: a plausible, wrong order
        bad = np.flatnonzero(~np.isfinite(c))
        if bad.size:
            raise InputError(
                f"feature {f!r} of candidate #{bad[0]} is {c[bad[0]]}; the fused scorer needs finite values "
                "(give a candidate without that signal the query's lowest value)"
            )
    return standardise(np.column_stack(cols))
