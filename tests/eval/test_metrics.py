from __future__ import annotations

import math
import os
import re
import stat

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.eval import evaluate, evaluate_per_query, read_qrels, read_run, write_run
from attnrank.eval.metrics import per_query_ndcg_of_each, wins_losses


def test_read_trec_and_beir_qrels(dl19_mini, scifact_mini):
    trec = read_qrels(dl19_mini / "qrels.txt")
    assert len(trec) == 3 and all(v in (0, 1, 2, 3) for q in trec.values() for v in q.values())
    beir = read_qrels(scifact_mini / "qrels" / "train.tsv")  # header line skipped
    assert len(beir) == 12 and read_qrels(scifact_mini) == beir


def test_run_round_trip(tmp_path, dl19_mini):
    run = read_run(dl19_mini / "run.bm25.trec")
    write_run(run, tmp_path / "r.trec")
    again = read_run(tmp_path / "r.trec")
    assert again.keys() == run.keys()
    for q in run:
        assert again[q] == pytest.approx(run[q], abs=1e-6)
    with pytest.raises(InputError, match="expected 6 columns"):
        (tmp_path / "bad").write_text("1 Q0 d 1\n")
        read_run(tmp_path / "bad")


def test_a_run_whose_tied_scores_contradict_its_rank_column_is_read_as_trec_eval_reads_it_and_said(tmp_path, caplog):
    """A run ranked by its rank column alone (every score 1.0) was read in doc-id order without a
    word: `rerank --depth 2` reranked the two documents with the largest ids, not its first two."""
    tied = tmp_path / "tied.trec"
    tied.write_text("q1 Q0 a 1 1.0 x\nq1 Q0 c 2 1.0 x\nq1 Q0 b 3 1.0 x\nq2 Q0 a 1 2.0 x\nq2 Q0 b 2 1.0 x\n")
    with caplog.at_level("WARNING"):
        run = read_run(tied)
    assert list(run["q1"]) == ["a", "c", "b"]  # (as listed; the order read is trec_eval's)
    assert "1 quer(ies) (first 'q1'; 1 with tied scores) rank documents in another order by their scores" in caplog.text
    caplog.clear()
    ascending = tmp_path / "ascending.trec"  # the rank written as the score: read c, b, a
    ascending.write_text("q1 Q0 a 1 1 x\nq1 Q0 b 2 2 x\nq1 Q0 c 3 3 x\n")
    with caplog.at_level("WARNING"):
        assert list(read_run(ascending)["q1"]) == ["a", "b", "c"]
    assert "(first 'q1'; 0 with tied scores) rank documents in another order" in caplog.text
    caplog.clear()
    agree = tmp_path / "agree.trec"  # ties the rank column orders as trec_eval does (doc id descending)
    agree.write_text("q1 Q0 c 1 1.0 x\nq1 Q0 b 2 1.0 x\nq1 Q0 a 3 0.5 x\n")
    with caplog.at_level("WARNING"):
        read_run(agree)
    assert "rank column" not in caplog.text


def test_byte_order_mark_is_not_part_of_the_first_id(tmp_path):
    (tmp_path / "q.txt").write_bytes("\ufeffq1 0 d1 1\nq2 0 d2 1\n".encode())
    (tmp_path / "r.trec").write_bytes("\ufeffq1 Q0 d1 1 2.0 x\n".encode())
    assert read_qrels(tmp_path / "q.txt") == {"q1": {"d1": 1}, "q2": {"d2": 1}}
    assert read_run(tmp_path / "r.trec") == {"q1": {"d1": 2.0}}


@pytest.mark.parametrize(
    ("run", "fragment"),
    [
        ({"q 1": {"d": 1.0}}, "query id 'q 1'"),
        ({"q": {"d\t2": 1.0}}, "holds whitespace"),
        ({"": {"d": 1.0}}, "query id ''"),
        ({"q": {"d": float("nan")}}, "score nan"),
        ({"q": {"d": float("inf"), "e": float("inf"), "f": 0.5}}, "score inf"),
    ],
)
def test_runs_a_trec_file_cannot_hold_are_refused(tmp_path, run, fragment):
    with pytest.raises(InputError, match=fragment):
        write_run(run, tmp_path / "r.trec")
    assert not (tmp_path / "r.trec").exists()


def test_an_infinite_score_of_ranked_results_is_refused_not_written_as_a_huge_number(tmp_path):
    """Tie-breaking started below +inf: a first score of +inf became 1.8e308, past the check."""
    from attnrank.types import RankedResults, ScoredDocument

    res = RankedResults("q", [ScoredDocument("d1", float("inf"), 1), ScoredDocument("d2", 0.5, 2)], "q1")
    with pytest.raises(InputError, match="score inf"):
        write_run([res], tmp_path / "r.trec")


