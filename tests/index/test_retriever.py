from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from _manifest import past_the_sample

from attnrank.errors import IndexFormatError, InputError
from attnrank.index.bm25 import BM25Params
from attnrank.index.retriever import HybridRetriever
from attnrank.index.store import read_manifest
from attnrank.types import Document, RankedResults

QUERY = "Vitamin D supplementation and fracture risk"


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
def test_search_typed_sorted(built_retriever, mode):
    res = built_retriever.search(QUERY, k=5, mode=mode)
    assert isinstance(res, RankedResults) and len(res) == 5 and res.stage == mode
    assert [r.rank for r in res] == [1, 2, 3, 4, 5]
    assert res.scores == sorted(res.scores, reverse=True)
    assert all(r.text for r in res)
    if mode == "hybrid":
        assert "hybrid" in res[0].stage_scores and ({"bm25", "dense"} & set(res[0].stage_scores))


def test_hybrid_convex_and_batch(built_retriever):
    r = built_retriever
    before = (r.fusion, r.alpha, r.norm)
    r.set_fusion("convex", alpha=0.3, norm="zscore")
    try:
        batch = r.search_batch({"a": QUERY, "b": "gene expression"}, k=3)
        assert [x.query_id for x in batch] == ["a", "b"]
        single = r.search(QUERY, k=3)
        assert single.ids == batch[0].ids
    finally:
        r.set_fusion(before[0], alpha=before[1], norm=before[2])


def _fused(r, fusion, alpha, norm, k=10):
    """``r``'s hybrid results under one fusion setting (restored afterwards)."""
    before = (r.fusion, r.alpha, r.norm)
    r.set_fusion(fusion, alpha=alpha, norm=norm)
    try:
        return r.search(QUERY, k, mode="hybrid")
    finally:
        r.set_fusion(before[0], alpha=before[1], norm=before[2])


def test_default_fusion_is_the_tuned_convex_zscore(built_retriever):
    """The default is convex, alpha 0.45 on dense, z-score (tuned on SciFact and HotpotQA,
    docs/results/first_stage.md), not RRF: same results as that setting asked for, other than RRF's."""
    fresh = HybridRetriever()
    assert (fresh.fusion, fresh.alpha, fresh.norm) == ("convex", 0.45, "zscore")
    r = built_retriever  # built with the defaults
    default = r.search(QUERY, 10, mode="hybrid")
    tuned = _fused(r, "convex", 0.45, "zscore")
    rrf = _fused(r, "rrf", None, None)
    assert default.ids == tuned.ids and default.scores == tuned.scores
    assert default.scores != rrf.scores  # RRF scores are sums of 1/(60 + rank): never z-score mixtures
    m = HybridRetriever._manifest_info(r)["fusion"]
    assert (m["method"], m["alpha"], m["norm"]) == ("convex", 0.45, "zscore")


def test_fusion_recorded_in_the_manifest_is_kept(tmp_path, built_retriever):
    """An index keeps the fusion it was saved with: one saved while RRF was the default (its
    manifest says rrf, alpha 0.5, minmax) reloads as RRF and gives RRF's results."""
    r = built_retriever
    before = (r.fusion, r.alpha, r.norm)
    r.set_fusion("rrf", alpha=0.5, norm="minmax")
    try:
        r.save(tmp_path / "old")
    finally:
        r.set_fusion(before[0], alpha=before[1], norm=before[2])
    loaded = HybridRetriever.load(tmp_path / "old")
    assert (loaded.fusion, loaded.alpha, loaded.norm) == ("rrf", 0.5, "minmax")
    a, b = _fused(r, "rrf", None, None), loaded.search(QUERY, 10)
    assert a.ids == b.ids
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    assert b.ids != r.search(QUERY, 10).ids or b.scores != r.search(QUERY, 10).scores


def test_k_larger_than_corpus_returns_everything(built_retriever):
    """Everything that can be found: by BM25 only the documents that hold a query term."""
    for mode in ("dense", "hybrid"):
        res = built_retriever.search(QUERY, k=10_000, mode=mode)
        assert len(res) == built_retriever.num_docs == len(set(res.ids))
    res = built_retriever.search(QUERY, k=10_000, mode="bm25")
    held = built_retriever.bm25.matches(QUERY)
    assert 0 < len(res) == held.sum() < built_retriever.num_docs and len(set(res.ids)) == len(res)
    assert all(r.score > 0 for r in res)


