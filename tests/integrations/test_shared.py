"""One reranker/pruner (and one loaded model) per configuration, shared by every adapter."""

from __future__ import annotations

import pytest

from attnrank.errors import InputError
from attnrank.integrations.shared import model_lock, shared_pruner, shared_reranker


def test_same_settings_share_one_object(settings):
    a = shared_reranker(**settings)
    assert shared_reranker(**settings) is a
    assert (
        shared_reranker(**settings, heads="auto-or-all", scorer="sum") is a
    )  # defaults spelled out: same configuration
    b = shared_reranker(**{**settings, "max_doc_words": 20})
    assert b is not a and b.llm is a.llm  # another configuration, the same loaded model (load_llm cache)
    assert shared_reranker(a) is a  # a built reranker passes through
    with pytest.raises(InputError, match="give one or the other"):
        shared_reranker(a, heads="all")


def test_heads_none_is_the_presets_heads_in_every_adapter(settings):
    """LangChain's and LlamaIndex's heads=None chose the preset fused (attention), Haystack's the
    default likelihood preset: one argument, two rankings."""
    from attnrank.integrations.haystack import reranker_settings

    none = shared_reranker(**settings, heads=None)
    assert none is shared_reranker(**settings) and none.config.name == "likelihood"
    extra = {k: v for k, v in settings.items() if k != "model"}
    assert shared_reranker(**reranker_settings(settings["model"], None, "sum", extra)) is none


def test_a_pruners_heads_none_is_all_heads_as_context_pruner_reads_it(settings):
    """shared_pruner dropped heads=None as the reranker's adapters do, so a config's heads stayed:
    AttnrankPruner(config=PruneConfig(heads=...), heads=None) pruned with them, ContextPruner with all."""
    from attnrank.prune.config import PruneConfig

    config = PruneConfig(heads=[(1, 2)])
    model = settings["model"]
    assert shared_pruner(model=model, config=config).heads == [(1, 2)]
    assert shared_pruner(model=model, config=config, heads=None).heads is None
    assert shared_pruner(model=model, heads=None) is shared_pruner(model=model)  # one configuration, one pruner


def test_reranker_and_pruner_on_one_model_share_its_lock(settings):
    reranker = shared_reranker(**settings)
    pruner = shared_pruner(model=settings["model"])
    assert pruner.llm is reranker.llm
    assert model_lock(reranker) is model_lock(pruner)


def test_a_model_path_loads_that_model(settings):
    """A pathlib.Path is the model folder it names (it loaded the packaged default model)."""
    from pathlib import Path

    path = Path(settings["model"])
    reranker = shared_reranker(**{**settings, "model": path})
    assert reranker is shared_reranker(**settings)
    pruner = shared_pruner(model=path)
    assert pruner is shared_pruner(model=settings["model"]) and pruner.llm is reranker.llm


def test_stage_scores_with_a_null_relevance_score_are_kept():
    """Metadata holding relevance_score=None (a framework's unscored document) was a TypeError."""
    from attnrank.integrations.documents import keep_stages
    from attnrank.types import Document

    docs = [Document("a", "x"), Document("b", "y")]
    meta = [{"stage_scores": {"bm25": 1.0}, "relevance_score": None}, {"stage_scores": {"bm25": 0.5}}]
    kept = keep_stages(docs, meta)
    assert [d.score for d in kept] == [0.0, 0.0] and [d.stage_scores for d in kept] == [{"bm25": 1.0}, {"bm25": 0.5}]


