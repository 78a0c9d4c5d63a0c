"""What fitted fused weights check when a reranker applies them: that their features are read as
they were fitted (the prompt, the passage cut, the capture, the heads, re-weighting, the signals'
version and BM25's stemmer). Each check logs a warning naming the difference and the fix: the
weights still score, but not as they measured. A mixin of
:class:`~attnrank.rerank.fused.FusedWeights`."""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Protocol

from ..artifacts import warn_if_set_otherwise
from ..llm.headspec import format_heads, parse_heads
from .signals import SIGNALS_VERSION, candidate_terms

logger = logging.getLogger("attnrank.rerank.fused")  # (the weights' own logger, as before the split)


class _Fitted(Protocol):
    """What the checks read of the weights (:class:`~attnrank.rerank.fused.FusedWeights`)."""

    LABEL: ClassVar[str]
    TRAIN: ClassVar[str]
    features: list[str]
    learner: str
    prompt: dict[str, Any] | None
    signals_version: int | None
    bm25_stemmer: str | None
    max_doc_words: int | None
    max_doc_tokens: int | None
    heads: list[str] | str | None
    capture: str | None
    gate: float | None

    @property
    def uses_attention(self) -> bool: ...

    @property
    def uses_llm(self) -> bool: ...

    @property
    def base_features(self) -> list[str]: ...

    @property
    def fitted_to_attention(self) -> bool: ...


class AppliedOtherwise:
    """The warnings of weights applied otherwise than they were fitted."""

    @property
    def fitted_to_attention(self: _Fitted) -> bool:
        """Whether anything was chosen on attention's values: fitted weights over it, or equal
        weights' confidence gate (``--learner equal`` still chooses one on the training queries)."""
        return self.uses_attention and (self.learner != "equal" or self.gate is not None)

    def warn_if_prompted_otherwise(self: _Fitted, settings: dict[str, Any]) -> None:
        """Log a warning naming each prompt setting their attention feature was read with that a
        reranker's ``settings`` (:meth:`~attnrank.rerank.config.RerankConfig.prompt_settings`) give
        otherwise (the passage cut, words and tokens, is :meth:`warn_if_cut_otherwise`'s). Unfitted or unrecorded: not checked."""
        if not self.fitted_to_attention:
            return
        fitted = {k: v for k, v in (self.prompt or {}).items() if k not in ("max_doc_words", "max_doc_tokens")}
        warn_if_set_otherwise(self.LABEL, fitted, settings, self.TRAIN)

    def warn_if_stale(self: _Fitted, source: str) -> None:
        """Log a warning when these weights were fitted to signals computed otherwise than this
        attnrank computes them (:data:`~attnrank.rerank.signals.SIGNALS_VERSION`), or when that
        was not recorded: they still score (every feature is z-scored per query), but not as
        they measured. ``source``: what they are, for the message."""
        if self.learner == "equal" or not self.base_features:
            return  # nothing fitted to the signals' values
        stemmer = candidate_terms().stemmer  # (PyStemmer installed or not: the 'stem' extra)
        if "bm25" in self.features and self.bm25_stemmer not in (None, stemmer):
            # (candidate BM25 stems wherever PyStemmer imports: the extra is the fix one way only)
            fix = "install attnrank[stem] (PyStemmer)" if stemmer == "none" else "uninstall PyStemmer"
            logger.warning(
                "%s were fitted to candidate BM25 with stemmer %r; this install computes it with %r, so they do not "
                "score as they measured; %s, or retrain them here with %s",
                source,
                self.bm25_stemmer,
                stemmer,
                fix,
                self.TRAIN,
            )
        if self.signals_version == SIGNALS_VERSION:
            return  # fitted to these
        fitted = (
            "signals computed before their versions were recorded"
            if self.signals_version is None
            else f"version {self.signals_version} of the signals"
        )
        logger.warning(
            "%s were fitted to %s; this attnrank computes version %d (rerank.signals.SIGNALS_VERSION), so they "
            "do not score as they measured; retrain them with %s",
            source,
            fitted,
            SIGNALS_VERSION,
            self.TRAIN,
        )

    def warn_if_cut_otherwise(self: _Fitted, max_doc_words: int | None, max_doc_tokens: int | None = None) -> None:
        """Log a warning when their LLM feature (attention, likelihood) is read from passages cut
        otherwise (``max_doc_words``, ``max_doc_tokens``) than it was fitted with: the scores still
        rank, but not as they measured. Weights that record no cut are not checked. (The token cut
        was not recorded: likelihood weights fitted at one and applied at another were not warned of.)"""
        if not self.uses_llm or self.max_doc_words is None:
            return
        # (weights saved before the token cut was recorded beside the words hold it in their prompt, if any)
        tokens = self.max_doc_tokens if self.max_doc_tokens is not None else (self.prompt or {}).get("max_doc_tokens")
        fitted, used = (self.max_doc_words, tokens), (max_doc_words, max_doc_tokens)
        if fitted == used:
            return

        def cut(words: int | None, tokens: int | None) -> str:
            return f"{words} words" + ("" if tokens is None else f" and {tokens} tokens")

        logger.warning(
            "the %s were fitted to passages cut to %s; this reranker cuts them to %s, so they do not "
            "score as they measured; use max_doc_words=%d and max_doc_tokens=%s (--max-doc-words, --max-doc-tokens), "
            "or retrain them with %s",
            self.LABEL,
            cut(*fitted),
            cut(*used),
            self.max_doc_words,
            tokens,
            self.TRAIN,
        )

    def warn_if_applied_otherwise(self: _Fitted, heads: Any, capture: str, reweighted: bool = False) -> None:
        """Log a warning when these weights' attention feature is read from other ``heads`` (None:
        all) than they record, or captured otherwise than ``capture``
        (:func:`~attnrank.llm.blocks.capture_name`) captures it: e.g. weights fitted to block
        attention at shared positions, applied to full-prompt attention, whose scores follow the
        candidates' slots (docs/benchmarks.md); or ``reweighted`` (sink, IDF, entropy, slot
        correction: no trainer fits weights to re-weighted attention, and its confidence gate reads
        how peaked the scores are). They still score, but not as they measured. Weights that record
        no capture were fitted before it was recorded, to full attention."""
        if not self.fitted_to_attention:
            return
        if reweighted:
            logger.warning(
                "the fused weights were fitted to attention without re-weighting; this reranker re-weights it, so "
                "they (and their confidence gate) do not score as they measured; drop reweight, or use preset icr or "
                "qrhead with it"
            )
        fitted = self.capture or "full"
        if fitted != capture:
            logger.warning(
                "the fused weights were fitted to attention captured as %r; this reranker captures it as %r, "
                "so they do not score as they measured; use the attention options they record, or retrain "
                "them with %s",
                fitted,
                capture,
                self.TRAIN,
            )
        if self.heads is not None and parse_heads(self.heads) != parse_heads(heads):
            logger.warning(
                "the fused weights were fitted to the attention of heads %s; this reranker reads %s, so they do "
                "not score as they measured; leave heads at their default to read theirs",
                _shown(self.heads),
                _shown(heads),
            )


def _shown(heads: Any) -> str:
    pairs = parse_heads(heads)
    return "all" if pairs is None else f"{len(pairs)} ({format_heads(pairs[:4])}{', ...' if len(pairs) > 4 else ''})"
