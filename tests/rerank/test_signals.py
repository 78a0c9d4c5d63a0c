"""First-stage signals computed over the candidates (attnrank.rerank.signals)."""

from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.rerank.signals import SIGNALS, SignalComputer, candidate_bm25, rank_signal, text_key


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


def test_candidates_from_an_index_get_their_stored_vectors_not_a_second_embedding(built_retriever, embedded):
    docs = built_retriever.docs[:6]
    ids, texts = [d.id for d in docs], [d.full_text for d in docs]
    fresh = SignalComputer()("a query about cells", texts, ["dense"])["dense"]
    sc = SignalComputer()
    assert sc.use_index(built_retriever)
    sizes = embedded
    sizes.clear()
    got = sc("a query about cells", texts, ["dense"], ids=ids)["dense"]
    np.testing.assert_allclose(got, fresh, atol=1e-5)
    assert sizes == [1]  # the query alone
    # another text under a known id, and an id the index lacks, are embedded: only those
    texts2, ids2 = [texts[0], "Cells divide by mitosis.", "An unindexed passage."], [ids[0], ids[1], "new-doc"]
    want2 = SignalComputer()("a query about cells", texts2, ["dense"])["dense"]
    got2 = sc("a query about cells", texts2, ["dense"], ids=ids2)["dense"]
    np.testing.assert_allclose(got2, want2, atol=1e-5)
    assert sizes[-2:] == [1, 2]  # the query, then the two texts the index does not hold
    assert sc("a query about cells", texts, ["dense"])["dense"].shape == (6,)  # no ids: all embedded
    assert sizes[-2:] == [1, 6]


def test_an_index_of_another_embedder_is_not_read(built_retriever):
    import copy

    other = copy.copy(built_retriever)
    other.embedder = "/models/some-other-embedder"  # vectors of another space
    sc = SignalComputer()
    assert not sc.use_index(other) and sc.index is None


def test_an_index_of_the_same_embedder_folder_spelled_relatively_is_read(built_retriever, tmp_path, monkeypatch):
    """The index records a local embedder folder as its absolute path; a reranker given the same
    folder as a relative path re-embedded every candidate instead of reading the stored vectors."""
    import copy
    import os

    from attnrank.index.embed import resolve_embedder_path

    folder = resolve_embedder_path(None)
    monkeypatch.chdir(tmp_path)
    indexed = copy.copy(built_retriever)
    indexed.embedder = folder
    sc = SignalComputer(embedder=os.path.relpath(folder, tmp_path))
    assert sc.use_index(indexed)


def test_a_reindexed_retriever_is_followed_not_read_at_stale_positions(scifact_docs):
    """The same retriever object re-indexed with the documents in another order: each candidate
    still gets its own vector (the positions were mapped again)."""
    from attnrank.index.retriever import HybridRetriever

    r = HybridRetriever().index(scifact_docs[:8], show_progress=False)
    sc = SignalComputer()
    assert sc.use_index(r)
    r.index(list(reversed(scifact_docs[:8])), show_progress=False)
    ids, texts = [d.id for d in scifact_docs[:3]], [d.full_text for d in scifact_docs[:3]]
    got = sc("cell biology", texts, ["dense"], ids=ids)["dense"]
    np.testing.assert_allclose(got, SignalComputer()("cell biology", texts, ["dense"])["dense"], atol=1e-5)
    assert all(v is not None for v in sc.index.lookup(ids, texts))  # read back, not embedded


def test_only_an_attnrank_index_with_float_vectors_is_read(built_retriever):
    """Another object with ``search`` is left alone; vectors an int8 export embedded are not read."""
    import copy

    class Wrapped:
        def search(self, query, k):
            return built_retriever.search(query, k)

    assert not SignalComputer().use_index(Wrapped())  # type: ignore[arg-type]
    int8 = copy.copy(built_retriever)
    int8.dense = copy.copy(built_retriever.dense)
    int8.dense.built_with = "onnx-int8"
    assert int8.stored_vectors([0]) is None and not SignalComputer().use_index(int8)


def test_a_candidate_embedded_once_is_not_embedded_again(scifact_docs, embedded):
    """Kept vectors serve a later query over the same passages (the query alone is embedded), give
    the cosines a fresh embedding gives, and are bounded by ``cache_vectors``."""
    texts = [d.full_text for d in scifact_docs[:5]]
    sc = SignalComputer(cache_vectors=4)
    sc("a query about cells", texts[:3], ["dense"])
    embedded.clear()
    got = sc("bone fractures", texts[:3], ["dense"])["dense"]
    assert embedded == [1]
    np.testing.assert_allclose(
        got, SignalComputer(cache_vectors=0)("bone fractures", texts[:3], ["dense"])["dense"], atol=1e-6
    )
    sc("bone fractures", texts[2:], ["dense"])  # two new texts: five kept would pass the bound of four
    assert embedded[-2:] == [1, 2] and len(sc.vectors) == 4 and text_key(texts[0]) not in sc.vectors
    assert all(len(k) == 16 for k in sc.vectors)  # digests, not the passages' texts
    none = SignalComputer(cache_vectors=0)
    none("q", texts[:2], ["dense"])
    none("q", texts[:2], ["dense"])
    assert embedded[-4:] == [1, 2, 1, 2] and not none.vectors
    with pytest.raises(InputError, match="cache_vectors=-1"):
        SignalComputer(cache_vectors=-1)


def test_a_repeated_request_scores_as_the_first_though_its_texts_were_kept(scifact_docs):
    """In bfloat16 the query's vector moved with the batch it was embedded in (about 1e-3): the
    first call embedded it beside the texts, a repeat alone (the texts kept), so a server's second
    identical /v1/rerank answered other scores. The query is embedded alone every time."""
    texts = [d.full_text for d in scifact_docs[:12]]
    sc = SignalComputer(backend="torch-bf16")
    first = sc("Which vitamin protects bones?", texts, ["dense"])["dense"]
    again = sc("Which vitamin protects bones?", texts, ["dense"])["dense"]
    np.testing.assert_array_equal(again, first)


def test_candidate_bm25_runs_without_pystemmer_and_says_so(monkeypatch, caplog):
    """The default preset's BM25 required the `stem` extra: a core install failed every rerank
    with MissingExtraError; it now makes unstemmed terms and warns once."""
    import logging
    import sys

    from attnrank.index import tokenize
    from attnrank.rerank import signals

    texts = ["Fractures of the bone heal.", "Vitamin D and bone fractures.", "Cats sleep a lot."]
    stemmed = candidate_bm25("fracture", texts)
    assert stemmed[0] > 0 and stemmed[1] > 0  # "fractures" stems to "fractur", as "fracture" does
    monkeypatch.setitem(sys.modules, "Stemmer", None)  # (import Stemmer raises ImportError)
    for cached in (tokenize._has_stemmer, signals.candidate_terms):
        cached.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="attnrank.index.tokenize"):
            plain = candidate_bm25("fracture", texts)
            candidate_bm25("fracture", texts)
        assert signals.candidate_terms().stemmer == "none"
        assert np.array_equal(plain, np.zeros(3))  # no stem: "fracture" matches neither plural
        assert caplog.text.count("PyStemmer is not installed") == 1
    finally:
        monkeypatch.undo()
        for cached in (tokenize._has_stemmer, signals.candidate_terms):
            cached.cache_clear()
