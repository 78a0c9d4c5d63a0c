"""Shared fixtures of the rerank tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from attnrank.rerank.fused_features import FusionExample


def _examples(n: int, group: str, att_noise: float, seed: int) -> list[FusionExample]:
    """Queries of 10 candidates, 2 relevant: ``dense`` is informative, ``bm25`` weakly, ``rank``
    not at all; ``attention`` is informative with noise ``att_noise``."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        y = np.zeros(10, dtype=np.int64)
        y[rng.choice(10, 2, replace=False)] = 1
        sig = {
            "dense": y + rng.normal(0, 0.7, 10),
            "bm25": y + rng.normal(0, 2.0, 10),
            "rank": -np.arange(10.0),
            "attention": y + rng.normal(0, att_noise, 10),
        }
        out.append(FusionExample(f"{group}{i}", [f"d{j}" for j in range(10)], sig, y, 1, group))
    return out


@pytest.fixture
def make_examples() -> Callable[[int, str, float, int], list[FusionExample]]:
    """Synthetic labelled queries for the fused scorer: ``make_examples(n, group, att_noise, seed)``."""
    return _examples