def test_a_mistyped_label_on_the_first_qrels_line_is_refused_not_taken_for_a_header(tmp_path):
    """Any first line whose label was no number was dropped as BEIR's header: a judgment lost, exit 0."""
    path = tmp_path / "q.txt"
    path.write_text("q1 0 d1 two\nq1 0 d2 1\n")
    with pytest.raises(InputError, match="relevance 'two' is not a number"):
        read_qrels(path)
    path.write_text("q1\td1\tx\nq1\td2\t1\n")
    with pytest.raises(InputError, match="relevance 'x' is not a number"):
        read_qrels(path)
    path.write_text("query-id\tcorpus-id\tscore\nq1\td2\t1\n")  # BEIR's header: skipped
    assert read_qrels(path) == {"q1": {"d2": 1}}


def test_run_is_never_renamed_over_a_pipe(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        write_run({"q": {"d": 1.0}}, fifo)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_ndcg_by_hand():
    qrels = {"q": {"a": 2, "b": 1, "c": 0}}
    run = {"q": {"c": 3.0, "a": 2.0, "b": 1.0}}
    # trec_eval linear gain: DCG = 0/log2(2) + 2/log2(3) + 1/log2(4); ideal = 2 + 1/log2(3)
    expected = (2 / math.log2(3) + 1 / 2) / (2 + 1 / math.log2(3))
    assert evaluate(run, qrels, ["nDCG@10"])["nDCG@10"] == pytest.approx(expected)
    assert evaluate(run, qrels, ["RR@10"])["RR@10"] == pytest.approx(0.5)
    assert evaluate(run, qrels, ["RR@10"], rel=2)["RR@10"] == pytest.approx(0.5)
    assert evaluate(run, qrels, ["R@1"], rel=2)["R@1"] == 0.0


def test_missing_query_counts_zero():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    vals = evaluate({"q1": {"a": 1.0}}, qrels, ["nDCG@10"])
    assert vals["nDCG@10"] == pytest.approx(0.5)
    assert evaluate_per_query({"q1": {"a": 1.0}}, qrels, ["nDCG@10"])["q2"]["nDCG@10"] == 0.0


def test_what_moves_the_means_unseen_is_logged(caplog):
    """evaluate() returned plausible means and said nothing of a run none of whose documents is
    judged (another corpus's ids: every metric 0), nor of the run's queries left out."""
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    with caplog.at_level("WARNING", logger="attnrank.eval.metrics"):
        assert evaluate({"q1": {"X-a": 1.0}, "q2": {"X-b": 1.0}}, qrels, ["nDCG@10"]) == {"nDCG@10": 0.0}
    assert "no document the run ranks is judged (the run ranks 'X-a' for 'q1'" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.eval.metrics"):
        assert evaluate({"q1": {"a": 1.0}, "zz": {"a": 1.0}}, qrels, ["nDCG@10"])["nDCG@10"] == pytest.approx(0.5)
    assert "1 of the run's 2 queries (first: 'zz') have no judgments in the qrels" in caplog.text
    assert "1 of the 2 judged queries (first: 'q2') have no ranking in the run" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.eval.metrics"):
        evaluate({"q1": {"a": 1.0}, "q2": {"b": 1.0}}, qrels, ["nDCG@10"])
        evaluate({"q1": {"X": 1.0}}, qrels, ["nDCG@10"], warn=False)
    assert not caplog.records


def test_ids_spelt_otherwise_in_the_run_and_the_qrels_are_named(caplog):
    """Zero-padded ids in one file and plain ones in the other, matching for some documents only:
    nDCG@10 0.4875 for 0.8209 in a user's run, exit 0, without a word (only a run none of whose
    documents is judged was named)."""
    qrels = {"1": {"02613775": 1, "55": 1}, "06": {"a": 1}, "7": {"Doc-B ": 1}}
    run = {"1": {"2613775": 2.0, "55": 1.0}, "6": {"a": 1.0}, "7": {"doc-b": 1.0}}
    with caplog.at_level("WARNING", logger="attnrank.eval.metrics"):
        evaluate(run, qrels, ["nDCG@10"])
    assert (
        "1 judged query the run lacks matches one of its query ids but for leading zeros, case or spaces "
        "(the qrels' '06', the run's '6')" in caplog.text
    )
    assert (
        "2 judged document(s) are ranked under another spelling of their id, leading zeros, case or spaces (for '1' "
        "the run ranks '2613775', the qrels judge '02613775')" in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="attnrank.eval.metrics"):  # (ids alike as given: nothing said)
        evaluate({"1": {"02613775": 2.0, "55": 1.0}, "06": {"a": 1.0}}, {"1": {"02613775": 1}, "06": {"a": 1}})
    assert not caplog.records


def test_a_query_the_run_lacks_is_evaluated_as_an_empty_ranking_for_every_metric():
    """Every metric of a judged query missing from the run was filled in as 0: NumRel (a count of
    the qrels) too, where trec_eval -c reports the query's relevant documents."""
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 2, "d": 0}}
    per = evaluate_per_query({"q1": {"a": 1.0, "z": 0.5}}, qrels, ["NumRel", "NumRet", "NumRelRet", "nDCG@10", "P@5"])
    assert per["q2"] == {"NumRel": 2.0, "NumRet": 0.0, "NumRelRet": 0.0, "nDCG@10": 0.0, "P@5": 0.0}
    assert per["q1"]["NumRet"] == 2.0 and per["q1"]["NumRel"] == 1.0
    assert evaluate({"q1": {"a": 1.0}}, qrels, ["NumRel"])["NumRel"] == pytest.approx(1.5)
    # with rel=2, NumRet still counts what was retrieved (it became NumRelRet), and NumRel is refused in one line
    assert evaluate_per_query({"q1": {"a": 1.0, "z": 0.5}}, qrels, ["NumRet"], rel=2)["q1"]["NumRet"] == 2.0
    with pytest.raises(InputError, match="metric 'NumRel' at rel=2 is not computed by ir-measures"):
        evaluate_per_query({}, qrels, ["NumRel"], rel=2)


