"""One attention score per candidate from the attention rows of a query's windows.

Each window (:class:`~attnrank.llm.rows.WindowRows`) holds the chosen heads' rows over its
context tokens and its documents' token spans. A document's score is ICR's (Chen et al., ICLR
2025): calibrated token scores ``Δ = a(q) − a(N/A)`` summed over heads, then over the document's
tokens that pass the μ − 2σ filter; or, with re-weighting, :mod:`attnrank.rerank.reweight`'s.
Windows hold disjoint candidates (:mod:`attnrank.rerank.windows`), and their scores, shares of
one query-attention budget each, are merged as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..llm.rows import WindowRows, document_scores, keep_mask, token_scores
from ..types import ScoredDocument
from .position import SlotProfile
from .reweight import Reweighting, content_free_last, content_free_spans, reweighted_document_scores
from .terms import tokenized_query_terms

# the evidence an attention stage gives each passage (return_evidence): its token scores, and which counted
ATTENTION_EVIDENCE = ("attention_tokens", "attention_counted")


def window_document_scores(
    windows: Sequence[WindowRows],
    n_docs: int,
    *,
    token_filter: bool = True,
    reweighting: tuple[Any, str, Reweighting, SlotProfile | Callable[[int], SlotProfile | None] | None] | None = None,
    evidence: bool = False,
) -> tuple[np.ndarray, list[dict[str, Any]] | None]:
    """The score of each of ``n_docs`` candidates (input order) from the ``windows`` that hold
    them, and with ``evidence`` each one's token scores: ``attention_tokens`` (token id, plain
    calibrated score) and ``attention_counted`` (which of them the μ − 2σ filter kept).
    ``reweighting``: (tokenizer, query, steps, slot profile) to re-weight the rows instead of
    ICR's plain sum; the evidence holds the plain scores either way."""
    scores = np.zeros(n_docs)
    ev: list[dict[str, Any]] | None = [{} for _ in range(n_docs)] if evidence else None
    tokenizer = reweighting[0] if reweighting is not None and reweighting[2].sink else None
    empty = np.zeros(n_docs, dtype=bool)  # (sink filtering: candidates it reads no token of)
    for w in windows:
        tok = token_scores(w.rows)
        if reweighting is None:
            doc_s = document_scores(tok, w.spans, use_filter=token_filter)
        else:
            doc_s = reweighted_window_scores(w, *reweighting, token_filter=token_filter)
        if tokenizer is not None:
            empty[list(w.doc_index)] = content_free_spans(w, tokenizer.convert_ids_to_tokens(w.input_ids))
        for j, (i, (s, e)) in enumerate(zip(w.doc_index, w.spans)):
            scores[i] = doc_s[j]
            if ev is not None:
                tokens, counted = ATTENTION_EVIDENCE
                ev[i][tokens] = list(zip(w.input_ids[s:e], tok[s:e].round(6).tolist()))
                # which tokens the μ − 2σ filter counted, decided on the unrounded scores
                ev[i][counted] = keep_mask(tok[s:e], token_filter).tolist()
    # over the whole list, not per window: a window's lowest is not the list's (windows are merged)
    return (content_free_last(scores, empty.tolist()) if tokenizer is not None else scores), ev


def reweighted_window_scores(
    window: WindowRows,
    tokenizer: Any,
    query: str,
    steps: Reweighting,
    slot_profile: SlotProfile | Callable[[int], SlotProfile | None] | None,
    *,
    token_filter: bool = True,
) -> np.ndarray:
    """The re-weighted score of each of ``window``'s documents (:mod:`attnrank.rerank.reweight`),
    its tokens and the query's terms read with ``tokenizer``; ``slot_profile``: the profile, or
    what gives the one for a window of that many documents."""
    if callable(slot_profile):
        slot_profile = slot_profile(len(window.spans))
    tokens = tokenizer.convert_ids_to_tokens(window.input_ids)
    terms = tokenized_query_terms(tokenizer, query, steps.idf_unit)
    return reweighted_document_scores(window, tokens, terms, steps, use_filter=token_filter, slot_profile=slot_profile)


def without_attention_evidence(doc: ScoredDocument) -> ScoredDocument:
    """``doc`` without an earlier attention stage's token evidence (explained as this stage's, it
    would not add up to this stage's scores)."""
    if not any(k in doc.evidence for k in ATTENTION_EVIDENCE):
        return doc
    return replace(doc, evidence={k: v for k, v in doc.evidence.items() if k not in ATTENTION_EVIDENCE})
