"""Sharded index: global BM25 statistics, shard build, ShardedRetriever, merge (issue 17)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _manifest import past_the_sample_of_shard
from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.errors import IndexFormatError, InputError
from attnrank.index.bm25 import BM25Params, top_k
from attnrank.index.retriever import HybridRetriever
from attnrank.index.sharded import (
    CorpusStats,
    LocalExecutor,
    RayExecutor,
    ShardedIndexer,
    ShardedRetriever,
    block_stats,
    merge_shards,
    merge_stats,
)
from attnrank.index.tokenize import TokenizerConfig, tokenize_all
from attnrank.types import Document

TOK = TokenizerConfig(stemmer="none")


def _vectors(r: HybridRetriever) -> np.ndarray:
    return r.dense.faiss_index.reconstruct_n(0, r.dense.num_docs)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, built_retriever, scifact_docs):
    """A 4-shard build over the slice from the single index's own vectors (no second embedding pass)."""
    path = tmp_path_factory.mktemp("sh") / "idx"
    ShardedIndexer(HybridRetriever(), shards=4, block_size=7).build(
        scifact_docs, path, embeddings=_vectors(built_retriever)
    )
    return path


def test_stats_merge_is_associative_and_equals_whole_corpus(scifact_docs):
    texts = [d.full_text for d in scifact_docs]
    a, b, c = (block_stats(texts[i::3], TOK) for i in range(3))
    whole = block_stats(texts, TOK)
    for merged in (
        merge_stats(merge_stats(a, b), c),
        merge_stats(a, merge_stats(b, c)),
        merge_stats(c, merge_stats(b, a)),
    ):
        assert (merged.num_docs, merged.total_len, merged.df) == (whole.num_docs, whole.total_len, whole.df)
    assert a.num_docs + b.num_docs + c.num_docs == len(texts) and a.df != whole.df


@pytest.mark.parametrize("method", ["okapi", "lucene"])
def test_global_idf_equals_single_index(scifact_docs, method):
    from rank_bm25 import BM25Okapi

    texts = [d.full_text for d in scifact_docs]
    stats = merge_stats(block_stats(texts[:20], TOK), block_stats(texts[20:], TOK))
    tokens = tokenize_all(texts, TOK)
    okapi = BM25Okapi(tokens)
    assert stats.avgdl == okapi.avgdl
    idf = stats.idf(BM25Params(method=method))
    if method == "okapi":
        assert idf.keys() == okapi.idf.keys()
        assert max(abs(idf[t] - okapi.idf[t]) for t in idf) < 1e-12
    else:
        n = len(texts)
        assert idf["cancer"] == pytest.approx(np.log(1 + (n - stats.df["cancer"] + 0.5) / (stats.df["cancer"] + 0.5)))


def test_stats_save_load_roundtrip(tmp_path, scifact_docs):
    s = block_stats([d.full_text for d in scifact_docs], TOK)
    s.save(tmp_path / "st")
    t = CorpusStats.load(tmp_path / "st")
    assert (t.num_docs, t.total_len, t.df) == (s.num_docs, s.total_len, s.df)


def test_shards_have_global_bm25_and_dense_scores(sharded, built_retriever, scifact_queries):
    sr = ShardedRetriever.load(sharded, verify=True)
    assert sr.num_shards == 4 and sr.num_docs == built_retriever.num_docs
    for q in scifact_queries.values():
        single = built_retriever.bm25.get_scores(q)
        parts = [(s["start"], b.get_scores(q)) for s, b in zip(sr.manifest["shards"], sr.shard_bm25, strict=True)]
        joined = np.concatenate([p for _, p in sorted(parts, key=lambda x: x[0])])
        assert np.max(np.abs(joined - single)) <= 1e-6
    ids, scores = sr.candidates(list(scifact_queries.values()), 55, "dense")[1]
    sids, sscores = built_retriever.dense.retrieve(list(scifact_queries.values()), 55)
    for row in range(len(ids)):  # the same cosine for every (query, document)
        assert np.max(np.abs(scores[row][np.argsort(ids[row])] - sscores[row][np.argsort(sids[row])])) <= 1e-6


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_sharded_topk_equals_single(sharded, built_retriever, scifact_queries, mode):
    sr = ShardedRetriever.load(sharded)
    a = built_retriever.search_batch(scifact_queries, 30, mode=mode)
    b = sr.search_batch(scifact_queries, 30, mode=mode)
    for x, y in zip(a, b, strict=True):
        assert x.ids == y.ids and x.query_id == y.query_id
        assert np.allclose(x.scores, y.scores, atol=1e-6)
        assert [d.stage_scores.keys() for d in x] == [d.stage_scores.keys() for d in y]