def test_a_document_without_text_leaves_the_others_stage_scores_alone():
    """One empty chunk among a retriever's hits (it carries no stage_scores) made every hit lose its
    first-stage scores: the reranked documents came back with the reranker's alone."""
    from attnrank.integrations.documents import keep_stages
    from attnrank.types import Document

    docs = [Document("a", "x"), Document("e", ""), Document("b", "y")]
    meta = [{"stage_scores": {"bm25": 2.0}, "relevance_score": 2.0}, {}, {"stage_scores": {"bm25": 1.0}}]
    kept = keep_stages(docs, meta)
    assert [d.stage_scores for d in kept] == [{"bm25": 2.0}, {}, {"bm25": 1.0}]
    assert [d.score for d in kept] == [2.0, 0.0, 0.0] and [d.rank for d in kept] == [1, 2, 3]
    assert keep_stages(docs, [meta[0], {}, {}]) == docs  # (a hit with text but no stage scores: unchanged)


def test_reranked_documents_give_their_retrievers_score_as_the_first_stage():
    """Documents an attnrank retriever returned with rerank=True carry the reranker's score as
    relevance_score: a second reranker's learned scorer read it as the first-stage score."""
    from attnrank.integrations.documents import keep_stages
    from attnrank.types import Document

    docs = [Document("a", "x"), Document("b", "y"), Document("c", "z")]
    meta = [
        {"stage_scores": {"bm25": 5.0, "dense": 0.5, "hybrid": 9.0, "attention": 3.0}, "relevance_score": 3.0},
        {"stage_scores": {"bm25": 4.0, "likelihood": -1.0}, "relevance_score": -1.0},  # bm25 mode, then reranked
        {"stage_scores": {"bm25": 1.0, "dense": 0.1, "hybrid": 2.0}, "relevance_score": 2.0},  # not reranked
    ]
    assert [d.score for d in keep_stages(docs, meta)] == [9.0, 4.0, 2.0]


def test_a_slow_build_holds_up_neither_other_builds_nor_model_free_stages():
    """One lock for the cache was held through every build (a model load: minutes), and model-free
    stages took the same lock for their call lock: a signals reranker serving in one thread froze
    while another adapter loaded its model."""
    import threading

    from attnrank.integrations import shared

    release, started = threading.Event(), threading.Event()

    def slow():
        started.set()
        assert release.wait(30)
        return "slow"

    builds = []
    worker = threading.Thread(target=lambda: builds.append(shared._cached("test", {"k": "slow"}, slow)))
    worker.start()
    try:
        assert started.wait(10)
        assert shared._cached("test", {"k": "other"}, lambda: "other") == "other"  # did not wait
        stage = type("ModelFree", (), {"uses_llm": False})()
        lock = model_lock(stage)
        assert lock.acquire(timeout=2)
        lock.release()
        waiter = []
        twin = threading.Thread(target=lambda: waiter.append(shared._cached("test", {"k": "slow"}, lambda: "again")))
        twin.start()  # the same configuration waits for the build under way, and shares its object
        release.set()
        worker.join(10)
        twin.join(10)
        assert builds == ["slow"] and waiter == ["slow"]
    finally:
        release.set()
        shared.clear_shared()


def test_objects_inside_a_config_are_passed_on_not_turned_into_dicts():
    """A slot profile (or fused/learned weights) inside a stored config came back a dict: the
    rebuilt config differed, and a FusedWeights as signals was refused."""
    from attnrank.integrations.shared import built_settings, stored_settings
    from attnrank.rerank.config import RerankConfig
    from attnrank.rerank.position import SlotProfile
    from attnrank.rerank.reweight import Reweighting

    profile = SlotProfile(2, (0.1, 0.2), (0.01, 0.02), "m", "f", 3, "2026-12-05")
    config = RerankConfig(reweight=Reweighting(slot_correction=True), slot_profile=profile)
    stored = stored_settings({"config": config})
    assert stored["config"]["reweight"]["slot_correction"] is True  # a Reweighting as JSON holds it
    assert stored["config"]["slot_profile"] is profile
    assert built_settings(stored)["config"] == config


def test_a_custom_stage_that_cannot_be_hashed_or_weakly_referenced_still_gets_a_lock():
    """A plain dataclass reranker (unhashable) or one with __slots__ failed every call with a
    TypeError from the lock table."""
    import dataclasses

    @dataclasses.dataclass
    class Unhashable:
        def rank(self, query, docs, k=None):
            return docs

    class Slotted:
        __slots__ = ("name",)

    for stage in (Unhashable(), Slotted()):
        with model_lock(stage):
            pass
        assert model_lock(stage) is model_lock(type(stage)())  # one lock for every such stage


