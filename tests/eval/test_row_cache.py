from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from _tiny import rerank_docs, tiny_llm

from attnrank.eval.rows import (
    cache_file,
    cached_signals,
    candidates_digest,
    capture_all,
    first_stage_run,
    load_windows,
    run_of,
    save_windows,
    setting_key,
    stored_candidates,
)
from attnrank.rerank.attention import AttentionReranker


class Counting:
    """The real reranker, counting its captures."""

    def __init__(self, rr):
        self.rr, self.llm, self.calls = rr, rr.llm, 0

    def windows(self, query, docs):
        self.calls += 1
        return self.rr.windows(query, docs)


@pytest.fixture(scope="module")
def reranker():
    return AttentionReranker(tiny_llm(), None)


def test_setting_key_drops_the_sample_size():
    assert setting_key("SciFact train hybrid top-20 (50 queries)") == setting_key(
        "SciFact train hybrid top-20 (809 queries)"
    )
    assert setting_key("HotpotQA distractor BM25-ordered (400 questions)") == "HotpotQA_distractor_BM25_ordered"
    assert cache_file(None, "x", "q", "abc") is None
    assert (
        cache_file(Path("c"), "DL19 BM25 top-20", "1037798", "0123456789abcdef").as_posix()
        == "c/DL19_BM25_top_20_0123456789ab/1037798.npz"
    )
    int8 = cache_file(Path("c"), "DL19 BM25 top-20", "1037798", "0123456789abcdef+int8")
    assert int8.as_posix() == "c/DL19_BM25_top_20_0123456789ab-int8/1037798.npz"  # never the float32 rows


def test_cache_files_of_distinct_query_ids_never_meet():
    """Ids that differ only in punctuation or case once shared a file, so one query read another's rows."""
    ids = ["a.b", "a_b", "a-b", "a b", "a__b", "A_B", "ab", "AB", "a_b_", "", "x" * 300, "x" * 301]
    names = [cache_file(Path("c"), "toy", q, "0123456789abcdef").name for q in ids]
    assert len({n.lower() for n in names}) == len(ids), names  # distinct on a case-insensitive disk too
    assert cache_file(Path("c"), "toy", "a.b", "0123456789abcdef").name.startswith("a_b-")  # still readable
    assert max(len(n) for n in names) < 100


def test_windows_round_trip_as_float32(tmp_path, reranker):
    docs = rerank_docs()
    wins = reranker.windows("capital of France?", docs)
    save_windows(tmp_path / "q.npz", wins, 1.5)
    back, secs = load_windows(tmp_path / "q.npz")
    assert secs == 1.5 and len(back) == len(wins)
    for w, b in zip(wins, back):
        assert b.doc_index == list(w.doc_index) and b.spans == [tuple(s) for s in w.spans]
        assert b.input_ids == list(w.input_ids) and b.real.dtype == np.float32
        want = w.real.astype(np.float32).astype(np.float64) - w.null.astype(np.float32).astype(np.float64)
        np.testing.assert_array_equal(b.rows, want)
        np.testing.assert_allclose(b.rows, w.rows, atol=1e-6)
    assert [p.name for p in tmp_path.iterdir()] == ["q.npz"]  # the temporary file was renamed
    for labelled in (True, False):  # full prompts' spans begin with their [i] label, blocks' do not
        save_windows(tmp_path / "b.npz", [replace(w, labelled=labelled) for w in wins], 1.0)
        assert [b.labelled for b in load_windows(tmp_path / "b.npz")[0]] == [labelled] * len(wins)


def test_capture_all_reads_the_cache_the_second_time(tmp_path, reranker):
    docs = rerank_docs()
    cands = {"a": docs, "b": docs[:2]}
    queries = {"a": "capital of France?", "b": "yellow fruit"}
    cap = Counting(reranker)
    first = capture_all(cap, "toy (2 queries)", queries, cands, tmp_path)
    assert cap.calls == 2
    again = capture_all(cap, "toy (5 queries)", queries, cands, tmp_path)  # same key without the sample size
    assert cap.calls == 2
    for q in queries:
        np.testing.assert_allclose(again[q]["windows"][0].rows, first[q]["windows"][0].rows, atol=1e-6)
        assert again[q]["seconds"] == pytest.approx(first[q]["seconds"])
    capture_all(cap, "toy", {"a": queries["a"]}, cands, None)  # no cache: captured again
    assert cap.calls == 3


