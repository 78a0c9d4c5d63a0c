from __future__ import annotations

import math
import os
import stat

import pytest

from attnrank.errors import InputError
from attnrank.eval import evaluate, evaluate_per_query, read_qrels, read_run, write_run


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
    ],
)
def test_runs_a_trec_file_cannot_hold_are_refused(tmp_path, run, fragment):
    with pytest.raises(InputError, match=fragment):
        write_run(run, tmp_path / "r.trec")
    assert not (tmp_path / "r.trec").exists()


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
