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
  ``"passage-heads"`` — the same passage mean, per head (H more columns: the per-head passage
  evidence that the learned head weighting of :mod:`attnrank.rerank.learned` ranks passages by).
  ``"bm25"`` — the sentence's BM25 score for the question (:class:`~attnrank.index.bm25.BM25Index`,
  statistics over the context's sentences): a lexical signal fused with attention (not part of
  Sentinel; off unless named).
- Every column is z-scored **within one question** (the candidates of one prompt are what is
  compared; scales differ between prompts), as in :mod:`attnrank.rerank.learned`. A context the
  pruner scores in several chunks (full attention past ``max_prompt_tokens``) is z-scored as one
  pool over its chunks' prompts, whose scales may differ (the probe was trained on one prompt per
  question).
- Model: scikit-learn's L2-regularised logistic regression (``C = 1/λ``), pointwise, label =
  the sentence is a supporting fact. Selection then uses the probe's score like any other.

Trained probes are stored per model in the head registry (artifact ``"sentence-probe"``);
``ContextPruner(method="probe")`` loads the registered one.
"""

from __future__ import annotations

import datetime as _dt
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..artifacts import RegistryArtifact
from ..config import check_l2
from ..errors import InputError, require
from ..eval.crossval import check_folds, check_unique_queries
from ..index.bm25 import BM25Index
from ..index.tokenize import resolve_config
from ..llm.headspec import format_heads, parse_heads
from ..llm.prompts import INSTRUCTIONS
from ..rerank.learned.features import standardise
from .config import LENGTH_NORMS

logger = logging.getLogger(__name__)

ARTIFACT = "sentence-probe"
EXTRAS = ("passage", "passage-heads", "first", "position", "bm25")
DEFAULT_EXTRAS = ("passage", "first", "position")
INNER_FOLDS = 3  # select_l2's cross-validation, inside each training part of crossfit_scores

Position = tuple[int, int]  # (passage index, sentence index within the passage)
# The pruner settings a probe's features depend on, as a probe that records none was trained on
# (the pruner's defaults): :func:`probe_capture` reads them off a pruner's configuration.
DEFAULT_CAPTURE: dict[str, Any] = {
    "attention": "full",
    "calibrate": True,
    "sink": False,
    "instruction": "qa",
    "order": "reverse",
}


def probe_capture(config: Any, adapter: str = "") -> dict[str, Any]:
    """The settings of a pruner's configuration (:class:`~attnrank.prune.config.PruneConfig`)
    that its sentence features depend on (block attention named with its positions), and the
    head adapter of its model (``LLM.adapter``; recorded only where there is one, as probes saved
    before it was recorded are of models without)."""
    attention = config.attention if config.attention != "block" else f"block:{config.block_positions}"
    return {
        **({"adapter": adapter} if adapter else {}),
        "attention": attention,
        "calibrate": config.calibrate,
        "sink": config.sink,
        "instruction": _instruction_key(config.instruction),
        "order": config.order,
    }


def _instruction_key(instruction: str) -> str:
    """An instruction as the prompt reads it (:func:`~attnrank.llm.prompts.late_instruction`): a
    built-in's name in any case (``"QA"`` and ``"qa"`` build one prompt), another text as given
    (``" qa "`` is no built-in's name there: the prompt holds the text "qa")."""
    key = instruction.lower()
    return key if key in INSTRUCTIONS else instruction


def lexical_scores(query: str, texts: Sequence[str]) -> np.ndarray:
    """BM25 of ``query`` against each sentence (statistics over these sentences; 0 if none has a term)."""
    try:
        # (Porter stems where PyStemmer is installed, as the probe was trained; else none, warned)
        terms = replace(resolve_config("lucene", "auto"), unicode="none", words="w")
        return BM25Index(tokenizer=terms).index(list(texts)).get_scores(query).astype(np.float64)
    except InputError:  # every sentence empty after tokenization
        return np.zeros(len(texts))


def design(
    head_scores: np.ndarray,
    positions: Sequence[Position],
    extras: Sequence[str],
    lexical: Sequence[float] | np.ndarray | None = None,
) -> np.ndarray:
    """Raw feature matrix ``[S, H + len(extras)]`` of one question's sentences (``lexical``:
    the sentences' :func:`lexical_scores`, needed for the ``"bm25"`` extra)."""
    x = np.asarray(head_scores, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != len(positions):
        raise InputError(f"head scores of shape {x.shape} do not match {len(positions)} sentence positions")
    if not np.isfinite(x).all():  # (standardising zeroed such a column: every sentence tied, without a word)
        s, h = (int(i) for i in np.argwhere(~np.isfinite(x))[0])
        raise InputError(
            f"head score {x[s, h]} (sentence {s}, head column {h}) is not finite; check the model's dtype "
            "(an overflow: use float32 or bfloat16)"
        )
    bad = set(extras) - set(EXTRAS)
    if bad:
        raise InputError(f"unknown probe extras {sorted(bad)}; choose from {EXTRAS}")
    cols = [x]
    doc = np.array([d for d, _ in positions], dtype=np.int64)
    idx = np.array([k for _, k in positions], dtype=np.float64)
    for name in extras:
        if name in ("passage", "passage-heads"):
            per = x if name == "passage-heads" else x.sum(1, keepdims=True)
            means = {d: per[doc == d].mean(0) for d in set(doc.tolist())}
            cols.append(np.array([means[d] for d in doc]))
        elif name == "bm25":
            if lexical is None or len(lexical) != len(positions):
                raise InputError("the 'bm25' probe extra needs lexical= scores, one per sentence")
            cols.append(np.asarray(lexical, dtype=np.float64)[:, None])
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
    lexical: np.ndarray | None = None


@dataclass
class SentenceProbe(RegistryArtifact):
    """``score(s) = w · z(features(s)) + b`` over one question's sentences (see module doc);
    stored with :meth:`save` / :meth:`load` in the head registry."""

    KIND: ClassVar[str] = ARTIFACT
    LABEL: ClassVar[str] = "sentence probe"
    HINT: ClassVar[str] = "train one with train_probe(...) and .save(model_id, fingerprint), or use method='query'"

    weights: np.ndarray
    bias: float
    heads: list[str]
    extras: list[str]
    length_norm: str = "sqrt"
    l2: float = 10.0
    trained_on: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    capture: dict[str, Any] = field(default_factory=dict)  # how its features were captured (empty: DEFAULT_CAPTURE)

    def __post_init__(self) -> None:
        if self.length_norm not in LENGTH_NORMS:  # (the pruner reads anything but "sqrt" as "none")
            raise InputError(f"sentence probe length_norm={self.length_norm!r} is not one of {LENGTH_NORMS}")
        # the pruner reads the heads' scores sorted (head_pairs): weights given in another order would
        # each score another head
        given = [pair for h in self.heads for pair in parse_heads([h]) or []]
        if given != self.head_pairs:
            raise InputError(
                f"sentence probe heads {list(self.heads)[:8]} are not each once in (layer, head) order, the order "
                "its weights are read in; sort the heads with their weights (train_probe does)"
            )
        # (each of these was found at the first prune, after the model had loaded, or never: NaN
        # weights scored every sentence NaN)
        bad = sorted(set(self.extras) - set(EXTRAS))
        if bad:
            raise InputError(f"sentence probe extras {bad} are unknown; the extras are {EXTRAS}")
        weights = np.asarray(self.weights, dtype=np.float64)
        columns = len(self.heads) * (1 + ("passage-heads" in self.extras)) + sum(
            e != "passage-heads" for e in self.extras
        )
        if weights.shape != (columns,) or not np.isfinite(weights).all() or not np.isfinite(self.bias):
            raise InputError(
                f"sentence probe weights (shape {weights.shape}) are not {columns} finite numbers, one per feature "
                f"of its {len(self.heads)} heads and extras {list(self.extras)}; train the probe again"
            )

    @property
    def head_pairs(self) -> list[tuple[int, int]]:
        return [(int(p[0]), int(p[1])) for p in (parse_heads(self.heads) or [])]

    def warn_if_applied_otherwise(self, capture: dict[str, Any]) -> None:
        """Log a warning when the pruner reads its features otherwise than they were captured for
        training (``capture``: :func:`probe_capture` of the pruner; a probe that records none was
        trained on :data:`DEFAULT_CAPTURE`'s): block attention, no calibration or sink filtering
        change every feature's scale, so the weights do not score as they measured."""
        trained = {**DEFAULT_CAPTURE, **self.capture}
        differ = sorted(k for k in trained if k in capture and capture[k] != trained[k])
        if differ:
            logger.warning(
                "the sentence probe was trained on features captured with %s; this pruner captures them with %s, "
                "so it does not score as it measured; prune with the probe's settings or train it again",
                ", ".join(f"{k}={trained[k]!r}" for k in differ),
                ", ".join(f"{k}={capture[k]!r}" for k in differ),
            )

    def score(
        self,
        head_scores: np.ndarray,
        positions: Sequence[Position],
        lexical: Sequence[float] | np.ndarray | None = None,
    ) -> np.ndarray:
        """Scores of one question's sentences from raw ``head_scores [S, H]`` (probe head order)."""
        x = design(head_scores, positions, self.extras, lexical)
        if x.shape[1] != self.weights.shape[0]:
            raise InputError(
                f"{x.shape[1]} features for a probe of {self.weights.shape[0]} weights; capture the "
                f"probe's {len(self.heads)} heads"
            )
        return standardise(x) @ self.weights + self.bias

    def save(self, model_id: str, fingerprint: str, *, root: Path | None = None) -> Path:
        """Register the probe for the model, refused for one trained on a model with a head
        adapter merged in: the registry keys it by the base model's fingerprint, where the base
        model would find it (as learned and fused weights are refused)."""
        adapter = self.capture.get("adapter", "")
        if adapter:
            raise InputError(
                f"this sentence probe was trained on {model_id!r} with the head adapter {adapter} merged in, and the "
                "registry keys probes by the base model's fingerprint; pass it as probe= instead, or train it on "
                "the model without the adapter"
            )
        return super().save(model_id, fingerprint, root=root)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SentenceProbe:
        try:
            if not isinstance(data.get("capture", {}), dict):
                raise TypeError(f"capture {data['capture']!r} is not an object")
            probe = cls(**{**data, "weights": np.asarray(data["weights"], dtype=np.float64)})
        except (KeyError, TypeError, ValueError, InputError) as e:  # (InputError: heads out of order, a length_norm)
            raise InputError(f"stored sentence probe is malformed ({e}); train and save it again") from None
        return probe


def train_probe(
    examples: Sequence[ProbeExample],
    heads: Sequence[tuple[int, int]],
    *,
    extras: Sequence[str] = DEFAULT_EXTRAS,
    l2: float = 10.0,
    length_norm: str = "sqrt",
    trained_on: str = "",
    capture: dict[str, Any] | None = None,
) -> SentenceProbe:
    """Fit the probe on labelled questions (features built as :func:`design`, z-scored per question);
    ``capture``: how the features were captured (:func:`probe_capture` of the pruner that read
    them; None: :data:`DEFAULT_CAPTURE`), recorded so that a pruner that reads them otherwise warns."""
    require("sklearn", "train", "Training the sentence probe")
    from sklearn.linear_model import LogisticRegression

    if not examples:
        raise InputError("no training questions; pass at least one ProbeExample")
    check_l2(l2)
    for ex in examples:
        if ex.head_scores.shape != (len(ex.positions), len(heads)):
            raise InputError(
                f"question {ex.qid!r}: head scores {ex.head_scores.shape} but {len(ex.positions)} "
                f"sentences and {len(heads)} heads; build every example with the same heads"
            )
        if len(ex.labels) != len(ex.positions):  # (two such questions could offset each other silently)
            raise InputError(
                f"question {ex.qid!r}: {len(ex.labels)} labels for {len(ex.positions)} sentences; give one label "
                "per sentence"
            )
    order = probe_order(heads)
    heads = [(int(heads[i][0]), int(heads[i][1])) for i in order]
    x = np.vstack([standardise(design(ex.head_scores[:, order], ex.positions, extras, ex.lexical)) for ex in examples])
    y = np.concatenate([np.asarray(ex.labels, dtype=bool) for ex in examples]).astype(int)
    if y.min() == y.max():
        raise InputError(
            f"all {len(y)} training sentences have the same label; the probe needs supporting and other sentences"
        )
    clf = LogisticRegression(C=1.0 / l2, max_iter=3000).fit(x, y)
    return SentenceProbe(
        clf.coef_[0].copy(),
        float(clf.intercept_[0]),
        format_heads(list(heads)).split(","),
        list(extras),
        length_norm,
        l2,
        trained_on or f"{len(examples)} questions",
        {},
        _dt.datetime.now().isoformat(timespec="seconds"),
        dict(capture or DEFAULT_CAPTURE),
    )


def probe_order(heads: Sequence[tuple[int, int]]) -> list[int]:
    """The order of ``heads``' columns in a probe: a probe keeps its heads sorted (``head_pairs``, as
    ``parse_heads`` returns them) and the pruner reads their scores in that order, so head scores
    given in another order are put in it (``head_scores[:, order]``) wherever a probe reads them."""
    pairs = [(int(layer), int(head)) for layer, head in heads]
    if len(set(pairs)) != len(pairs):
        raise InputError(f"heads {format_heads(pairs)} repeat a head; give each (layer, head) once")
    return sorted(range(len(pairs)), key=lambda i: pairs[i])


def _held_out_scores(probe: SentenceProbe, ex: ProbeExample, order: list[int]) -> np.ndarray:
    """``probe``'s scores of ``ex``'s sentences, its head scores (in the caller's head order) in the probe's."""
    return probe.score(ex.head_scores[:, order], ex.positions, ex.lexical)


def _folds(n: int, folds: int, seed: int) -> list[list[int]]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [order[f::folds] for f in range(folds)]


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mean precision at each supporting sentence's rank (scores descending); 0 without any."""
    hits = np.asarray(labels, dtype=bool)[np.argsort(-np.asarray(scores), kind="stable")]
    if not hits.any():
        return 0.0
    return float((np.cumsum(hits)[hits] / (np.flatnonzero(hits) + 1)).mean())


def select_l2(
    examples: Sequence[ProbeExample],
    heads: Sequence[tuple[int, int]],
    grid: Sequence[float],
    *,
    folds: int = INNER_FOLDS,
    seed: int = 0,
    **train_kw: Any,
) -> float:
    """The L2 penalty of ``grid`` with the best mean average precision of the supporting
    sentences under ``folds``-fold cross-validation over ``examples`` (ties: the larger penalty)."""
    check_folds(folds, len(examples), "questions")
    order = probe_order(heads)
    parts = _folds(len(examples), folds, seed)
    best: tuple[float, float] | None = None
    for l2 in sorted(grid, reverse=True):
        ap = []
        for test in parts:
            probe = train_probe(
                [examples[i] for i in range(len(examples)) if i not in set(test)], heads, l2=l2, **train_kw
            )
            ap += [average_precision(_held_out_scores(probe, examples[i], order), examples[i].labels) for i in test]
        if best is None or np.mean(ap) > best[0] + 1e-12:
            best = (float(np.mean(ap)), l2)
    if best is None:
        raise InputError("select_l2 needs a non-empty grid of L2 penalties")
    return best[1]


def crossfit_scores(
    examples: Sequence[ProbeExample],
    heads: Sequence[tuple[int, int]],
    *,
    folds: int = 5,
    seed: int = 0,
    l2: float | Sequence[float] = 10.0,
    **train_kw: Any,
) -> dict[str, np.ndarray]:
    """Held-out probe scores for every question: ``folds`` folds over questions (shuffled with ``seed``),
    each fold scored by a probe trained on the other folds only. With a grid of ``l2`` values the
    penalty is chosen inside each training part (:func:`select_l2`), never on the scored fold."""
    check_folds(folds, len(examples), "questions")
    check_unique_queries(examples)
    order = probe_order(heads)
    smallest = len(examples) - -(-len(examples) // folds)  # the training part beside the largest fold
    if not isinstance(l2, (int, float)) and smallest < INNER_FOLDS:
        raise InputError(
            f"a grid of l2 values is chosen by {INNER_FOLDS}-fold cross-validation inside each training part, and "
            f"{len(examples)} questions in {folds} folds leave {smallest} to train on; give more questions, "
            "fewer folds or one l2 value"
        )
    out: dict[str, np.ndarray] = {}
    for test in _folds(len(examples), folds, seed):
        train = [examples[i] for i in range(len(examples)) if i not in set(test)]
        penalty = float(l2) if isinstance(l2, (int, float)) else select_l2(train, heads, l2, seed=seed, **train_kw)
        probe = train_probe(train, heads, l2=penalty, **train_kw)
        for i in test:
            out[examples[i].qid] = _held_out_scores(probe, examples[i], order)
    return out