def test_merge_gives_the_single_index(sharded, built_retriever, scifact_queries, tmp_path):
    merged = HybridRetriever.load(merge_shards(sharded, tmp_path / "merged"), verify=True)
    s, m = built_retriever.bm25, merged.bm25
    assert m.vocab == s.vocab
    for name in ("data", "indices", "indptr"):
        assert np.array_equal(np.asarray(getattr(m, name)), np.asarray(getattr(s, name))), name
    assert np.array_equal(_vectors(merged), _vectors(built_retriever))
    assert [d.id for d in merged.docs] == [d.id for d in built_retriever.docs]
    assert [r.ids for r in merged.search_batch(scifact_queries, 10)] == [
        r.ids for r in built_retriever.search_batch(scifact_queries, 10)
    ]


def test_ivf_shards_share_one_quantizer_and_merge(tmp_path, scifact_docs, built_retriever, scifact_queries):
    import faiss

    path = tmp_path / "ivf"
    ShardedIndexer(HybridRetriever(dense_index="ivf"), shards=2).build(
        scifact_docs, path, embeddings=_vectors(built_retriever)
    )
    sr = ShardedRetriever.load(path)
    cents = [faiss.extract_index_ivf(d.faiss_index).quantizer.reconstruct_n(0, 1) for d in sr.shard_dense]
    assert np.array_equal(cents[0], cents[1])
    merged = HybridRetriever.load(merge_shards(path, tmp_path / "m"))
    assert merged.dense.num_docs == len(scifact_docs)
    qs = list(scifact_queries.values())
    assert [r.ids for r in sr.search_batch(qs, 5, mode="dense")] == [
        r.ids for r in merged.search_batch(qs, 5, mode="dense")
    ]


def test_ray_build_writes_the_same_shards(ray_local, tmp_path, sharded, scifact_docs, built_retriever):
    ex = RayExecutor()  # joins the running local Ray
    path = ShardedIndexer(HybridRetriever(), shards=4, executor=ex, block_size=7).build(
        scifact_docs, tmp_path / "ray", embeddings=_vectors(built_retriever)
    )
    assert not ex.owned and json.loads((path / "manifest.json").read_text())["build"]["executor"] == "ray"
    for i in range(4):
        for f in ("bm25/data.npy", "bm25/indices.npy", "bm25/vocab.json", "dense/index.faiss", "docs.jsonl"):
            assert (path / f"shard-{i:05d}" / f).read_bytes() == (sharded / f"shard-{i:05d}" / f).read_bytes()


def test_tampered_shard_is_refused(tmp_path, sharded):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(sharded, copy)
    m = copy / "shard-00002" / "manifest.json"
    m.write_text(m.read_text().replace('"num_docs"', '"num_docs" ', 1))
    with pytest.raises(IndexFormatError, match="replaced after"):
        ShardedRetriever.load(copy)
    (copy / "shard-00001" / "bm25" / "data.npy").write_bytes(b"x")
    with pytest.raises(IndexFormatError, match="wrong size"):
        ShardedRetriever.load(copy)


def test_bad_settings_are_refused(scifact_docs, tmp_path):
    with pytest.raises(InputError, match="HNSW"):
        ShardedIndexer(HybridRetriever(dense_index="hnsw"))
    with pytest.raises(InputError, match="exceeds the 55 documents"):
        ShardedIndexer(shards=56).build(scifact_docs, tmp_path / "x")
    dup = list(scifact_docs[:3]) + [scifact_docs[0]]
    with pytest.raises(InputError, match="duplicate document id"):
        ShardedIndexer(shards=2).build(dup, tmp_path / "y")
    blank = list(scifact_docs[:3]) + [Document("blank", "\u200b")]  # (refused by load_corpus, taken here)
    with pytest.raises(InputError, match=r"document #3 \('blank'\) has no text"):
        ShardedIndexer(shards=2).build(blank, tmp_path / "z")
    assert not any((tmp_path / n).exists() for n in "xyz")


def test_top_k_keeps_lowest_indexes_among_ties():
    scores = np.array([0, 1, 0, 0, 2, 0, 0, 0], dtype=np.float32)
    idx, _ = top_k(scores, 4)
    assert idx.tolist() == [4, 1, 0, 2]


def test_local_executor_tree_reduce_is_a_fold():
    assert LocalExecutor().tree_reduce(lambda a, b: a + b, [[1], [2], [3], [4], [5]]) == [1, 2, 3, 4, 5]


def _copy(sharded, tmp_path):
    import shutil

    return shutil.copytree(sharded, tmp_path / "copy")


