from __future__ import annotations

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.eval import evaluate, read_qrels, results_to_run
from attnrank.index.dense import DenseIndex
from attnrank.index.tuning import tune_alpha
from attnrank.queries import load_queries


def test_tune_alpha_on_labelled_queries(built_retriever, scifact_mini):
    qrels = read_qrels(scifact_mini)
    queries = load_queries(scifact_mini / "queries.jsonl")
    before = (built_retriever.fusion, built_retriever.alpha, built_retriever.norm)
    try:
        best = tune_alpha(built_retriever, queries, qrels, alphas=[0.0, 0.5, 1.0], norms=["minmax"])
        assert len(best.table) == 3 and best.score == max(r["nDCG@10"] for r in best.table)
        assert built_retriever.fusion == "convex" and built_retriever.alpha == best.alpha
        # each row fused with its own alpha (the weight on dense): the rows differ, and the two
        # ends score what BM25 alone and dense alone score on the same labelled queries
        by_alpha = {r["alpha"]: r["nDCG@10"] for r in best.table}
        assert len(set(by_alpha.values())) > 1, best.table
        labelled = {q: t for q, t in queries.items() if q in qrels}
        for alpha, mode in ((0.0, "bm25"), (1.0, "dense")):
            alone = built_retriever.search_batch(labelled, 10, mode=mode)
            want = evaluate(results_to_run(alone), qrels, ["nDCG@10"])["nDCG@10"]
            assert by_alpha[alpha] == pytest.approx(want, abs=1e-9), (alpha, mode, best.table)
    finally:  # the session's shared retriever: later tests expect its default fusion
        built_retriever.set_fusion(before[0], alpha=before[1], norm=before[2])
    with pytest.raises(InputError, match="none of the given queries has relevance judgments"):
        tune_alpha(built_retriever, {"x": "unlabelled"}, qrels)
    # a search's own checks: an empty labelled query was embedded and scored into the grid
    qid = next(iter(qrels))
    with pytest.raises(InputError, match="empty"):
        tune_alpha(built_retriever, {qid: "   "}, qrels)


@pytest.mark.parametrize("nprobe", [0, -1, 2.5, True])
def test_nprobe_is_a_positive_count(nprobe):
    """0 built an IVF index after the whole corpus was embedded, then failed in every search
    inside FAISS; -1 overflowed."""
    with pytest.raises(InputError, match=f"nprobe={nprobe!r} must be an integer >= 1"):
        DenseIndex(kind="ivf", nprobe=nprobe)


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_indexes_round_trip(tmp_path, scifact_docs, kind):
    texts = [d.full_text for d in scifact_docs]
    exact = DenseIndex(kind="flat").index(texts)
    approx = DenseIndex(kind=kind).index(texts)
    approx.save(tmp_path / kind)
    loaded = DenseIndex.load(tmp_path / kind, model=None, kind=kind)
    q = ["vitamin D", "gene expression"]
    np.testing.assert_array_equal(approx.retrieve(q, 5)[0], loaded.retrieve(q, 5)[0])
    # on 55 documents the approximate indexes find the exact top-1
    np.testing.assert_array_equal(exact.retrieve(q, 1)[0], loaded.retrieve(q, 1)[0])


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_stored_vectors_are_the_documents_embeddings_also_when_loaded(tmp_path, scifact_docs, kind):
    from attnrank.index.embed import encode

    texts = [d.full_text for d in scifact_docs]
    built = DenseIndex(kind=kind).index(texts)
    built.save(tmp_path / kind)
    loaded = DenseIndex.load(tmp_path / kind, model=None, kind=kind)  # memory-mapped
    want = encode(built.encoder, [texts[7], texts[2], texts[7]])
    for index in (built, loaded):
        got = index.vectors([7, 2, 7])
        assert got is not None and got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_stored_vectors_refuse_a_position_outside_the_index(built_retriever):
    n = built_retriever.dense.num_docs
    for outside in (-1, n):
        with pytest.raises(InputError, match=f"position {outside} is outside the index's {n} documents"):
            built_retriever.stored_vectors([0, outside])


def test_an_ivf_index_gives_no_stored_vectors(scifact_docs):
    """IVF keeps no map from a position to its vector: None, so callers embed instead."""
    assert DenseIndex(kind="ivf").index([d.full_text for d in scifact_docs]).vectors([0, 1]) is None


def test_unknown_dense_kind():
    with pytest.raises(InputError, match="'pq' is not one of"):
        DenseIndex(kind="pq")


