from __future__ import annotations

from attnrank.types import Document, RankedResults, ScoredDocument, rank_documents


def test_results_are_sorted_and_reranked_from_one():
    res = RankedResults("q", [ScoredDocument("a", 0.1, 1), ScoredDocument("b", 0.9, 2), ScoredDocument("c", 0.5, 3)])
    assert res.ids == ["b", "c", "a"] and [r.rank for r in res] == [1, 2, 3]
    assert res.top_k(2).ids == ["b", "c"]


def test_ties_keep_previous_order():
    res = RankedResults("q", [ScoredDocument("x", 1.0, 2), ScoredDocument("y", 1.0, 1)])
    assert res.ids == ["y", "x"]


def test_rank_documents_keeps_stage_scores_and_metadata():
    docs = [Document("a", "t1", metadata={"sentences": ["t1"]}), Document("b", "t2")]
    first = rank_documents("q", docs, [2.0, 1.0], stage="bm25")
    second = rank_documents("q", first.documents(), [0.1, 0.3], stage="attention", previous=first.results)
    assert second.ids == ["b", "a"]
    assert second[1].stage_scores == {"bm25": 2.0, "attention": 0.1}
    assert second.documents()[1].metadata == {"sentences": ["t1"]}
