from __future__ import annotations

import random

import pytest

from attnrank.errors import InputError
from attnrank.eval.crossval import cross_validate, group_splits, kfold_splits, pool


def test_kfold_partitions_items():
    items = [f"q{i}" for i in range(23)]
    splits = kfold_splits(items, 5, seed=3)
    assert [s.name for s in splits] == ["0", "1", "2", "3", "4"]
    tested = [x for s in splits for x in s.test]
    assert sorted(tested) == sorted(items)  # every item held out exactly once
    for s in splits:
        assert not set(s.train) & set(s.test) and len(s.train) + len(s.test) == len(items)
    assert {len(s.test) for s in splits} == {4, 5}
    assert kfold_splits(items, 5, seed=3)[0].test == splits[0].test  # seeded
    assert kfold_splits(items, 5, seed=4)[0].test != splits[0].test


def test_kfold_matches_the_benchmarks_round_robin_of_a_shuffled_list():
    """The split the published bench_heads figures used: shuffle the sorted ids with
    random.Random(0), folds = ids[i::k], training ids in shuffled order."""
    ids = sorted(f"{i:03d}" for i in range(43))
    shuffled = list(ids)
    random.Random(0).shuffle(shuffled)
    for i, s in enumerate(kfold_splits(ids, 5, seed=0)):
        test = shuffled[i::5]
        assert s.test == test and s.train == [q for q in shuffled if q not in set(test)]


def test_group_splits_order_and_errors():
    items = [("b", 1), ("a", 2), ("b", 3), ("c", 4)]
    splits = group_splits(items, lambda x: x[0])
    assert [s.name for s in splits] == ["a", "b", "c"]
    assert splits[1].test == [("b", 1), ("b", 3)] and splits[1].train == [("a", 2), ("c", 4)]
    assert [s.name for s in group_splits(items, lambda x: x[0], groups=["c", "a", "b"])] == ["c", "a", "b"]
    with pytest.raises(InputError, match="no items"):
        group_splits(items, lambda x: x[0], groups=["a", "z"])
    with pytest.raises(InputError, match="at least 2 groups"):
        group_splits([("a", 1)], lambda x: x[0])
    with pytest.raises(InputError, match=r"groups \['a'\] are named more than once"):  # was held out twice
        group_splits(items, lambda x: x[0], groups=["a", "b", "a"])
    with pytest.raises(InputError, match="folds=1 needs a whole number 2 <= folds"):
        kfold_splits(items, 1)
    with pytest.raises(InputError, match="folds=5 needs a whole number 2 <= folds <= 4 .the number of items."):
        kfold_splits(items, 5)
    with pytest.raises(InputError, match="folds=2.5 needs a whole number"):  # (a float failed later, a TypeError)
        kfold_splits(items, 2.5)


def test_cross_validate_fits_on_train_only_and_pools_by_test_size():
    items = list(range(10))
    seen = []

    def fit(train):
        seen.append(sorted(train))
        return sum(train) / len(train)  # a "model": the training mean

    rows = cross_validate(
        kfold_splits(items, 3), fit, lambda m, test: {"err": sum(abs(x - m) for x in test) / len(test), "label": "x"}
    )
    assert [r["n_test"] for r in rows] == [4, 3, 3] and all(r["n_train"] + r["n_test"] == 10 for r in rows)
    assert all(len(s) == 10 - r["n_test"] for s, r in zip(seen, rows))
    pooled = pool(rows)
    assert set(pooled) == {"err"}  # non-numeric columns are left out
    assert pooled["err"] == pytest.approx(sum(r["err"] * r["n_test"] for r in rows) / 10)
    assert pool([{"n": 1, "m": 1.0}, {"n": 3, "m": 0.0}], n="n") == {"m": 0.25}
    with pytest.raises(InputError):
        pool([])
    with pytest.raises(InputError, match="no test items"):  # was ZeroDivisionError
        pool([{"n_test": 0, "m": 1.0}])


def test_pool_keeps_numpy_number_columns():
    """A metric computed with NumPy (np.float32 means, np.int64 counts) was silently left out."""
    import numpy as np

    rows = [
        {"fold": "0", "n_test": 1, "ndcg": np.float32(1.0), "hits": np.int64(2), "ok": np.bool_(True)},
        {"fold": "1", "n_test": 3, "ndcg": np.float32(0.0), "hits": np.int64(6), "ok": np.bool_(False)},
    ]
    assert pool(rows) == {"ndcg": pytest.approx(0.25), "hits": pytest.approx(5.0)}


def test_pool_pools_the_metrics_of_nested_method_columns():
    """kfold_evaluate's rows hold each method's metrics as a dict: pooled, they came out {}."""
    rows = [
        {"fold": "0", "n_train": 3, "n_test": 1, "learned": {"nDCG@10": 1.0}, "first-stage": {"nDCG@10": 0.5}},
        {"fold": "1", "n_train": 1, "n_test": 3, "learned": {"nDCG@10": 0.0}, "first-stage": {"nDCG@10": 0.5}},
    ]
    assert pool(rows) == {"learned nDCG@10": pytest.approx(0.25), "first-stage nDCG@10": pytest.approx(0.5)}


