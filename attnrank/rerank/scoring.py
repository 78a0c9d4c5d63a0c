"""From captured attention rows to document scores (ICR, Chen et al. ICLR 2025; QRHead, Zhang et
al. EMNLP 2025).

Inputs are per-head attention rows averaged over the query span, shape ``[H, T]`` over the
context tokens: ``a[h, j] = (1/|T_q|) Σ_{t∈T_q} attn^{h}_{t→j}``. With content-free
calibration the rows of the "N/A" query are subtracted: ``Δ[h, j] = a_q[h, j] − a_∅[h, j]``.

- :func:`token_scores`: Σ over heads (optionally weighted) → ``Δ_j`` per context token.
- :func:`document_scores`: per document, keep tokens with ``Δ_j > μ_d − 2σ_d`` (torch-style
  unbiased std) and sum them; no length normalisation (ICR §3 / QRHead).
- :func:`per_head_document_scores`: the same aggregation per head (QRHead's per-head mask),
  the features used by head detection and the learned head weighting.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InputError

Span = tuple[int, int]


def token_scores(rows: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Sum ``[H, T]`` head rows into ``[T]`` token scores (``weights`` per head, default 1)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2:
        raise InputError(f"attention rows must be [heads, tokens], got shape {rows.shape}")
    return rows.sum(0) if weights is None else np.asarray(weights, dtype=np.float64) @ rows


def filter_mask(values: np.ndarray, use_filter: bool = True) -> np.ndarray:
    """Which of one document's token scores count in its score: ICR's ``Δ_j > μ − 2σ`` (all of
    them without the filter, with fewer than 2 tokens, or when all are equal)."""
    values = np.asarray(values, dtype=np.float64)
    if not use_filter or values.size < 2:
        return np.ones(values.shape, dtype=bool)
    sd = values.std(ddof=1)
    if sd == 0.0:  # all tokens equal: none is an outlier (a strict '>' would drop them all)
        return np.ones(values.shape, dtype=bool)
    return values > values.mean() - 2.0 * sd


def _filtered_sum(values: np.ndarray, use_filter: bool) -> float:
    return float(values[filter_mask(values, use_filter)].sum())


def document_scores(tokens: np.ndarray, spans: Sequence[Span], *, use_filter: bool = True) -> np.ndarray:
    """Score each document span ``[start, end)`` of ``tokens`` (ICR aggregation)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    if not np.isfinite(tokens).all():
        bad = int(np.flatnonzero(~np.isfinite(tokens))[0])
        raise InputError(f"non-finite attention score at context token {bad}; check the model dtype (use float32/bfloat16)")
    out = np.empty(len(spans))
    for i, (s, e) in enumerate(spans):
        if not 0 <= s < e <= tokens.shape[0]:
            raise InputError(f"document span {(s, e)} is outside the {tokens.shape[0]} context tokens")
        out[i] = _filtered_sum(tokens[s:e], use_filter)
    return out


def per_head_document_scores(rows: np.ndarray, spans: Sequence[Span], *, use_filter: bool = True) -> np.ndarray:
    """``[H, D]``: each head's own document scores, with its own μ−2σ mask (QRHead detection)."""
    rows = np.asarray(rows, dtype=np.float64)
    out = np.empty((rows.shape[0], len(spans)))
    for i, (s, e) in enumerate(spans):
        seg = rows[:, s:e]
        if use_filter and seg.shape[1] > 1:
            sd = seg.std(1, ddof=1, keepdims=True)
            thr = seg.mean(1, keepdims=True) - 2.0 * sd
            seg = np.where((seg > thr) | (sd == 0.0), seg, 0.0)
        out[:, i] = seg.sum(1)
    return out