def test_more_results_than_the_fusion_depth_keep_the_top_the_depth_fuses(built_retriever, monkeypatch):
    """Hybrid search fetched max(k, depth) from each side and fused those: convex fusion's
    normalisation (and RRF's sums) then read every document fetched, so the top 10 of -k 40 was
    not the top 10 of -k 10, nor the fusion at the depth the index records."""
    monkeypatch.setattr(built_retriever, "depth", 8)
    queries = [QUERY, "cancer cells and mutations", "blood pressure in children", "antibiotic resistance"]
    for fusion in ("convex", "rrf"):
        monkeypatch.setattr(built_retriever, "fusion", fusion)
        for q in queries:
            top, more = built_retriever.search(q, 5), built_retriever.search(q, 40)
            assert more.ids[:5] == top.ids and more.scores[:5] == pytest.approx(top.scores), (fusion, q)
            assert len(more) == 40 == len(set(more.ids)) and all(np.diff(more.scores) <= 0), (fusion, q)


def test_documents_without_a_query_term_get_no_rank_fusion_credit():
    """BM25's list held, after the documents that match, the others in corpus order: RRF credited
    them by that order, so results depended on it. Reversing the corpus now changes nothing."""
    docs = [
        Document("violin", "The violin and the cello are string instruments."),
        Document("kyoto", "Kyoto has many old temples and shrines."),
        Document("cello", "A cello concert."),
        Document("bread", "Sourdough bread needs a starter."),
        Document("music", "Orchestras play classical music with strings and winds."),
        Document("train", "Trains connect the cities of Japan."),
    ]
    query = "violin cello instruments"

    def top(corpus):
        r = HybridRetriever(fusion="rrf").index(corpus, show_progress=False)
        return r.search(query, k=6, mode="hybrid").ids, r.search(query, k=6, mode="bm25").ids

    (hybrid, bm25), (hybrid_rev, bm25_rev) = top(docs), top(docs[::-1])
    assert hybrid == hybrid_rev and bm25 == bm25_rev == ["violin", "cello"]


@pytest.mark.parametrize(
    "bad,msg",
    [
        ("", "query #0 is empty"),
        ("   ", "query #0 is empty"),
        (5, r"query #0 \(5\) is a int, not a text"),  # (called empty)
        (b"bytes", r"query #0 \(b'bytes'\) is a bytes, not a text"),
    ],
)
def test_empty_query(built_retriever, bad, msg):
    with pytest.raises(InputError, match=msg):
        built_retriever.search(bad)


@pytest.mark.parametrize("k", [0, -3, 2.5])
def test_bad_k(built_retriever, k):
    with pytest.raises(InputError, match="must be a positive integer"):
        built_retriever.search(QUERY, k=k)


def test_empty_corpus_and_duplicates():
    with pytest.raises(InputError, match="empty corpus"):
        HybridRetriever().index([])
    with pytest.raises(InputError, match="duplicate document id 'x'"):
        HybridRetriever().index([Document("x", "a"), Document("x", "b")])
    with pytest.raises(InputError, match="no documents"):
        HybridRetriever().search("q")


def test_save_load_round_trip(tmp_path, built_retriever):
    built_retriever.save(tmp_path / "ix")
    m = read_manifest(tmp_path / "ix", verify=True)
    assert m["num_docs"] == built_retriever.num_docs and m["format_version"] == 1
    loaded = HybridRetriever.load(tmp_path / "ix")
    for mode in ("bm25", "dense", "hybrid"):
        a, b = built_retriever.search(QUERY, 10, mode=mode), loaded.search(QUERY, 10, mode=mode)
        assert a.ids == b.ids
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)


@pytest.fixture()
def saved(tmp_path, built_retriever):
    built_retriever.save(tmp_path / "ix")
    return tmp_path / "ix"


def test_corrupted_manifest(saved):
    (saved / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="manifest.json is corrupted.*rebuild"):
        HybridRetriever.load(saved)


def test_old_format_version(saved):
    m = json.loads((saved / "manifest.json").read_text())
    m["format_version"] = 0
    (saved / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexFormatError, match="format version 0, this attnrank reads version 1"):
        HybridRetriever.load(saved)


def test_truncated_component_detected(saved):
    f = saved / "bm25" / "data.npy"
    f.write_bytes(f.read_bytes()[:-8])
    with pytest.raises(IndexFormatError, match="data.npy is missing or has the wrong size"):
        HybridRetriever.load(saved)


def test_checksum_verification(saved):
    f = saved / "dense" / "index.faiss"
    raw = bytearray(f.read_bytes())
    raw[-7] ^= 1  # same size, lowest mantissa bit of a vector component: structurally plausible
    f.write_bytes(bytes(raw))
    past_the_sample(saved, "dense/index.faiss")  # (in the middle of a large file)
    HybridRetriever.load(saved)  # the cheap structural checks cannot see it
    with pytest.raises(IndexFormatError, match="fails its SHA-256 check"):
        HybridRetriever.load(saved, verify=True)