def test_numrelret_counts_at_the_callers_rel_and_a_cutoff_it_takes_not_is_one_line():
    """NumRelRet reads as NumRet(rel=1) in ir-measures: at rel=2 it counted label-1 documents too;
    NumRet@10 failed with an AssertionError from deep inside ir-measures."""
    qrels, run = {"q1": {"a": 2, "b": 1, "c": 0}}, {"q1": {"a": 1.0, "b": 2.0, "c": 3.0}}
    per = evaluate_per_query(run, qrels, ["NumRelRet", "NumRet(rel=1)", "NumRet"], rel=2)["q1"]
    assert per == {"NumRelRet": 1.0, "NumRet(rel=1)": 2.0, "NumRet": 3.0}  # a rel the name gives is kept
    with pytest.raises(InputError, match="metric 'NumRet@10' is not computed by ir-measures"):
        evaluate(run, qrels, ["NumRet@10"])


def test_dl19_bm25_slice(dl19_mini):
    vals = evaluate(
        read_run(dl19_mini / "run.bm25.trec"), read_qrels(dl19_mini / "qrels.txt"), ["nDCG@10", "R@20"], rel=2
    )
    assert 0 < vals["nDCG@10"] < 1 and 0 < vals["R@20"] <= 1


def test_wins_losses_and_sign_test_match_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    from attnrank.eval import sign_test, wins_losses

    assert wins_losses([0.1, -0.2, 0.0, 1e-12, -1e-12, 0.3]) == (2, 1)  # ties within 1e-9 not counted
    for w, l in [(25, 14), (7, 21), (0, 3), (5, 5), (12, 0)]:
        assert sign_test(w, l) == pytest.approx(scipy_stats.binomtest(w, w + l, 0.5).pvalue, rel=1e-12)
    assert sign_test(0, 0) == 1.0
    # the exact sums the records were computed with (docs/benchmarks.md: 19/20 p 1, 76/28 p 2.7e-06)
    assert sign_test(19, 20) == 1.0 and sign_test(76, 28) == pytest.approx(2.736780589985e-06, rel=1e-9)
    assert sign_test(np.int64(3), 0) == 0.25
    for bad in [(-1, 3), (2.5, 1), (True, 1)]:  # (a negative count gave p 0, a significant-looking figure)
        with pytest.raises(InputError, match="wins and losses are counts"):
            sign_test(*bad)


def test_tied_scores_rank_as_trec_eval_for_every_metric():
    """trec_eval orders equal scores by doc id descending; RR@k (computed by ir-measures' MS MARCO
    provider, which breaks ties ascending) must agree with it and with nDCG@k."""
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "b": 1.0}}  # trec_eval ranks b first
    vals = evaluate(run, qrels, ["RR@10", "RR", "nDCG@10"])
    assert vals["RR@10"] == pytest.approx(0.5) and vals["RR"] == pytest.approx(0.5)
    assert vals["nDCG@10"] == pytest.approx(1 / math.log2(3))


def test_tie_heavy_runs_match_pytrec_eval():
    import random

    pytrec_eval = pytest.importorskip("pytrec_eval")
    rnd = random.Random(1)
    docs = [f"d{i}" for i in range(30)]
    qrels = {f"q{i}": {d: rnd.choice([0, 0, 1, 2, 3]) for d in rnd.sample(docs, 10)} for i in range(10)}
    run = {q: {d: float(rnd.randint(0, 4)) for d in rnd.sample(docs, 20)} for q in qrels}
    top10 = {q: dict(sorted(d.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:10]) for q, d in run.items()}
    for rel in (1, 2):
        ours = evaluate_per_query(run, qrels, ["nDCG@10", "RR@10", "R@20"], rel=rel)
        ev = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_10", "recall_20"}, relevance_level=rel).evaluate(run)
        rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}, relevance_level=rel).evaluate(top10)
        for q in qrels:
            assert ours[q]["nDCG@10"] == pytest.approx(ev[q]["ndcg_cut_10"])
            assert ours[q]["R@20"] == pytest.approx(ev[q]["recall_20"])
            assert ours[q]["RR@10"] == pytest.approx(rr[q]["recip_rank"]), (rel, q)


