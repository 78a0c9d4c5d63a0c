"""Re-weighting calibrated attention before document aggregation: sink filtering, cross-document
IDF, entropy regularization and positional (slot) calibration, each switchable.

Works on one scored window (:class:`~attnrank.llm.rows.WindowRows`: per-head rows
``real``/``null`` ``[H, P]`` over the ``P`` context tokens, document ``spans``) plus the
context's token strings (``tokenizer.convert_ids_to_tokens``), so it runs offline on cached rows.
Steps, in order (notation: ``Δ_j`` = calibrated score of context token ``j``, summed over heads;
``J_d`` = the tokens of document ``d``):

1. **Sink filtering** (``sink``; our design, motivated by attention sinks and by ICR's own
   calibration): tokens that absorb attention without content (special/template tokens, the
   ``[i]`` labels, ``\\n``/``\\n\\n`` delimiters, pure punctuation/whitespace tokens and
   everything outside the document spans) are zeroed in each head's ``real`` and ``null`` row;
   each row is renormalized to sum to 1 over the remaining content tokens (separately for real
   and null), then ``Δ = Σ_h (real' − null')``. ``J_d`` becomes the content tokens of ``d``.
2. **Cross-document IDF** (``idf``; ReAttn-style, our reconstruction: ReAttn, Tian et al.,
   arXiv 2602.19969, states the idea but no formula). Terms are normalized token texts
   (space markers ``Ġ``/``▁`` decoded, lower-cased, punctuation dropped), per token
   (``"piece"``) or per whole word (``"word"``; :mod:`attnrank.rerank.terms`). Over the window's ``K`` documents,
   ``df(v)`` = #documents containing ``v``, ``idf(v) = log((K+1)/(df(v)+1)) + ε`` and the token
   weight ``w_j = idf(v_j) / (log((K+1)/2) + ε)``: a term in one document keeps weight 1, a
   term in all ``K`` gets ``ε / (log((K+1)/2) + ε)``. With ``idf_query_only`` only tokens whose
   term is a query term are re-weighted (the abstract's "query-overlapping tokens"); all others
   keep 1. ``Δ'_j = w_j · Δ_j``. (The reconstruction in ../shared/REFERENCES.md §4.3 divides by
   the mean idf instead; dividing by the largest idf a term can have keeps every weight ≤ 1, so
   the step only down-weights terms common across the candidates, as the abstract describes, and
   a window's weights do not rescale with its vocabulary.) The counts are the window's, not the
   query's whole candidate list: where the candidates exceed one prompt and run in several windows
   (``max_prompt_tokens``), a document's weights depend on the others in its window.
3. **Aggregation** per document: ICR's μ − 2σ filter over ``J_d`` (Chen et al., ICLR 2025), sum.
4. **Entropy regularization** (``entropy``; ReAttn-style, our formula, no public one exists).
   ``"blend"``: ``p_j = max(Δ'_j, 0) / Σ_{J_d} max(Δ', 0)``,
   ``H_d = −Σ p_j log p_j / log|J_d| ∈ [0, 1]`` and ``S'(d) = S(d) · H_d^β`` (β ≥ 0, β = 0 is
   the identity; ``H_d = 1`` when ``|J_d| < 2`` or no Δ' is positive). It shrinks documents
   whose score comes from a few tokens; note that for a negative ``S(d)`` it moves the score
   *up* toward 0. ``"temper"``: ``S(d) = Σ_{kept j} sign(Δ'_j) |Δ'_j|^γ``, γ ∈ (0, 1] (γ = 1 is
   the identity; the μ − 2σ mask is computed on the untempered Δ'). β and γ are
   hyper-parameters to tune on dev data only.
5. **Slot correction** (``slot_correction``; Attention Basin, Yi et al. arXiv 2508.05128, our
   reconstruction): :func:`attnrank.rerank.position.slot_correct` with a measured profile.

With every step off the result equals ``document_scores(token_scores(window.rows))`` exactly.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import check_flags
from ..errors import InputError
from ..index.hybrid import score_below
from ..llm.headspec import format_heads
from ..llm.rows import WindowRows, check_finite, check_spans, document_scores, keep_mask, token_scores
from ..types import is_real
from .position import SlotProfile, prompt_slots, slot_correct
from .terms import IDF_UNITS, has_content, normalize_text, token_terms, token_texts

logger = logging.getLogger(__name__)

Span = tuple[int, int]
ENTROPY_MODES = ("blend", "temper")


@dataclass(frozen=True)
class Reweighting:
    """Which re-weighting steps to apply (see the module docstring), and their parameters.

    ``idf_eps`` (ε > 0), ``entropy_beta`` (β ≥ 0) and ``temper_gamma`` (γ ∈ (0, 1]) are untuned
    defaults; tune them on dev data only.
    """

    sink: bool = False
    idf: bool = False
    idf_unit: str = "piece"
    idf_query_only: bool = True
    idf_eps: float = 0.5
    entropy: bool = False
    entropy_mode: str = "blend"
    entropy_beta: float = 1.0
    temper_gamma: float = 0.5
    slot_correction: bool = False

    def __post_init__(self) -> None:
        check_flags(self, ("sink", "idf", "idf_query_only", "entropy", "slot_correction"))
        if self.idf_unit not in IDF_UNITS:
            raise InputError(f"idf_unit={self.idf_unit!r} is not one of {IDF_UNITS}")
        if self.entropy_mode not in ENTROPY_MODES:
            raise InputError(f"entropy_mode={self.entropy_mode!r} is not one of {ENTROPY_MODES}")
        for name in ("idf_eps", "entropy_beta", "temper_gamma"):
            if not is_real(getattr(self, name)):  # (None or "1" failed the range checks below with a TypeError)
                raise InputError(f"{name}={getattr(self, name)!r} must be a number")
        if not 0 < self.idf_eps < math.inf:
            raise InputError(
                f"idf_eps={self.idf_eps} must be finite and > 0 (it keeps a term found in every document "
                "above weight 0 and the K=1 case finite); try 0.5"
            )
        if not 0 <= self.entropy_beta < math.inf:
            raise InputError(f"entropy_beta={self.entropy_beta} must be finite and >= 0 (0 = no regularization)")
        if not 0 < self.temper_gamma <= 1:
            raise InputError(f"temper_gamma={self.temper_gamma} must be in (0, 1] (1 = no tempering)")

    @property
    def changes_tokens(self) -> bool:
        """True if any token- or document-level step (all but slot correction) is on."""
        return self.sink or self.idf or self.entropy

    @property
    def changes_scores(self) -> bool:
        """True if any step is on (slot correction too): the scores are not plain attention's."""
        return self.changes_tokens or self.slot_correction


