"""A learned sentence probe for context pruning (Sentinel-style).

Sentinel (Zhang et al., arXiv 2505.23277) reads sentence-level attention features from a small
proxy LLM and trains a lightweight classifier that says which sentences a question needs. Ours,
made to fit :class:`~attnrank.prune.pruner.ContextPruner`:

- **Head features** — for every captured head ``h`` and sentence ``s``, the calibrated attention
  of the query span to the sentence's tokens, summed and length-normalised exactly as the
  pruner's ``method="query"`` score (``Σ_j Δ[h, j] / sqrt(n_s)``; units: shares of the query
  span's attention), so the plain pruner score is the sum of these columns.
- **Extras** (optional, named in :attr:`SentenceProbe.extras`): ``"passage"`` — the mean
  head-summed score of the sentences of the same passage (context from the passage the
  sentence sits in, which a sentence-only feature cannot see); ``"first"`` — 1 for a passage's
  first sentence; ``"position"`` — ``1 / (1 + index in passage)``. Multi-hop QA evidence often
  sits in a passage's opening sentence; these let the probe learn how much that matters.
- Every column is z-scored **within one question** (the candidates of one prompt are what is
  compared; scales differ between prompts), as in :mod:`attnrank.rerank.learned`.
- Model: scikit-learn's L2-regularised logistic regression (``C = 1/λ``), pointwise, label =
  the sentence is a supporting fact. Selection then uses the probe's score like any other.

Trained probes are stored per model in the head registry (artifact ``"sentence-probe"``);
``ContextPruner(method="probe")`` loads the registered one.
"""

from __future__ import annotations

import datetime as _dt
import logging
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import InputError
from ..heads.spec import format_heads, parse_heads
from ..rerank.learned import standardise

logger = logging.getLogger(__name__)

ARTIFACT = "sentence-probe"
EXTRAS = ("passage", "first", "position")

Position = tuple[int, int]  # (passage index, sentence index within the passage)