def test_rel_applies_to_every_metric_with_a_threshold():
    qrels = {"q": {"a": 1, "b": 2}}
    run = {"q": {"a": 2.0, "b": 1.0}}
    # rel=2: one relevant document (b), ranked second
    vals = evaluate(run, qrels, ["Rprec", "Bpref", "SetP", "R@1"], rel=2)
    assert vals == {"Rprec": 0.0, "Bpref": 0.0, "SetP": 0.5, "R@1": 0.0}
    assert evaluate(run, qrels, ["Rprec", "SetP"]) == {"Rprec": 1.0, "SetP": 1.0}


def test_a_metrics_own_rel_above_every_label_is_refused_as_rel_is():
    """``P(rel=3)@5`` over labels 1-2 read 0 without a word, where ``rel=3`` was refused."""
    qrels, run = {"q": {"a": 1, "b": 2}}, {"q": {"a": 2.0, "b": 1.0}}
    assert evaluate(run, qrels, ["P(rel=2)@5"]) == {"P(rel=2)@5": pytest.approx(0.2)}
    for name in ("P(rel=3)@5", "NumRelRet(rel=3)"):
        with pytest.raises(InputError, match=rf"metric '{re.escape(name)}' counts labels of 3 and above .* is 2"):
            evaluate(run, qrels, ["nDCG@10", name])


def test_queries_without_judgments_are_not_averaged():
    qrels = {"q1": {"a": 1}, "q2": {}}  # q2 has no judgments: trec_eval would not know it
    assert evaluate({"q1": {"a": 1.0}, "q2": {"a": 1.0}}, qrels, ["nDCG@10"])["nDCG@10"] == 1.0
    assert set(evaluate_per_query({"q1": {"a": 1.0}}, qrels, ["nDCG@10"])) == {"q1"}
    # none judged: no mean (it was 0.0, read as a very bad score)
    for none in ({}, {"q2": {}}):
        with pytest.raises(InputError, match="the qrels judge no query"):
            evaluate({"q1": {"a": 1.0}}, none, ["nDCG@10"])


def test_ndcg_of_each_scorer_leaves_out_queries_without_judgments():
    """As in :func:`evaluate`: a query absent from the qrels or with none judged is not scored."""
    scores = {"q1": np.array([[2.0, 1.0], [1.0, 2.0]]), "q2": np.ones((2, 2)), "q3": np.ones((2, 2))}
    doc_ids = {q: ["a", "b"] for q in scores}
    per = per_query_ndcg_of_each(scores, doc_ids, {"q1": {"a": 1}, "q3": {}}, chunk=1)
    assert set(per) == {"q1"}
    assert per["q1"].tolist() == [1.0, pytest.approx(1 / math.log2(3))]  # a first, then a second
    assert per_query_ndcg_of_each(scores, doc_ids, {}) == {}


def test_written_run_keeps_the_order_of_close_scores(tmp_path):
    run = {"q": {"a": 0.1234564, "b": 0.1234561, "c": 2.5e-9, "d": 1e-9}}
    write_run(run, tmp_path / "r.trec")
    again = read_run(tmp_path / "r.trec")
    assert again == run  # in full: rounded, the scores would tie, and trec_eval ranks ties by doc id
    qrels = {"q": {"a": 1, "c": 1}}
    assert evaluate(again, qrels, ["nDCG@10"]) == evaluate(run, qrels, ["nDCG@10"])
    write_run({"q": {"a": 0.25, "b": 1 / 3, "c": 1 / 3}}, tmp_path / "r6.trec")  # 6 decimals tie nothing new
    assert (tmp_path / "r6.trec").read_text().split("\n")[2] == "q Q0 a 3 0.250000 attnrank"
    signed = {"q": {"a": 4e-7, "b": -4e-7}}  # "0.000000" and "-0.000000": different text, one value read back
    write_run(signed, tmp_path / "r0.trec")
    assert read_run(tmp_path / "r0.trec") == signed


def test_two_names_of_one_measure_each_get_their_line():
    """With rel=3, ``R@2`` and ``R(rel=3)@2`` are one measure: both names are reported."""
    qrels, run = {"q": {"a": 3, "b": 1, "c": 2}}, {"q": {"a": 1.0, "b": 0.9, "c": 0.8}}
    assert evaluate(run, qrels, ["R@2", "R(rel=3)@2"], rel=3) == {"R@2": 1.0, "R(rel=3)@2": 1.0}
    per = evaluate_per_query(run, qrels, ["R@2", "R(rel=3)@2"], rel=1)
    assert per == {"q": {"R@2": pytest.approx(2 / 3), "R(rel=3)@2": 1.0}}


def test_nan_scores_are_refused_not_ranked_anywhere():
    """A NaN score sorts anywhere: the relevant document ranked first gave a perfect nDCG."""
    qrels = {"q": {"a": 1, "b": 0, "c": 0}}
    run = {"q": {"a": math.nan, "b": 0.5, "c": 0.2}}
    with pytest.raises(InputError, match=r"query 'q', document 'a' has score nan"):
        evaluate(run, qrels, ["nDCG@10"])
    with pytest.raises(InputError, match="score nan"):
        per_query_ndcg_of_each({"q": np.array([[math.nan, 1.0, 2.0]])}, {"q": ["a", "b", "c"]}, qrels)
    assert evaluate({"q": {"a": math.inf, "b": -math.inf}}, qrels, ["nDCG@10"]) == {"nDCG@10": 1.0}


