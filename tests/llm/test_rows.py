from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.llm.rows import (
    WindowRows,
    document_scores,
    keep_mask,
    per_head_document_scores,
    token_scores,
    window_features,
)


def test_token_scores_sum_and_weights():
    rows = np.array([[0.1, 0.2, 0.3], [0.5, 0.0, 0.1]])
    np.testing.assert_allclose(token_scores(rows), [0.6, 0.2, 0.4])
    np.testing.assert_allclose(token_scores(rows, np.array([2.0, -1.0])), [-0.3, 0.4, 0.5])


def test_filter_drops_tokens_below_mean_minus_two_std():
    # one strongly negative token among ten: mean - 2*std (unbiased) excludes it
    tokens = np.array([0.1] * 9 + [-5.0])
    vals = tokens[:10]
    thr = vals.mean() - 2 * vals.std(ddof=1)
    assert thr > -5.0  # the outlier is below the threshold
    s = document_scores(tokens, [(0, 10)])
    assert s[0] == pytest.approx(0.9)
    assert document_scores(tokens, [(0, 10)], use_filter=False)[0] == pytest.approx(-4.1)
    # ... and the std is the unbiased one: -2.2 lies above mean - 2*std with ddof=1 (-2.365), below
    # it with ddof=0 (-2.129), so the biased std would drop it (4.3 instead of 2.1)
    tokens = np.array([1.6, 1.3, 0.6, -2.2, 0.1, 0.7])
    assert tokens.mean() - 2 * tokens.std(ddof=1) < -2.2 < tokens.mean() - 2 * tokens.std(ddof=0)
    assert keep_mask(tokens).all()
    assert document_scores(tokens, [(0, 6)])[0] == pytest.approx(2.1)
    assert per_head_document_scores(tokens[None], [(0, 6)])[0, 0] == pytest.approx(2.1)  # each head's own mask


def test_scores_per_span_and_no_length_normalisation():
    tokens = np.array([1.0, 1.0, 1.0, 2.0, 0.5])
    np.testing.assert_allclose(document_scores(tokens, [(0, 3), (3, 5)]), [3.0, 2.5])


def test_single_token_span_and_bad_spans():
    assert document_scores(np.array([0.3]), [(0, 1)])[0] == pytest.approx(0.3)
    with pytest.raises(InputError, match=r"span \(2, 9\) is outside the 3 context tokens"):
        document_scores(np.zeros(3), [(2, 9)])


def test_non_finite_is_an_error():
    with pytest.raises(InputError, match="non-finite attention score at context token 1"):
        document_scores(np.array([0.1, np.nan, 0.2]), [(0, 3)])


def test_per_head_scores_use_their_own_mask():
    rows = np.array([[0.1] * 9 + [-5.0], [1.0] * 10])
    out = per_head_document_scores(rows, [(0, 10), (0, 5)])
    np.testing.assert_allclose(out, [[0.9, 0.5], [10.0, 5.0]])
    # summing per-head scores differs from filtering the head-summed tokens (QRHead vs ICR order)
    assert document_scores(token_scores(rows), [(0, 10)])[0] != pytest.approx(out[:, 0].sum())


def test_per_head_scores_refuse_non_finite_rows():
    """A NaN (or inf) failed every μ−2σ comparison, so the filter zeroed its whole span: head 0
    scored 0.0 for the document instead of raising as document_scores does."""
    rows = np.array([[0.1, np.nan, 0.2, 0.3], [0.1, 0.2, 0.3, 0.4]])
    with pytest.raises(InputError, match="non-finite attention score at context token 1"):
        per_head_document_scores(rows, [(0, 4)])
    rows[0, 1] = np.inf
    with pytest.raises(InputError, match="non-finite attention score at context token 1"):
        window_features([WindowRows([0], [(0, 4)], [1, 2, 3, 4], rows)], 1)
