from __future__ import annotations

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from attnrank.errors import IndexFormatError, InputError
from attnrank.index.bm25 import BM25Index, BM25Params, top_k
from attnrank.index.tokenize import TokenizerConfig, make_tokenizer, resolve_config


def test_tokenizer_lucene_stopwords_and_porter():
    tok = make_tokenizer(TokenizerConfig(stopwords="lucene", stemmer="porter"))
    assert tok("The Cats' running in Paris's parks, is it?") == ["cat", "run", "pari", "park"]
    assert make_tokenizer(TokenizerConfig(stopwords="none", stemmer="none"))("The cat") == ["the", "cat"]


def test_resolve_config_rejects_unknown():
    with pytest.raises(InputError, match="stemmer='snowball' is not one of"):
        resolve_config(stemmer="snowball")


@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.5, 0.75)])
def test_scores_equal_rank_bm25(scifact_docs, k1, b):
    """Precomputed CSC weights reproduce rank-bm25's BM25Okapi.get_scores exactly."""
    texts = [d.full_text for d in scifact_docs]
    cfg = TokenizerConfig()
    ix = BM25Index(BM25Params(k1=k1, b=b), cfg).index(texts)
    tok = make_tokenizer(cfg)
    ref = BM25Okapi([tok(t) for t in texts], k1=k1, b=b)
    for q in ["vitamin D deficiency and bone fractures", "cancer cells cancer", "nothingmatcheshere"]:
        np.testing.assert_allclose(ix.get_scores(q), ref.get_scores(tok(q)), rtol=1e-5, atol=1e-5)


def test_lucene_idf_is_positive(scifact_docs):
    ix = BM25Index(BM25Params(method="lucene")).index([d.full_text for d in scifact_docs])
    assert (np.asarray(ix.data) > 0).all()


def test_retrieve_k_larger_than_corpus_and_ties():
    ix = BM25Index().index(["apple pie", "apple tart", "banana bread"])
    idx, scores = ix.retrieve(["apple"], k=10)
    assert idx.shape == (1, 3) and idx[0, 2] == 2 and scores[0, 2] == 0
    assert list(idx[0, :2]) == [0, 1] or scores[0, 0] > scores[0, 1]  # equal scores keep index order


def test_top_k_orders_ties_by_index():
    idx, s = top_k(np.array([1.0, 3.0, 3.0, 2.0, 3.0], dtype=np.float32), 3)
    assert list(idx) == [1, 2, 4] and list(s) == [3.0, 3.0, 3.0]


def test_save_load_round_trip_mmap(tmp_path, scifact_docs):
    texts = [d.full_text for d in scifact_docs]
    ix = BM25Index().index(texts)
    ix.save(tmp_path / "bm25")
    again = BM25Index.load(tmp_path / "bm25", mmap=True)
    assert isinstance(again.data, np.memmap)
    q = ["coffee consumption risk", "gene expression in mice"]
    for a, b in zip(ix.retrieve(q, 10), again.retrieve(q, 10)):
        np.testing.assert_array_equal(a, b)


def test_empty_inputs(tmp_path):
    with pytest.raises(InputError, match="0 documents"):
        BM25Index().index([])
    with pytest.raises(InputError, match="empty after tokenization"):
        BM25Index().index(["the a", "!!"])
    (tmp_path / "bad").mkdir()
    with pytest.raises(IndexFormatError, match="cannot be read"):
        BM25Index.load(tmp_path / "bad")
