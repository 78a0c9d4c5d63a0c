"""Loading the embedder (attnrank.index.embed.load_embedder) by hub id, path or default."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from _tiny import save_tiny_encoder

from attnrank.errors import ModelError
from attnrank.index.embed import clear_embedders, encode, load_embedder


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_embedders()
    yield
    clear_embedders()


def test_a_hub_id_in_the_local_cache_loads_from_its_snapshot_without_the_hub(tmp_path, offline_hub):
    encoder = save_tiny_encoder(tmp_path / "enc")
    offline_hub.snapshot("attnrank-test/encoder", "4567def", source=encoder)
    offline_hub.tried.clear()  # (building the test's encoder asked the hub for something): only the load counts
    by_id = encode(load_embedder("attnrank-test/encoder"), ["the cat sat on the mat"])
    assert offline_hub.tried == []
    by_path = encode(load_embedder(str(encoder)), ["the cat sat on the mat"])
    np.testing.assert_allclose(by_id, by_path, atol=1e-6)


def test_a_missing_local_path_is_named_before_loading(tmp_path):
    with pytest.raises(ModelError, match="no such local model folder"):
        load_embedder(str(tmp_path / "missing" / "encoder"))


def test_a_prompted_embedder_embeds_documents_and_queries_with_their_prompts(tmp_path):
    """e5-style models define a query and a document prompt (sentence-transformers' encode_query /
    encode_document): both sides were embedded bare. An index records the prompts its documents
    took; one built before keeps bare queries, and its stored vectors are not read as the document
    prompt's; a model whose prompts changed since the build is refused."""
    import json

    from attnrank.errors import InputError
    from attnrank.index.embed import check_embedder, role_prompts
    from attnrank.index.retriever import HybridRetriever
    from attnrank.rerank.signals import SignalComputer
    from attnrank.types import Document

    prompts = {"query": "query: ", "document": "passage: "}
    enc = save_tiny_encoder(tmp_path / "enc", prompts=prompts)
    model = load_embedder(str(enc))
    texts = ["the cat sat on the mat", "a dog ran in the park"]
    docs = encode(model, texts, role="document")
    np.testing.assert_allclose(docs, encode(model, [f"passage: {t}" for t in texts]), atol=1e-6)
    assert not np.allclose(docs, encode(model, texts), atol=1e-3)
    r = HybridRetriever(embedder=str(enc)).index(
        [Document(str(i), t) for i, t in enumerate(texts)], show_progress=False
    )
    np.testing.assert_allclose(r.dense.vectors([0, 1]), docs, atol=1e-5)
    np.testing.assert_allclose(r.dense.encode_queries(["cat"]), encode(model, ["query: cat"]), atol=1e-6)
    r.save(tmp_path / "ix")
    loaded = HybridRetriever.load(tmp_path / "ix")
    assert loaded.dense.prompts == prompts == role_prompts(model)
    # the reranker's dense signal: the index's stored vectors, or its own embedding, the same values
    from_index = SignalComputer(str(enc))
    assert from_index.use_index(loaded)
    got = from_index("cat", texts, ["dense"], ids=["0", "1"])["dense"]
    np.testing.assert_allclose(got, SignalComputer(str(enc))("cat", texts, ["dense"])["dense"], atol=1e-5)
    loaded.dense.prompts = None  # (as an index built before roles: bare queries, its vectors not read)
    np.testing.assert_allclose(loaded.dense.encode_queries(["cat"]), encode(model, ["cat"]), atol=1e-6)
    assert not SignalComputer(str(enc)).use_index(loaded)
    with pytest.raises(InputError, match="does not put .* prompts \\(document, query\\) before the texts"):
        check_embedder(str(enc), "cpu", "onnx")
    # the model's prompts edited since the build: a search embeds queries only, so a new document
    # prompt is no matter there (the dense signal then embeds its own), a new query prompt is
    config = enc / "config_sentence_transformers.json"
    stored = json.loads(config.read_text())
    config.write_text(json.dumps({**stored, "prompts": {"query": "query: ", "document": "doc: "}}))
    clear_embedders()
    assert HybridRetriever.load(tmp_path / "ix").search("cat", 2, mode="dense").ids
    assert not SignalComputer(str(enc)).use_index(HybridRetriever.load(tmp_path / "ix"))
    config.write_text(json.dumps({**stored, "prompts": {"query": "q: ", "document": "passage: "}}))
    clear_embedders()
    with pytest.raises(InputError, match="this index's documents were embedded to meet 'query: '"):
        HybridRetriever.load(tmp_path / "ix").search("cat", 2, mode="dense")
    # a prompt no role reads does not keep the exported backends away
    plain = save_tiny_encoder(tmp_path / "cls", prompts={"classification": "Classify: "})
    with contextlib.suppress(ImportError):  # (the onnx extra not installed: past the prompts' check)
        check_embedder(str(plain), "cpu", "onnx")


def test_a_default_prompt_and_equal_prompts_are_read_as_sentence_transformers_reads_them(tmp_path):
    """An empty document prompt beside a default query prompt took the default (every document
    embedded as a query); equal query and document prompts were dropped from the dense signal."""
    from sentence_transformers import SentenceTransformer

    from attnrank.index.embed import role_prompts, uses_roles

    enc = save_tiny_encoder(tmp_path / "enc", prompts={"query": "query: ", "document": ""})
    st = SentenceTransformer(str(enc), device="cpu", default_prompt_name="query")
    assert role_prompts(st) == {"query": "query: ", "document": None} and uses_roles(st)
    texts = ["the cat sat on the mat"]
    np.testing.assert_allclose(
        encode(st, texts, role="document"), st.encode_document(texts, normalize_embeddings=True), atol=1e-6
    )
    assert not np.allclose(encode(st, texts, role="document"), encode(st, texts), atol=1e-3)  # bare: the default
    same = load_embedder(str(save_tiny_encoder(tmp_path / "same", prompts={"query": "query: ", "document": "query: "})))
    assert uses_roles(same) and role_prompts(same) == {"query": "query: ", "document": "query: "}