def test_an_index_rebuilt_at_its_path_is_loaded_again(tmp_path):
    """The cache was keyed by the path alone: a notebook that rebuilt ./indexes/x and made a new
    retriever adapter got the earlier load, without the new documents."""
    from attnrank.index.retriever import HybridRetriever
    from attnrank.integrations.shared import shared_index
    from attnrank.types import Document

    path = tmp_path / "idx"
    HybridRetriever().index([Document("a", "apples are red")], show_progress=False).save(path)
    first = shared_index(path)
    assert shared_index(str(path)) is first and first.num_docs == 1
    HybridRetriever().index([Document("a", "apples"), Document("b", "pears")], show_progress=False).save(path)
    assert shared_index(path).num_docs == 2
    from attnrank.integrations import shared

    assert sum(k[0] == "HybridRetriever" and str(path) in k[1] for k in shared._CACHE) == 1  # the earlier build: let go


def test_an_index_object_goes_with_the_last_reranker_made_for_it(settings):
    """A reranker made for an index the caller built (not a folder shared_index loads) was kept in
    the process-wide cache for good, and the index with it: a service that built one index per
    session held every one of them."""
    import gc
    import weakref

    from attnrank.index.retriever import HybridRetriever
    from attnrank.integrations import shared
    from attnrank.types import Document

    index = HybridRetriever().index([Document("a", "apples are red")], show_progress=False)
    gone = weakref.ref(index)
    reranker = shared_reranker(index=index, **settings)
    assert shared_reranker(index=index, **settings) is reranker  # shared while it is held
    del index, reranker
    gc.collect()
    assert gone() is None and not any("HybridRetriever" in k[1] for k in shared._HELD)
    # a reranker that reads no vectors from its index (preset icr) still holds it while it lives:
    # collected earlier, another index at its id would have been given this reranker
    index = HybridRetriever().index([Document("a", "apples are red")], show_progress=False)
    gone = weakref.ref(index)
    icr = shared_reranker(index=index, config="icr", **settings)
    del index
    gc.collect()
    assert gone() is not None
    del icr
    gc.collect()
    assert gone() is None


def test_a_model_object_that_is_no_attnrank_llm_is_refused_not_replaced_by_the_default(settings, monkeypatch):
    """A transformers model (or a framework's LLM object) was taken as no model given: the packaged
    default reranked in its place, exit 0."""
    from _tiny import tiny_model

    from attnrank.integrations.langchain import AttnrankReranker
    from attnrank.llm import models
    from attnrank.prune.pruner import ContextPruner
    from attnrank.rerank.attention import AttentionReranker

    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    for wrong in (tiny_model(), 123):
        for build in (
            lambda m: AttentionReranker(m),
            lambda m: ContextPruner(m),
            lambda m: AttnrankReranker(**{**settings, "model": m}),
        ):
            with pytest.raises(InputError, match=r"model is a (LlamaForCausalLM|int), not a model name"):
                build(wrong)
    assert loads == []


def test_an_index_is_a_folder_path_or_an_attnrank_retriever(demo_index):
    """Any object with a search() was taken (a LangChain vector store: a traceback at the first
    query), and a path object other than pathlib's was refused."""
    import os

    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore

    from attnrank.integrations.shared import shared_index

    with pytest.raises(InputError, match="index is a InMemoryVectorStore, neither an attnrank index folder"):
        shared_index(InMemoryVectorStore(DeterministicFakeEmbedding(size=4)))

    class Folder(os.PathLike):
        def __fspath__(self) -> str:
            return str(demo_index)

    assert shared_index(Folder()) is shared_index(str(demo_index))


