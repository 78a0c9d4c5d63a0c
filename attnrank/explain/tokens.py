"""Per-token explanations of attention reranking scores (ICR, Chen et al. ICLR 2025).

A passage's score is the sum, over the tokens of its prompt block ``[k] title\\ntext``, of the
calibrated token scores ``Δ_j = Σ_heads (a_q − a_N/A)`` that pass ICR's ``μ − 2σ`` filter
(:mod:`attnrank.llm.rows`). The reranker already records ``Δ_j`` for every token of every
passage when asked (``rank(..., return_evidence=True)`` → ``evidence["attention_tokens"]``,
rounded to 1e-6, and ``evidence["attention_counted"]``, the tokens the filter kept); this module
only reads that evidence and attaches each token's text. The counted
scores add up to the passage score (to the evidence's rounding: at most 5e-7 per token).

Learned head weights and re-weighting score passages differently from the plain token sum, so
their results are refused with an explanation of why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from ..llm.rows import keep_mask
from ..types import RankedResults, ScoredDocument, is_count


@dataclass
class TokenScore:
    """One prompt token of a passage: its text, calibrated attention score, and whether it counts."""

    text: str
    score: float
    counted: bool


@dataclass
class PassageExplanation:
    """A ranked passage and its tokens; :attr:`token_sum` (counted tokens) equals :attr:`score`."""

    id: str
    rank: int
    score: float
    title: str
    tokens: list[TokenScore] = field(default_factory=list)

    @property
    def token_sum(self) -> float:
        return float(sum(t.score for t in self.tokens if t.counted))

    @property
    def filtered(self) -> int:
        """Tokens left out by the μ − 2σ filter."""
        return sum(not t.counted for t in self.tokens)

    def top_tokens(self, n: int = 5) -> list[TokenScore]:
        """The ``n`` highest-scoring counted tokens that hold some text."""
        if not is_count(n):  # (n=-1 returned all but the last: a Python slice)
            raise InputError(f"n={n!r} tokens: give a whole number >= 1")
        return sorted((t for t in self.tokens if t.counted and t.text.strip()), key=lambda t: -t.score)[:n]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "rank": self.rank,
            "score": self.score,
            "token_sum": self.token_sum,
            "tokens": [{"text": t.text, "score": t.score, "counted": t.counted} for t in self.tokens],
        }


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """The text each token adds, by decoding growing prefixes (so byte-level pieces and
    leading-space markers come out as the reader sees them); a character of several byte
    tokens belongs to its last one, the others add ""; falls back to the lone token."""
    out, prev = [], ""
    for i in range(len(ids)):
        cur = tokenizer.decode(list(ids[: i + 1]), skip_special_tokens=False)
        last = i + 1 == len(ids)
        if not last:  # a prefix ending inside a character decodes to U+FFFD: not yet shown
            cur = cur.rstrip("\ufffd")
        if cur.startswith(prev):
            out.append(cur[len(prev) :])
        elif not last:
            # (SentencePiece's byte fallback decodes a whole run of byte tokens to U+FFFDs while any is
            # incomplete, taking back a character already shown: "😀😀" came out "😀�😀😀". Nothing is
            # shown until a prefix extends the one shown)
            out.append("")
            continue
        else:
            out.append(tokenizer.decode([ids[i]]))
        prev = cur
    return out


def check_explainable(reranker: Any) -> None:
    """Raise :class:`InputError` unless ``reranker``'s results can be explained token by token:
    its scores are calibrated attention summed over tokens (calibrated, no learned weights, no re-weighting)
    and its preset computes attention. Cheap: call it before the ranking it would otherwise fail after."""
    if getattr(reranker, "learned", None) is None and not getattr(reranker, "uses_attention", True):
        name = getattr(getattr(reranker, "config", None), "name", "?")
        raise InputError(
            f"preset {name!r} computes no per-token attention evidence; use e.g. preset 'qrhead' to explain"
        )
    if getattr(reranker, "learned", None) is not None:
        raise InputError(
            "explanations need scorer='sum': learned head weights score passages from per-head "
            "features, not from a token sum; rerank with the default scorer to explain"
        )
    if getattr(reranker, "reweight", None) is not None:
        raise InputError(
            "explanations need reweight=None: re-weighted scores are not the sum of the calibrated "
            "token scores shown; rerank without re-weighting to explain"
        )
    if getattr(reranker, "calibrate", True) is False:  # (the page said "calibrated" over raw attention)
        raise InputError(
            "explanations need calibrate=True: the page and its scores are calibrated attention (the query's "
            "minus a content-free query's); rerank with calibration to explain"
        )


def explain_one(tokenizer: Any, d: ScoredDocument, use_filter: bool) -> PassageExplanation:
    ev = d.evidence.get("attention_tokens")
    if ev is None:
        raise InputError(f"passage {d.id!r} has no token evidence; rank with return_evidence=True")
    ids = [int(i) for i, _ in ev]
    scores = np.array([s for _, s in ev], dtype=np.float64)
    # the reranker's own decision (on unrounded scores: the rounded ones can tip a token near
    # the threshold); recomputed for evidence recorded before it was stored
    kept = d.evidence.get("attention_counted")
    counted = np.asarray(kept, dtype=bool) if kept is not None else keep_mask(scores, use_filter)
    texts = token_texts(tokenizer, ids)
    # a fused result's score mixes in first-stage signals; the tokens explain its attention part
    score = d.stage_scores.get("attention", d.score)
    return PassageExplanation(
        d.id, d.rank, score, d.title, [TokenScore(t, float(s), bool(c)) for t, s, c in zip(texts, scores, counted)]
    )


def explain_results(reranker: Any, res: RankedResults | Sequence[ScoredDocument]) -> list[PassageExplanation]:
    """Explanations of results that ``reranker`` (an :class:`AttentionReranker`) ranked with
    ``return_evidence=True``, in rank order."""
    check_explainable(reranker)
    return [explain_one(reranker.llm.tokenizer, d, reranker.token_filter) for d in res]