# --------------------------------------------------------------------------- steps

_LABEL_FULL = re.compile(r"\s*\[\d+\]\s*")
_LABEL_PREFIX = re.compile(r"\s*(\[\d*)?")


def _label_length(texts: Sequence[str], s: int, e: int) -> int:
    """Number of tokens at the start of span ``[s, e)`` that spell the ``[i]`` label."""
    acc = ""
    for j in range(s, e):
        acc += texts[j]
        if _LABEL_FULL.fullmatch(acc):
            return j - s + 1
        if not _LABEL_PREFIX.fullmatch(acc):
            return j - s
    return e - s


def content_mask(token_strings: Sequence[str | None], spans: Sequence[Span], *, labelled: bool = True) -> np.ndarray:
    """``[P]`` bool: tokens inside a span that are neither a special token, nor pure
    punctuation/whitespace, nor (``labelled``: spans of passages, which begin with their ``[i]``
    label) the span's leading label. Sentence spans carry no label: a sentence that begins with a
    citation such as ``[3]`` keeps it."""
    check_spans(spans, len(token_strings))
    texts = token_texts(token_strings)
    mask = np.zeros(len(texts), dtype=bool)
    for s, e in spans:
        for j in range(s + (_label_length(texts, s, e) if labelled else 0), e):
            mask[j] = has_content(texts[j])
    return mask


def _renormalized(rows: np.ndarray, mask: np.ndarray) -> np.ndarray:
    kept = np.where(mask[None, :], np.asarray(rows, dtype=np.float64), 0.0)
    total = kept.sum(1, keepdims=True)
    return np.divide(kept, total, out=np.zeros_like(kept), where=total > 0)


def sink_filtered_rows(real: np.ndarray, null: np.ndarray | None, mask: np.ndarray) -> np.ndarray:
    """``[H, P]`` calibrated rows after sink filtering: each head's real (and null) row zeroed
    outside ``mask`` and renormalized to sum 1 over it, then ``real' − null'`` (``real'``
    without calibration). A head with no attention on the content gives a zero row. Non-finite
    attention (a float16 overflow) is refused, not renormalised away to a zero row."""
    check_finite(np.asarray(real))
    if null is not None:
        check_finite(np.asarray(null))
    real_c = _renormalized(real, mask)
    return real_c if null is None else real_c - _renormalized(null, mask)


