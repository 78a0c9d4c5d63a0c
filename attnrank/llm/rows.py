"""Window rows — the raw material every attention stage reads — and the ICR aggregation of them.

A *window* is one prompt (instruction, candidates, query) captured once by
:func:`attnrank.llm.capture.capture_window`: per-head attention rows averaged over the query span,
shape ``[H, T]`` over the ``T`` context tokens,
``a[h, j] = (1/|T_q|) Σ_{t∈T_q} attn^{h}_{t→j}``. With content-free calibration the rows of the
"N/A" query are subtracted: ``Δ[h, j] = a_q[h, j] − a_∅[h, j]`` (ICR, Chen et al. ICLR 2025).

- :func:`token_scores`: Σ over heads (optionally weighted) → ``Δ_j`` per context token.
- :func:`document_scores`: per document, keep tokens with ``Δ_j > μ_d − 2σ_d`` (:func:`keep_mask`,
  torch-style unbiased std) and sum them; no length normalisation (ICR §3 / QRHead, Zhang et al.
  EMNLP 2025).
- :func:`per_head_document_scores` / :func:`window_features`: the same aggregation per head
  (QRHead's per-head mask), the features of head detection and the learned head weighting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

Span = tuple[int, int]
QUERY_SPANS = ("full", "last")  # the query rows averaged: the whole suffix, or its last token


@dataclass
class WindowRows:
    """One captured window: per-head attention rows over its context tokens.

    ``real[h, j]`` / ``null[h, j]``: attention of the query span (real query / "N/A") from head
    ``h`` (in the capturer's head order) to context token ``j``, averaged over the span's tokens.
    ``null`` is None without calibration. ``doc_index``: the input indices of the window's
    documents; ``spans``: their token spans in the context, in the same order; ``labelled``:
    whether each span begins with its slot label ``[i]`` (full prompts; blocks have none).
    """

    doc_index: list[int]
    spans: list[tuple[int, int]]
    input_ids: list[int]  # the context tokens
    real: np.ndarray
    null: np.ndarray | None = None
    labelled: bool = True

    @property
    def rows(self) -> np.ndarray:
        """Calibrated rows ``real − null`` (ICR's Δ per head), or ``real`` without calibration."""
        return self.real if self.null is None else self.real - self.null


def token_scores(rows: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Sum ``[H, T]`` head rows into ``[T]`` token scores (``weights`` per head, default 1)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2:
        raise InputError(f"attention rows must be [heads, tokens], got shape {rows.shape}")
    return rows.sum(0) if weights is None else np.asarray(weights, dtype=np.float64) @ rows


def keep_mask(values: np.ndarray, use_filter: bool = True) -> np.ndarray:
    """ICR's μ − 2σ mask over one span's token scores: keep ``v > mean − 2·std`` (unbiased std).

    All are kept when the filter is off, with fewer than 2 values, or when every value is equal
    (none is an outlier; a strict ``>`` would drop them all).
    """
    values = np.asarray(values, dtype=np.float64)
    if not use_filter or values.size < 2:
        return np.ones(values.shape, dtype=bool)
    sd = values.std(ddof=1)
    return np.ones(values.shape, dtype=bool) if sd == 0.0 else values > values.mean() - 2.0 * sd


def check_spans(spans: Sequence[Span], n: int) -> None:
    """Raise unless every span ``[start, end)`` is non-empty and inside ``n`` context tokens."""
    for s, e in spans:
        if not 0 <= s < e <= n:
            raise InputError(f"document span {(s, e)} is outside the {n} context tokens")


def check_finite(tokens: np.ndarray) -> None:
    """Raise on the first non-finite token score (a float16 overflow, typically); ``[H, T]``
    head rows name the first token any head is non-finite at."""
    finite = np.isfinite(tokens)
    if not finite.all():
        bad = int(np.flatnonzero(~finite.reshape(-1, finite.shape[-1]).all(0))[0])
        raise InputError(
            f"non-finite attention score at context token {bad}; check the model dtype (use float32/bfloat16)"
        )


def document_scores(tokens: np.ndarray, spans: Sequence[Span], *, use_filter: bool = True) -> np.ndarray:
    """Score each document span ``[start, end)`` of ``tokens`` (ICR aggregation)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    check_finite(tokens)
    check_spans(spans, tokens.shape[0])
    out = np.empty(len(spans))
    for i, (s, e) in enumerate(spans):
        seg = tokens[s:e]
        out[i] = float(seg[keep_mask(seg, use_filter)].sum())
    return out


def per_head_document_scores(rows: np.ndarray, spans: Sequence[Span], *, use_filter: bool = True) -> np.ndarray:
    """``[H, D]``: each head's own document scores, with its own μ−2σ mask (QRHead detection)."""
    rows = np.asarray(rows, dtype=np.float64)
    check_finite(rows)  # a NaN would otherwise fail every μ−2σ test and count as 0
    check_spans(spans, rows.shape[1])
    out = np.empty((rows.shape[0], len(spans)))
    for i, (s, e) in enumerate(spans):
        seg = rows[:, s:e]
        if use_filter and seg.shape[1] > 1:
            sd = seg.std(1, ddof=1, keepdims=True)
            thr = seg.mean(1, keepdims=True) - 2.0 * sd
            seg = np.where((seg > thr) | (sd == 0.0), seg, 0.0)
        out[:, i] = seg.sum(1)
    return out


def window_features(
    windows: Sequence[WindowRows], n_docs: int, *, calibrate: bool = True, use_filter: bool = True
) -> np.ndarray:
    """``[H, D]`` per-head passage scores over a query's windows, in the input order of the
    candidates (``w.doc_index``) and the rows' head order."""
    out = None
    for w in windows:
        rows = w.rows if calibrate else w.real
        if out is None:
            out = np.zeros((rows.shape[0], n_docs))
        out[:, w.doc_index] = per_head_document_scores(rows, w.spans, use_filter=use_filter)
    if out is None:
        raise InputError("no windows given; pass the output of AttentionReranker.windows(query, docs)")
    return out