def test_ndcg_of_each_scorer_refuses_ragged_scores():
    """A query with fewer scorers or candidates than the first got nDCG 0 for the missing ones."""
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    doc_ids = {"q1": ["a", "b"], "q2": ["a", "b"]}
    for bad in (np.array([[1.0, 2.0]]), np.array([[1.0], [2.0]])):
        with pytest.raises(InputError, match=r"scores of query 'q2' have shape \(\d, \d\), not \(2, 2\)"):
            per_query_ndcg_of_each({"q1": np.array([[2.0, 1.0], [1.0, 2.0]]), "q2": bad}, doc_ids, qrels)


@pytest.mark.parametrize(
    "run, qrels, bad",
    [
        ({"1": {"a": 1.0}}, {1: {"a": 1}}, "qrels id 1 is a int"),
        ({1: {"a": 1.0}}, {"1": {"a": 1}}, "run id 1 is a int"),
        ({"q": {"a": 1.0}}, {"q": {7: 1}}, "qrels id 7 is a int"),
    ],
)
def test_ids_that_are_not_strings_get_one_line(run, qrels, bad):
    """pytrec_eval used to fail deep inside with "Expected string as key"."""
    with pytest.raises(InputError, match=f"{bad}, not a string; .* convert them with str"):
        evaluate(run, qrels, ["nDCG@10"])


@pytest.mark.parametrize(
    "metric, message",
    [
        ("R@0", "metric 'R@0' has cutoff 0; a cutoff is a whole number >= 1"),
        ("ndcg@10", "metric 'ndcg@10' is not an ir-measures name .*; use e.g. nDCG@10"),
        ("R(rel=2@5", "metric 'R\\(rel=2@5' is not an ir-measures name"),
    ],
)
def test_bad_metric_names_get_one_line(metric, message):
    """A cutoff below 1 used to abort the whole Python process inside trec_eval; an unknown name
    raised ir-measures' NameError."""
    with pytest.raises(InputError, match=message):
        evaluate({"q": {"a": 1.0}}, {"q": {"a": 1}}, [metric])


def test_qrels_judging_a_pair_twice_warn_and_keep_the_last(tmp_path, caplog):
    from attnrank.eval import read_qrels

    path = tmp_path / "q.txt"
    path.write_text("q1 0 d1 1\nq1 0 d2 0\nq1 0 d1 2\nq1 0 d2 0\n")
    with caplog.at_level("WARNING", logger="attnrank.eval.data"):
        assert read_qrels(path) == {"q1": {"d1": 2, "d2": 0}}
    assert "1 (query, document) pair(s) judged again with another label, first at" in caplog.text
    assert "q.txt:3" in caplog.text


def test_readers_refuse_what_they_would_misread(tmp_path):
    """A fractional label was truncated (0.6 -> 0), rank and score swapped reversed the order, and
    a tab-separated id with a space was split into other columns; all silently."""
    from attnrank.eval import read_qrels, read_run

    qrels = tmp_path / "q.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\tdoc a\t1\nq1\tdoc b\t0\n")
    assert read_qrels(qrels) == {"q1": {"doc a": 1, "doc b": 0}}
    qrels.write_text("q1 0 d1 0.6\n")
    with pytest.raises(InputError, match=r"q.tsv:1: relevance '0.6' is not a whole number"):
        read_qrels(qrels)
    qrels.write_text("q1 0 d1 inf\n")  # raised OverflowError, a traceback
    with pytest.raises(InputError, match="relevance 'inf' is not a whole number"):
        read_qrels(qrels)
    run = tmp_path / "r.trec"
    run.write_text("q1 Q0 dA 12.7 1 bm25\nq1 Q0 dB 11.2 2 bm25\n")
    with pytest.raises(InputError, match=r"r.trec:1: rank '12.7' is not an integer; the columns are"):
        read_run(run)


def test_metrics_are_reported_under_the_names_given():
    """ir-measures spells NDCG@10 nDCG@10 and MRR@10 RR@10: figures filed under its spelling were
    looked up under the given one and read as 0 (a k-fold report of zeros, and a tie that registered)."""
    run, qrels = {"q": {"a": 2.0, "b": 1.0}}, {"q": {"a": 1}}
    got = evaluate(run, qrels, ["NDCG@10", "MRR@10", "RR@10"])
    assert got == {"NDCG@10": 1.0, "MRR@10": 1.0, "RR@10": 1.0}
    assert evaluate_per_query(run, qrels, ["NDCG@10"]) == {"q": {"NDCG@10": 1.0}}


