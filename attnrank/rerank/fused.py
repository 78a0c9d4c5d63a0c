"""The fused scorer: attention combined with the first stage's signals, trained across datasets.

An attention score from a small model is a noisy relevance signal: on some data it adds to the
first stage, on other data it ranks below plain BM25 (docs/benchmarks.md). The fused scorer
therefore never scores with attention alone. For each query it z-scores, over that query's
candidates, the features

- ``attention``: the reranker's own attention score (the selected heads' calibrated ICR score);
- ``bm25``, ``dense``, ``rank``: the first-stage signals of :mod:`attnrank.rerank.signals`,
  computed over the candidate texts, so a bare TREC run or plain list gets them too;
- ``likelihood`` (only in weights that name it): the LLM's query likelihood given each passage
  (UPR, :mod:`attnrank.rerank.likelihood`), not an attention score;

and scores ``s(d) = w · z(d)`` with ``w >= 0`` (every feature is a relevance estimate; a negative
weight only fits one training set's collinearity, e.g. one BM25 against another). ``w`` is learned
on the labelled queries of several datasets, pooled (``balance``: each dataset given equal say):

- ``pointwise`` (default): L2-regularised logistic regression, relevant vs not;
- ``pairwise``: RankNet with a linear scorer (logistic regression on feature differences);
- ``listwise``: the grid point of the simplex (steps of 1/10) with the best mean nDCG@10, averaged
  per dataset and then over datasets — a direct optimisation of the metric;
- ``equal``: weight 1 on every feature, nothing fitted (only the gate, if any, is chosen on the
  labelled queries).

**Fallback** (``gate``, on by default: it measured best held out with 100 SciFact queries; trained
with 400, no gate scored best, so the shipped weights have none). The same model is also trained without the attention
feature (``base_weights``); a query whose attention is not confident — its ``confidence``
(:func:`~attnrank.rerank.fused_features.attention_confidence`) below ``gate`` — is scored by the
base model alone, i.e. by the weights' other features (the first-stage signals, and the query
likelihood where they read it).
``gate`` is the threshold that scores best on the training queries.

**Untrained** (:func:`equal_weights`): weight 1 on z(BM25) and z(dense). The preset ``signals``
uses it unless a user has registered :class:`SignalsWeights` or fused weights for the model: left out of training and tested
on each dataset in turn, it transferred better than weights trained on the others. The default
preset ``likelihood`` adds z(likelihood) with weight 1 (docs/results/likelihood.md), unless a user
has registered :class:`LikelihoodWeights` for the model (``attnrank train``). Which weights a
reranker reads: :mod:`attnrank.rerank.fused_resolve`. Which model, features and fallback each
preset uses was chosen by leave-one-dataset-out evaluation (``scripts/bench_fusion.py``,
docs/benchmarks.md). The per-query features: :mod:`attnrank.rerank.fused_features`; training:
:mod:`attnrank.rerank.fused_training`; the warnings of weights applied otherwise than fitted:
:mod:`attnrank.rerank.fused_checks`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..artifacts import RegistryArtifact
from ..errors import InputError
from ..llm.headspec import format_heads, parse_heads
from .fused_checks import AppliedOtherwise
from .fused_features import attention_confidence, feature_matrix
from .signals import SIGNALS, SIGNALS_VERSION

logger = logging.getLogger(__name__)

ATTENTION = "attention"
LIKELIHOOD = "likelihood"  # the LLM's query likelihood (attnrank.rerank.likelihood)
FUSED_STAGE = "fused"  # the stage name of fused results (their attention score stays under ATTENTION)
FEATURES = (ATTENTION, *SIGNALS)  # what training fits by default
KNOWN_FEATURES = (*FEATURES, LIKELIHOOD)  # what weights may name
LLM_FEATURES = (ATTENTION, LIKELIHOOD)  # computed by the LLM, not from the candidate texts alone
SIGNALS_AUTO = "auto"  # RerankConfig.signals: the registered (else shipped) weights, with attention
SIGNALS_ONLY = "only"  # ... the signals alone: signals_only
SIGNALS_LIKELIHOOD = "likelihood"  # ... the query likelihood with them, no attention: likelihood_weights


@dataclass
class FusedWeights(AppliedOtherwise, RegistryArtifact):
    """Linear weights over per-query z-scored ``features`` (and ``base_weights`` over the same
    features without ``attention``, used when the attention confidence is below ``gate``)."""

    KIND: ClassVar[str] = "fused-weights"
    LABEL: ClassVar[str] = "fused scorer weights"
    HINT: ClassVar[str] = "train them with `attnrank train --preset fused`, or use signals=None (--signals none)"
    TRAIN: ClassVar[str] = "`attnrank train --preset fused`"  # what fits them, for the messages
    RENAMED: ClassVar[dict[str, str]] = {"model": "learner"}  # (before 2026-12-05)

    features: list[str]
    weights: list[float]
    base_weights: list[float] = field(default_factory=list)
    gate: float | None = None
    # the fewest and most candidates per query the gate was chosen on (None: not recorded): a query's
    # confidence grows with its number of candidates, so the gate reads lists of other lengths otherwise
    gate_candidates: list[int] | None = None
    learner: str = "pointwise"
    l2: float = 1.0
    trained_on: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    embedder: str | None = None  # whose cosines the dense weight was fitted to (None: the packaged MiniLM)
    signals_version: int | None = None  # the signals' SIGNALS_VERSION they were fitted to (None: not recorded)
    # the candidate BM25's stemmer they were fitted to ("porter", "none"; None: not recorded)
    bm25_stemmer: str | None = None
    heads: list[str] | str | None = None  # the attention feature's heads ("l-h" or "all"; None: not recorded)
    capture: str | None = None  # how that attention was captured (llm.blocks.capture_name; None: not recorded)
    max_doc_words: int | None = None  # the passage cut (words) their LLM feature was read with (None: not recorded)
    # the token cut beside it (None: none; recorded with max_doc_words, read only where that is recorded)
    max_doc_tokens: int | None = None
    # the version of attnrank's scoring (rerank.versions.SCORING_VERSION) their LLM feature was read with
    scoring_version: int | None = None
    adapter: str = ""  # the head adapter merged into the model their LLM feature came from (LLM.adapter; "": none)
    # the prompt their attention feature was read from (RerankConfig.prompt_settings; None: not recorded)
    prompt: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        unknown = [f for f in self.features if f not in KNOWN_FEATURES]
        if unknown or len(set(self.features)) != len(self.features) or len(self.weights) != len(self.features):
            raise InputError(
                f"fused weights over {self.features} with {len(self.weights)} weights; the features must be "
                f"among {KNOWN_FEATURES}, each once, one weight each; retrain them with {self.TRAIN}"
            )
        # Checked here, not when a query falls below the gate: a wrong base model would otherwise
        # fail (or score NaN) only on the rare low-confidence query.
        if self.base_weights and len(self.base_weights) != len(self.base_features):
            raise InputError(
                f"fused base_weights has {len(self.base_weights)} weights for the {len(self.base_features)} "
                f"features {self.base_features}; give one each (or none); retrain them with {self.TRAIN}"
            )
        values = [*self.weights, *self.base_weights, *([] if self.gate is None else [self.gate])]
        # numbers only: asarray would read "0.5" from a hand-edited file, which then fails at a query
        numbers = all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values)
        if not numbers or not np.isfinite(np.asarray(values, dtype=np.float64)).all():
            raise InputError(
                f"fused weights {self.weights}, base_weights {self.base_weights} or gate {self.gate} are not "
                f"all finite numbers; retrain them with {self.TRAIN}"
            )
        if self.heads is not None:
            if not self.uses_attention:
                raise InputError(
                    f"fused weights over {self.features} record heads {self.heads!r}, but only the attention "
                    f"feature reads heads; drop them, or retrain the weights with {self.TRAIN}"
                )
            pairs = parse_heads(self.heads)  # checked on load, not at the first query
            self.heads = "all" if pairs is None else format_heads(pairs).split(",")
        counts = self.gate_candidates
        if counts is not None and not (
            isinstance(counts, list)
            and len(counts) == 2
            and all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts)
            and counts[0] <= counts[1]
        ):
            raise InputError(
                f"fused gate_candidates={counts!r} is not [fewest, most] candidates per query; retrain them with {self.TRAIN}"
            )
        if self.gate is not None and not (self.uses_attention and self.base_weights):
            raise InputError(
                f"fused gate={self.gate} falls back to base_weights, which these weights over {self.features} "
                "lack; give base_weights over the features without attention, or gate=None"
            )

    @property
    def uses_attention(self) -> bool:
        return ATTENTION in self.features

    @property
    def uses_llm(self) -> bool:
        """Whether a feature needs the LLM (attention, or the query likelihood)."""
        return any(f in LLM_FEATURES for f in self.features)

    @property
    def text_signals(self) -> list[str]:
        """The features computed from the candidate texts alone (:mod:`attnrank.rerank.signals`)."""
        return [f for f in self.features if f not in LLM_FEATURES]

    @property
    def base_features(self) -> list[str]:
        return [f for f in self.features if f != ATTENTION]

    def confident(self, signals: Mapping[str, Any]) -> bool | None:
        """Whether attention is used for this query (None: no gate, always). Warned once where the
        query has fewer or more candidates than any the gate was chosen on: the top z-score of
        ``n`` candidates is at most ``sqrt(n - 1)`` and grows with ``n`` even on noise."""
        if not (self.uses_attention and self.gate is not None and self.base_weights):
            return None
        n = len(signals[ATTENTION])
        fitted = self.gate_candidates
        if fitted and not fitted[0] <= n <= fitted[-1] and not getattr(self, "_told_candidates", False):
            self._told_candidates = True
            logger.warning(
                "the fused weights' confidence gate (%.3g) was chosen on queries of %s candidates; this one has %d, "
                "whose top attention z-score reads otherwise (it grows with the number of candidates, and cannot "
                "pass %.3g below %d), so attention is used or set aside unlike in training; rerank as many "
                "candidates as it was trained on (--depth), or retrain them with %s at this depth",
                self.gate,
                fitted[0] if fitted[0] == fitted[-1] else f"{fitted[0]}-{fitted[-1]}",
                n,
                self.gate,
                math.ceil(self.gate**2 + 1),
                self.TRAIN,
            )
        return attention_confidence(signals[ATTENTION]) >= self.gate

    def base_scored_below_equal(self) -> bool:
        """Whether the held-out report these weights were registered with (``metrics``, written by
        ``attnrank train --preset fused``) scored their model without attention below the untrained
        equal weights over the same signals; False where it does not record both."""
        held = self.metrics.get("heldout", {}) if isinstance(self.metrics, dict) else {}
        try:
            return float(held[NO_ATTENTION]["nDCG@10"]) < float(held[EQUAL_SIGNALS]["nDCG@10"])
        except (KeyError, TypeError, ValueError):
            return False

    def without_attention(self) -> FusedWeights:
        """The model the gate falls back to, on its own: ``base_weights`` over the first-stage
        signals, no gate (these weights themselves if they do not use attention)."""
        if not self.uses_attention:
            return self
        if not self.base_weights:
            raise InputError(
                f"these fused weights over {self.features} hold no model without attention (base_weights); "
                f"retrain them with {self.TRAIN} (it fits one alongside)"
            )
        return FusedWeights(
            self.base_features,
            list(self.base_weights),
            learner=self.learner,
            l2=self.l2,
            trained_on=self.trained_on,
            date=self.date,
            embedder=self.embedder,
            signals_version=self.signals_version,
            bm25_stemmer=self.bm25_stemmer,
            max_doc_words=self.max_doc_words,  # (the cut a likelihood among the base features was read with)
            max_doc_tokens=self.max_doc_tokens,
            scoring_version=self.scoring_version,
            adapter=self.adapter,
        )

    def score(self, signals: Mapping[str, Any]) -> np.ndarray:
        """Scores of one query's candidates from ``{feature: values}`` (input order)."""
        if self.confident(signals) is False:
            return feature_matrix(signals, self.base_features) @ np.asarray(self.base_weights)
        return feature_matrix(signals, self.features) @ np.asarray(self.weights)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FusedWeights:
        try:
            weights = cls(**cls.current_fields(data))
        except TypeError as e:
            raise InputError(f"stored {cls.LABEL} are malformed ({e}); retrain them with {cls.TRAIN}") from None
        if weights.base_weights and not any(weights.base_weights):  # registered before 2026-12-05, when
            # training still kept them: the fallback is dropped (as training now does), not the weights
            logger.warning(
                "the stored %s' model without attention is all 0: not used (the preset signals uses equal weights, "
                "and there is no gate); retrain them with %s",
                cls.LABEL,
                cls.TRAIN,
            )
            weights.base_weights, weights.gate = [], None
        weights.check_informative()
        return weights

    def check_informative(self) -> None:
        """Refuse weights that are all 0 (a fit in which every feature came out negative): they
        rank every candidate alike, so registered they would replace a preset with tie-breaking."""
        if not any(self.weights):
            raise InputError(
                f"{self.LABEL} {self.weights} over {self.features} are all 0: they would rank every candidate "
                f"alike; retrain them with {self.TRAIN} on more labelled queries"
            )
        base = self.base_weights
        if base and not any(base):  # the fallback of the gate and of the preset signals
            raise InputError(
                f"the base_weights {base} of these {self.LABEL}, over {self.base_features} are all 0: the model without "
                f"attention would rank every candidate alike; retrain them with {self.TRAIN} on more labelled queries"
            )

    def save(self, model_id: str, fingerprint: str, *, root: Path | None = None) -> Path:
        """Register these weights for the model (:meth:`check_informative` first); refused for
        weights whose LLM feature came from a model with a head adapter merged in (the registry
        keys weights by the base model's fingerprint, which the adapted copy keeps)."""
        self.check_informative()
        if self.adapter and self.uses_llm:
            raise InputError(
                f"these {self.LABEL} were fitted to the LLM feature of {model_id!r} with the head adapter "
                f"{self.adapter} merged in, and the registry keys weights by the base model's fingerprint; pass "
                "them as signals= instead, or fit them on the model without the adapter"
            )
        return super().save(model_id, fingerprint, root=root)

    def check_adapter(self, adapter: str) -> None:
        """Refuse to score on a model whose head adapter (``adapter``, ``""``: none) is not the one
        the LLM feature of these weights came from (its attention or likelihood is another model's);
        untrained equal weights fit every model."""
        if self.uses_llm and adapter != self.adapter and self.trained_on != UNTRAINED:
            had = f"with the head adapter {self.adapter}" if self.adapter else "without a head adapter"
            has = f"has the head adapter {adapter}" if adapter else "has none"
            raise InputError(
                f"these {self.LABEL} were fitted to the LLM feature of a model {had}, and this model {has}; "
                f"fit them on this model ({self.TRAIN})"
            )


