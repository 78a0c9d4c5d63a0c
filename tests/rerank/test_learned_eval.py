"""Cross-validated evaluation of learned head weights over queries of different datasets."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_learned import synthetic

from attnrank.rerank.learned import evaluate_scores, leave_one_group_out


def test_folds_evaluate_each_query_with_its_own_rel():
    # Two datasets mixed in every fold: "dl" judges relevance from label 2 (none of its labels
    # reach it), "sci" from label 1. Before, a fold with both was evaluated with rel=1 for all,
    # so the "dl" queries' label-1 passages counted as relevant.
    ex = [replace(q, rel=2 if i % 4 >= 2 else 1) for i, q in enumerate(synthetic(n_queries=40, groups=("a", "b")))]
    rows = leave_one_group_out(ex, metrics=("RR@10",), l2=0.1)
    sum_of_heads = lambda q: q.features.sum(axis=1)  # noqa: E731
    for row in rows:
        test = [q for q in ex if q.group == row["fold"]]
        sci = [q for q in test if q.rel == 1]
        assert 0 < len(sci) < len(test)
        expected = evaluate_scores(sci, sum_of_heads, ("RR@10",), 1)["RR@10"] * len(sci) / len(test)
        assert np.isclose(row["sum-of-heads"]["RR@10"], expected)


def test_learned_scorer_says_that_it_overrides_calibrate_and_token_filter(llm, caplog):
    from attnrank.rerank.attention import AttentionReranker
    from attnrank.rerank.learned import QueryFeatures, train_head_weights

    heads = [(0, 2), (1, 1)]
    ex = [
        QueryFeatures(f"q{i}", ["a", "b", "c"], np.eye(3)[:, :2] * (i + 1), np.array([1, 0, 0]), heads)
        for i in range(4)
    ]
    w = train_head_weights(ex, calibrate=True, use_filter=True)
    rr = AttentionReranker(llm, scorer=w, signals=None)
    assert (rr.calibrate, rr.token_filter) == (True, True) and "not applied" not in caplog.text
    # before: calibrate=False was silently replaced by the weights' calibrate=True
    rr = AttentionReranker(llm, scorer=w, signals=None, calibrate=False)
    assert rr.calibrate is True
    assert "calibrate=False, token_filter=True are not applied" in caplog.text


def test_first_stage_or_stage_scores_of_another_length_are_refused():
    from attnrank.errors import InputError
    from attnrank.rerank.learned import QueryFeatures, train_head_weights

    ex = [
        QueryFeatures(
            f"q{i}", ["a", "b", "c"], np.eye(3)[:, :2] * (i + 1), np.array([1, 0, 0]), [(0, 0), (0, 1)], np.ones(3)
        )
        for i in range(4)
    ]
    ex[2].first_stage = np.array([3.0, 2.0])  # before: a numpy concatenation traceback
    with pytest.raises(
        InputError, match=r"query 'q2'.* different numbers of values \{'features': 3, 'first_stage': 2\}"
    ):
        train_head_weights(ex, first_stage=True)
    ex[2].first_stage, ex[1].stages = np.array([3.0, 2.0, 1.0]), {"dense": np.ones(4)}
    for q in ex[:1] + ex[2:]:
        q.stages = {"dense": np.ones(3)}
    with pytest.raises(InputError, match=r"query 'q1'.* \{'features': 3, 'dense': 4\}"):
        train_head_weights(ex, stages=["dense"])


def test_evaluation_reads_every_judgment_of_the_query_not_only_the_candidates():
    """One of two relevant documents retrieved and ranked first: nDCG@10 0.613 and R@2 0.5 against
    the query's judgments; against the candidates' labels alone it read 1.0 and 1.0."""
    from attnrank.llm.rows import WindowRows
    from attnrank.rerank.learned import evaluate_scores, query_features

    rows = np.array([[0.9, 0.1, 0.0]])
    window = WindowRows([0, 1, 2], [(0, 1), (1, 2), (2, 3)], [0, 1, 2], rows)
    qrels = {"q": {"a": 1, "missed": 1}}
    q = query_features("q", [window], ["a", "b", "c"], [(0, 0)], qrels, calibrate=False, use_filter=False)
    got = evaluate_scores([q], lambda x: x.features[:, 0], ("nDCG@10", "R@2"))
    assert got["R@2"] == pytest.approx(0.5)
    assert got["nDCG@10"] == pytest.approx(1 / (1 + 1 / np.log2(3)))


def test_a_candidate_listed_twice_is_refused():
    """Its label counted twice in training, and one of its two scores was lost in evaluation."""
    from attnrank.errors import InputError
    from attnrank.llm.rows import WindowRows
    from attnrank.rerank.learned import query_features

    window = WindowRows([0, 1, 2], [(0, 1), (1, 2), (2, 3)], [0, 1, 2], np.array([[0.9, 0.1, 0.0]]))
    with pytest.raises(InputError, match=r"query 'q' lists the candidates \['a'\] more than once"):
        query_features("q", [window], ["a", "b", "a"], [(0, 0)], {}, calibrate=False, use_filter=False)


@pytest.mark.parametrize("mixed", [False, True])
def test_a_judged_query_without_candidates_counts_zero_whatever_the_fold_mix(mixed):
    """It counted 0 where a fold held one rel and was dropped where it mixed two."""
    from attnrank.rerank.learned.features import QueryFeatures
    from attnrank.rerank.learned.training import _evaluate_by_rel

    def query(qid, rel, docs=("d1", "d2")):
        n = len(docs)
        return QueryFeatures(qid, list(docs), np.eye(n)[:, :1], np.array([2, 0][:n]), [(0, 0)], rel=rel)

    other = 2 if mixed else 1
    none = replace(query("b", other, ()), qrels={"x": 2})
    got = _evaluate_by_rel([query("a", 1), query("c", other), none], lambda q: q.features[:, 0], ("nDCG@10",), 1)
    assert got["nDCG@10"] == pytest.approx(2 / 3)
