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
    with pytest.raises(InputError, match="stemmer 'snowball' is not one of auto, porter, none"):
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


def test_epsilon_above_one_saves_and_loads(tmp_path):
    """rank-bm25 floors a negative idf at epsilon * mean(idf): with epsilon > 1 that floor exceeds
    max |idf|, and a valid index must still load (not be called corrupted) and score as rank-bm25."""
    texts = ["apple banana", "apple cherry", "apple date", "kiwi lemon", "apple fig"]
    params = BM25Params(epsilon=10.0)
    BM25Index(params).index(texts).save(tmp_path / "b")
    loaded = BM25Index.load(tmp_path / "b")
    tok = make_tokenizer(loaded.tokenizer_config)
    ref = BM25Okapi([tok(t) for t in texts], k1=params.k1, b=params.b, epsilon=params.epsilon)
    np.testing.assert_allclose(loaded.get_scores("apple kiwi"), ref.get_scores(tok("apple kiwi")), rtol=1e-5)


@pytest.mark.parametrize("field", ["k1", "epsilon"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "1"])
def test_non_finite_params_are_refused(field, value):
    """A NaN or infinite k1/epsilon made NaN weights, then every search called the index corrupted."""
    with pytest.raises(InputError, match="must be finite numbers"):
        BM25Params(**{field: value})


@pytest.mark.parametrize("k", [0, -1])
def test_retrieve_bad_k(k):
    ix = BM25Index().index(["apple pie", "banana bread"])
    with pytest.raises(InputError, match="must be a positive integer"):
        ix.retrieve(["apple"], k)


def test_sklearn_stopwords_without_scikit_learn(monkeypatch):
    """scikit-learn is an optional extra: `--stopwords sklearn` without it was a bare ModuleNotFoundError."""
    import sys

    from attnrank.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "sklearn.feature_extraction.text", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"stopword list needs .*attnrank\[train\]"):
        BM25Index(tokenizer=resolve_config(stopwords="sklearn", stemmer="none")).index(["a text"])


def test_matched_only_leaves_documents_without_a_query_term_out():
    from attnrank.index.bm25 import BM25Index

    bm25 = BM25Index().index(["red apples", "green pears", "red wine", "blue sky"])
    assert bm25.matches("red fruit").tolist() == [True, False, True, False]
    ids, scores = bm25.retrieve(["red fruit", "purple"], k=3, matched_only=True)
    assert ids[0, :2].tolist() in ([0, 2], [2, 0]) and ids[0, 2] == -1 and scores[0, 2] == -np.inf
    assert ids[1].tolist() == [-1, -1, -1]  # no term of the query in the corpus: no hit
    assert bm25.retrieve(["purple"], k=3)[0].tolist() == [[0, 1, 2]]  # without it, as before


def test_new_indexes_match_decomposed_and_full_width_text_to_the_composed_words():
    """NFD "café" (e + combining acute) and full-width letters were other terms than "café"."""
    import unicodedata

    composed, decomposed = "café", unicodedata.normalize("NFD", "café")
    assert composed != decomposed
    bm25 = BM25Index(BM25Params(), resolve_config(stemmer="none")).index(
        [f"a {composed} in Paris", "a bakery", "a train", "a museum"]
    )
    for query in (composed, decomposed, "ｃａｆé"):
        assert bm25.get_scores(query)[0] > 0, query
    assert resolve_config().unicode == "nfkc"


def test_indexes_built_before_unicode_normalisation_keep_their_terms(tmp_path):
    """A manifest without the field reads as no normalisation: queries are tokenized as its documents were."""
    import unicodedata

    old = TokenizerConfig(**{k: v for k, v in resolve_config(stemmer="none").to_dict().items() if k != "unicode"})
    assert old.unicode == "none"
    tok = make_tokenizer(old)
    assert tok(unicodedata.normalize("NFD", "café")) != tok("café")
    with pytest.raises(InputError, match="unicode='nfd' is not one of nfkc, none"):
        TokenizerConfig(unicode="nfd")