def test_sharded_index_is_rebuilt_in_place(sharded, tmp_path, scifact_docs, built_retriever):
    copy = _copy(sharded, tmp_path)
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "thesis.txt").write_text("mine")
    vectors = _vectors(built_retriever)
    ShardedIndexer(HybridRetriever(), shards=2).build(scifact_docs, copy, embeddings=vectors)
    assert ShardedRetriever.load(copy).num_shards == 2
    with pytest.raises(InputError, match="is not an attnrank index"):
        ShardedIndexer(HybridRetriever(), shards=2).build(scifact_docs, tmp_path / "user", embeddings=vectors)
    assert (tmp_path / "user" / "thesis.txt").read_text() == "mine"


def test_edited_shard_documents_are_refused(sharded, tmp_path):
    copy = _copy(sharded, tmp_path)
    docs = copy / "shard-00001" / "docs.jsonl"
    raw = docs.read_bytes()
    i = raw.index(b'"text": "') + 9
    docs.write_bytes(raw[:i] + (b"X" if raw[i : i + 1] != b"X" else b"Y") + raw[i + 1 :])  # same size
    past_the_sample_of_shard(copy, "shard-00001", "docs.jsonl")
    with pytest.raises(IndexFormatError, match="does not match the checksum"):
        ShardedRetriever.load(copy)


def test_shard_vector_ids_are_checked(sharded, tmp_path):
    copy = _copy(sharded, tmp_path)
    m = json.loads((copy / "manifest.json").read_text())
    start, n = m["shards"][1]["start"], m["shards"][1]["num_docs"]
    faiss_file = copy / "shard-00001" / "dense" / "index.faiss"
    raw = bytearray(faiss_file.read_bytes())
    at = raw.rfind(np.arange(start, start + n, dtype=np.int64).tobytes())
    raw[at : at + 8] = np.array([0], dtype=np.int64).tobytes()  # the shard's first vector now says "document 0"
    faiss_file.write_bytes(bytes(raw))
    past_the_sample_of_shard(copy, "shard-00001", "dense/index.faiss")
    with pytest.raises(IndexFormatError, match="vector ids are not the global ids"):
        ShardedRetriever.load(copy)


def test_shard_tokenizer_is_checked(sharded, tmp_path):
    copy = _copy(sharded, tmp_path)
    params = copy / "shard-00000" / "bm25" / "params.json"
    text = params.read_text()
    assert '"stemmer": "porter"' in text
    params.write_text(text.replace('"stemmer": "porter"', '"stemmer": "none"  '))  # same size
    past_the_sample_of_shard(copy, "shard-00000", "bm25/params.json")
    with pytest.raises(IndexFormatError, match="tokenizer differs"):
        ShardedRetriever.load(copy)


@pytest.mark.parametrize("damage", ["ranges", "no-shards", "fusion"])
def test_damaged_top_manifest_is_refused(sharded, tmp_path, damage):
    copy = _copy(sharded, tmp_path)
    m = json.loads((copy / "manifest.json").read_text())
    if damage == "ranges":  # the same total, other ranges: shard 0 would serve shard 1's documents
        m["shards"][0]["num_docs"] -= 1
        m["shards"][1]["start"] -= 1
        m["shards"][1]["num_docs"] += 1
    elif damage == "no-shards":
        del m["shards"]
    else:
        m["fusion"] = 5
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="its own manifest says|list of shards|mangles a setting"):
        ShardedRetriever.load(copy)


def test_merge_never_writes_into_its_source(sharded, tmp_path):
    copy = _copy(sharded, tmp_path)
    before = (copy / "shard-00000" / "manifest.json").read_bytes()
    for target in (copy, copy / "shard-00000", tmp_path):
        with pytest.raises(InputError, match="merged from"):
            merge_shards(copy, target)
    assert (copy / "shard-00000" / "manifest.json").read_bytes() == before
    assert ShardedRetriever.load(copy).num_docs == 55


def test_ordinary_load_of_a_sharded_index_says_what_it_is(sharded):
    with pytest.raises(IndexFormatError, match="is a sharded index: search it with `attnrank batch`"):
        HybridRetriever.load(sharded)