def test_linked_items_stay_in_one_fold_and_unlinked_ones_are_dealt_as_before():
    """LoCoMo questions about one conversation share evidence turns (and SciFact repeats claims
    with their judgements): dealt one by one, a question's twin sat in the training part."""
    from types import SimpleNamespace

    from attnrank.eval.crossval import relevant_links

    items = list(range(20))
    plain = kfold_splits(items, 4, seed=3)
    unlinked = kfold_splits(items, 4, seed=3, links=lambda x: [f"doc{x}"])
    assert [(s.train, s.test) for s in unlinked] == [(s.train, s.test) for s in plain]

    linked = kfold_splits(items, 4, seed=3, links=lambda x: [x // 5] if x < 10 else [f"own{x}"])  # two sets of 5
    for group in (set(range(5)), set(range(5, 10))):
        assert sum(bool(group & set(s.test)) for s in linked) == 1  # each in one fold's test part only
    assert sorted(x for s in linked for x in s.test) == items and max(len(s.test) for s in linked) <= 6
    chained = kfold_splits(
        items, 2, links=lambda x: [x, x + 1] if x < 3 else [f"own{x}"]
    )  # 0-1-2 through 1 and 2: one set
    assert sum(bool({0, 1, 2} & set(s.test)) for s in chained) == 1
    with pytest.raises(InputError, match=r"folds=3 needs .* <= 2 .the number of sets of linked items"):
        kfold_splits(items, 3, links=lambda x: [x % 2])

    q = SimpleNamespace(doc_ids=["a", "b"], labels=[1, 0], qrels={"a": 2, "c": 1, "b": 0}, rel=None, group="locomo")
    assert relevant_links(rel=2)(q) == [("locomo", "a")] and relevant_links()(q) == [("locomo", "a"), ("locomo", "c")]
    bare = SimpleNamespace(doc_ids=["a", "b"], labels=[0, 1], qrels=None, rel=1, group="")
    assert relevant_links()(bare) == [("", "b")]


def test_query_ids_judged_relevant_to_one_document_stay_in_one_fold():
    """qrels_links: the links of query ids read from qrels (benchmarks, the train command's check)."""
    from attnrank.eval.crossval import labelled_splits, qrels_links

    qrels = {"q0": {"a": 2, "b": 0}, "q1": {"a": 1}, "q2": {"c": 1}, "q3": {"a": 0}}
    assert (
        qrels_links(qrels)("q0") == ["a"] and qrels_links(qrels, rel=2)("q1") == [] and qrels_links(qrels)("q9") == []
    )
    qids = ["q0", "q1", "q2", "q3"] + [f"x{i}" for i in range(8)]
    for s in labelled_splits(qids, 4, seed=1, links=qrels_links(qrels)):
        assert ("q0" in s.test) == ("q1" in s.test)  # both judged relevant to "a"


def test_labelled_queries_sharing_few_relevant_documents_are_dealt_one_by_one_and_warned(caplog):
    """Where a few documents are relevant to many queries (a FAQ), keeping linked queries together
    would leave fewer sets than folds: they are dealt one by one, and that is said."""
    from types import SimpleNamespace

    from attnrank.eval.crossval import labelled_splits

    def query(i: int, doc: str) -> SimpleNamespace:
        return SimpleNamespace(qid=str(i), doc_ids=[doc, "x"], labels=[1, 0], qrels=None, rel=1, group="")

    twins = [query(i, f"d{i // 2}") for i in range(10)]  # five pairs
    splits = labelled_splits(twins, 5, seed=1)
    assert all({q.doc_ids[0] for q in s.test} & {q.doc_ids[0] for q in s.train} == set() for s in splits)
    faq = [query(i, f"answer{i % 2}") for i in range(10)]  # two sets only
    with caplog.at_level("WARNING", logger="attnrank.eval.crossval"):
        splits = labelled_splits(faq, 5, seed=1)
    assert [len(s.test) for s in splits] == [2] * 5 and "dealt one by one" in caplog.text


def test_one_linked_set_larger_than_a_fold_is_dealt_one_by_one_not_lopsided(caplog):
    """96 of 100 queries sharing one relevant document passed (5 sets for 5 folds): one fold tested
    96 queries with a model trained on 4."""
    from types import SimpleNamespace

    from attnrank.eval.crossval import labelled_splits

    qs = [
        SimpleNamespace(doc_ids=["faq1" if i < 96 else f"d{i}"], labels=[1], qrels=None, rel=1, group="")
        for i in range(100)
    ]
    with caplog.at_level("WARNING", logger="attnrank.eval.crossval"):
        splits = labelled_splits(qs, 5, seed=2)
    assert [len(s.test) for s in splits] == [20] * 5 and "dealt one by one" in caplog.text
