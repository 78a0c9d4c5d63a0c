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
    np.testing.assert_allclose(normalize(np.array([2.0, 2.0]), "minmax"), [0, 0])
    with pytest.raises(InputError, match="'l3' is not one of"):
        normalize(np.array([1.0]), "l3")


def test_convex_minmax_missing_gets_list_minimum():
    sparse = (np.array([0, 1, 2]), np.array([10.0, 5.0, 0.0]))
    dense = (np.array([3, 0, 1]), np.array([0.9, 0.5, 0.1]))
    ids, scores = convex(sparse, dense, k=4, alpha=0.25, norm="minmax")
    # doc 0: .75*1 + .25*.5 ; doc 3: .75*0 (missing) + .25*1 ; doc 1: .75*.5 + 0 ; doc 2: 0 + 0 (missing)
    expected = {0: 0.875, 1: 0.375, 3: 0.25, 2: 0.0}
    assert list(ids) == [0, 1, 3, 2]
    np.testing.assert_allclose(scores, [expected[i] for i in ids])


def test_convex_alpha_extremes_reproduce_single_lists():
    sparse = (np.array([0, 1, 2]), np.array([3.0, 2.0, 1.0]))
    dense = (np.array([2, 1, 0]), np.array([0.9, 0.8, 0.7]))
    assert list(convex(sparse, dense, 3, alpha=0.0)[0]) == [0, 1, 2]
    assert list(convex(sparse, dense, 3, alpha=1.0, norm="zscore")[0]) == [2, 1, 0]
    with pytest.raises(InputError, match="alpha=1.5 is outside"):
        convex(sparse, dense, 3, alpha=1.5)