def test_merge_shards_command_replaces_a_user_folder_only_with_force(sharded, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    loaded = []
    real_load = ShardedRetriever.load
    with pytest.MonkeyPatch.context() as m:  # refused before the sharded index is loaded and merged
        m.setattr(ShardedRetriever, "load", classmethod(lambda cls, *a, **k: loaded.append(1) or real_load(*a, **k)))
        r = CliRunner().invoke(app, ["merge-shards", str(sharded), "--index-dir", str(mine)])
    assert r.exit_code == 1 and (mine / "notes.txt").exists() and not loaded
    r = CliRunner().invoke(app, ["merge-shards", str(sharded), "--index-dir", str(mine), "--force"])
    assert r.exit_code == 0, r.output
    assert HybridRetriever.load(mine).num_docs == 55 and not (mine / "notes.txt").exists()


def test_merge_shards_reads_index_names_as_index_and_search_do(sharded, tmp_path, monkeypatch):
    """`merge-shards shn` looked for ./shn, not for the ./indexes/shn `index --index shn --shards 2`
    wrote, and said ./shn had no manifest; the merged index could be named by a folder only."""
    import shutil

    monkeypatch.setenv("ATTNRANK_INDEX_DIR", str(tmp_path / "named"))
    shutil.copytree(sharded, tmp_path / "named" / "shn")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["merge-shards", "shn", "--index", "merged", "-q"])
    assert r.exit_code == 0, r.output
    assert HybridRetriever.load(tmp_path / "named" / "merged").num_docs == 55
    r = CliRunner().invoke(app, ["merge-shards", "nope", "-n", "other"])
    assert r.exit_code == 2 and "nope is no folder nor an index named 'nope'" in r.output, r.output
    r = CliRunner().invoke(app, ["merge-shards", "./shn", "-n", "other"])  # a path: never read as a name
    assert r.exit_code == 2 and "./shn is no folder;" in r.output and not (tmp_path / "named" / "other").exists()
    r = CliRunner().invoke(app, ["merge-shards", "shn", "-n", "x", "-o", str(tmp_path / "y")])
    assert r.exit_code == 2 and "give --index x or --index-dir" in r.output and not (tmp_path / "y").exists()


