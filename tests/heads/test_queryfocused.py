"""Query-focused retrieval heads (QRHead's QRScore and nDCG selection, CoRe's contrast) on a
tiny random model, checked against per-head document scores computed by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.heads.queryfocused import detect_query_focused, query_focused_scores
from attnrank.heads.scores import HeadScores
from attnrank.rerank.attention import AttentionReranker
from attnrank.types import Document

DOCS = [
    Document("paris", "Paris is the capital of France."),
    Document("berlin", "Berlin is the capital of Germany."),
    Document("banana", "Bananas are yellow fruit."),
    Document("rome", "Rome is the capital of Italy."),
]
QUERIES = {"q1": "capital of France?", "q2": "yellow fruit?", "q3": "capital of Italy?"}
QRELS = {"q1": {"paris": 1}, "q2": {"banana": 2, "rome": 0}, "q3": {"rome": 1}}


def test_query_focused_detection_end_to_end(llm, tmp_path):
    reranker = AttentionReranker(llm, config="icr")  # every head over the full prompt
    cands = {q: DOCS for q in QUERIES}
    res = detect_query_focused(reranker, QUERIES, cands, QRELS, shuffle_seed=None)  # in DOCS order, as by hand
    assert set(res) == {"qr-score", "qr-ndcg", "contrastive"}
    # how the rows were read goes with the scores (heads ranked on block attention read otherwise)
    assert res["qr-ndcg"].params["capture"] == "full" and res["qr-ndcg"].params["shuffle_seed"] is None
    assert res["qr-ndcg"].params["prompt"] == reranker.config.prompt_settings()
    for name, hs in res.items():
        assert isinstance(hs, HeadScores) and hs.method == name and hs.scores.shape == (4, 4)
        assert np.isfinite(hs.scores).all() and hs.n_used == 3 and len(hs.top(16)) == 16
    # reference for one head: its per-head document scores, by hand
    from attnrank.llm.rows import per_head_document_scores

    h = 5  # layer 1, head 1
    qr, con, nd = [], [], []
    for q, text in QUERIES.items():
        wins = reranker.windows(text, DOCS)
        s = np.zeros(4)
        s[wins[0].doc_index] = per_head_document_scores(wins[0].rows, wins[0].spans)[h]
        gold = np.array([QRELS[q].get(d.id, 0) >= 1 for d in DOCS])
        qr.append(s[gold].sum())
        con.append(s[gold].mean() - s[~gold].mean())
        gains = np.array([QRELS[q].get(d.id, 0) for d in DOCS], dtype=float)  # trec_eval nDCG: gain = label
        discount = 1.0 / np.log2(np.arange(2, len(DOCS) + 2))
        nd.append((gains[np.argsort(-s)] * discount).sum() / (np.sort(gains)[::-1] * discount).sum())
    assert res["qr-score"].scores[1, 1] == pytest.approx(np.mean(qr))
    assert res["contrastive"].scores[1, 1] == pytest.approx(np.mean(con))
    assert res["qr-ndcg"].scores[1, 1] == pytest.approx(np.mean(nd))
    assert res["qr-ndcg"].scores.min() >= 0.0 and res["qr-ndcg"].scores.max() <= 1.0
    path = res["qr-ndcg"].save(4, root=tmp_path)
    stored = json.loads(path.read_text())["sets"][0]
    assert stored["method"] == "qr-ndcg" and len(stored["heads"]) == 4 and len(stored["scores"]) == 4


def test_query_focused_with_a_head_subset_and_no_gold(llm):
    reranker = AttentionReranker(llm, "1-2,2-0")
    # nothing relevant among any query's candidates (qrels of other ids): refused before the model
    # runs (every query ran first, to give all-NaN scores and a note)
    with pytest.raises(InputError, match="no candidate of the 1 queries is judged relevant"):
        detect_query_focused(reranker, {"q9": "anything"}, {"q9": DOCS}, {"q9": {"nope": 1}})
    res = query_focused_scores(iter([("q9", reranker.windows("anything", DOCS), [d.id for d in DOCS])]),
                               {"q9": {"nope": 1}}, reranker.head_list, llm.num_layers, llm.num_heads)  # fmt: skip
    assert res["qr-score"].n_used == 0 and "no usable query" in res["qr-score"].note
    assert res["qr-score"].top() == []
    # judged but nothing relevant among the candidates: every head's nDCG 0, which registered an
    # arbitrary head set (the lowest layers') as qr-ndcg, the preferred method of heads="auto"
    assert res["qr-ndcg"].n_used == 0 and np.isnan(res["qr-ndcg"].scores).all() and res["qr-ndcg"].top() == []


def test_detection_checks_every_querys_candidates_before_the_model_runs(llm, monkeypatch):
    """A duplicate id in the last query was found in its turn, every earlier query computed and lost."""
    reranker = AttentionReranker(llm, "1-2,2-0")
    ran: list[str] = []
    real = reranker.windows
    monkeypatch.setattr(reranker, "windows", lambda q, docs: ran.append(q) or real(q, docs))
    cands = {**{q: DOCS for q in QUERIES}, "q3": [*DOCS, DOCS[0]]}
    with pytest.raises(InputError, match="query 'q3' has duplicate candidate ids"):
        detect_query_focused(reranker, QUERIES, cands, QRELS)
    assert ran == []


def test_a_reranker_that_re_weights_attention_is_refused(llm):
    """Detection scores each head's plain rows: a set "detected" through a reranker with sink
    filtering was plain attention's, recorded as the re-weighted preset's."""
    from attnrank.rerank.reweight import Reweighting

    reranker = AttentionReranker(llm, "1-2,2-0", signals=None, reweight=Reweighting(sink=True))
    with pytest.raises(InputError, match="build the reranker without reweight to detect"):
        detect_query_focused(reranker, {"q9": "anything"}, {"q9": DOCS}, {"q9": {"nope": 1}})
    plain = AttentionReranker(llm, "1-2,2-0", signals=None, reweight=Reweighting(idf_eps=0.3))  # no step on
    detect_query_focused(plain, {"q1": QUERIES["q1"]}, {"q1": DOCS}, QRELS)


def test_detection_shuffles_each_querys_candidates_as_qrhead_does(llm):
    """In first-stage order a head that attends to the slot nearest the query scored as the first
    stage does; QRHead shuffles the documents (seed 42) before detection. Each query's shuffle is
    seeded by its id too: one generator for all made a query's order depend on the queries before it."""
    import random

    reranker = AttentionReranker(llm, None)
    shuffled = {}
    for q in QUERIES:
        docs = list(DOCS)
        random.Random(f"42:{q}").shuffle(docs)
        shuffled[q] = docs
    default = detect_query_focused(reranker, QUERIES, {q: DOCS for q in QUERIES}, QRELS)
    by_hand = detect_query_focused(reranker, QUERIES, shuffled, QRELS, shuffle_seed=None)
    unshuffled = detect_query_focused(reranker, QUERIES, {q: DOCS for q in QUERIES}, QRELS, shuffle_seed=None)
    for method in default:
        np.testing.assert_array_equal(default[method].scores, by_hand[method].scores)
    assert not np.array_equal(default["qr-score"].scores, unshuffled["qr-score"].scores)


