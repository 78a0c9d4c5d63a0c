"""What a :class:`~attnrank.rerank.config.RerankConfig`'s names resolve to for one model: the head
set (``"auto"``, ``"auto:METHOD"``, ``"auto-or-all"``) and the head scorer (``"sum"``, ``"learned"``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..errors import InputError, ModelError
from ..llm.headspec import HeadsArg, check_head_range, parse_heads
from ..llm.modelconfig import check_attention_architecture, model_shape
from ..llm.models import LLM, check_prompt_budget, unloaded_model
from ..llm.statestore import check_store_fits, store_folder
from ..llm.tokenizers import load_tokenizer
from ..registry import resolve_heads
from .config import AUTO_OR_ALL, RerankConfig
from .fused_resolve import resolve_fused
from .learned import LearnedHeadWeights
from .position import load_stored_profile
from .windows import check_frame

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRef:
    """A model by what the head registry keys it by, without its weights."""

    model_id: str
    fingerprint: str


def resolve_config_heads(heads: HeadsArg, llm: LLM | ModelRef, fitted: HeadsArg = None) -> HeadsArg:
    """Registered sets for ``"auto"``/``"auto:METHOD"``; ``"auto-or-all"`` reads ``fitted`` (the
    heads the reranker's fused weights were fitted to) where given, else the registered set, and
    falls back to all heads (with a warning) for a model that has none registered. ``llm``: the
    model, or its id and fingerprint only (:class:`ModelRef`)."""
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


def check_head_list(heads: Any, model: str | None) -> None:
    """An explicit head list or head file (not ``"all"``, nor a registered set's ``"auto…"``)
    read and checked against ``model``'s config alone, before any weights load: pairs outside
    the model are an :class:`InputError` naming them (the load found them, after it). A model
    whose config cannot be read here is left to the load, which names it."""
    word = heads.strip().lower() if isinstance(heads, str) else ""
    if heads is None or word in ("auto", AUTO_OR_ALL) or word.startswith("auto:"):
        return  # (registered sets: check_registered_heads; anything else, "autox" too, is read as a list)
    pairs = parse_heads(heads)
    shape = model_shape(model) if pairs else None
    if shape is not None:
        check_head_range(pairs or [], *shape)


def check_registered_heads(model: str | None, heads: Any) -> None:
    """An ``"auto"`` / ``"auto:METHOD"`` head spec's registered set, looked up by the model's id and
    fingerprint before anything loads (``"auto-or-all"`` falls back to every head; other specs
    read nothing); a model whose config cannot be read here is left to the load, which names it."""
    spec = heads.strip().lower() if isinstance(heads, str) else ""
    if not (spec == "auto" or spec.startswith("auto:")):
        return
    try:
        key = unloaded_model(model)
    except ModelError:
        return
    resolve_heads(heads, ModelRef(*key))


def check_lookups(cfg: RerankConfig, *, warn: bool = True) -> None:
    """Look up once, without loading the model, what a reranker built from ``cfg`` looks up in the
    head registry (learned head weights, fused weights, an ``"auto"`` head set, an ``"auto"`` slot
    profile) and its passage-state store's folder, so that a run of
    many rerankers (``attnrank batch``'s actors) with nothing registered fails before it starts,
    naming what is missing, as :class:`~attnrank.rerank.attention.AttentionReranker` would. A model
    whose config cannot be read here (a path only the workers have) is left to them, with a warning
    (``warn=False``: without one, for a reranker about to load the model itself)."""
    if not cfg.uses_llm:
        return
    store = None if cfg.passage_states is None else store_folder(cfg.passage_states)  # (was opened after the loads)
    try:
        model_id, fingerprint = unloaded_model(cfg.model)
    except ModelError as e:  # e.g. a path only the workers have: they will look it up themselves
        if warn:
            logger.warning("the registry lookups are left to the rerankers: %s", e)
        return
    if store is not None:  # (another model's or cut's store: named before the load, not after it)
        check_store_fits(store, fingerprint, cfg.max_doc_words, cfg.max_doc_tokens)
    learned = learned_weights(cfg.scorer, model_id, fingerprint)
    fused = resolve_fused(cfg.signals, model_id, fingerprint)
    if learned is None and cfg.uses_attention and (fused is None or fused.uses_attention):  # heads are read
        resolve_config_heads(cfg.heads, ModelRef(model_id, fingerprint), None if fused is None else fused.heads)
    if isinstance(cfg.slot_profile, str) and cfg.slot_profile == "auto":  # some profile of this calibration
        load_stored_profile(model_id, fingerprint, calibrated=cfg.calibrate)


def check_before_load(cfg: RerankConfig, llm: LLM | None) -> None:
    """What ``cfg`` alone tells before a model's weights load (``llm``: a model given loaded): a
    prompt budget past the model's context (untrained positions), what the registry lacks, and a
    budget that not even a one-word passage's prompt fits, read with the tokenizer alone
    (calibration's prompt may only add to that frame; weights that turn out to read no attention
    would never build one)."""
    if cfg.uses_attention:
        check_prompt_budget(cfg.max_prompt_tokens, llm or cfg.model)
    if llm is not None or not cfg.uses_llm:
        return
    if cfg.uses_attention:
        check_attention_architecture(cfg.model)  # (GPT-2's layers: refused at the first query, model loaded)
        check_head_list(cfg.heads, cfg.model)
    check_lookups(cfg, warn=False)
    check_window(cfg)


def check_window(cfg: RerankConfig) -> None:
    """Refuse a ``max_prompt_tokens`` that not even a one-word passage's prompt fits, read with the
    tokenizer alone: the calibration prompt's frame too where the head sum builds it (learned
    weights may fix calibration off; the frame without it was checked for every scorer, and a
    window 2 positions short of the calibration prompt passed, refused after the model loaded)."""
    if cfg.uses_attention and cfg.max_prompt_tokens is not None:
        check_frame(
            load_tokenizer(cfg.model),
            cfg.prompt_kw,
            cfg.max_prompt_tokens,
            calibrate=cfg.calibrate and isinstance(cfg.scorer, str) and cfg.scorer == "sum",
            block_positions=cfg.block_positions_read,
        )


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