def test_small_shards_with_global_idf_load(tmp_path):
    """A shard's weights use the whole corpus's idf, above the bound its own document count gives
    (log(2n + 2)): a valid build of many small shards must load and score as the single index."""
    from attnrank.index.bm25 import BM25Index
    from attnrank.index.tokenize import resolve_config

    docs = [Document(f"d{i}", f"word{i} word{i} word{i} common text here") for i in range(20)]
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(20, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    path = ShardedIndexer(HybridRetriever(), shards=20).build(docs, tmp_path / "idx", embeddings=vectors)
    sr = ShardedRetriever.load(path)
    single = BM25Index(BM25Params(), resolve_config()).index([d.full_text for d in docs])
    for q in ("word3", "word7 common"):
        ids, scores = single.retrieve([q], 5, matched_only=True)
        hit = ids[0] >= 0  # "word3" is in one document: the others hold no term of it
        res = sr.search(q, 5, mode="bm25")
        assert res.ids == [docs[i].id for i in ids[0][hit]] and len(res) == (1 if q == "word3" else 5)
        np.testing.assert_allclose(res.scores, scores[0][hit], rtol=1e-6)


def test_a_sharded_index_gives_each_global_positions_own_vector(sharded, built_retriever):
    """Shards hold vectors under global ids: a position past shard 0 must come from its own
    shard's row (reading shard 0's index, or any shard's, at the global position gives another
    document's vector or none)."""
    from attnrank.rerank.signals import SignalComputer

    r = ShardedRetriever.load(sharded)
    assert len(r.shard_dense) == 4 and r.docs.starts[1] > 0
    positions = [len(r.docs) - 1, 0, r.docs.starts[2], r.docs.starts[2] - 1, 0]
    got = r.stored_vectors(positions)
    assert got is not None
    np.testing.assert_array_equal(got, _vectors(built_retriever)[positions])
    assert SignalComputer().use_index(r)
    for outside in (-1, len(r.docs)):  # -1 would read past the last shard's array, not fail
        with pytest.raises(InputError, match=f"position {outside} is outside"):
            r.stored_vectors([0, outside])


def test_an_ivf_sharded_index_gives_no_stored_vectors_so_rerankers_embed(tmp_path, scifact_docs, built_retriever):
    from attnrank.rerank.signals import SignalComputer

    path = tmp_path / "ivf"
    ShardedIndexer(HybridRetriever(dense_index="ivf"), shards=2).build(
        scifact_docs, path, embeddings=_vectors(built_retriever)
    )
    r = ShardedRetriever.load(path)
    assert r.stored_vectors([0, 30]) is None
    assert not SignalComputer().use_index(r)


def test_vectors_an_int8_export_embedded_are_not_read_from_shards(tmp_path, sharded):
    """The build's embedder is recorded once, in the top-level manifest: each shard must know it,
    even when queries are embedded by another backend."""
    import shutil

    copy = tmp_path / "int8"
    shutil.copytree(sharded, copy)
    m = json.loads((copy / "manifest.json").read_text())
    m["dense"]["backend"] = "onnx-int8"
    (copy / "manifest.json").write_text(json.dumps(m))
    r = ShardedRetriever.load(copy, embed_backend="torch")
    assert r.stored_vectors([0]) is None
    assert ShardedRetriever.load(sharded, embed_backend="torch").stored_vectors([0]) is not None


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda v: 0.3 * v, "embedding 0 has norm 0.3000"),
        (
            lambda v: v[:, :16] / np.linalg.norm(v[:, :16], axis=1, keepdims=True),
            "16 dimensions, the index's embedder 384",
        ),
        (lambda v: np.where(np.arange(v.shape[1]) == 0, np.nan, v), "non-finite"),
    ],
)
def test_given_embeddings_that_are_not_the_embedders_are_refused_before_the_build(tmp_path, change, message):
    """0.3 x unit vectors built and scored wrongly, silently; 16 dimensions built and failed at load."""
    from attnrank.types import Document

    docs = [Document(f"d{i}", f"text number {i}") for i in range(6)]
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(6, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    with pytest.raises(InputError, match=message):
        ShardedIndexer(HybridRetriever(), shards=2).build(docs, tmp_path / "idx", embeddings=change(vectors))
    assert not (tmp_path / "idx").exists()


def test_a_rebuild_swapped_in_during_a_load_restarts_it(sharded, tmp_path, scifact_docs, built_retriever, monkeypatch):
    """ShardedRetriever.load had no restart: a rebuild with the same shard count, sizes and ids
    (here other BM25 settings) swapped in after the manifests were read gave a mix of the two
    builds that passed every shard check."""
    import shutil

    from attnrank.index.sharded import retriever as sharded_retriever

    copy = _copy(sharded, tmp_path)
    other = tmp_path / "other"
    ShardedIndexer(HybridRetriever(bm25=BM25Params(k1=0.3, b=0.2)), shards=4, block_size=7).build(
        scifact_docs, other, embeddings=_vectors(built_retriever)
    )
    read, swapped = sharded_retriever.read_sharded, []

    def read_then_swap(path, **kw):
        out = read(path, **kw)
        if not swapped:  # the rebuild lands right after this load read the manifests
            swapped.append(True)
            shutil.rmtree(copy)
            shutil.copytree(other, copy)
        return out

    monkeypatch.setattr(sharded_retriever, "read_sharded", read_then_swap)
    loaded = ShardedRetriever.load(copy)
    assert swapped and loaded.manifest == ShardedRetriever.load(other).manifest
    assert loaded.shard_bm25[0].params == ShardedRetriever.load(other).shard_bm25[0].params


def test_the_document_ids_of_a_sharded_index_are_read_without_loading_it(sharded, built_retriever, tmp_path):
    """What attnrank batch checks before a run whose run file must hold every id."""
    import shutil

    from attnrank.batch.runner import index_doc_ids

    assert list(index_doc_ids(sharded)) == [d.id for d in ShardedRetriever.load(sharded).docs]
    built_retriever.save(tmp_path / "one")
    assert list(index_doc_ids(tmp_path / "one")) == [d.id for d in built_retriever.docs]
    damaged = _copy(sharded, tmp_path)
    # the first shard, intact, outside the index: only its name is wrong (its manifest's SHA-256,
    # ids and files all match), so the name check alone refuses it
    shutil.copytree(damaged / "shard-00000", tmp_path / "outside")
    manifest = json.loads((damaged / "manifest.json").read_text())
    assert manifest["shards"][0]["name"] == "shard-00000"
    manifest["shards"][0]["name"] = "../outside"  # read docs outside the index; a load refuses the name
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="lacks or mangles its list of shards"):
        list(index_doc_ids(damaged))


class _OtherNodes(LocalExecutor):
    """Runs each shard task as a worker node without shared storage would: its writes land on
    that node's own disk (here, another folder), not in the driver's temporary folder."""

    name = "other-nodes"

    def __init__(self, disk):
        self.disk = disk

    def map(self, fn, args, *, num_cpus=1, num_gpus=0):
        from attnrank.index.sharded.build import build_shard

        if fn is not build_shard:  # the statistics pass returns its results, it writes nothing
            return super().map(fn, args)
        return [fn(*a[:6], self.disk / a[6].name, *a[7:]) for a in args]


def test_shards_written_on_other_nodes_are_refused_not_a_traceback(tmp_path, scifact_docs, built_retriever):
    """On a multi-node Ray cluster without shared storage the driver failed with a raw
    FileNotFoundError after every shard was built."""
    target = tmp_path / "idx"
    with pytest.raises(InputError, match=r"written on the machines that built them.*storage every node shares"):
        ShardedIndexer(HybridRetriever(), shards=2, executor=_OtherNodes(tmp_path / "node")).build(
            scifact_docs, target, embeddings=_vectors(built_retriever)
        )
    assert not target.exists()