def test_a_query_with_an_empty_judgment_set_is_not_counted(llm):
    """qr-ndcg averages over judged queries as evaluate_per_query / per_query_ndcg_of_each do: a
    query whose judgments are empty is left out, not counted as nDCG 0 for every head."""
    reranker = AttentionReranker(llm, "0-1,1-1,3-2")
    qs = {"q1": QUERIES["q1"], "q3": QUERIES["q3"]}
    base = detect_query_focused(reranker, qs, {q: DOCS for q in qs}, QRELS)["qr-ndcg"]
    more = detect_query_focused(reranker, {**qs, "q4": "anything"}, {q: DOCS for q in [*qs, "q4"]}, {**QRELS, "q4": {}})
    np.testing.assert_allclose(more["qr-ndcg"].scores, base.scores)
    assert more["qr-ndcg"].n_used == 2


def test_qr_ndcg_reads_queries_of_lower_grades_at_a_higher_rel(llm):
    """At rel 2 a query whose candidates are judged grade 1 only was left out of qr-ndcg, though
    nDCG's graded gains let it tell heads apart (the one query that did, in a review's example,
    was dropped and the heads tied). QR-score still counts only queries with gold (>= rel)."""
    reranker = AttentionReranker(llm, "0-1,1-1,3-2")
    qs = {"q1": QUERIES["q1"], "q2": QUERIES["q2"]}
    out = detect_query_focused(reranker, qs, {q: DOCS for q in qs}, QRELS, rel=2)
    assert out["qr-ndcg"].n_used == 2 and out["qr-score"].n_used == 1
    alone = detect_query_focused(reranker, {"q1": QUERIES["q1"]}, {"q1": DOCS}, QRELS, rel=2)["qr-ndcg"]
    assert alone.n_used == 1 and np.isfinite(alone.scores).any()
