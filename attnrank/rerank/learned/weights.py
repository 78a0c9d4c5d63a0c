"""The saved object of learned head weighting, :class:`LearnedHeadWeights`: a linear scorer
over standardised features, stored per model in the head registry and applied to a reranker's
windows (the method: :mod:`attnrank.rerank.learned`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...artifacts import RegistryArtifact, warn_if_set_otherwise
from ...errors import InputError
from ...llm.headspec import format_heads, parse_heads
from ...llm.rows import window_features
from .features import Scores, feature_matrix

logger = logging.getLogger(__name__)

ARTIFACT = "head-weights"


@dataclass
class FeatureConfig:
    """How features were built: the heads (``"l-h"``, feature order), calibration, filter,
    layer limit, whether the first-stage score is a feature, the standardisation, how the
    attention was captured (:func:`~attnrank.llm.blocks.capture_name`; weights trained before it
    was recorded read full-prompt attention), the head adapter merged into the model the
    features came from (:attr:`LLM.adapter <attnrank.llm.models.LLM.adapter>`, ``""``: none) and
    the prompt the attention was read from (``prompt``:
    :meth:`~attnrank.rerank.config.RerankConfig.prompt_settings`, instruction, order, query span,
    calibration, token filter, passage cut; empty: not recorded). A reranker is warned where it
    sets the prompt otherwise; calibration and the filter are not checked, as the weights apply
    their own (``calibrate``, ``use_filter``)."""

    heads: list[str]
    calibrate: bool = True
    use_filter: bool = True
    max_layer: int | None = None
    first_stage: bool = False
    standardise: str = "per-query z-score"
    stages: list[str] = field(default_factory=list)
    capture: str = "full"
    adapter: str = ""
    prompt: dict[str, Any] = field(default_factory=dict)
    scoring_version: int | None = None  # rerank.versions.SCORING_VERSION of the features (None: not recorded)


@dataclass(eq=False)
class LearnedHeadWeights(RegistryArtifact):
    """A linear head weighting: ``score(d) = Σ_h w_h z_h(d) (+ w_fs z_fs(d)) (+ Σ_s w_s z_s(d)) + bias``
    (``s``: the ``config.stages`` scores, weights ``stage_weights``); stored
    with :meth:`save` / :meth:`load` in the head registry. Equal only to itself (its arrays have no
    one truth value: comparing two raised, and with them two configurations holding them)."""

    KIND: ClassVar[str] = ARTIFACT
    LABEL: ClassVar[str] = "learned head weights"
    HINT: ClassVar[str] = (
        "train them with `attnrank heads train --model MODEL` (or train_head_weights(...).save(model_id, "
        "fingerprint)), or use scorer='sum'"
    )
    RENAMED: ClassVar[dict[str, str]] = {"model": "learner"}  # (before 2026-12-05)

    weights: np.ndarray
    bias: float
    config: FeatureConfig
    learner: str = "pointwise"
    first_stage_weight: float = 0.0
    l2: float = 1.0
    trained_on: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    stage_weights: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Checked on load: weights that do not match their heads/stages would fail deep in scoring.
        self.weights = np.asarray(self.weights, dtype=np.float64)
        heads, stages = list(self.config.heads or []), list(self.config.stages)
        if not heads or self.weights.shape != (len(heads),) or len(self.stage_weights) != len(stages):
            raise InputError(
                f"learned head weights hold {self.weights.size} weights for {len(heads)} heads {heads[:8]} and "
                f"{len(self.stage_weights)} for the stages {stages}; need one per head and stage; retrain them"
            )
        if not np.isfinite([*self.weights, self.bias, self.first_stage_weight, *self.stage_weights]).all():
            raise InputError("learned head weights hold non-finite values (NaN or inf); retrain and save them")

    @property
    def heads(self) -> list[tuple[int, int]]:
        """The heads in the order of the weights (``config.heads`` as trained; ``parse_heads``
        of the whole list would sort them, and each weight would then read another head)."""
        return [(int(p[0]), int(p[1])) for h in self.config.heads or [] for p in parse_heads([h]) or []]

    def warn_if_captured_otherwise(self, capture: str) -> None:
        """Log a warning when a reranker captures attention otherwise (``capture``) than these
        weights' features were (block attention changes every head's scale): they still score,
        but not as they measured."""
        if capture != self.config.capture:
            logger.warning(
                "the learned head weights were trained on attention captured as %r; this reranker captures it "
                "as %r, so they do not score as they measured; use the attention options they record, or "
                "retrain them (attnrank heads train)",
                self.config.capture,
                capture,
            )

    def warn_if_prompted_otherwise(self, settings: dict[str, Any]) -> None:
        """Log a warning naming each prompt setting these weights' features were read with that a
        reranker's ``settings`` (:meth:`~attnrank.rerank.config.RerankConfig.prompt_settings`) give
        otherwise (calibration and the token filter excepted: the weights apply their own)."""
        fitted = {k: v for k, v in self.config.prompt.items() if k not in ("calibrate", "token_filter")}
        warn_if_set_otherwise(self.LABEL, fitted, settings, "attnrank heads train")

    def check_adapter(self, adapter: str) -> None:
        """Refuse to score on a model whose head adapter (``adapter``, ``""``: none) is not the
        one these weights' features were measured with: each head's scale and ranking change."""
        if adapter != self.config.adapter:
            had = f"with the head adapter {self.config.adapter}" if self.config.adapter else "without a head adapter"
            has = f"has the head adapter {adapter}" if adapter else "has none"
            raise InputError(
                f"the learned head weights were trained on the model {had}, and this one {has}; "
                "score on the model they were trained on, or retrain them on this one"
            )

    def save(self, model_id: str, fingerprint: str, *, root: Path | None = None) -> Path:
        """Register these weights for the model; refused for weights trained with a head adapter
        (the registry keys them by the base weights' fingerprint, whose heads they do not weigh:
        pass them to the reranker as ``scorer=`` instead), and for weights that are all 0 (every
        feature constant within each training query: they would rank every candidate alike, so
        registered they would replace the head sum with tie-breaking)."""
        w = np.concatenate([self.weights, [self.first_stage_weight], self.stage_weights])
        if not np.any(w):
            raise InputError(
                f"these {self.LABEL} are all 0: they would rank every candidate alike; retrain them on labelled "
                "queries whose candidates' head scores differ (more queries, or other heads)"
            )
        if self.config.adapter:
            raise InputError(
                f"these learned head weights were trained on {model_id!r} with the head adapter "
                f"{self.config.adapter} merged in, and the registry keys weights by the base model's fingerprint; "
                "pass them as AttentionReranker(scorer=weights) instead, or train on the model without the adapter"
            )
        return super().save(model_id, fingerprint, root=root)

    def fixed_options(self, calibrate: bool, token_filter: bool) -> tuple[bool, bool]:
        """The calibration and token filter these weights were trained with, which a reranker
        scoring with them uses; logged where the asked ``calibrate``/``token_filter`` differ."""
        fixed = (self.config.calibrate, self.config.use_filter)
        if fixed != (calibrate, token_filter):
            logger.warning(
                "the learned head weights were trained with calibrate=%s, token_filter=%s and score with "
                "them: calibrate=%s, token_filter=%s are not applied (use scorer='sum' for those)",
                *fixed,
                calibrate,
                token_filter,
            )
        return fixed

    def score_features(
        self, features: np.ndarray, first_stage: Scores | None = None, stages: Mapping[str, Scores] | None = None
    ) -> np.ndarray:
        """Scores of one query's candidates from raw ``features [D, H]`` (config head order),
        the first-stage scores and the earlier stages' scores by name (if the config uses them)."""
        x = feature_matrix(
            features, first_stage, stages, use_first_stage=self.config.first_stage, use_stages=self.config.stages
        )
        w = np.concatenate(
            [self.weights, [self.first_stage_weight] if self.config.first_stage else [], self.stage_weights]
        )
        return x @ w + self.bias

    def score_windows(
        self,
        windows: Sequence[Any],
        n_docs: int,
        head_list: Sequence[tuple[int, int]],
        first_stage: Scores | None = None,
        stages: Mapping[str, Scores] | None = None,
    ) -> np.ndarray:
        """Scores from a reranker's windows (rows in ``head_list`` order)."""
        order = [tuple(h) for h in head_list]
        missing = [h for h in self.heads if h not in order]
        if missing:
            raise InputError(
                f"the windows lack heads {format_heads(missing)} of the learned weights; "
                "capture them (AttentionReranker(scorer='learned') does)"
            )
        f = window_features(windows, n_docs, calibrate=self.config.calibrate, use_filter=self.config.use_filter)
        return self.score_features(f[[order.index(h) for h in self.heads]].T, first_stage, stages)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LearnedHeadWeights:
        try:
            kw = cls.current_fields(data)
            kw["weights"] = np.asarray(kw["weights"], dtype=np.float64)
            kw["config"] = FeatureConfig(**kw["config"])
            return cls(**kw)
        except (KeyError, TypeError, ValueError) as e:  # (ValueError: a weight that is no number)
            raise InputError(f"stored head weights are malformed ({e}); retrain and save them") from None