def test_a_sharded_manifest_without_its_file_list_is_refused(tmp_path, sharded):
    """Without "files" the corpus statistics (stats/) were never checked, not even for size."""
    import shutil

    copy = tmp_path / "idx"
    shutil.copytree(sharded, copy)
    m = json.loads((copy / "manifest.json").read_text())
    del m["files"]
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="lacks its list of files"):
        ShardedRetriever.load(copy)


def test_tied_dense_scores_rank_alike_in_a_sharded_and_a_single_index(tmp_path):
    """Twelve copies of one passage: FAISS gave them by id descending, the sharded merge by id
    ascending, so a sharded index and its own merge ranked duplicates apart."""
    from attnrank.types import Document

    docs = [Document(f"o{i}", f"other passage number {i} about rivers") for i in range(6)]
    docs += [Document(f"dup{i}", "Vitamin D lowers the risk of fractures.") for i in range(12)]
    single = HybridRetriever().index(docs, show_progress=False)
    path = ShardedIndexer(HybridRetriever(), shards=3).build(docs, tmp_path / "sh", embeddings=_vectors(single))
    sharded = ShardedRetriever.load(path)
    for r in (single, sharded):
        hits = r.search("vitamin D fractures", 5, mode="dense").ids
        assert hits == ["dup0", "dup1", "dup2", "dup3", "dup4"], hits


def test_settings_for_a_ray_already_running_are_not_dropped_silently(ray_local, caplog):
    """A run given a cluster address in a process that already ran a local Ray ran on the local one."""
    import logging

    with caplog.at_level(logging.WARNING, logger="attnrank.index.sharded.executor"):
        ex = RayExecutor("ray://elsewhere:10001", num_cpus=3)
    assert not ex.owned and "Ray is already running in this process" in caplog.text
    assert "ray://elsewhere:10001" in caplog.text


def test_a_failed_ray_task_stops_the_others_before_the_caller_cleans_up(ray_local, tmp_path):
    """ray.get raised at the first failed shard while the others ran on, writing their shards into
    the temporary folder the failed build then removed (and so made again)."""
    import time

    def _slow_write(i: int, folder: str) -> int:  # (nested: pickled by value for the workers)
        import time
        from pathlib import Path

        if i == 0:
            raise ValueError("shard 0 failed")
        (Path(folder) / f"started-{i}").write_text(str(time.time()))
        time.sleep(10)  # (room for the failure to reach the driver on a loaded machine)
        (Path(folder) / f"written-{i}").write_text("late")
        return i

    ex = RayExecutor()
    start = time.monotonic()
    with pytest.raises(Exception, match="shard 0 failed"):
        ex.map(_slow_write, [(i, str(tmp_path)) for i in range(3)])
    time.sleep(max(0.0, 12 - (time.monotonic() - start)))  # past the tasks' writes, had they run on
    for started in tmp_path.glob("started-*"):  # (and past a late-starting task's: it would write late)
        time.sleep(max(0.0, float(started.read_text()) + 12 - time.time()))
    assert list(tmp_path.glob("written-*")) == []


def test_a_submission_that_fails_stops_the_tasks_submitted_before_it(ray_local, tmp_path):
    """The tasks were submitted outside the cleanup's reach: when a later submission failed (an
    argument Ray cannot pickle), the shards already started wrote on after the caller cleaned up."""
    import threading
    import time

    def _slow_write(i: int, folder: str, _lock: object) -> int:  # (nested: pickled by value for the workers)
        import time
        from pathlib import Path

        (Path(folder) / f"started-{i}").write_text(str(time.time()))
        time.sleep(6)
        (Path(folder) / f"written-{i}").write_text("late")
        return i

    ex = RayExecutor()
    with pytest.raises(TypeError):
        ex.map(_slow_write, [(0, str(tmp_path), None), (1, str(tmp_path), threading.Lock())])
    deadline = time.monotonic() + 20  # the first task, had it run on: started, then written 6 s later
    while time.monotonic() < deadline and not list(tmp_path.glob("written-*")):
        started = list(tmp_path.glob("started-*"))
        if started and time.time() > float(started[0].read_text()) + 8:
            break
        time.sleep(0.5)
    assert list(tmp_path.glob("written-*")) == []


def test_a_prompted_embedders_shards_and_merge_embed_as_one_index(tmp_path):
    """Shards embedded their documents bare and searched with bare queries: with an e5-style
    embedder, a sharded index ranked otherwise than the single index built from the same corpus."""
    from _tiny import save_tiny_encoder

    from attnrank.types import Document

    enc = str(save_tiny_encoder(tmp_path / "enc", prompts={"query": "query: ", "document": "passage: "}))
    docs = [Document(str(i), t) for i, t in enumerate(["the cat sat", "a dog ran", "the bird sang", "a cat ran"])]
    single = HybridRetriever(embedder=enc).index(docs, show_progress=False)
    path = ShardedIndexer(HybridRetriever(embedder=enc), shards=2).build(docs, tmp_path / "sh")
    sr = ShardedRetriever.load(path)
    merged = HybridRetriever.load(merge_shards(path, tmp_path / "merged"))
    for other in (sr, merged):
        a, b = single.search("cat", 4, mode="dense"), other.search("cat", 4, mode="dense")
        assert a.ids == b.ids and np.allclose(a.scores, b.scores, atol=1e-5)
    assert merged.dense.prompts and sr.dense.prompts


@pytest.mark.parametrize(("option", "value"), [("ivf_sample", 0), ("block_size", 0.5), ("shards", 0)])
def test_sharded_build_settings_are_checked_when_made(option, value):
    """ivf_sample=0 failed as an IndexError after the corpus statistics; block_size=0.5 in range()."""
    with pytest.raises(InputError, match=f"{option}={value!r} must be a positive integer"):
        ShardedIndexer(HybridRetriever(dense_index="ivf"), **{option: value})


def test_merging_an_ordinary_index_says_it_needs_none(tmp_path):
    """merge-shards on an ordinary index said only that its manifest is not a sharded one."""
    from attnrank.errors import IndexFormatError
    from attnrank.types import Document

    HybridRetriever().index([Document("a", "apples"), Document("b", "pears")], show_progress=False).save(
        tmp_path / "ix"
    )
    with pytest.raises(
        IndexFormatError, match="is an ordinary \\(single\\) attnrank index, not a sharded one: it needs no merging"
    ):
        merge_shards(tmp_path / "ix", tmp_path / "merged")


def test_a_sharded_index_refuses_an_embedder_replaced_since_its_build(tmp_path):
    """Queries are embedded by the first shard's DenseIndex, as an ordinary index's: the probe text
    embedded otherwise than at the build (another model at the same path) is refused."""
    from _tiny import save_tiny_encoder

    from attnrank.types import Document

    enc = save_tiny_encoder(tmp_path / "enc")
    docs = [Document(str(i), t) for i, t in enumerate(["the cat sat", "a dog ran", "the bird sang", "a cat ran"])]
    path = ShardedIndexer(HybridRetriever(embedder=str(enc)), shards=2).build(docs, tmp_path / "sh")
    assert ShardedRetriever.load(path).search("cat", 2, mode="dense").ids
    import shutil

    from attnrank.index.embed import clear_embedders

    shutil.rmtree(enc)
    save_tiny_encoder(enc, seed=1)  # same path, same dimension, another vector space
    clear_embedders()
    with pytest.raises(InputError, match="embeds a probe text differently"):
        ShardedRetriever.load(path).search("cat", 2, mode="dense")


def test_a_failed_tasks_own_error_reaches_the_caller_as_itself(ray_local):
    """Ray wrapped a task's InputError in a RayTaskError, which the CLI printed as a coloured
    remote traceback of several lines instead of its one-line message."""
    from attnrank.errors import InputError

    def _refuse(i: int) -> int:  # (nested: pickled by value for the workers)
        from attnrank.errors import InputError

        raise InputError(f"embedder folder /models/x{i} is missing")

    with pytest.raises(InputError) as caught:
        RayExecutor().map(_refuse, [(0,)])
    assert type(caught.value) is InputError and str(caught.value) == "embedder folder /models/x0 is missing"


def test_a_task_that_has_ended_is_not_cancelled(ray_local, monkeypatch):
    """The executor force-cancelled every task of a failed map, the failed one too; Ray 2.60's driver
    then sometimes aborted ("Check failed: it != submissible_tasks_.end()"), which killed the test
    suite silently in CI. The task still running is cancelled; the one that failed is left alone."""
    got, cancelled = [], []
    real_get, real_cancel = ray_local.get, ray_local.cancel
    monkeypatch.setattr(ray_local, "get", lambda refs, **kw: (got.append(list(refs)), real_get(refs, **kw))[1])
    monkeypatch.setattr(ray_local, "cancel", lambda ref, **kw: (cancelled.append(ref), real_cancel(ref, **kw))[1])

    def _task(i: int) -> int:
        import time

        if i == 0:
            raise ValueError("task 0 failed")
        time.sleep(60)
        return i

    with pytest.raises(Exception, match="task 0 failed"):
        RayExecutor().map(_task, [(0,), (1,)])
    failed, running = got[0]
    assert running in cancelled and failed not in cancelled


