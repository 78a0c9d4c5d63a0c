"""What a :class:`~attnrank.rerank.config.RerankConfig`'s names resolve to for one model: the head
set (``"auto"``, ``"auto:METHOD"``, ``"auto-or-all"``) and the head scorer (``"sum"``, ``"learned"``)."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import InputError
from ..llm.headspec import HeadsArg
from ..llm.models import LLM
from ..registry import resolve_heads
from .config import AUTO_OR_ALL
from .learned import LearnedHeadWeights

logger = logging.getLogger(__name__)


def resolve_config_heads(heads: HeadsArg, llm: LLM, fitted: HeadsArg = None) -> HeadsArg:
    """Registered sets for ``"auto"``/``"auto:METHOD"``; ``"auto-or-all"`` reads ``fitted`` (the
    heads the reranker's fused weights were fitted to) where given, else the registered set, and
    falls back to all heads (with a warning) for a model that has none registered."""
    if not isinstance(heads, str):
        return heads
    spec = heads.strip().lower()
    if spec == AUTO_OR_ALL and fitted is not None:
        count = "all" if fitted == "all" else len(fitted)  # type: ignore[arg-type]  # FusedWeights.heads: list or "all"
        logger.info("heads='%s' -> the %s heads the fused weights were fitted to", heads, count)
        return fitted
    if spec == AUTO_OR_ALL:
        try:
            return resolve_heads("auto", llm)
        except InputError:
            logger.warning(
                "no retrieval-head set is registered for %s: reranking with all heads (ICR); "
                "detect one with `attnrank heads detect`",
                llm.model_id,
            )
            return None
    return resolve_heads(heads, llm) if spec.startswith("auto") else heads


def learned_weights(scorer: Any, model_id: str, fingerprint: str) -> LearnedHeadWeights | None:
    """``scorer``: "sum" (ICR/QRHead head sum), "learned" (the model's registered
    :class:`~attnrank.rerank.learned.LearnedHeadWeights`) or such an object."""
    if isinstance(scorer, str) and scorer == "sum":
        return None
    if isinstance(scorer, LearnedHeadWeights):
        return scorer
    if scorer == "learned":
        return LearnedHeadWeights.load(model_id, fingerprint)
    raise InputError(f"scorer={scorer!r} is not 'sum', 'learned' or a LearnedHeadWeights")
