"""Which of :class:`~attnrank.rerank.config.RerankConfig`'s fields each part of reranking reads,
and what its ``signals`` setting computes: the fields only attention reads (refused where
``signals`` computes none), those the query likelihood reads too, those that name what a
configuration computes, and those that build the attention prompt; ``signals`` as the
configuration holds it, and whether a setting computes attention or reads the query likelihood."""

from __future__ import annotations

from typing import Any

from .fused import LIKELIHOOD, SIGNALS_AUTO, SIGNALS_LIKELIHOOD, SIGNALS_ONLY, FusedWeights

# Fields only attention reads: with signals="only" or "likelihood" a value other than the default would be ignored.
ATTENTION_FIELDS = (
    "heads",
    "scorer",
    "calibrate",
    "token_filter",
    "query_span",
    "reweight",
    "slot_profile",
    "instruction",
    "order",
    "max_doc_words",
    "max_doc_tokens",
    "max_prompt_tokens",
    "attention",
    "block_positions",
    "passage_states",
)
SIGNALS_SETTINGS = (None, SIGNALS_AUTO, SIGNALS_ONLY, SIGNALS_LIKELIHOOD)  # and FusedWeights
# Attention fields the query likelihood reads too: it cuts the passages of its prompts the same way.
LIKELIHOOD_FIELDS = ("max_doc_words", "max_doc_tokens")
# What a reranker computes, beyond how it reads it (cuts, prompt wording, calibration): a preset
# with another of these is named for the preset it then equals (RerankConfig.with_options).
METHOD_FIELDS = ("signals", "heads", "scorer", "reweight", "attention", "block_positions")
# How the attention prompt is built and read: weights fitted to its scores record them where
# their trainer is given them (RerankConfig.prompt_settings; the CLI and the ship scripts give
# them), and warn where a reranker sets them otherwise.
PROMPT_FIELDS = ("instruction", "order", "query_span", "calibrate", "token_filter", "max_doc_words", "max_doc_tokens")


def signals_setting(value: Any) -> Any:
    """``signals`` as the configuration holds it: the word ``"none"`` (any case, as the CLI and
    YAML give it) is None, attention alone; anything else as given."""
    return None if isinstance(value, str) and value.strip().lower() == "none" else value


def plain_heads(heads: Any) -> Any:
    """``heads`` as the configuration holds it: a NumPy array of ``(layer, head)`` rows (or any
    array with ``tolist``) as a list of lists, whose comparisons are plain truth values (an array's
    ``!=`` is one per element, which raised deep in the choice of a preset); anything else as given."""
    tolist = getattr(heads, "tolist", None)
    return tolist() if callable(tolist) and not isinstance(heads, (str, bytes)) else heads


def reads_likelihood(signals: Any) -> bool:
    """Whether ``signals`` (as the configuration holds it) reads the LLM's query likelihood."""
    if isinstance(signals, FusedWeights):
        return LIKELIHOOD in signals.features
    return signals == SIGNALS_LIKELIHOOD


def computes_attention(signals: Any) -> bool:
    """Whether ``signals`` (as the configuration holds it) computes attention."""
    if isinstance(signals, FusedWeights):
        return signals.uses_attention
    return signals not in (SIGNALS_ONLY, SIGNALS_LIKELIHOOD)


def method_of(cfg: Any) -> tuple[Any, ...]:
    """A :class:`~attnrank.rerank.config.RerankConfig`'s :data:`METHOD_FIELDS` (what it computes),
    its fused weights as the setting they stand in for (weights without attention read as
    ``signals`` or ``likelihood`` does, with it as ``auto``)."""
    signals = cfg.signals
    if isinstance(signals, FusedWeights):
        reads = SIGNALS_LIKELIHOOD if reads_likelihood(signals) else SIGNALS_ONLY
        signals = SIGNALS_AUTO if signals.uses_attention else reads
    heads = cfg.heads
    if heads is None or (isinstance(heads, str) and heads.strip().lower() == "all"):  # every head, however spelt
        heads = "all"
    # (block positions where blocks are read: preset fused with the full prompt computes the full prompt)
    rest = [cfg.block_positions_read if f == "block_positions" else getattr(cfg, f) for f in METHOD_FIELDS[2:]]
    if not isinstance(rest[0], str):  # learned head weights given: the scorer they stand in for
        rest[0] = "learned"
    return (signals, heads, *rest)