def test_a_run_refuses_a_query_id_twice():
    """A query id twice: the later ranking replaced the earlier one, and the run silently lacked a
    query, which evaluation scores 0."""
    from attnrank.eval.data import results_to_run
    from attnrank.types import RankedResults, ScoredDocument

    first = RankedResults("q a", [ScoredDocument("d1", 1.0, 1, "x")], "0")
    second = RankedResults("q b", [ScoredDocument("d2", 1.0, 1, "y")], "0")
    with pytest.raises(InputError, match=r"results #1 repeat the query id '0'"):
        results_to_run([first, second])
    assert set(results_to_run([first, RankedResults("q b", [], "q2")])) == {"0", "q2"}


def test_results_without_a_query_id_are_refused_not_numbered_by_position(tmp_path):
    """search_batch(list of texts) gives results without query ids; numbered "0", "1", ... by their
    position, each was evaluated against the judgments of the query whose id was that number
    (nDCG@10 0.048 for 0.821 in a user's run, exit 0), and written so."""
    from attnrank.types import RankedResults, ScoredDocument

    results = [RankedResults(f"q {i}", [ScoredDocument(f"d{i}", 1.0, 1, "x")]) for i in range(2)]
    qrels = {"0": {"d1": 1}, "1": {"d0": 1}}
    for call in (lambda: evaluate(results, qrels), lambda: write_run(results, tmp_path / "r.trec")):
        with pytest.raises(InputError, match=r"results #0 \(query 'q 0'\) have no query_id, .* query_ids="):
            call()
    assert not (tmp_path / "r.trec").exists()


def test_a_ranking_with_tied_scores_is_written_and_evaluated_in_its_own_order(tmp_path):
    """Two duplicate passages tie; the reranker ranks them by first-stage order, but the run file
    (and trec_eval) put the larger doc id first."""
    from attnrank.types import RankedResults, ScoredDocument

    ranked = RankedResults("q", [ScoredDocument("d1", 0.5, 1, "a"), ScoredDocument("d9", 0.5, 2, "a")], "q1")
    write_run([ranked], tmp_path / "r.trec")
    lines = (tmp_path / "r.trec").read_text().split("\n")
    assert [line.split()[2] for line in lines if line] == ["d1", "d9"]
    back = read_run(tmp_path / "r.trec")["q1"]
    assert back["d1"] > back["d9"]  # read back, trec_eval ranks them as the reranker did


def test_scores_tied_as_32_bit_floats_rank_as_trec_eval_ranks_them(tmp_path):
    """trec_eval (and pytrec_eval, which ir-measures runs nDCG on) holds a run's scores as 32-bit
    floats: scores that differ only past that are a tie, broken by doc id. attnrank ranked them by
    their 64-bit values: RR 1.0 where trec_eval gave 0.5 for a third party's run, and its own run
    of two tied results, written one 64-bit step apart, was evaluated in one order and read by
    trec_eval in the other. (ir-measures' own RR provider ranks by 64-bit values: not the reference.)"""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    from attnrank.eval.data import results_to_run
    from attnrank.types import RankedResults, ScoredDocument

    def trec_eval(run, qrels):
        got = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "ndcg_cut_10"}).evaluate(run)["q1"]
        return {"RR@10": got["recip_rank"], "nDCG@10": got["ndcg_cut_10"]}

    qrels = {"q1": {"a": 1}}
    run = {"q1": {"a": -450.123456, "b": -450.123457}}  # one 32-bit float: b first, by doc id
    assert evaluate(run, qrels, metrics=["RR@10", "nDCG@10"]) == pytest.approx(trec_eval(run, qrels))
    assert trec_eval(run, qrels)["RR@10"] == 0.5
    tied = RankedResults("q", [ScoredDocument("a", 0.5, 1, "x"), ScoredDocument("b", 0.5, 2, "x")], "q1")
    write_run([tied], tmp_path / "r.trec")
    back = read_run(tmp_path / "r.trec")
    ours = evaluate(results_to_run([tied]), qrels, metrics=["RR@10", "nDCG@10"])
    assert ours == pytest.approx(trec_eval(back, qrels)) and ours["RR@10"] == 1.0  # a ranked first, both ways


def test_tied_scores_past_the_32_bit_range_stay_finite(tmp_path):
    """A tie below -3.4e38 has no 32-bit step below it: it became -inf, which write_run refused."""
    from attnrank.eval.data import strictly_decreasing

    out = strictly_decreasing([("a", -1e39), ("b", -1e39), ("c", -1e39)])
    assert all(math.isfinite(v) for v in out.values()) and out["a"] > out["b"] > out["c"]
    write_run({"q": out}, tmp_path / "r.trec")  # (written; trec_eval reads all three as -inf, a tie by doc id)
    assert len((tmp_path / "r.trec").read_text().splitlines()) == 3


def test_trec_qrels_with_a_tab_among_their_columns_are_read_by_whitespace(tmp_path):
    """ "q1 0<TAB>d1<TAB>1" was split on its tabs only: a query named "q1 0", which no run holds."""
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("q1 0\td1\t1\nq1 0 d2 0\n")
    assert read_qrels(mixed) == {"q1": {"d1": 1, "d2": 0}}
    beir = tmp_path / "beir.tsv"  # a BEIR id may hold a space: three tab fields stay three
    beir.write_text("query-id\tcorpus-id\tscore\nq 1\td 1\t1\n")
    assert read_qrels(beir) == {"q 1": {"d 1": 1}}