def test_a_router_without_a_default_route_builds_searches_and_feeds_the_dense_signal(tmp_path):
    """A Router embeds no text without a role; the index's probe text was embedded bare, after the
    whole corpus (the build failed at its end), and the reranker's check for roles embedded bare too."""
    from _tiny import save_tiny_router

    from attnrank.index.embed import PROBE_TEXT, uses_roles
    from attnrank.index.retriever import HybridRetriever
    from attnrank.index.sharded import ShardedIndexer, ShardedRetriever
    from attnrank.rerank.signals import SignalComputer
    from attnrank.types import Document

    router = str(save_tiny_router(tmp_path / "router"))
    model = load_embedder(router)
    with pytest.raises(ValueError, match="route"):
        encode(model, ["the cat"])  # (the premise: no text without a role)
    assert uses_roles(model)
    texts = ["the cat sat on the mat", "a dog ran in the park", "the bird sang"]
    docs = [Document(str(i), t) for i, t in enumerate(texts)]
    HybridRetriever(embedder=router).index(docs, show_progress=False).save(tmp_path / "ix")
    loaded = HybridRetriever.load(tmp_path / "ix")
    np.testing.assert_allclose(loaded.dense.probe, encode(model, [PROBE_TEXT], role="document")[0], atol=1e-5)
    hits = loaded.search("cat", 3, mode="dense")
    query = encode(model, ["cat"], role="query")[0]
    np.testing.assert_allclose(hits.scores, np.sort(encode(model, texts, role="document") @ query)[::-1], atol=1e-5)
    sharded = ShardedRetriever.load(
        ShardedIndexer(HybridRetriever(embedder=router), shards=2).build(docs, tmp_path / "sh")
    )
    assert sharded.search("cat", 3, mode="dense").ids == hits.ids
    signal = SignalComputer(router)
    assert signal.use_index(loaded)
    np.testing.assert_allclose(
        signal("cat", texts, ["dense"], ids=["0", "1", "2"])["dense"],
        SignalComputer(router)("cat", texts, ["dense"])["dense"],
        atol=1e-5,
    )


def test_the_probe_of_an_index_built_before_roles_is_checked_bare(tmp_path):
    """An index whose manifest records no role prompts embedded its probe bare: read as a
    document's, a prompted model's probe would differ from it and the index be refused."""
    from attnrank.index.embed import PROBE_TEXT, check_probe, embedder_probe

    model = load_embedder(
        str(save_tiny_encoder(tmp_path / "enc", prompts={"query": "query: ", "document": "passage: "}))
    )
    bare = embedder_probe(model, role=None)
    assert not np.allclose(bare, embedder_probe(model), atol=1e-3)
    check_probe(model, bare, "enc", None)  # built before roles: no error
    check_probe(model, embedder_probe(model), "enc", {"query": "query: ", "document": "passage: "})
    np.testing.assert_allclose(embedder_probe(model), encode(model, [PROBE_TEXT], role="document")[0], atol=1e-5)


def test_a_passage_prompt_that_encode_document_does_not_read_is_warned_of(tmp_path, caplog):
    """sentence-transformers 6 gives every model an empty "document" prompt, which encode_document
    reads before an e5 model's "passage" prompt: its documents are embedded bare. What the index
    records (role_prompts) is what was put before them, and the user is told."""
    import json

    from attnrank.index.embed import role_prompts

    enc = save_tiny_encoder(tmp_path / "enc")
    config = enc / "config_sentence_transformers.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "prompts": {"query": "query: ", "passage": "passage: "}})
    )
    with caplog.at_level("WARNING", logger="attnrank"):
        model = load_embedder(str(enc))
    texts = ["the cat sat on the mat"]
    document = encode(model, texts, role="document")
    if model.prompts.get("document") == "":  # (sentence-transformers 6)
        assert "'passage' prompt ('passage: ') that sentence-transformers does not put before documents" in caplog.text
        assert role_prompts(model) == {"query": "query: ", "document": None}
        np.testing.assert_allclose(document, encode(model, texts), atol=1e-6)
    else:  # (before 6: the passage prompt is the document prompt)
        assert "does not put before documents" not in caplog.text
        assert role_prompts(model) == {"query": "query: ", "document": "passage: "}
        np.testing.assert_allclose(document, encode(model, ["passage: " + texts[0]]), atol=1e-6)


def test_two_threads_loading_one_embedder_at_once_share_one_copy(tmp_path, monkeypatch):
    """lru_cache alone let two threads' first calls both miss and load the embedder twice (a
    framework's batch on a fresh retriever held two copies; a reranker kept one for good). The
    check before the load is slowed so that the two calls overlap."""
    import threading
    import time

    from attnrank.index import embed

    enc = str(save_tiny_encoder(tmp_path / "enc"))
    check = embed.check_embedder

    def slow_check(*args):
        time.sleep(0.3)
        return check(*args)

    monkeypatch.setattr(embed, "check_embedder", slow_check)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(load_embedder(enc))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] is got[1]
