"""The fused scorer's evaluation helpers: the mean nDCG training selects by, and what they refuse."""

from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.rerank.fused_features import FusionExample
from attnrank.rerank.fused_training import mean_ndcg
from attnrank.rerank.fusion_eval import compare


def _example(qid: str, labels: list[int], group: str = "A", qrels: dict | None = None) -> FusionExample:
    n = len(labels)
    signals = {"bm25": np.arange(n, 0, -1, dtype=float)}
    return FusionExample(qid, [f"{qid}-d{i}" for i in range(n)], signals, np.array(labels), 1, group, qrels)


def test_mean_ndcg_counts_a_query_without_judgments_as_zero_as_the_reports_do():
    """It gave such a query the other queries' mean (1.0 here), where compare counts it 0 (0.5)."""
    examples = [_example("q1", [1, 0]), _example("q2", [0, 0], qrels={})]
    first = {e.qid: e.signals["bm25"] for e in examples}
    assert mean_ndcg(examples, lambda e: e.signals["bm25"]) == pytest.approx(0.5)
    assert compare(examples, {"first": first}, ["nDCG@10"], baselines=("first",))[0]["nDCG@10"] == pytest.approx(0.5)


def test_examples_that_share_a_query_id_are_refused():
    """Keyed by query id, one replaced the other (datasets pooled with overlapping ids)."""
    examples = [_example("1", [1, 0], "A"), _example("1", [0, 1], "B")]
    with pytest.raises(InputError, match="query id '1' is in two examples \\(groups 'A' and 'B'\\)"):
        mean_ndcg(examples, lambda e: e.signals["bm25"])
    with pytest.raises(InputError, match="query id '1' is in two examples"):
        compare(examples, {"first": {"1": np.array([2.0, 1.0])}}, ["nDCG@10"], baselines=("first",))


def test_attention_confidence_refuses_non_finite_scores_and_reads_equal_ones_as_zero():
    from attnrank.rerank.fused_features import attention_confidence

    assert attention_confidence(np.full(3, 0.1)) == 0.0  # rounding made it -1.0
    assert attention_confidence(np.array([0.0, 0.0, 3.0])) == pytest.approx(np.sqrt(2))
    with pytest.raises(InputError, match="hold NaN or inf"):
        attention_confidence(np.array([np.nan, 0.0, 1.0]))  # read as 0: the gate hid it


def test_an_infinite_stage_score_ranks_where_it_stood():
    from attnrank.rerank.learned.features import stage_feature

    # +inf above every finite score (it tied with the best), -inf and NaN with the lowest
    assert stage_feature([np.inf, 2.0, 1.0, np.nan, -np.inf]).tolist() == [3.0, 2.0, 1.0, 1.0, 1.0]
