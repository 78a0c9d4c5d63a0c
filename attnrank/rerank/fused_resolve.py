"""Which fused weights (:mod:`attnrank.rerank.fused`) a reranker scores by, for each ``signals``
setting of :class:`~attnrank.rerank.config.RerankConfig`: a user's registered weights, the ones
shipped for the packaged model, or the untrained equal weights.

- ``"auto"`` (preset ``fused``): :class:`~attnrank.rerank.fused.FusedWeights` registered for the
  model, else the packaged model's;
- ``"only"`` (preset ``signals``): :func:`signals_only`, a user's
  :class:`~attnrank.rerank.fused.SignalsWeights` or their fused weights' model without attention;
- ``"likelihood"`` (the default preset ``likelihood``): :func:`likelihood_weights`.

A user's weights come from ``attnrank train`` on their own labelled queries. Shipped weights are
never used in place of the untrained ones where equal weights transferred better held out
(docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..config import DEFAULT_LLM
from ..errors import InputError
from ..registry import load_artifact, shipped_artifact
from .fused import (
    LIKELIHOOD_FEATURES,
    LLM_FEATURES,
    SIGNALS_LIKELIHOOD,
    SIGNALS_ONLY,
    UNTRAINED,
    FusedWeights,
    LikelihoodWeights,
    SignalsWeights,
    equal_weights,
)

logger = logging.getLogger(__name__)


def signals_only(model_id: str, fingerprint: str) -> FusedWeights:
    """The model of ``signals="only"``: the :class:`~attnrank.rerank.fused.SignalsWeights` a user
    registered for this model (``attnrank train --preset signals``), else the model without
    attention of the fused weights they registered (``attnrank train --preset fused``) unless their
    held-out report scored it below equal weights, else :func:`equal_weights` (the shipped weights'
    base model is not used: trained on other datasets, it transferred worse than equal weights)."""
    own = load_artifact(SignalsWeights.KIND, model_id, fingerprint, user_only=True)
    if own is not None:
        weights = _stored(SignalsWeights, own, f"the first-stage signal weights registered for {model_id}")
        logger.info(
            "preset signals scores by the weights registered for %s (trained on %s)", model_id, weights.trained_on
        )
        return weights
    registered = load_artifact(FusedWeights.KIND, model_id, fingerprint, user_only=True)
    if registered is None:
        return equal_weights()
    fused = _stored(FusedWeights, registered, f"the fused weights registered for {model_id}")
    if fused.uses_attention and not fused.base_weights:  # e.g. saved from Python without a fallback
        logger.warning(
            "the fused weights registered for %s hold no model without attention (base_weights): the "
            "preset signals uses equal weights; retrain them with `attnrank train --preset fused`, or train its "
            "own with --preset signals",
            model_id,
        )
        return equal_weights()
    if fused.base_scored_below_equal():  # the rule of --preset signals: never registered below equal weights
        logger.info(
            "preset signals keeps equal weights for %s: the model without attention of its registered fused "
            "weights scored below them in their held-out report",
            model_id,
        )
        return equal_weights()
    base = fused.without_attention()
    if base.uses_llm:  # (the query likelihood: the preset that runs no model would load and run one)
        logger.warning(
            "preset signals keeps equal weights for %s: the model without attention of its registered fused "
            "weights reads %s, an LLM feature, and preset signals runs no LLM; use preset likelihood for those",
            model_id,
            [f for f in base.features if f in LLM_FEATURES],
        )
        return equal_weights()
    return base


def likelihood_weights(model_id: str, fingerprint: str) -> FusedWeights:
    """The model of ``signals="likelihood"`` (the default preset): the
    :class:`~attnrank.rerank.fused.LikelihoodWeights` a user registered for this model
    (``attnrank train``), else equal weights over BM25, dense and the query likelihood (nothing
    ships: trained on the other datasets, no fusion beat them held out, docs/results/likelihood.md)."""
    registered = load_artifact(LikelihoodWeights.KIND, model_id, fingerprint, user_only=True)
    if registered is None:
        return equal_weights(LIKELIHOOD_FEATURES)
    weights = _stored(LikelihoodWeights, registered, f"the query-likelihood weights registered for {model_id}")
    logger.info(
        "preset likelihood scores by the weights registered for %s (trained on %s), not equal weights",
        model_id,
        weights.trained_on,
    )
    return weights


def current_label(resolve: Callable[[str, str], FusedWeights], model_id: str, fingerprint: str) -> str:
    """How a report names what ``resolve`` (:func:`signals_only`, :func:`likelihood_weights`) gives
    the model now: its untrained equal weights, or a user's registered ones (what they were trained
    on); registered weights that do not load are named so (training replaces them), not raised."""
    try:
        weights = resolve(model_id, fingerprint)
    except InputError as e:
        return f"registered weights, which do not load ({e})"
    return (
        "equal weights" if weights.trained_on == UNTRAINED else f"registered weights (trained on {weights.trained_on})"
    )


def fitted_heads(model_id: str, fingerprint: str) -> list[str] | str | None:
    """The heads that the fused weights registered (or shipped) for exactly this model read, or
    None (none registered, none recorded, or no attention feature): what preset ``fused`` reads
    under its default heads."""
    stored = load_artifact(FusedWeights.KIND, model_id, fingerprint)
    if stored is None:
        return None
    fused = FusedWeights.from_json(stored)
    return fused.heads if fused.uses_attention else None


def resolve_fused(signals: Any, model_id: str, fingerprint: str, adapter: str | None = None) -> FusedWeights | None:
    """``signals``: None (attention alone), a :class:`FusedWeights`, ``"only"`` (:func:`signals_only`),
    ``"likelihood"`` (:func:`likelihood_weights`) or ``"auto"``: the weights registered for this
    model, else the ones shipped for the packaged model (logged: features are z-scored per query,
    so they transfer, but they were not trained on this model's attention). ``adapter``: the head
    adapter of the loaded model (None: not loaded), which weights given or registered for it must
    have been fitted with (:meth:`FusedWeights.check_adapter`)."""
    found = _for_this_model(signals, model_id, fingerprint)
    if found is not None and adapter is not None:
        found.check_adapter(adapter)
    if found is not None or signals is None or signals in (SIGNALS_ONLY, SIGNALS_LIKELIHOOD):
        return found
    payload = shipped_artifact(FusedWeights.KIND, DEFAULT_LLM)
    if payload is None:
        return FusedWeights.load(model_id, fingerprint)  # raises: none registered, none shipped
    logger.warning(
        "no fused weights are registered for %s: using those trained for the packaged %s (over the "
        "reranker's own heads, not theirs); train your own with `attnrank train --preset fused`",
        model_id,
        DEFAULT_LLM,
    )
    shipped = _stored(FusedWeights, payload, f"the fused weights shipped for {DEFAULT_LLM}")
    return replace(shipped, heads=None)  # another model's heads need not exist in this one


def _for_this_model(signals: Any, model_id: str, fingerprint: str) -> FusedWeights | None:
    """The weights of ``signals`` given, or registered for this model (or the untrained equal
    weights of ``"only"``/``"likelihood"``); None for attention alone or where ``"auto"`` finds none."""
    if signals is None or isinstance(signals, FusedWeights):
        return signals
    if signals == SIGNALS_ONLY:
        return signals_only(model_id, fingerprint)
    if signals == SIGNALS_LIKELIHOOD:
        return likelihood_weights(model_id, fingerprint)
    registered = load_artifact(FusedWeights.KIND, model_id, fingerprint)
    if registered is None:
        return None
    # Registered ones that do not load (malformed, other features) are an error, not a reason
    # to score with another model's weights in their place.
    return _stored(FusedWeights, registered, f"the fused weights registered for {model_id}")


def _stored(kind: type[FusedWeights], payload: dict[str, Any], source: str) -> FusedWeights:
    """Stored weights of ``kind`` (registered or shipped), with a warning if fitted to other signals."""
    fused = kind.from_json(payload)
    fused.warn_if_stale(source)
    return fused