def test_documents_without_text_come_after_the_ranked_ones_in_every_adapter(settings):
    """One empty chunk (a PDF loader's, an image node's) failed the whole rerank, naming its
    position: it is left unscored after the ranked documents, as far as top_n leaves room."""
    from haystack import Document as HSDocument
    from langchain_core.documents import Document as LCDocument
    from llama_index.core.schema import NodeWithScore, TextNode

    from attnrank.integrations.langchain import AttnrankReranker
    from attnrank.integrations.llamaindex import AttnrankRerank
    from haystack_integrations.components.rankers.attnrank import AttnrankRanker

    texts = ["", "Paris is the capital of France.", "Bananas are yellow."]
    query = "capital of France?"
    # an earlier reranker's scores (another scale) are not kept on the unscored one: a chain sorting by
    # relevance_score put it first
    earlier = {"relevance_score": 0.98, "rank": 1, "stage_scores": {"cohere": 0.98}, "source": "a.pdf"}
    lc = AttnrankReranker(top_n=None, **settings).compress_documents(
        [LCDocument(page_content=t, id=f"d{i}", metadata=dict(earlier)) for i, t in enumerate(texts)], query
    )
    assert sorted(d.id for d in lc[:2]) == ["d1", "d2"] and lc[2].id == "d0" and lc[2].metadata == {"source": "a.pdf"}
    nodes = [
        NodeWithScore(node=TextNode(text=t, id_=f"d{i}", metadata=dict(earlier)), score=1.0)
        for i, t in enumerate(texts)
    ]
    li = AttnrankRerank(top_n=3, **settings).postprocess_nodes(nodes, query_str=query)
    assert [n.node.node_id for n in li][2] == "d0" and li[2].score is None and li[0].score is not None
    assert li[2].node.metadata == {"source": "a.pdf"} and nodes[0].node.metadata == earlier  # (the caller's untouched)
    assert len(AttnrankRerank(top_n=2, **settings).postprocess_nodes(nodes, query_str=query)) == 2  # no room left
    ranker = AttnrankRanker(model=settings["model"], top_k=None, reranker_kwargs={"max_doc_words": 40})
    hs = ranker.run(
        query, [HSDocument(id=f"d{i}", content=t or None, meta=dict(earlier)) for i, t in enumerate(texts)]
    )["documents"]
    assert [d.id for d in hs][2] == "d0" and hs[2].score is None and hs[2].meta == {"source": "a.pdf"}
    only_empty = AttnrankReranker(top_n=2, **settings).compress_documents([LCDocument(page_content=" ")], query)
    assert [d.page_content for d in only_empty] == [" "]


def test_a_count_set_after_construction_is_refused_under_the_adapters_name(settings):
    """top_n set on the object after construction (pydantic does not validate assignment) was
    refused by the reranker as "k=0", a name the LangChain or LlamaIndex user never wrote."""
    from langchain_core.documents import Document as LCDocument
    from llama_index.core.schema import NodeWithScore, TextNode

    from attnrank.integrations.langchain import AttnrankReranker
    from attnrank.integrations.llamaindex import AttnrankRerank

    lc = AttnrankReranker(top_n=2, **settings)
    lc.top_n = 0
    with pytest.raises(InputError, match=r"^top_n=0 must be None"):
        lc.compress_documents([LCDocument(page_content="Paris is in France.")], "France?")
    li = AttnrankRerank(top_n=2, **settings)
    li.top_n = -1
    with pytest.raises(InputError, match=r"^top_n=-1 must be None"):
        li.postprocess_nodes([NodeWithScore(node=TextNode(text="Paris is in France."))], query_str="France?")
    from haystack import Document as HSDocument

    from haystack_integrations.components.rankers.attnrank import AttnrankRanker

    hs = AttnrankRanker(model=settings["model"], top_k=2)
    hs.top_k = 0  # (Haystack's own name for it: top_k)
    with pytest.raises(InputError, match=r"^top_k=0 must be None"):
        hs.run("France?", [HSDocument(content="Paris is in France.")])