def test_tune_alpha_without_apply_leaves_the_fusion_alone(built_retriever, scifact_mini):
    """apply=False must not leave the retriever on the grid's last setting (alpha 1.0: dense only)."""
    qrels = read_qrels(scifact_mini)
    queries = load_queries(scifact_mini / "queries.jsonl")
    before = (built_retriever.fusion, built_retriever.alpha, built_retriever.norm)
    try:
        built_retriever.set_fusion("convex", alpha=0.45, norm="zscore")
        tune_alpha(built_retriever, queries, qrels, alphas=[0.0, 1.0], norms=["minmax"], apply=False)
        assert (built_retriever.fusion, built_retriever.alpha, built_retriever.norm) == ("convex", 0.45, "zscore")
    finally:
        built_retriever.set_fusion(before[0], alpha=before[1], norm=before[2])


@pytest.mark.parametrize("k", [0, -2])
def test_dense_retrieve_bad_k(k):
    import faiss

    index = DenseIndex()
    index.faiss_index, index.dim = faiss.IndexFlatIP(4), 4
    index.faiss_index.add(np.eye(3, 4, dtype=np.float32))
    with pytest.raises(InputError, match="must be a positive integer"):
        index.retrieve(["q"], k, query_embeddings=np.eye(1, 4, dtype=np.float32))


def test_tune_alpha_ties_go_to_the_smaller_alpha(built_retriever):
    """A query equal to a document's text ranks it first at every alpha: every setting ties, and the
    documented tie rule picks the smallest alpha whatever order the grid lists them in."""
    doc = built_retriever.docs[3]
    queries, qrels = {"q": doc.full_text}, {"q": {doc.id: 1}}
    before = (built_retriever.fusion, built_retriever.alpha, built_retriever.norm)
    best = tune_alpha(built_retriever, queries, qrels, alphas=[0.8, 0.2, 0.5], norms=["minmax", "zscore"], apply=False)
    assert {row["nDCG@10"] for row in best.table} == {1.0}
    assert best.alpha == 0.2
    assert (built_retriever.fusion, built_retriever.alpha, built_retriever.norm) == before
    with pytest.raises(InputError, match="must be a positive integer"):
        tune_alpha(built_retriever, queries, qrels, k=0)


def test_the_packaged_embedders_names_in_any_case_and_the_load_device(built_retriever, tmp_path):
    """ "All-MiniLM-L6-v2" went to the hub; a loaded index embedded its queries on the CPU whatever
    device was asked for."""
    from attnrank.index.embed import resolve_embedder_path
    from attnrank.index.retriever import HybridRetriever

    assert resolve_embedder_path("All-MiniLM-L6-v2") == resolve_embedder_path(None)
    assert resolve_embedder_path(" sentence-transformers/all-minilm-l6-v2 ") == resolve_embedder_path(None)
    built_retriever.save(tmp_path / "idx")
    assert HybridRetriever.load(tmp_path / "idx", device="cuda:1").dense.device == "cuda:1"


