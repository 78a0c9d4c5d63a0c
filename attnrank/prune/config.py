"""The context pruner's one configuration object (see :mod:`attnrank.rerank.config` for the
reranker's): the Python API, :class:`~attnrank.pipeline.Pipeline` and the CLI build a
:class:`~attnrank.prune.pruner.ContextPruner` from it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..config import check_flags
from ..errors import InputError
from ..llm.blocks import check_attention_mode, check_positions
from ..rerank.config_checks import (
    check_attention_inputs,
    check_fields,
    check_model_field,
    check_prompt_options,
    store_precision_names,
)
from ..types import is_count
from .segment import DEFAULT_MAX_WORDS

PRUNE_METHODS = ("query", "focus", "probe")
LENGTH_NORMS = ("sqrt", "none")
FOCUS_HINT = "The answer is"


@dataclass(frozen=True)
class PruneConfig:
    """Every option of attention-guided context pruning (:class:`~attnrank.prune.pruner.ContextPruner`).

    ``method``: ``"query"`` (ICR query-span attention), ``"focus"`` (AttentionRAG answer-hint token)
    or ``"probe"`` (the learned sentence probe; it fixes heads and length normalisation).
    ``heads``, ``calibrate``, ``token_filter``, ``instruction``, ``order``, ``max_prompt_tokens``,
    ``model``, ``device``, ``dtype``: as in :class:`RerankConfig`. ``length_norm``: sentence
    score divided by ``sqrt(tokens)`` or not; ``sink``: sink filtering of the sentence rows;
    ``focus_hint``: the answer hint of ``focus``; ``max_sentence_words``: longer sentences split.
    ``attention``, ``block_positions``, ``state_cache_mb``: block attention, as in
    :class:`RerankConfig` (in block mode every passage is one block of one prompt, never chunked:
    with ``"shared"`` positions each block reaches only the prefix's length plus its own, with
    ``"rotated"`` and ``"sequential"`` the blocks follow one another, and a context that reaches
    past ``max_prompt_tokens`` is refused, where full attention scores it in chunks).
    """

    model: str | None = None
    heads: Any = "all"  # as RerankConfig.heads
    method: str = "query"
    calibrate: bool = True
    token_filter: bool = False
    sink: bool = False
    length_norm: str = "sqrt"
    instruction: str = "qa"
    order: str = "reverse"
    focus_hint: str = FOCUS_HINT
    max_sentence_words: int = DEFAULT_MAX_WORDS
    max_prompt_tokens: int | None = None
    device: str = "cpu"
    dtype: str = "auto"
    attention: str = "full"
    block_positions: str = "rotated"
    state_cache_mb: int = 256

    def __post_init__(self) -> None:
        check_flags(self, ("calibrate", "token_filter", "sink"))
        check_model_field(self)
        check_attention_inputs(self.heads, None, None)  # a head list's syntax, before a model loads
        check_attention_mode(self.attention)
        check_positions(self.block_positions)
        if self.attention != "block" and self.block_positions != type(self).block_positions:  # (nothing reads them)
            raise InputError(
                f"block_positions={self.block_positions!r} is read by block attention only, and this pruner reads "
                f"attention={self.attention!r}; add attention='block' (--attention block), or drop block_positions"
            )
        if not is_count(self.state_cache_mb, 0):
            raise InputError(f"state_cache_mb={self.state_cache_mb!r} must be an integer >= 0 (0: no state cache)")
        object.__setattr__(self, "state_cache_mb", int(self.state_cache_mb))  # a NumPy integer written as JSON
        if self.attention != "block" and self.state_cache_mb != type(self).state_cache_mb:  # (nothing reads it)
            raise InputError(
                f"state_cache_mb={self.state_cache_mb} sizes block attention's passage states, and this pruner reads "
                f"attention={self.attention!r}; add attention='block' (--attention block), or drop state_cache_mb"
            )
        if self.method not in PRUNE_METHODS:
            raise InputError(f"method={self.method!r} is not one of {PRUNE_METHODS}")
        if self.length_norm not in LENGTH_NORMS:
            raise InputError(f"length_norm={self.length_norm!r} is not one of {LENGTH_NORMS}")
        if self.method == "probe":  # the probe fixes these: a value given here would be replaced silently
            for name, defaults in (("heads", ("all", None)), ("length_norm", ("sqrt",)), ("token_filter", (False,))):
                if getattr(self, name) not in defaults:
                    raise InputError(
                        "method='probe' scores with the heads, length normalisation and unfiltered scores its probe "
                        f"was trained with, so {name}={getattr(self, name)!r} would be ignored; drop {name} or use "
                        "method='query' or 'focus'"
                    )
        if self.method != "focus" and self.focus_hint != FOCUS_HINT:  # only focus reads it
            raise InputError(
                f"focus_hint={self.focus_hint!r} is read by method='focus' only, not {self.method!r}; drop focus_hint "
                "or use method='focus'"
            )
        if not isinstance(self.focus_hint, str):
            raise InputError(f"focus_hint={self.focus_hint!r} is not a string; pass the answer hint's text")
        if self.method == "focus" and not self.focus_hint.strip():
            raise InputError(f"focus_hint is empty; method='focus' needs an answer hint such as {FOCUS_HINT!r}")
        words = self.max_sentence_words
        if not is_count(words):  # (was an error only at the first prune)
            raise InputError(f"max_sentence_words={words!r} must be an integer >= 1 (longer sentences are split)")
        mpt = self.max_prompt_tokens
        if mpt is not None and not is_count(mpt):
            raise InputError(f"max_prompt_tokens={mpt!r} must be a positive integer or None")
        object.__setattr__(self, "max_sentence_words", int(words))
        object.__setattr__(self, "max_prompt_tokens", None if mpt is None else int(mpt))
        # the reranker's checks of the same options (before, found at the first prune, model loaded)
        check_prompt_options(self.order, self.instruction)
        store_precision_names(self)

    def with_options(self, **overrides: Any) -> PruneConfig:
        check_fields(type(self), overrides)
        return replace(self, **overrides) if overrides else self