def test_rows_captured_over_another_candidate_list_are_captured_again(tmp_path, reranker):
    """Rows are placed by candidate position: a cached file from another list (a rebuilt index,
    another first stage) would give its scores to the wrong documents."""
    docs = rerank_docs()
    cap = Counting(reranker)
    capture_all(cap, "toy", {"a": "capital of France?"}, {"a": docs}, tmp_path)
    capture_all(cap, "toy", {"a": "capital of France?"}, {"a": docs}, tmp_path)
    assert cap.calls == 1
    again = capture_all(cap, "toy", {"a": "capital of France?"}, {"a": docs[::-1]}, tmp_path)
    assert cap.calls == 2
    np.testing.assert_allclose(
        again["a"]["windows"][0].rows, reranker.windows("capital of France?", docs[::-1])[0].rows, atol=1e-6
    )
    # a file from before lists were recorded is read only where its spans hold these candidates,
    # and is then stamped with the list
    (f,) = tmp_path.rglob("a.npz")
    save_windows(f, reranker.windows("capital of France?", docs), 1.0)
    capture_all(cap, "toy", {"a": "capital of France?"}, {"a": docs[::-1]}, tmp_path)
    assert cap.calls == 3  # other candidates in those spans: captured again (and stamped)
    save_windows(f, reranker.windows("capital of France?", docs), 1.0)
    capture_all(cap, "toy", {"a": "capital of France?"}, {"a": docs}, tmp_path)
    assert cap.calls == 3 and stored_candidates(f) == candidates_digest([d.id for d in docs])
    capture_all(cap, "toy", {"a": "capital of France?"}, {"a": docs[:2]}, tmp_path)
    assert cap.calls == 4


def test_cached_signals_computes_only_missing_queries(tmp_path):
    asked = []

    def compute(qids):
        asked.append(list(qids))
        return {q: {"bm25": [1.0, float("nan")], "dense": [0.5, 0.25]} for q in qids}

    s = cached_signals("set (3 queries)", ["a", "b"], compute, tmp_path)
    assert asked == [["a", "b"]] and np.isnan(s["a"]["bm25"][1]) and s["b"]["dense"].tolist() == [0.5, 0.25]
    cached_signals("set (9 queries)", ["b", "c"], compute, tmp_path)
    assert asked[1] == ["c"]
    assert set(json.loads((tmp_path / "signals_set.json").read_text())) == {"a", "b", "c"}


def test_cached_signals_are_computed_again_for_a_changed_candidate_list(tmp_path):
    """Scores follow their candidates' order: an entry computed over another list (the first
    stage changed since) would give them to the wrong documents, so it is computed again."""
    asked = []

    def compute(qids):
        asked.append(list(qids))
        return {q: {"bm25": [float(len(asked)), 0.0]} for q in qids}

    lists = {"a": ["d1", "d2"], "b": ["d3", "d4"]}
    cached_signals("set", ["a", "b"], compute, tmp_path, lists)
    again = cached_signals("set", ["a", "b"], compute, tmp_path, lists)
    assert asked == [["a", "b"]] and set(again["a"]) == {"bm25"}  # the record is not a signal
    moved = cached_signals("set", ["a", "b"], compute, tmp_path, {**lists, "b": ["d4", "d3"]})
    assert asked[1] == ["b"] and moved["b"]["bm25"][0] == 2.0 and moved["a"]["bm25"][0] == 1.0


def test_runs_from_candidates():
    docs = rerank_docs()
    assert first_stage_run({"q": docs[:3]}) == {"q": {"paris": 3.0, "berlin": 2.0, "banana": 1.0}}
    assert run_of({"q": docs[:2]}, {"q": np.array([0.5, 2])}) == {"q": {"paris": 0.5, "berlin": 2.0}}


def test_run_of_refuses_scores_that_do_not_cover_the_candidates():
    """A candidate without a score used to vanish from the run (counted as never retrieved)."""
    from attnrank.errors import InputError

    docs = rerank_docs()
    with pytest.raises(InputError, match="query 'q' has 1 scores for 2 candidates"):
        run_of({"q": docs[:2]}, {"q": [1.0]})


def test_two_runs_sharing_a_signals_cache_keep_each_others_entries(tmp_path):
    """Each run wrote back what it had read at its start plus its own: the one that finished last
    dropped the other's entries (and both wrote through one fixed temporary name)."""

    def compute(qids):
        if qids == ["a"]:  # run one, still computing, while run two computes and saves "b"
            cached_signals("set", ["b"], lambda q: {x: {"bm25": [2.0]} for x in q}, tmp_path)
        return {q: {"bm25": [1.0]} for q in qids}

    cached_signals("set", ["a"], compute, tmp_path)
    assert set(json.loads((tmp_path / "signals_set.json").read_text())) == {"a", "b"}
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []
