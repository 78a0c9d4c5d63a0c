"""First-stage signals computed over the candidates (attnrank.rerank.signals)."""

from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.rerank.signals import SIGNALS, SignalComputer, candidate_bm25, rank_signal


def test_candidate_bm25_prefers_the_passage_with_the_rare_query_term():
    texts = ["the cat sat on the mat", "a cat and a dog", "quantum entanglement of a cat"]
    s = candidate_bm25("quantum cat", texts)
    assert s.shape == (3,) and int(np.argmax(s)) == 2
    # every candidate holds "cat": Lucene's idf keeps it positive (Okapi's would floor it)
    assert (candidate_bm25("cat", texts) > 0).all()


def test_candidate_bm25_does_not_weigh_a_question_word_only_some_candidates_hold():
    """Candidates a first stage found all hold the query's content words, so their idf over the
    candidates is low; a function word that only one holds ("which") must not outrank them."""
    texts = [
        "Which of them? Kiwi birds are found in New Zealand.",
        "Kiwi birds eat worms, and kiwi birds eat insects.",
        "Kiwi birds are nocturnal birds.",
    ]
    s = candidate_bm25("which birds eat worms kiwi", texts)
    assert int(np.argmax(s)) == 1
    assert s[0] <= s[2]  # "which" counts for nothing


def test_candidate_bm25_of_empty_texts_is_zero():
    assert candidate_bm25("anything", ["", "   "]).tolist() == [0.0, 0.0]


def test_rank_signal_is_minus_position():
    assert rank_signal(3).tolist() == [0.0, -1.0, -2.0]


def test_signal_computer_cosine_matches_the_embedder(scifact_docs):
    from attnrank.index.embed import encode

    sc = SignalComputer()
    texts = [d.full_text for d in scifact_docs[:4]]
    out = sc("a query about cells", texts)
    assert set(out) == set(SIGNALS)
    v = encode(sc.embedder, ["a query about cells", *texts])
    np.testing.assert_allclose(out["dense"], v[1:] @ v[0], atol=1e-6)
    # a passage's own text is its nearest passage
    assert int(np.argmax(sc(texts[2], texts, ["dense"])["dense"])) == 2


def test_unknown_signal_is_refused():
    with pytest.raises(InputError, match="among"):
        SignalComputer()("q", ["a"], ["bm25", "splade"])