def test_a_ranking_listing_a_document_twice_is_refused_not_written_with_its_last_score():
    from attnrank.eval.data import results_to_run
    from attnrank.types import RankedResults, ScoredDocument

    with pytest.raises(InputError, match="the results repeat the id 'a'"):  # (refused where made, since)
        RankedResults("q", [ScoredDocument("a", 3.0, 1, ""), ScoredDocument("a", 1.0, 2, "")], "q1")
    twice = RankedResults("q", [ScoredDocument("a", 3.0, 1, ""), ScoredDocument("b", 2.0, 2, "")], "q1")
    twice.results.append(ScoredDocument("a", 1.0, 3, ""))  # (a list edited after it was made)
    with pytest.raises(InputError, match="results of query 'q1' list the document 'a' twice"):
        results_to_run([twice])


def test_qrels_refuse_empty_ids_and_ignore_trailing_tabs(tmp_path):
    """'q1<TAB><TAB>1' judged a document with an empty id relevant (no run can hold it: nDCG
    lowered, exit 0); a trailing tab on a one-line file made it a 'header', dropped."""
    bad = tmp_path / "bad.tsv"
    bad.write_text("q1\td1\t1\nq1\t\t1\n")
    with pytest.raises(InputError, match=r"bad.tsv:2: empty document id"):
        read_qrels(bad)
    trailing = tmp_path / "trailing.tsv"
    trailing.write_text("q1\td1\t1\t\n")
    assert read_qrels(trailing) == {"q1": {"d1": 1}}


def test_write_run_replaces_only_a_run_attnrank_wrote(tmp_path):
    """The library's write_run replaced any file (a user's notes at the path were lost), and a tag
    with a space wrote 7-column lines that read_run then refused."""
    notes = tmp_path / "notes.txt"
    notes.write_text("precious notes\n")
    with pytest.raises(InputError, match="exists and is not a TREC run attnrank wrote"):
        write_run({"q": {"d": 1.0}}, notes)
    assert notes.read_text() == "precious notes\n"
    write_run({"q": {"d": 1.0}}, notes, force=True)  # asked for: replaced
    run = tmp_path / "r.trec"
    write_run({"q": {"d": 1.0}}, run)
    write_run({"q": {"d": 2.0}}, run)  # its own run: replaced
    assert read_run(run) == {"q": {"d": 2.0}}
    write_run({"q": {"d": 1.0}}, tmp_path / "b.trec", tag="bm25")
    write_run({"q": {"d": 3.0}}, tmp_path / "b.trec", tag="bm25")  # a run of its own tag too
    with pytest.raises(InputError, match="exists and is not a TREC run attnrank wrote"):
        write_run({"q": {"d": 3.0}}, tmp_path / "b.trec", tag="other")
    with pytest.raises(InputError, match="run tag 'my run' is empty or holds whitespace"):
        write_run({"q": {"d": 1.0}}, tmp_path / "t.trec", tag="my run")


def test_write_run_refuses_a_run_that_ranks_no_document_and_writes_nothing(tmp_path):
    """write_run({}) wrote an empty file, which read_run and `attnrank eval` then refused as no run."""
    for run in ({}, {"q": {}}, []):
        with pytest.raises(InputError, match="the run ranks no document, so nothing was written to"):
            write_run(run, tmp_path / "e.trec")
        assert not (tmp_path / "e.trec").exists()
    before = tmp_path / "kept.trec"
    write_run({"q": {"d": 1.0}}, before)
    with pytest.raises(InputError, match="ranks no document"):
        write_run({}, before)
    assert read_run(before) == {"q": {"d": 1.0}}  # (the earlier run is left as it was)
    write_run({"q": {}, "r": {"d": 2.0}}, tmp_path / "one.trec")  # a query without documents has no line
    assert read_run(tmp_path / "one.trec") == {"r": {"d": 2.0}}
    assert sorted(tmp_path.iterdir()) == sorted([before, tmp_path / "one.trec"])  # (no temporary file left)


def test_a_beir_folder_says_which_qrels_split_it_reads(tmp_path, caplog):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "qrels" / "train.tsv").write_text("q1\td1\t1\n")
    (tmp_path / "qrels" / "test.tsv").write_text("q2\td2\t1\n")
    with caplog.at_level("WARNING", logger="attnrank.eval.data"):  # (at INFO `attnrank eval` never showed it)
        assert read_qrels(tmp_path) == {"q2": {"d2": 1}}
    assert "reading the qrels of test.tsv (beside train.tsv)" in caplog.text


def test_a_metric_its_provider_fails_on_is_one_input_error():
    """ERR@10 goes to ir-measures' gdeval, which failed on any input: the API raised perl's
    CalledProcessError (the CLI refused the name first; the Python API did not)."""
    with pytest.raises(InputError, match=r"ir-measures could not compute \['ERR@10'\]"):
        evaluate({"q": {"d": 1.0, "e": 0.5}}, {"q": {"d": 1}}, ["ERR@10"])