def design(head_scores: np.ndarray, positions: Sequence[Position], extras: Sequence[str]) -> np.ndarray:
    """Raw feature matrix ``[S, H + len(extras)]`` of one question's sentences."""
    x = np.asarray(head_scores, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != len(positions):
        raise InputError(f"head scores of shape {x.shape} do not match {len(positions)} sentence positions")
    bad = set(extras) - set(EXTRAS)
    if bad:
        raise InputError(f"unknown probe extras {sorted(bad)}; choose from {EXTRAS}")
    cols = [x]
    doc = np.array([d for d, _ in positions], dtype=np.int64)
    idx = np.array([k for _, k in positions], dtype=np.float64)
    for name in extras:
        if name == "passage":
            total = x.sum(1)
            means = {d: total[doc == d].mean() for d in set(doc.tolist())}
            cols.append(np.array([means[d] for d in doc])[:, None])
        elif name == "first":
            cols.append((idx == 0).astype(np.float64)[:, None])
        else:
            cols.append((1.0 / (1.0 + idx))[:, None])
    return np.hstack(cols)


@dataclass
class ProbeExample:
    """One labelled question: per-head sentence scores ``[S, H]``, each sentence's
    (passage, sentence) position and whether it is a supporting fact."""

    qid: str
    head_scores: np.ndarray
    positions: list[Position]
    labels: np.ndarray


@dataclass
class SentenceProbe:
    """``score(s) = w · z(features(s)) + b`` over one question's sentences (see module doc)."""

    weights: np.ndarray
    bias: float
    heads: list[str]
    extras: list[str]
    length_norm: str = "sqrt"
    l2: float = 10.0
    trained_on: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    date: str = ""

    @property
    def head_pairs(self) -> list[tuple[int, int]]:
        return [tuple(p) for p in (parse_heads(self.heads) or [])]

    def score(self, head_scores: np.ndarray, positions: Sequence[Position]) -> np.ndarray:
        """Scores of one question's sentences from raw ``head_scores [S, H]`` (probe head order)."""
        x = design(head_scores, positions, self.extras)
        if x.shape[1] != self.weights.shape[0]:
            raise InputError(f"{x.shape[1]} features for a probe of {self.weights.shape[0]} weights; capture the "
                             f"probe's {len(self.heads)} heads")
        return standardise(x) @ self.weights + self.bias

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["weights"] = [float(v) for v in self.weights]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SentenceProbe:
        try:
            return cls(**{**data, "weights": np.asarray(data["weights"], dtype=np.float64)})
        except (KeyError, TypeError) as e:
            raise InputError(f"stored sentence probe is malformed ({e}); train and save it again") from None

    def save(self, model_id: str, fingerprint: str, *, root: Path | None = None) -> Path:
        from ..heads.registry import save_artifact

        return save_artifact(ARTIFACT, model_id, fingerprint, self.to_json(), root=root)

    @classmethod
    def load(cls, model_id: str, fingerprint: str, *, root: Path | None = None) -> SentenceProbe:
        from ..heads.registry import load_artifact

        data = load_artifact(ARTIFACT, model_id, fingerprint, root=root)
        if data is None:
            raise InputError(f"no sentence probe is registered for model {model_id!r} (fingerprint "
                             f"{fingerprint[:12]}); train one with train_probe(...) and .save(model_id, fingerprint), "
                             "or use method='query'")
        return cls.from_json(data)


def train_probe(examples: Sequence[ProbeExample], heads: Sequence[tuple[int, int]], *,
                extras: Sequence[str] = EXTRAS, l2: float = 10.0, length_norm: str = "sqrt",
                trained_on: str = "") -> SentenceProbe:
    """Fit the probe on labelled questions (features built as :func:`design`, z-scored per question)."""
    from sklearn.linear_model import LogisticRegression

    if not examples:
        raise InputError("no training questions; pass at least one ProbeExample")
    if l2 <= 0:
        raise InputError(f"l2={l2} must be > 0 (the L2 penalty λ; sklearn's C = 1/λ)")
    for ex in examples:
        if ex.head_scores.shape != (len(ex.positions), len(heads)):
            raise InputError(f"question {ex.qid!r}: head scores {ex.head_scores.shape} but {len(ex.positions)} "
                             f"sentences and {len(heads)} heads; build every example with the same heads")
    x = np.vstack([standardise(design(ex.head_scores, ex.positions, extras)) for ex in examples])
    y = np.concatenate([np.asarray(ex.labels, dtype=bool) for ex in examples]).astype(int)
    if y.min() == y.max():
        raise InputError(f"all {len(y)} training sentences have the same label; the probe needs supporting "
                         "and other sentences")
    clf = LogisticRegression(C=1.0 / l2, max_iter=3000).fit(x, y)
    return SentenceProbe(clf.coef_[0].copy(), float(clf.intercept_[0]), format_heads(list(heads)).split(","),
                         list(extras), length_norm, l2, trained_on or f"{len(examples)} questions", {},
                         _dt.datetime.now().isoformat(timespec="seconds"))


def crossfit_scores(examples: Sequence[ProbeExample], heads: Sequence[tuple[int, int]], *, k: int = 5,
                    seed: int = 0, **train_kw: Any) -> dict[str, np.ndarray]:
    """Held-out probe scores for every question: k folds over questions (shuffled with ``seed``),
    each fold scored by a probe trained on the other folds only."""
    if not 2 <= k <= len(examples):
        raise InputError(f"k={k} folds need 2 <= k <= {len(examples)} (the number of questions)")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    out: dict[str, np.ndarray] = {}
    for f in range(k):
        test = set(order[f::k])
        probe = train_probe([examples[i] for i in order if i not in test], heads, **train_kw)
        for i in test:
            out[examples[i].qid] = probe.score(examples[i].head_scores, examples[i].positions)
    return out