@dataclass
class LikelihoodWeights(FusedWeights):
    """Fused weights over the query likelihood and first-stage signals, no attention, that a user
    trained on their own labelled queries (``attnrank train``, default preset): the model the
    preset ``likelihood`` scores by once registered, in place of its untrained equal weights.
    Registered apart from :class:`FusedWeights` (another ``KIND``), so training one preset never
    replaces the other's weights."""

    KIND: ClassVar[str] = "likelihood-weights"
    LABEL: ClassVar[str] = "query-likelihood fusion weights"
    HINT: ClassVar[str] = "train them with `attnrank train` (preset likelihood)"
    TRAIN: ClassVar[str] = "`attnrank train`"

    def __post_init__(self) -> None:
        super().__post_init__()
        if LIKELIHOOD not in self.features or self.uses_attention:
            raise InputError(
                f"query-likelihood weights over {self.features}: they must read {LIKELIHOOD!r} and not "
                f"{ATTENTION!r}; retrain them with {self.TRAIN}"
            )


@dataclass
class SignalsWeights(FusedWeights):
    """Fused weights over the first-stage signals alone (no LLM feature) that a user trained on
    their own labelled queries (``attnrank train --preset signals``, no model run): the model the
    preset ``signals`` scores by once registered, before the model without attention of registered
    :class:`FusedWeights` and the untrained equal weights."""

    KIND: ClassVar[str] = "signals-weights"
    LABEL: ClassVar[str] = "first-stage signal weights"
    HINT: ClassVar[str] = "train them with `attnrank train --preset signals`"
    TRAIN: ClassVar[str] = "`attnrank train --preset signals`"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.uses_llm:
            raise InputError(
                f"first-stage signal weights over {self.features}: they must read none of {LLM_FEATURES}; "
                f"retrain them with {self.TRAIN}"
            )