@pytest.mark.parametrize(
    "run, qrels, rel, message",
    [
        ({"q": {"a": 2.0, "b": 1.0}}, {"q": {"a": 1, "b": 0}}, -1, "rel=-1 must be a whole number >= 1"),
        ({"q": {"a": 2.0, "b": 1.0}}, {"q": {"a": 1, "b": 0}}, 0, "rel=0 must be a whole number >= 1"),
        ({"q": {"a": None, "b": 1.0}}, {"q": {"a": 1}}, 1, "document 'a' has score None, a NoneType"),
        ({"q": {"a": "2", "b": 1.0}}, {"q": {"a": 1}}, 1, "document 'a' has score '2', a str"),
        ({"q": {"a": 2.0}}, {"q": {"a": "1"}}, 1, "document 'a': label '1' is not a whole number"),
        ({"q": {"a": 2.0}}, {"q": {"a": 1.7}}, 1, "document 'a': label 1.7 is not a whole number"),
    ],
)
def test_a_threshold_score_or_label_of_the_wrong_kind_is_one_line_naming_it(run, qrels, rel, message):
    """rel=-1 counted a label 0 as relevant for RR but not for R or AP, exit 0; a score None failed
    in the sort (a TypeError); a label "1" failed inside ir-measures, blamed on a metric."""
    for fn in (evaluate, evaluate_per_query):
        with pytest.raises(InputError, match=re.escape(message)):
            fn(run, qrels, ["RR@10", "R@1", "AP"], rel=rel)


def test_numpy_labels_and_scores_are_numbers_like_any_other():
    got = evaluate({"q": {"a": np.float32(2.0), "b": 1}}, {"q": {"a": np.int64(1), "b": np.int32(0)}}, ["nDCG@10"])
    assert got == {"nDCG@10": 1.0}


def test_evaluate_refuses_what_attnrank_eval_refuses():
    """evaluate() returned 0.0 where none of the run's queries is judged, or where rel is above every
    label (attnrank eval refused both); a str of metrics was read a character at a time, an empty
    list failed inside ir-measures."""
    run = {"q9": {"d1": 1.0}}
    qrels = {"q1": {"d1": 2, "d2": 0}}
    with pytest.raises(InputError, match=r"none of the run's 1 queries has judgments in the qrels \(e.g. 'q9'\)"):
        evaluate(run, qrels, ["nDCG@10"])
    with pytest.raises(InputError, match="rel 3 is above every label of the qrels"):
        evaluate({"q1": {"d1": 1.0}}, qrels, ["R@10"], rel=3)
    assert evaluate({"q1": {"d1": 1.0}}, qrels, ["nDCG@10"], rel=3)["nDCG@10"] == 1.0  # (graded: rel unread)
    with pytest.raises(InputError, match=r"metrics='nDCG@10' is one str; pass a list"):
        evaluate({"q1": {"d1": 1.0}}, qrels, "nDCG@10")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="metrics is empty"):
        evaluate({"q1": {"d1": 1.0}}, qrels, [])


def test_wins_losses_refuses_a_negative_eps_and_differences_that_are_no_numbers():
    """eps=-1 counted each tie as a win and a loss; NaN differences passed as ties."""
    assert wins_losses([0.1, -0.2, 0.0]) == (1, 1)
    with pytest.raises(InputError, match="eps=-1 must be a finite number >= 0"):
        wins_losses([0.0, 0.0], eps=-1)
    with pytest.raises(InputError, match="a per-query difference is nan"):
        wins_losses([0.1, float("nan")])


def test_evaluate_and_write_run_take_the_same_run_shapes_and_refuse_others_in_one_line(tmp_path):
    """write_run took a list of RankedResults and evaluate did not (AttributeError); one
    RankedResults, {qid: [doc ids]} or a line of text failed as AttributeErrors in both."""
    from attnrank.eval import write_run
    from attnrank.types import RankedResults, ScoredDocument

    qrels = {"q1": {"a": 1}}
    ranked = RankedResults("x", [ScoredDocument("a", 1.0, 1), ScoredDocument("b", 0.5, 2)], query_id="q1")
    assert evaluate([ranked], qrels, ["RR@10"]) == evaluate(ranked, qrels, ["RR@10"]) == {"RR@10": 1.0}
    write_run(ranked, tmp_path / "one.trec")
    assert read_run(tmp_path / "one.trec") == {"q1": {"a": 1.0, "b": 0.5}}
    for bad, said in (
        ({"q1": ["a", "b"]}, "the run's query 'q1' holds a list, not {doc id: score}"),
        ("q1 Q0 a 1 1.0 x", "the run is a str"),
        ([ranked, {"q2": {"a": 1.0}}], "the run is a list"),
    ):
        with pytest.raises(InputError, match=re.escape(said)):
            evaluate(bad, qrels, ["RR@10"])
        with pytest.raises(InputError, match=re.escape(said)):
            write_run(bad, tmp_path / "bad.trec")