def test_same_size_docs_edit_is_caught_on_every_load(saved):
    f = saved / "docs.jsonl"
    raw = bytearray(f.read_bytes())
    raw[raw.index(b'"text": "') + 9] ^= 1  # same size, different text
    f.write_bytes(bytes(raw))
    with pytest.raises(IndexFormatError, match="docs.jsonl is not the file this index was built with"):
        HybridRetriever.load(saved)
    past_the_sample(saved, "docs.jsonl")  # (in the middle of a large file)
    with pytest.raises(IndexFormatError, match="does not match the corpus checksum"):
        HybridRetriever.load(saved)


def test_interrupted_save_keeps_previous_index(saved, built_retriever, monkeypatch):
    before = HybridRetriever.load(saved).search(QUERY, 5).ids

    def boom(*a, **k):
        raise KeyboardInterrupt("simulated crash mid-save")

    monkeypatch.setattr("attnrank.index.dense.DenseIndex.save", boom)
    with pytest.raises(KeyboardInterrupt):
        built_retriever.save(saved)
    assert HybridRetriever.load(saved, verify=True).search(QUERY, 5).ids == before
    assert [p.name for p in saved.parent.iterdir() if p.name.startswith(".")] == []


def test_missing_index_message(tmp_path):
    with pytest.raises(IndexFormatError, match="no index at .*attnrank index"):
        HybridRetriever.load(tmp_path / "nothing")
    (tmp_path / "half").mkdir()
    with pytest.raises(IndexFormatError, match="has no manifest.json"):
        HybridRetriever.load(tmp_path / "half")


def test_metadata_survives_save_and_load_and_is_checksummed(tmp_path):
    """Search results of a loaded index carry the corpus's metadata (a URL, the pruner's pre-split
    sentences) as the in-memory index's do; an edit to it is caught like an edit to the text."""
    import hashlib

    from attnrank.index.store import corpus_checksum

    docs = [
        Document("a", "Paris is the capital of France.", "Paris", {"url": "http://x/a", "sentences": ["Paris."]}),
        Document("b", "Bananas are yellow.", ""),
    ]
    r = HybridRetriever().index(docs, show_progress=False)
    loaded = HybridRetriever.load(r.save(tmp_path / "idx"))
    assert [d.metadata for d in loaded.docs] == [d.metadata for d in docs]
    assert loaded.search("capital", 1, mode="bm25")[0].metadata["url"] == "http://x/a"
    plain = Document("b", "Bananas are yellow.")  # no metadata: the checksum of older indexes
    assert corpus_checksum([plain]) == hashlib.sha256(b"b\0\0Bananas are yellow.\n").hexdigest()
    path = tmp_path / "idx" / "docs.jsonl"
    path.write_text(path.read_text().replace("http://x/a", "http://y/a"))  # same size
    past_the_sample(path.parent, path.name)  # (in the middle of a large file)
    with pytest.raises(IndexFormatError, match="corpus checksum"):
        HybridRetriever.load(tmp_path / "idx")


@pytest.mark.parametrize("mode", ["dense", "hybrid"])
def test_query_that_is_not_valid_unicode(built_retriever, mode):
    """A lone surrogate (a JSON "\\ud800" escape, or a non-UTF-8 byte in a command-line argument)
    made the embedder's tokenizer raise a bare TypeError."""
    with pytest.raises(InputError, match="not valid Unicode"):
        built_retriever.search("vitamin \udcff D", 3, mode=mode)
    assert built_retriever.search("vitamin \udcff D", 3, mode="bm25").ids  # BM25 reads it as it is


def test_document_that_is_not_valid_unicode():
    with pytest.raises(InputError, match=r"document #1 \('b'\) holds a lone surrogate"):
        HybridRetriever().index([Document("a", "fine"), Document("b", "bad \ud800 text")], show_progress=False)


@pytest.mark.parametrize("text", ["", "  \n", "\u200b", "\ufeff\u00ad"])
def test_a_document_without_text_is_refused_before_the_build(text):
    """load_corpus refused a blank document in a file, but index() took one given in Python: it was
    then a dense hit for unrelated queries, and every reranker refused the results that held it."""
    docs = [Document("a", "glaciers retreat"), Document("b", text), Document("c", "ice sheets")]
    with pytest.raises(InputError, match=r"document #1 \('b'\) has no text; drop empty documents before indexing"):
        HybridRetriever().index(docs, show_progress=False)
    assert HybridRetriever().index([Document("t", "", title="A title alone")], show_progress=False).num_docs == 1