def idf_weights(
    terms: Sequence[str], doc_tokens: Sequence[Sequence[int]], *, eps: float, query_terms: Collection[str] | None = None
) -> np.ndarray:
    """``[P]`` token weights ``(log((K+1)/(df+1)) + ε) / (log((K+1)/2) + ε)`` (1 elsewhere).

    ``doc_tokens[d]``: the context positions of document ``d``'s tokens (``K = len``);
    ``df(v)``: number of documents with a token of term ``v``. Only tokens of those documents
    with a term in ``query_terms`` (all terms if None) are re-weighted.
    """
    k = len(doc_tokens)
    df: Counter[str] = Counter()
    for toks in doc_tokens:
        df.update({terms[j] for j in toks if terms[j]})
    norm = math.log((k + 1) / 2) + eps
    w = np.ones(len(terms))
    for toks in doc_tokens:
        for j in toks:
            v = terms[j]
            if v and (query_terms is None or v in query_terms):
                w[j] = (math.log((k + 1) / (df[v] + 1)) + eps) / norm
    return w


def normalized_entropy(values: np.ndarray) -> float:
    """``−Σ p log p / log n`` of ``p = max(values, 0) / Σ max(values, 0)``; 1 if ``n < 2`` or
    nothing is positive."""
    pos = np.clip(np.asarray(values, dtype=np.float64), 0.0, None)
    total = pos.sum()
    if pos.size < 2 or total <= 0:
        return 1.0
    p = pos[pos > 0] / total
    return float(min(1.0, max(0.0, -(p * np.log(p)).sum() / math.log(pos.size))))


def aggregate(
    delta: np.ndarray, doc_tokens: Sequence[np.ndarray], cfg: Reweighting, *, use_filter: bool = True
) -> np.ndarray:
    """Per document: μ − 2σ filter and sum, with the entropy step of ``cfg`` if on."""
    out = np.zeros(len(doc_tokens))
    for d, toks in enumerate(doc_tokens):
        v = delta[toks]
        if v.size == 0:
            continue
        keep = keep_mask(v, use_filter)
        if cfg.entropy and cfg.entropy_mode == "temper":
            out[d] = float((np.sign(v) * np.abs(v) ** cfg.temper_gamma)[keep].sum())
        else:
            out[d] = float(v[keep].sum())
        if cfg.entropy and cfg.entropy_mode == "blend":
            out[d] *= normalized_entropy(v) ** cfg.entropy_beta
    return out


# --------------------------------------------------------------------------- entry


def reweighted_document_scores(
    window: WindowRows,
    token_strings: Sequence[str | None],
    query_terms: Collection[str],
    cfg: Reweighting,
    *,
    use_filter: bool = True,
    slot_profile: SlotProfile | None = None,
) -> np.ndarray:
    """Document scores of one window (in ``window.doc_index`` order) with ``cfg``'s steps.

    ``token_strings``: the ``P`` context tokens' strings; ``query_terms``: normalized query
    terms in ``cfg.idf_unit`` (:func:`~attnrank.rerank.terms.tokenized_query_terms`); ``use_filter``: ICR's μ − 2σ
    filter; ``slot_profile``: needed when ``cfg.slot_correction``.
    """
    n = window.real.shape[1]
    if len(token_strings) != n:
        raise InputError(
            f"{len(token_strings)} token strings for {n} context tokens; pass convert_ids_to_tokens(window.input_ids)"
        )
    if cfg.slot_correction and slot_profile is None:
        raise InputError("slot_correction=True needs a slot_profile; measure one with measure_slot_profile")
    if cfg.changes_tokens:
        scores = _reweighted(window, token_strings, query_terms, cfg, use_filter)
    else:
        scores = document_scores(token_scores(window.rows), window.spans, use_filter=use_filter)
    if cfg.slot_correction:
        assert slot_profile is not None
        scores = slot_correct(scores, prompt_slots(window.spans), slot_profile)
    return scores


def content_free_spans(window: WindowRows, token_strings: Sequence[str | None]) -> list[bool]:
    """For each of ``window``'s spans, whether it holds no content token (:func:`content_mask`):
    what sink filtering reads none of, put last over the whole ranking by :func:`content_free_last`."""
    return spans_without(content_mask(token_strings, window.spans, labelled=window.labelled), window.spans)