def test_an_ivf_index_whose_ids_name_other_documents_is_refused_on_load(tmp_path):
    """Only the vector count, dimension and metric were checked: an IVF list of the right size
    with other ids returned other documents (or failed past the last one)."""
    import faiss
    import numpy as np

    from attnrank.errors import IndexFormatError
    from attnrank.index.dense import DenseIndex

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((40, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)

    def ivf(ids):
        quantizer = faiss.IndexFlatIP(8)
        ix = faiss.IndexIVFFlat(quantizer, 8, 4, faiss.METRIC_INNER_PRODUCT)
        ix.train(vecs)
        ix.add_with_ids(vecs, ids)
        return ix

    dense = DenseIndex(kind="ivf")
    dense.faiss_index = ivf(np.arange(40, dtype=np.int64))
    dense.check(tmp_path, num_docs=40, dim=8)  # the ids a build writes
    dense.faiss_index = ivf(np.arange(1, 41, dtype=np.int64))  # one past each document
    with pytest.raises(IndexFormatError, match="vector ids are not the documents 0..39"):
        dense.check(tmp_path, num_docs=40, dim=8)


def test_loading_an_ivf_index_keeps_its_saved_nprobe_unless_told(tmp_path):
    """DenseIndex.load set nprobe 16 over the value saved in the index (1 searched one list in memory,
    16 once loaded: another result set for the same query)."""
    import faiss
    import numpy as np

    from attnrank.index.dense import DenseIndex

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((80, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    quantizer = faiss.IndexFlatIP(8)
    ix = faiss.IndexIVFFlat(quantizer, 8, 8, faiss.METRIC_INNER_PRODUCT)
    ix.train(vecs)
    ix.add_with_ids(vecs, np.arange(80, dtype=np.int64))
    ix.nprobe = 1
    dense = DenseIndex(kind="ivf", nprobe=1)
    dense.faiss_index = ix
    dense.save(tmp_path / "d")
    loaded = DenseIndex.load(tmp_path / "d", model=None, kind="ivf")
    assert loaded.nprobe == faiss.extract_index_ivf(loaded.faiss_index).nprobe == 1
    assert DenseIndex.load(tmp_path / "d", model=None, kind="ivf", nprobe=4).nprobe == 4


def test_a_loaded_ivf_index_saved_again_keeps_its_vectors(tmp_path, scifact_docs):
    """Loaded memory-mapped, an IVF index reads its lists from its file, and FAISS wrote it as
    offsets into that file: saved over itself (load, set_fusion, save), index.faiss became a stub of
    a few hundred bytes and the next search crashed the process."""
    import os

    from attnrank.errors import IndexFormatError
    from attnrank.index.retriever import HybridRetriever

    built = HybridRetriever(dense_index="ivf").index(scifact_docs, show_progress=False)
    built.save(tmp_path / "ix")
    size = (tmp_path / "ix" / "dense" / "index.faiss").stat().st_size
    want = built.search("vitamin D", 5, mode="dense")
    loaded = HybridRetriever.load(tmp_path / "ix")  # memory-mapped
    loaded.set_fusion("rrf")
    loaded.save(tmp_path / "ix")  # over itself
    loaded.save(tmp_path / "copy")
    for folder in ("ix", "copy"):
        assert (tmp_path / folder / "dense" / "index.faiss").stat().st_size == size
        got = HybridRetriever.load(tmp_path / folder).search("vitamin D", 5, mode="dense")
        assert got.ids == want.ids
    again = HybridRetriever.load(tmp_path / "ix")
    os.utime(tmp_path / "ix" / "dense" / "index.faiss", ns=(1, 1))  # (rewritten since the load)
    with pytest.raises(IndexFormatError, match="changed or went away since"):
        again.save(tmp_path / "third")


def test_a_bad_tuning_grid_is_refused_before_any_query_is_searched(built_retriever, monkeypatch):
    """An unknown norm, an alpha outside [0, 1] or an empty grid was found after every labelled
    query had been embedded and searched."""
    searched = []
    monkeypatch.setattr(built_retriever, "candidates", lambda *a, **k: searched.append(a))
    qrels = {"q": {"d": 1}}
    for grid, message in (
        ({"norms": ("l2",)}, "norm"),
        ({"alphas": (1.5,)}, "alpha"),
        ({"alphas": ()}, "must each hold"),
    ):
        with pytest.raises(InputError, match=message):
            tune_alpha(built_retriever, {"q": "vitamin"}, qrels, **grid)
    assert searched == []


def test_non_finite_vectors_are_refused_not_read_as_no_hits(scifact_docs, monkeypatch):
    """A corrupted vector (NaN) is left out of FAISS's exact search: a dense search answered "no
    hits" with exit 0, a hybrid one BM25's alone; a NaN query vector found nothing either."""
    import faiss

    from attnrank.errors import IndexFormatError, ModelError
    from attnrank.index import dense as dense_module

    dense = DenseIndex().index([d.full_text for d in scifact_docs[:6]])
    q = dense.encode_queries(["cell therapy"])
    dense.retrieve([], 3, query_embeddings=q)  # (a sound index and query: no refusal)
    with pytest.raises(ModelError, match="gave query vectors that are not finite"):
        dense.retrieve(["x"], 3, query_embeddings=np.full_like(q, np.nan))
    vectors = dense.faiss_index.reconstruct_n(0, dense.num_docs)
    vectors[:] = np.nan
    broken = faiss.IndexFlatIP(vectors.shape[1])
    broken.add(vectors)
    dense.faiss_index = broken
    with pytest.raises(IndexFormatError, match="left documents out of an exact search: its vectors are corrupted"):
        dense.retrieve(["x"], 3, query_embeddings=q)
    # and none is indexed: a NaN vector among sound ones was left out of a top-k below their count
    # (exit 0, the document never found), which the search cannot tell
    encode = dense_module.encode

    def one_nan(*args, **kwargs):
        emb = encode(*args, **kwargs)
        emb[2] = np.nan
        return emb

    monkeypatch.setattr(dense_module, "encode", one_nan)
    with pytest.raises(ModelError, match=r"gave 1 document vector\(s\) that are not finite \(first: document #2\)"):
        DenseIndex().index([d.full_text for d in scifact_docs[:6]])