def test_new_indexes_keep_words_of_marked_scripts_whole_and_split_chinese_and_japanese():
    """\\w leaves out combining marks and vowel signs: "हिन्दी" became the letters ह, न, द (matching
    Marathi text too), and a Chinese or Japanese sentence, written without spaces, one term no
    query matched. An index built before the rule (no words field) keeps its terms."""
    docs = ["हिन्दी भाषा", "मराठी भाषा नदी", "東京の天気は晴れです", "大阪の天気は雨です", "İzmir port"]
    bm25 = BM25Index(BM25Params(), resolve_config(stemmer="none")).index(docs)
    assert bm25.get_scores("हिन्दी")[1] == 0 and bm25.get_scores("हिन्दी")[0] > 0
    tokyo = bm25.get_scores("東京")
    assert tokyo[2] > 0 and tokyo[3] == 0
    assert bm25.get_scores("izmir")[4] > 0  # İ lowers to i + a combining dot: read as i
    tok = make_tokenizer(resolve_config(stemmer="none"))
    assert tok("Keep it up! \U0001f9d8\u200d\u2640\ufe0f") == ["keep", "up"]  # (a variation selector is no term)
    assert tok("1\ufe0f\u20e3 step, हिन्दी's grammar") == ["1", "step", "हिन्दी", "grammar"]  # keycap; possessive
    stored = resolve_config(stemmer="none").to_dict()
    assert stored["words"] == "scripts"
    old = TokenizerConfig(**{k: v for k, v in stored.items() if k != "words"})
    assert old.words == "w" and make_tokenizer(old)("東京の天気") == ["東京の天気"]
    assert "words" not in old.to_dict()  # (the manifest it was built with)
    with pytest.raises(InputError, match="words='x' is not one of scripts, w"):
        TokenizerConfig(words="x")


def test_a_small_corpus_of_shared_terms_never_inverts_the_ranking():
    """rank-bm25 floors a negative idf at epsilon times the mean idf, itself negative where most
    documents share most terms (any corpus of 2): a document matching more query terms scored
    lower. The floor is kept at 0; a corpus with a positive mean idf is unchanged."""
    from attnrank.index.bm25 import BM25Index, BM25Params

    ix = BM25Index(BM25Params(method="okapi")).index(["apple banana", "apple banana", "apple cherry"])
    scores = ix.get_scores("apple banana")
    assert (scores >= 0).all() and scores[0] >= scores[2]
    two = BM25Index(BM25Params(method="okapi")).index(["red apples", "green apples and pears"])
    assert (two.get_scores("green apples") >= 0).all()


def test_a_negative_epsilon_is_refused():
    from attnrank.errors import InputError
    from attnrank.index.bm25 import BM25Params

    with pytest.raises(InputError, match="BM25 epsilon -0.1 must be >= 0"):
        BM25Params(epsilon=-0.1)


def test_an_index_built_before_the_idf_floor_loads_as_a_rebuild_scores(tmp_path, monkeypatch, caplog):
    """Indexes saved before the floor keep negative weights on disk: read, they are floored as a
    rebuild would floor them (and the files are left as they are)."""
    import attnrank.index.bm25 as bm25

    texts = ["red apples", "green apples and pears"]
    with monkeypatch.context() as m:  # the builder as it was: rank-bm25's idf as it comes
        m.setattr(bm25, "nonnegative_idf", dict)
        old = BM25Index(BM25Params(method="okapi")).index(texts)
    assert float(old.data.min()) < 0
    old.save(tmp_path / "old")
    on_disk = np.load(tmp_path / "old" / "data.npy").copy()
    loaded = BM25Index.load(tmp_path / "old")
    assert "negative term weights" in caplog.text
    rebuilt = BM25Index(BM25Params(method="okapi")).index(texts)
    for query in ("green apples", "red", "apples pears"):
        np.testing.assert_array_equal(loaded.get_scores(query), rebuilt.get_scores(query))
    np.testing.assert_array_equal(np.load(tmp_path / "old" / "data.npy"), on_disk)


def test_a_file_it_may_not_read_is_a_permission_error_not_a_corrupted_index(tmp_path, monkeypatch):
    """A chmod 000 data.npy was called a damaged index to rebuild (hours of a large corpus) where a
    chmod fixes it; the CLI names an OSError's path and its fix."""
    ix = BM25Index().index(["coffee and tea", "gene expression in mice"])
    ix.save(tmp_path / "bm25")
    real = np.load

    def refused(path, *args, **kwargs):
        if str(path).endswith("data.npy"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(np, "load", refused)
    with pytest.raises(PermissionError):
        BM25Index.load(tmp_path / "bm25")