def test_a_title_or_text_that_is_not_text_is_refused_in_one_line():
    """A data frame's missing title (NaN) failed the new check with an AttributeError; before it,
    the build indexed the word "nan"."""
    with pytest.raises(InputError, match=r"document #0 \('a'\) has a title that is not text \(nan, of type float\)"):
        HybridRetriever().index([Document("a", "some text", float("nan"))], show_progress=False)  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"document #0 \('a'\) has a text that is not text \(3, of type int\)"):
        HybridRetriever().index([Document("a", 3)], show_progress=False)  # type: ignore[arg-type]


def test_metadata_that_json_cannot_write_is_refused_before_the_build():
    with pytest.raises(InputError, match=r"document #0 \('a'\) has metadata that cannot be written as JSON"):
        HybridRetriever().index([Document("a", "text", metadata={(1, 2): "tuple key"})], show_progress=False)
    with pytest.raises(InputError, match="lone surrogate"):
        HybridRetriever().index([Document("a", "text", metadata={"k": "bad \udcff"})], show_progress=False)


def test_a_save_records_the_settings_the_index_was_built_with(tmp_path, built_retriever, caplog):
    """Settings changed on a loaded retriever went into the manifest while the files kept what the
    index was built with: the save replaced a good index with one refused at load as corrupted."""
    built_retriever.save(tmp_path / "ix")
    r = HybridRetriever.load(tmp_path / "ix")
    before = r.search(QUERY, 5, mode="bm25")
    r.bm25_params = BM25Params(k1=1.2)
    with caplog.at_level(logging.WARNING, logger="attnrank.index.retriever"):
        r.save(tmp_path / "ix")
    assert "bm25_params=" in caplog.text and "apply at the next index()" in caplog.text
    again = HybridRetriever.load(tmp_path / "ix")
    assert again.bm25_params == BM25Params() and again.search(QUERY, 5, mode="bm25").ids == before.ids


@pytest.mark.parametrize("k", [0, -1, -3])
def test_fuse_refuses_a_k_below_one(built_retriever, k):
    """fuse() took any k: -1 gave all but the last result in bm25 mode, -3 three in hybrid, 0 none."""
    candidates = built_retriever.candidates([QUERY], 5)
    with pytest.raises(InputError, match=f"k={k} must be a positive integer"):
        built_retriever.fuse([QUERY], candidates, k)
    assert len(built_retriever.fuse([QUERY], candidates, 3)[0].ids) == 3


@pytest.mark.parametrize("mode", ["dense", "hybrid"])
def test_numpy_k_and_empty_batch(built_retriever, mode):
    """k as a NumPy integer is accepted (FAISS refused it with a TypeError); an empty batch gives no
    results, as in BM25 mode (the dense modes blamed the embedder: '0-dimensional vectors')."""
    res = built_retriever.search(QUERY, np.int64(3), mode=mode)
    assert res.ids == built_retriever.search(QUERY, 3, mode=mode).ids and len(res) == 3
    assert built_retriever.search_batch([], 3, mode=mode) == []
    assert built_retriever.search_batch({}, 3, mode=mode) == []


@pytest.mark.parametrize(
    "setting, message",
    [
        (dict(rrf_k=0), "rrf_k=0 must be a positive integer"),
        (dict(depth=2.5), "depth=2.5 must be a positive integer"),
        (dict(dense_index="hsnw"), "dense index type 'hsnw' is not one of flat, hnsw, ivf"),
        (dict(stemmer="snowball"), "stemmer 'snowball' is not one of auto, porter, none"),
        (dict(stopwords="french"), "stopwords 'french' is not one of lucene, sklearn, none"),
    ],
)
def test_retriever_settings_are_refused_when_it_is_made(setting, message):
    """Before: checked by the first build step or query that read them (a bad rrf_k was saved)."""
    with pytest.raises(InputError, match=message):
        HybridRetriever(**setting)


def test_a_manifest_naming_another_dense_index_type_is_refused_in_one_line(tmp_path, scifact_docs):
    path = tmp_path / "idx"
    HybridRetriever().index(scifact_docs[:8], show_progress=False).save(path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["dense"]["index"] = "hnsw"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="is a flat index, the manifest says hnsw"):
        HybridRetriever.load(path)


def test_an_index_built_before_unicode_normalisation_loads(saved, built_retriever):
    """Indexes from before the ``unicode`` tokenizer setting have no such key in bm25/params.json
    or the manifest; they must load (as ``unicode="none"``), not be called corrupted."""
    from attnrank.index.store import write_manifest

    params = json.loads((saved / "bm25" / "params.json").read_text())
    manifest = json.loads((saved / "manifest.json").read_text())
    for tokenizer in (params["tokenizer"], manifest["bm25"]["tokenizer"]):
        tokenizer.pop("unicode")
    (saved / "bm25" / "params.json").write_text(json.dumps(params))
    manifest.pop("files")
    write_manifest(saved, manifest)
    loaded = HybridRetriever.load(saved)
    assert loaded.bm25.tokenizer_config.unicode == "none"
    assert loaded.search(QUERY, 10, mode="bm25").ids == built_retriever.search(QUERY, 10, mode="bm25").ids


def test_a_loaded_index_rebuilds_with_its_own_tokenizer_settings(scifact_docs, tmp_path):
    """A loaded retriever fell back to lucene stopwords and Porter stemming: loading an index built
    without them and indexing new documents rebuilt it with both, silently."""
    from attnrank.index.retriever import HybridRetriever

    built = HybridRetriever(stopwords="none", stemmer="none").index(scifact_docs[:4], show_progress=False)
    built.save(tmp_path / "idx")
    loaded = HybridRetriever.load(tmp_path / "idx")
    assert (loaded.stopwords, loaded.stemmer) == ("none", "none")
    again = loaded.index(scifact_docs[:5], show_progress=False).bm25.tokenizer_config
    assert (again.stopwords, again.stemmer) == ("none", "none")


def test_save_never_replaces_the_folder_holding_the_corpus_it_indexed(scifact_docs, tmp_path):
    """index("data/corpus.jsonl").save("data", force=True) replaced, then deleted, the corpus."""
    import json

    from attnrank.errors import InputError
    from attnrank.index.retriever import HybridRetriever

    data = tmp_path / "data"
    data.mkdir()
    corpus = data / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.id, "text": d.text}) + "\n" for d in scifact_docs[:3]))
    r = HybridRetriever().index(corpus, show_progress=False)
    with pytest.raises(InputError, match="the corpus"):
        r.save(data, force=True)
    assert corpus.is_file()
    r.save(tmp_path / "idx")  # elsewhere: saved


def test_fusion_none_is_refused():
    """set_fusion(None) (and HybridRetriever(fusion=None)) was accepted, searched convexly and saved
    "method": null into the manifest."""
    from attnrank.errors import InputError
    from attnrank.index.retriever import HybridRetriever

    with pytest.raises(InputError, match="fusion None is not one of"):
        HybridRetriever(fusion=None)  # type: ignore[arg-type]


def test_a_failed_rebuild_leaves_the_retriever_as_it_was(monkeypatch):
    """BM25 of the new corpus was kept beside the old documents when the dense build failed:
    a caller that caught the error got the old corpus's texts under the new ranking."""
    from attnrank.errors import InputError
    from attnrank.index import dense as dense_module

    r = HybridRetriever().index(
        [Document("a1", "apples are red"), Document("a2", "bananas are yellow")], show_progress=False
    )

    def fail(self, texts, show_progress=True):
        raise InputError("embedding failed")

    monkeypatch.setattr(dense_module.DenseIndex, "index", fail)
    with pytest.raises(InputError, match="embedding failed"):
        r.index([Document("b1", "cherries"), Document("b2", "apples apples apples")], show_progress=False)
    hits = r.search("apples", 1, mode="bm25")
    assert hits.ids == ["a1"] and hits[0].text == "apples are red" and r.corpus_path is None


def test_an_index_saved_over_itself_keeps_its_passage_states(tmp_path, scifact_docs, monkeypatch, caplog):
    """README's load -> set_fusion -> save replaced the folder without its passage states; any
    other save over them (`attnrank index` again, without --passage-states) drops them, and says so."""
    from attnrank.config import PASSAGE_STATES_FOLDER

    def states(folder):
        (folder / PASSAGE_STATES_FOLDER).mkdir()
        (folder / PASSAGE_STATES_FOLDER / "states.json").write_text('{"kept": true}')

    path = HybridRetriever().index(scifact_docs, show_progress=False).save(tmp_path / "ix", extra=states)
    loaded = HybridRetriever.load(path)
    loaded.set_fusion("rrf")
    loaded.save(path)
    assert (path / PASSAGE_STATES_FOLDER / "states.json").read_text() == '{"kept": true}'
    assert HybridRetriever.load(path, verify=True).fusion == "rrf"  # listed in the manifest, checksummed
    monkeypatch.chdir(tmp_path)  # loaded by its absolute path, saved by a relative one: the same folder
    loaded = HybridRetriever.load(path)
    loaded.save("ix")
    assert (path / PASSAGE_STATES_FOLDER / "states.json").is_file()
    assert "dropped the passage states" not in caplog.text
    loaded.index(scifact_docs, show_progress=False)  # indexed anew since the load: the states go
    with caplog.at_level("WARNING", logger="attnrank.index.store"):
        loaded.save(path)
    assert not (path / PASSAGE_STATES_FOLDER).exists()
    assert caplog.text.count("dropped the passage states (0.0 MiB) of the index this build replaced") == 1
    assert "--passage-states" in caplog.text
    # damaged since they were listed (same size, other bytes): not blessed by the new manifest's checksums
    path = HybridRetriever().index(scifact_docs, show_progress=False).save(tmp_path / "ix2", extra=states)
    (path / PASSAGE_STATES_FOLDER / "states.json").write_text('{"kept": fals}')
    loaded = HybridRetriever.load(path)
    loaded.save(path)
    assert not (path / PASSAGE_STATES_FOLDER).exists()


def test_deleted_passage_states_are_named_with_a_rebuild_that_leaves_them_out(tmp_path, scifact_docs):
    """A user who deleted the (large) states to free disk was told to rebuild the index, and not
    that a rebuild without --passage-states would do."""
    from attnrank.config import PASSAGE_STATES_FOLDER

    def states(folder):
        (folder / PASSAGE_STATES_FOLDER).mkdir()
        (folder / PASSAGE_STATES_FOLDER / "keys.npy").write_bytes(b"0" * 64)

    path = HybridRetriever().index(scifact_docs, show_progress=False).save(tmp_path / "ix", extra=states)
    (path / PASSAGE_STATES_FOLDER / "keys.npy").unlink()
    with pytest.raises(IndexFormatError, match=r"keys.npy is missing .* \(without --passage-states to leave"):
        HybridRetriever.load(path)


def test_a_manifest_whose_dense_prompts_are_mangled_is_an_index_format_error(tmp_path, built_retriever):
    """recorded_prompts' ValueError came out bare, not as the "rebuild the index" error."""
    import json

    from attnrank.errors import IndexFormatError

    built_retriever.save(tmp_path / "ix")
    manifest = tmp_path / "ix" / "manifest.json"
    m = json.loads(manifest.read_text())
    assert m["dense"]["prompts"] == {"query": None, "document": None}  # (the packaged MiniLM: none)
    manifest.write_text(json.dumps({**m, "dense": {**m["dense"], "prompts": ["query: "]}}))
    with pytest.raises(IndexFormatError, match="dense prompts .* rebuild the index"):
        HybridRetriever.load(tmp_path / "ix")


def test_a_load_in_the_middle_of_a_two_rename_swap_waits_for_the_new_index(tmp_path, monkeypatch):
    """Where the folder cannot be exchanged at once (NFS, macOS) a save renames the old index away,
    then the new one in: a load that met the gap failed ("no index at ...") instead of reading the new one."""
    import os

    docs = [Document("a", "apples are red"), Document("b", "pears are green")]
    HybridRetriever().index(docs, show_progress=False).save(tmp_path / "ix")
    HybridRetriever().index([*docs, Document("c", "plums are blue")], show_progress=False).save(tmp_path / "new")
    real, calls = HybridRetriever._load_once, []

    def mid_swap(*a, **k):
        calls.append(1)
        if len(calls) == 1:  # the first rename lands as the load reads: the folder is gone for a moment
            os.replace(tmp_path / "ix", tmp_path / ".ix.old-1")
            raise IndexFormatError(f"no index at {tmp_path / 'ix'}")
        if len(calls) == 2:  # the second rename: the new index in place
            os.replace(tmp_path / "new", tmp_path / "ix")
        return real(*a, **k)

    monkeypatch.setattr(HybridRetriever, "_load_once", mid_swap)
    assert HybridRetriever.load(tmp_path / "ix").num_docs == 3


def test_numpy_settings_save_and_one_string_is_no_batch(tmp_path):
    """NumPy counts and floats passed every check, then failed the save's JSON after the whole
    build; search_batch("vitamin") searched each character as a query, exit 0."""
    from attnrank.index.bm25 import BM25Params

    docs = [Document("a", "apples are red"), Document("b", "pears are green")]
    r = HybridRetriever(bm25=BM25Params(k1=np.float32(1.2)), depth=np.int64(50), alpha=np.float32(0.3))
    r.index(docs, show_progress=False).save(tmp_path / "ix")
    loaded = HybridRetriever.load(tmp_path / "ix")
    assert loaded.depth == 50 and loaded.bm25_params.k1 == pytest.approx(1.2) and loaded.alpha == pytest.approx(0.3)
    with pytest.raises(InputError, match="search_batch takes a list of queries, not one string"):
        r.search_batch("apples", 2)


def test_document_ids_are_strings(tmp_path):
    """Ids 1 and "1" indexed as two documents: a run wrote "1" twice, and qrels read as text never
    matched the integer (evaluation scored 0); refused in the single and the sharded build."""
    from attnrank.index.sharded.build import ShardedIndexer

    docs = [Document(1, "one passage"), Document("1", "another passage")]  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"document #0's id 1 is a int, not a string; give ids as strings"):
        HybridRetriever().index(docs, show_progress=False)
    with pytest.raises(InputError, match=r"document #0's id 1 is a int"):
        ShardedIndexer(HybridRetriever(), shards=2).build(docs, tmp_path / "ix")
    with pytest.raises(InputError, match="duplicate document id '1'"):
        HybridRetriever().index([Document("1", "a"), Document("1", "b")], show_progress=False)
    # "" was a result without an id, " a " and "a" two documents that runs and qrels read as one
    for bad in ("", " "):
        with pytest.raises(InputError, match=rf"document #0's id {bad!r} is empty; give every document an id"):
            HybridRetriever().index([Document(bad, "x y"), Document("a", "z")], show_progress=False)
    with pytest.raises(InputError, match=r"ids 'a' and ' a ' differ only by surrounding whitespace"):
        HybridRetriever().index([Document("a", "x y"), Document(" a ", "z")], show_progress=False)
    with pytest.raises(InputError, match="differ only by surrounding whitespace"):
        ShardedIndexer(HybridRetriever(), shards=2).build([Document("a\n", "x"), Document("a", "y")], tmp_path / "ix")
    # alone it is kept, as a folder corpus's file name " notes.txt" is read
    kept = HybridRetriever().index([Document(" b", "x y"), Document("a", "z")], show_progress=False)
    assert kept.search("x y", k=1).ids == [" b"]


def test_a_results_metadata_is_its_own_not_the_indexs(tmp_path):
    """Search results held the index's own metadata dicts: a caller's change to one (a framework
    adapter's scores, a note) reached every later query's results and a later save of the index."""
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    docs = [Document("a", "Paris is the capital of France.", "", {"tags": ["city"]}), Document("b", "Berlin.")]
    ix = HybridRetriever().index(docs, show_progress=False)
    hit = ix.search("capital of France", 1)[0]
    hit.metadata["note"] = "mine"
    hit.metadata["tags"].append("changed")
    assert ix.search("capital of France", 1)[0].metadata == {"tags": ["city"]}
    ix.save(tmp_path / "ix")
    assert HybridRetriever.load(tmp_path / "ix").search("capital of France", 1)[0].metadata == {"tags": ["city"]}


def test_texts_in_place_of_documents_are_refused_in_one_line():
    """HybridRetriever().index(["Paris is nice", ...]) was an AttributeError ('str' has no 'id')."""
    import pytest

    from attnrank.errors import InputError
    from attnrank.index.retriever import HybridRetriever

    with pytest.raises(InputError, match="document #0 is a str, not attnrank's Document; pass attnrank.Document"):
        HybridRetriever().index(["Paris is nice", "Berlin too"], show_progress=False)


def test_a_dict_of_texts_in_place_of_documents_is_named_as_such(tmp_path):
    """A dict {id: text} was read by its keys: "document #0 is a str", of an input that held no str
    where the user looked; a set was read in no order. Both say what they are, and how to pass them."""
    import pytest

    from attnrank.errors import InputError
    from attnrank.index.retriever import HybridRetriever
    from attnrank.index.sharded.build import ShardedIndexer

    given = {"a": "Paris is nice", "b": "Berlin too"}
    with pytest.raises(InputError, match=r"the documents are a dict of 2; .*for i, t in d.items\(\)"):
        HybridRetriever().index(given, show_progress=False)
    with pytest.raises(InputError, match=r"the documents are a set of 1"):
        HybridRetriever().index({"Paris is nice"}, show_progress=False)
    with pytest.raises(InputError, match=r"the documents are a dict of 2"):
        ShardedIndexer(HybridRetriever(), shards=2).build(given, tmp_path / "ix")
    assert not (tmp_path / "ix").exists()