# the k-fold report's rows (attnrank.rerank.fusion_eval) that base_scored_below_equal compares
NO_ATTENTION = "fused without attention"
EQUAL_SIGNALS = "equal weights, no attention (untrained)"  # the preset signals where no weights are registered
UNTRAINED = "nothing: equal weights"  # what equal weights say they were trained on
EQUAL_FEATURES = ("bm25", "dense")
LIKELIHOOD_FEATURES = ("bm25", "dense", LIKELIHOOD)  # the preset likelihood's, untrained
LIKELIHOOD_TRAINED = (*SIGNALS, LIKELIHOOD)  # what `attnrank train` fits for it (with the first-stage rank)


def equal_weights(features: Sequence[str] = EQUAL_FEATURES) -> FusedWeights:
    """Weight 1 on each of ``features``' per-query z-scores (CombSUM over z-scored scores, Fox and
    Shaw TREC-2 1993, with z-score normalisation): nothing trained, so nothing learned on other
    data can fail to transfer. With BM25 and dense it is the ``signals`` preset's model where no
    signal or fused weights are registered for the model (:func:`~attnrank.rerank.fused_resolve.signals_only`);
    with the query likelihood too (:data:`LIKELIHOOD_FEATURES`), the default preset ``likelihood``'s
    where no :class:`LikelihoodWeights` are.

    Why: left out of training and tested on each of four datasets in turn, it scored at or above the
    trained weights' model without attention on all four (58 queries won, 34 lost, sign test p 0.016;
    ``docs/results/fusion_fixed-weights.md``)."""
    return FusedWeights(
        list(features),
        [1.0] * len(features),
        learner="equal",
        trained_on=UNTRAINED,
        signals_version=SIGNALS_VERSION,
    )
