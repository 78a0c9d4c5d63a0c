"""The query likelihood on a shortlist of the candidates (attnrank.rerank.shortlist)."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import RERANK_QUERY, rerank_docs

from attnrank.errors import InputError
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig
from attnrank.rerank.fused import LIKELIHOOD_FEATURES, FusedWeights, equal_weights
from attnrank.rerank.likelihood import query_likelihood
from attnrank.rerank.shortlist import fuse_shortlist, shortlist, signals_alone
from attnrank.rerank.signals import SignalComputer
from attnrank.types import Document


def _z(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / x.std()


SIGNALS = {
    "bm25": np.array([3.0, 1.0, 2.0, 0.0, 5.0, 4.0]),
    "dense": np.array([0.9, 0.1, 0.5, 0.2, 0.3, 0.8]),
    "likelihood": np.array([-2.0, -0.5, -1.0, -3.0, -2.5, -1.5]),
}


def test_the_shortlist_is_ranked_by_every_signal_and_the_rest_follow_in_the_signals_order():
    weights = equal_weights(LIKELIHOOD_FEATURES)
    base = signals_alone(weights, SIGNALS)
    np.testing.assert_allclose(base, _z(SIGNALS["bm25"]) + _z(SIGNALS["dense"]))
    top = shortlist(base, 3)
    assert top.tolist() == [5, 0, 4]  # BM25 and dense's three best, best first
    out = fuse_shortlist(weights, base, top, SIGNALS["likelihood"][top])
    expected_top = base[top] + _z(SIGNALS["likelihood"][top])  # the likelihood's z over the shortlist
    np.testing.assert_allclose(out[top], expected_top)
    rest = [2, 1, 3]  # the signals' order below
    assert np.argsort(-out, kind="stable").tolist()[3:] == rest
    assert out[rest].max() == pytest.approx(out[top].min() - 1.0)
    np.testing.assert_allclose(np.diff(out[rest]), np.diff(base[rest]))  # their differences kept


def test_a_shortlist_of_every_candidate_scores_as_the_weights_do():
    weights = FusedWeights(["bm25", "dense", "likelihood"], [0.8, 0.6, 0.5])
    base = signals_alone(weights, SIGNALS)
    top = shortlist(base, 6)
    np.testing.assert_allclose(fuse_shortlist(weights, base, top, SIGNALS["likelihood"][top]), weights.score(SIGNALS))


def test_weights_with_attention_or_without_the_likelihood_have_no_shortlist():
    with pytest.raises(InputError, match="read the likelihood and no attention"):
        signals_alone(equal_weights(), SIGNALS)


def test_the_reranker_reads_the_likelihood_of_the_shortlist_alone(llm):
    """With likelihood_depth, only the candidates BM25 and dense rank highest are given to the
    LLM: the others carry no likelihood, rank below them in the signals' order, and the
    shortlist's order is the one its own likelihoods give."""
    docs = [*rerank_docs(), Document("lyon", "Lyon is a city in France."), Document("oslo", "Oslo is in Norway.")]
    rr = AttentionReranker(llm, config=RerankConfig.preset("likelihood", likelihood_depth=3))
    texts = [d.full_text for d in docs]
    signals = SignalComputer(backend=rr.signals.backend)(RERANK_QUERY, texts, ["bm25", "dense"])
    base = _z(signals["bm25"]) + _z(signals["dense"])
    top = np.argsort(-base, kind="stable")[:3]
    ql = query_likelihood(llm, RERANK_QUERY, [docs[i] for i in top], max_doc_words=rr.config.max_doc_words)
    expected = base.copy()
    expected[top] += _z(ql.mean(1, dtype=np.float64))
    res = rr.rank(RERANK_QUERY, docs)
    order = [docs[i].id for i in top[np.argsort(-expected[top], kind="stable")]]
    rest = [docs[i].id for i in np.argsort(-base, kind="stable")[3:]]
    assert [d.id for d in res] == order + rest
    assert {d.id for d in res if "likelihood" in d.stage_scores} == {docs[i].id for i in top}
    assert len(rr.states) == 3  # no prompt of the others was run
    full = AttentionReranker(llm, config="likelihood")
    assert len(full.rank(RERANK_QUERY, docs)) == len(docs) and len(full.states) == len(docs)


def test_likelihood_depth_is_refused_where_no_likelihood_is_fused_without_attention():
    assert RerankConfig.preset("likelihood", likelihood_depth=12).likelihood_depth == 12
    for preset in ("signals", "fused", "qrhead"):
        with pytest.raises(InputError, match="likelihood_depth=5 shortlists"):
            RerankConfig.preset(preset, likelihood_depth=5)
    for bad in (0, -1, 2.5, "3"):
        with pytest.raises(InputError, match="must be a positive integer"):
            RerankConfig.preset("likelihood", likelihood_depth=bad)