def test_a_local_ray_is_started_even_where_ray_address_names_a_cluster(tmp_path):
    """RayExecutor(None) passed None to ray.init, which attaches to the cluster RAY_ADDRESS (or a
    `ray start` on this machine) names: a local build ran on a cluster, and with num_cpus failed in a
    traceback. In a fresh process: this one may hold a Ray already."""
    import os
    import subprocess
    import sys

    code = (
        "from attnrank.index.sharded.executor import RayExecutor\n"
        "ex = RayExecutor(None, num_cpus=1, quiet=True)\n"
        "print('owned', ex.owned, ex.map(lambda x: -x, [(-3,)]))\n"
        "ex.close()\n"
    )
    env = {**os.environ, "RAY_ADDRESS": "10.255.255.1:6379"}  # (nothing there)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "owned True [3]" in r.stdout


def test_a_local_ray_listens_on_the_loopback_address_alone(tmp_path):
    """A local Ray bound its GCS, raylet and workers to the machine's network address (reachable
    from other hosts; a _node_ip_address of 127.0.0.1 is resolved back to it). Every socket that
    this process and the processes it started listen on is read once a task has run."""
    import json
    import subprocess
    import sys

    code = (
        "import json\n"
        "import psutil\n"
        "from attnrank.index.sharded.executor import RayExecutor\n"
        "ex = RayExecutor('local', num_cpus=1, quiet=True)\n"
        "assert ex.map(lambda x: -x, [(-3,)]) == [3]\n"
        "me = psutil.Process()\n"
        "ips = set()\n"
        "for p in [me, *me.children(recursive=True)]:\n"
        "    try:\n"
        "        ips |= {c.laddr.ip for c in p.net_connections('inet') if c.status == psutil.CONN_LISTEN}\n"
        "    except psutil.NoSuchProcess:\n"
        "        pass\n"
        "print('listening', json.dumps(sorted(ips)))\n"
        "ex.close()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(s for s in r.stdout.splitlines() if s.startswith("listening"))
    ips = set(json.loads(line.split(" ", 1)[1]))
    assert ips and ips <= {"127.0.0.1", "::ffff:127.0.0.1"}, line


def test_a_file_given_as_a_sharded_index_is_named_a_file(tmp_path):
    """merge-shards run.trec said "run.trec/manifest.json cannot be read (Not a directory);
    rebuild the sharded index"."""
    from attnrank.errors import IndexFormatError
    from attnrank.index.sharded.layout import read_sharded

    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 1.0 x\n")
    with pytest.raises(IndexFormatError, match=r"run\.trec is a file, not a sharded index folder"):
        read_sharded(tmp_path / "run.trec")


def test_a_sharded_build_skips_invalid_records_where_asked_and_says_it_drops_passage_states(tmp_path, caplog):
    """ShardedIndexer.build(path) did not take the skip_invalid its refusal advises (TypeError), and
    a sharded build over an index dropped its stored passage states without a word."""
    from attnrank.config import PASSAGE_STATES_FOLDER

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(f'{{"_id": "d{i}", "text": "word{i} shared text"}}\n' for i in range(6)) + '{"_id": "x"}\n'
    )

    def states(folder):
        (folder / PASSAGE_STATES_FOLDER).mkdir()
        (folder / PASSAGE_STATES_FOLDER / "states.json").write_text('{"kept": true}')

    target = HybridRetriever().index(corpus, show_progress=False, skip_invalid=True).save(tmp_path / "ix", extra=states)
    with pytest.raises(InputError, match="skip_invalid=True"):
        ShardedIndexer(HybridRetriever(), shards=2).build(corpus, target)
    with caplog.at_level("WARNING", logger="attnrank.index.store"):
        ShardedIndexer(HybridRetriever(), shards=2).build(corpus, target, skip_invalid=True)
    assert ShardedRetriever.load(target).num_docs == 6 and not (target / PASSAGE_STATES_FOLDER).exists()
    assert "dropped the passage states (0.0 MiB) of the index this build replaced" in caplog.text


def test_a_damaged_sharded_manifest_advises_the_forced_rebuild(sharded, tmp_path):
    """It advised "rebuild the sharded index", which a plain rebuild refused: a folder whose manifest
    is damaged is no longer known for an index."""
    copy = _copy(sharded, tmp_path)
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match=r"cannot be read .*--shards N --force"):
        ShardedRetriever.load(copy)


@pytest.mark.parametrize("damage", ["{not json", '{"format": "something else"}'])
def test_a_damaged_shard_manifest_advises_the_sharded_rebuild(sharded, tmp_path, damage):
    """One shard's damaged manifest advised an ordinary index's rebuild (`attnrank index CORPUS
    --index-dir FOLDER --force`, no --shards), which would have replaced the sharded index by one."""
    copy = _copy(sharded, tmp_path)
    (copy / "shard-00001" / "manifest.json").write_text(damage)
    with pytest.raises(IndexFormatError, match=r"shard-00001.*--shards N --force"):
        ShardedRetriever.load(copy)