def spans_without(mask: np.ndarray, spans: Sequence[Span]) -> list[bool]:
    """For each of ``spans``, whether ``mask`` holds none of its tokens."""
    return [not mask[s:e].any() for s, e in spans]


def content_free_last(scores: np.ndarray, empty: Sequence[bool]) -> np.ndarray:
    """``scores`` with those of ``empty`` spans (no content token: punctuation, a "---" rule)
    just below every other span's, unless every span is empty.

    Why: sink filtering makes each head's calibrated row sum to about 0 over the content tokens,
    so the real spans' scores straddle 0, and a span whose tokens it reads none of, summed to 0,
    ranked above about half of them (a "... !!!" passage above a real one; a pruner keeping "---"
    and dropping a sentence)."""
    empty_at = np.asarray(empty, dtype=bool)
    if not empty_at.any() or empty_at.all():
        return scores
    out = np.array(scores, dtype=np.float64)
    out[empty_at] = score_below(out[~empty_at])
    return out


def _reweighted(
    window: WindowRows,
    token_strings: Sequence[str | None],
    terms_q: Collection[str],
    cfg: Reweighting,
    use_filter: bool,
) -> np.ndarray:
    spans = window.spans
    check_spans(spans, len(token_strings))
    if cfg.sink:
        mask = content_mask(token_strings, spans, labelled=window.labelled)
        delta = token_scores(sink_filtered_rows(window.real, window.null, mask))
        doc_tokens = [s + np.flatnonzero(mask[s:e]) for s, e in spans]
    else:
        delta = token_scores(window.rows)
        doc_tokens = [np.arange(s, e) for s, e in spans]
    check_finite(delta)
    if cfg.idf:
        texts = token_texts(token_strings)
        terms = token_terms(token_strings, cfg.idf_unit)
        idf_docs = [range(s + (_label_length(texts, s, e) if window.labelled else 0), e) for s, e in spans]
        wanted = {normalize_text(t) for t in terms_q} - {""} if cfg.idf_query_only else None
        delta = delta * idf_weights(terms, idf_docs, eps=cfg.idf_eps, query_terms=wanted)
    return aggregate(delta, doc_tokens, cfg, use_filter=use_filter)


def check_setup(
    profile: SlotProfile | None,
    model_id: str,
    fingerprint: str,
    adapter: str = "",
    calibrate: bool | None = None,
    heads: str | None = None,
) -> None:
    """Warn about a profile from another model, measured with another head
    adapter (``adapter``: the model's, ``LLM.adapter``), on scores calibrated otherwise than the
    reranker's (``calibrate``) or over other heads (``heads``, as :func:`heads_label` names them); slot correction without a profile, and a profile without slot
    correction, are refused where they are configured (:func:`~attnrank.rerank.config_checks.check_attention_inputs`)."""
    if profile is not None and (profile.model_id, profile.fingerprint) != (model_id, fingerprint):
        logger.warning(
            "slot profile of %s (%s) used with model %s (%s)",
            profile.model_id,
            profile.fingerprint[:12],
            model_id,
            fingerprint[:12],
        )
    if profile is not None and calibrate is not None and profile.calibrated != calibrate:
        logger.warning(
            "slot profile of %s scores used to correct %s scores: its per-slot bias is not theirs",
            "calibrated" if profile.calibrated else "raw-attention",
            "calibrated" if calibrate else "uncalibrated",
        )
    if profile is not None and heads is not None and profile.heads != heads:  # (a sum over other heads: its scale)
        logger.warning(
            "slot profile measured on the scores of %s heads used to correct the scores of %s heads: its per-slot "
            "bias is on another scale; measure one with this reranker (attnrank.rerank.profile.measure_slot_profile)",
            profile.heads,
            heads if heads == "all" else len(heads.split(",")),
        )
    if profile is not None and profile.adapter != adapter:  # (its slot bias is another model's)
        logger.warning(
            "slot profile measured %s used with a model %s: its per-slot bias is not this model's",
            f"with the head adapter {profile.adapter}" if profile.adapter else "without a head adapter",
            f"with the head adapter {adapter}" if adapter else "without one",
        )


def heads_label(heads: Any) -> str:
    """How a slot profile names the heads it was measured over: ``"all"`` (None), else ``"l-h,l-h"``."""
    return "all" if heads is None else format_heads(heads)
