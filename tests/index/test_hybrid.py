from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.index.hybrid import convex, normalize, rrf


def test_rrf_values_and_order():
    ids, scores = rrf([np.array([0, 1, 2]), np.array([2, 0, -1])], k=10, rrf_k=60)
    expected = {0: 1 / 61 + 1 / 62, 1: 1 / 62, 2: 1 / 63 + 1 / 61}
    assert list(ids) == [0, 2, 1]
    np.testing.assert_allclose(scores, [expected[i] for i in ids])


def test_rrf_weights_and_k_cut():
    ids, _ = rrf([np.array([0, 1]), np.array([1, 0])], k=1, weights=[1.0, 3.0])
    assert list(ids) == [1]
    with pytest.raises(InputError, match="2 fusion weights given for 1 lists"):
        rrf([np.array([0])], k=1, weights=[1, 2])


def test_normalize():
    np.testing.assert_allclose(normalize(np.array([1.0, 3.0, 2.0]), "minmax"), [0, 1, 0.5])
    z = normalize(np.array([1.0, 2.0, 3.0]), "zscore")
    assert abs(z.mean()) < 1e-12 and abs(z.std() - 1) < 1e-12
    np.testing.assert_allclose(normalize(np.array([2.0, 2.0]), "minmax"), [1, 1])  # tied: all the best
    with pytest.raises(InputError, match="'l3' is not one of"):
        normalize(np.array([1.0]), "l3")


def test_convex_minmax_missing_gets_just_below_the_list_minimum():
    sparse = (np.array([0, 1, 2]), np.array([10.0, 5.0, 0.0]))
    dense = (np.array([3, 0, 1]), np.array([0.9, 0.5, 0.1]))
    ids, scores = convex(sparse, dense, k=4, alpha=0.25, norm="minmax")
    # doc 0: .75*1 + .25*.5 ; doc 3: .75*0 (missing) + .25*1 ; doc 1: .75*.5 + 0 ; doc 2: 0 + 0 (missing)
    expected = {0: 0.875, 1: 0.375, 3: 0.25, 2: 0.0}
    assert list(ids) == [0, 1, 3, 2]
    np.testing.assert_allclose(scores, [expected[i] for i in ids], atol=1e-6)
    assert scores[2] < 0.25 and scores[3] < 0.0  # (each missing one just below its list's lowest)


@pytest.mark.parametrize("norm", ["minmax", "zscore", "none"])
def test_a_lone_or_tied_sparse_match_outranks_documents_that_do_not_match(norm):
    """A one-hit (or all-tied) list normalised to zeros and gave missing documents its minimum, 0
    too: at alpha=0 the only BM25 match ranked last (ties by position), and at 0.45 it got no
    credit for matching."""
    dense = (np.array([0, 1, 2]), np.array([0.9, 0.8, 0.7]))
    assert list(convex((np.array([2]), np.array([4.2])), dense, 3, alpha=0.0, norm=norm)[0])[0] == 2
    tied = (np.array([2, 1, -1]), np.array([4.2, 4.2, 0.0]))
    assert list(convex(tied, dense, 3, alpha=0.0, norm=norm)[0]) == [1, 2, 0]
    ids, scores = convex((np.array([2]), np.array([4.2])), dense, 3, alpha=0.45, norm=norm)
    one_match = dict(zip(ids.tolist(), scores.tolist()))
    ids, scores = convex((np.array([], dtype=np.int64), np.array([])), dense, 3, alpha=0.45, norm=norm)
    no_match = dict(zip(ids.tolist(), scores.tolist()))
    assert one_match[2] - one_match[1] > no_match[2] - no_match[1]  # matching counts


@pytest.mark.parametrize("norm", ["minmax", "zscore"])
def test_the_last_of_several_sparse_matches_outranks_documents_that_do_not_match(norm):
    """Missing documents got the list's minimum, the score of its last hit: at alpha=0 that hit tied
    with every document holding no query term and lost to them on position (the dense side too)."""
    sparse = (np.array([8, 9]), np.array([3.1, 1.2]))
    dense = (np.arange(10), np.linspace(0.9, 0.1, 10))
    assert list(convex(sparse, dense, 3, alpha=0.0, norm=norm)[0])[:2] == [8, 9]
    assert list(convex(dense, sparse, 3, alpha=1.0, norm=norm)[0])[:2] == [8, 9]


def test_convex_alpha_extremes_reproduce_single_lists():
    sparse = (np.array([0, 1, 2]), np.array([3.0, 2.0, 1.0]))
    dense = (np.array([2, 1, 0]), np.array([0.9, 0.8, 0.7]))
    assert list(convex(sparse, dense, 3, alpha=0.0)[0]) == [0, 1, 2]
    assert list(convex(sparse, dense, 3, alpha=1.0, norm="zscore")[0]) == [2, 1, 0]
    with pytest.raises(InputError, match="alpha=1.5 is outside"):
        convex(sparse, dense, 3, alpha=1.5)


def test_a_score_just_below_stays_below_as_a_32_bit_float():
    """Evaluation ranks scores as trec_eval reads them (32-bit floats): a gap of 1e-9 of the lowest
    vanished there, and a sink-filtered passage without content ranked among the real ones by doc id."""
    from attnrank.index.hybrid import score_below

    for lo in (-0.37, 0.0, 5.0, -1234.5, 1e-12):
        assert np.float32(score_below(np.array([lo + 1.0, lo]))) < np.float32(lo), lo