def test_index_of_a_path_skips_invalid_records_where_asked_as_its_refusal_advises(tmp_path, caplog):
    """The refusal of a bad record advised skip_invalid=True, which index() did not take (TypeError)."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "alpha beta"}\n{"_id": "b", "text": ""}\n{"_id": "c", "text": "gamma"}\n')
    with pytest.raises(InputError, match=r"skip_invalid=True"):
        HybridRetriever().index(corpus, show_progress=False)
    with caplog.at_level("WARNING", logger="attnrank.index.retriever"):
        r = HybridRetriever().index(corpus, show_progress=False, skip_invalid=True)
    assert [d.id for d in r.docs] == ["a", "c"] and "skipped an invalid record" in caplog.text and "'b'" in caplog.text
    with pytest.raises(InputError, match="skip_invalid applies to a corpus path"):
        HybridRetriever().index(r.docs, show_progress=False, skip_invalid=True)


def test_a_file_swapped_in_from_another_build_of_its_size_is_refused_on_load(tmp_path, scifact_docs):
    """A dense index copied from another build of as many documents (the same size) was searched,
    with the other corpus's vectors, exit 0, unless --verify read every byte."""
    import shutil

    one = HybridRetriever().index(scifact_docs[:10], show_progress=False).save(tmp_path / "one")
    other = HybridRetriever().index(scifact_docs[10:20], show_progress=False).save(tmp_path / "other")
    swapped = tmp_path / "one" / "dense" / "index.faiss"
    assert swapped.stat().st_size == (other / "dense" / "index.faiss").stat().st_size
    shutil.copyfile(other / "dense" / "index.faiss", swapped)
    with pytest.raises(IndexFormatError, match=r"index.faiss is not the file this index was built with"):
        HybridRetriever.load(one)


def test_alpha_that_is_no_number_and_ids_given_twice_are_refused(built_retriever, scifact_docs):
    """alpha="0.5" failed as a bare TypeError and alpha=True was taken as 1.0; query_ids beside a
    mapping of queries were dropped for its keys; the index read the caller's metadata dicts."""
    for bad in ("0.5", True):
        with pytest.raises(InputError, match=r"alpha=.* give a number in \[0, 1\]"):
            HybridRetriever(alpha=bad)
    with pytest.raises(InputError, match="give query_ids or a mapping, not both"):
        built_retriever.search_batch({"q1": "cells"}, k=1, query_ids=["z"])
    docs = [Document("a", "Paris is the capital", metadata={"src": "x"}), Document("b", "Berlin is cold")]
    r = HybridRetriever().index(docs, show_progress=False)
    docs[0].metadata["src"] = "CHANGED"
    assert r.search("Paris capital", k=1)[0].metadata == {"src": "x"}


def test_a_query_id_that_is_no_text_is_refused(built_retriever):
    """search(query_id=5) kept an int id, and "" passed, for write_run to refuse after the work."""
    for bad in (5, ""):
        with pytest.raises(InputError, match=r"query_id=.* is not a non-empty string"):
            built_retriever.search("cells", k=1, query_id=bad)
    assert built_retriever.search("cells", k=1, query_id="q1").query_id == "q1"


def test_metadata_of_numpy_numbers_saves_as_numbers_and_other_values_are_warned_of(tmp_path, caplog):
    """np.int64(211) was saved as "211" (a filter meta["size"] > 100 failed after a reload), and a set
    or a datetime as its text, without a word: searched before and after the save, the metadata
    differed."""
    import datetime

    import numpy as np

    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    meta = {"size": np.int64(211), "score": np.float32(0.5), "vec": np.arange(2), "ok": [1, "x"]}
    docs = [Document("a", "Paris is in France.", "", meta), Document("b", "Berlin is in Germany.")]
    with caplog.at_level("WARNING", logger="attnrank.types"):
        saved = HybridRetriever(fusion="rrf").index(docs, show_progress=False).save(tmp_path / "ix")
    assert "have no JSON form" not in caplog.text
    back = HybridRetriever.load(saved).search("Paris France", 1)[0].metadata
    assert back == {"size": 211, "score": 0.5, "vec": [0, 1], "ok": [1, "x"]}
    assert type(back["size"]) is int and type(back["score"]) is float
    odd = [Document("c", "Rome.", "", {"tags": {"x"}, "when": datetime.date(2026, 12, 8)})]
    with caplog.at_level("WARNING", logger="attnrank.types"):
        HybridRetriever(fusion="rrf").index(odd, show_progress=False)
    assert "2 metadata value(s) have no JSON form (e.g. a set of document 'c')" in caplog.text
