"""The LlamaIndex adapters inside LlamaIndex's own query engine (llama-index-core 0.13/0.14)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("llama_index.core", reason="needs the 'llamaindex' extra")

from llama_index.core import Settings
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from attnrank.errors import InputError
from attnrank.integrations.llamaindex import (
    AttnrankPruner,
    AttnrankRerank,
    AttnrankRetriever,
)
from attnrank.integrations.shared import shared_reranker
from attnrank.types import Document


@pytest.fixture
def offline_tokenizer(monkeypatch):
    """LlamaIndex's default prompt tokenizer is tiktoken (downloads its tables): count words instead."""
    monkeypatch.setattr(Settings, "_tokenizer", str.split)


def _nodes(demo_docs, n=6):
    return [
        NodeWithScore(
            node=TextNode(id_=d.id, text=d.text, metadata={"title": d.title, "source": "demo"}), score=float(n - i)
        )
        for i, d in enumerate(demo_docs[:n])
    ]


def test_rerank_agrees_with_attention_reranker(settings, demo_docs, query):
    post = AttnrankRerank(top_n=4, keep_retrieval_score=True, **settings)
    nodes = _nodes(demo_docs)
    out = post.postprocess_nodes(nodes, query_str=query)
    ref = shared_reranker(**settings).rank(query, [Document(d.id, d.text, d.title) for d in demo_docs[:6]])
    assert [n.node.node_id for n in out] == ref.ids[:4]
    assert [n.score for n in out] == pytest.approx(ref.scores[:4], abs=0)
    first = {n.node.node_id: n.score for n in nodes}
    for n in out:
        assert n.node.metadata["retrieval_score"] == first[n.node.node_id]
        assert n.node.metadata["relevance_score"] == n.score and n.node.metadata["source"] == "demo"
        assert "relevance_score" not in n.node.get_content(metadata_mode="llm")  # scores not shown to the LLM
    assert [n.node.metadata["rank"] for n in out] == [1, 2, 3, 4]
    assert nodes[0].node.metadata.keys() == {"title", "source"}  # the input nodes are not modified
    assert AttnrankRerank(top_n=1, **settings).reranker is post.reranker  # one shared model
    with pytest.raises(InputError, match="no query given"):
        post.postprocess_nodes(nodes)


def test_rerank_round_trips_through_to_dict(settings, demo_docs, query):
    """from_dict(to_dict()) rebuilds the same reranker (before, only top_n survived and the copy
    silently reranked with the default model); one built around a reranker object asks for it."""
    post = AttnrankRerank(top_n=3, **settings)
    data = post.to_dict()
    assert data["reranker_settings"] == settings and data["class_name"] == "AttnrankRerank"
    again = AttnrankRerank.from_dict(data)
    assert again.reranker is post.reranker and again.top_n == 3
    nodes = _nodes(demo_docs)
    ids = [n.node.node_id for n in post.postprocess_nodes(nodes, query_str=query)]
    assert [n.node.node_id for n in again.postprocess_nodes(nodes, query_str=query)] == ids
    custom = AttnrankRerank(reranker=post.reranker, top_n=2)
    with pytest.raises(InputError, match="from_dict\\(data, reranker=...\\)"):
        AttnrankRerank.from_dict(custom.to_dict())
    assert AttnrankRerank.from_dict(custom.to_dict(), reranker=post.reranker).reranker is post.reranker


def test_pruner_round_trips_through_to_dict(settings, demo_docs, query):
    """from_dict(to_dict()) rebuilds the pruner on the same model (before, the copy silently pruned
    with the default model); one built around a pruner object asks for it."""
    post = AttnrankPruner(keep_ratio=0.5, model=settings["model"])
    data = post.to_dict()
    assert data["pruner_settings"] == {"model": settings["model"]} and data["keep_ratio"] == 0.5
    again = AttnrankPruner.from_dict(data)
    nodes = _nodes(demo_docs, 3)
    texts = [n.node.get_content() for n in post.postprocess_nodes(nodes, query_str=query)]
    assert [n.node.get_content() for n in again.postprocess_nodes(nodes, query_str=query)] == texts
    custom = AttnrankPruner(pruner=post._pruner, budget_tokens=40)
    with pytest.raises(InputError, match="from_dict\\(data, pruner=...\\)"):
        AttnrankPruner.from_dict(custom.to_dict())
    assert AttnrankPruner.from_dict(custom.to_dict(), pruner=post._pruner).budget_tokens == 40


def test_postprocessors_take_the_query_given_where_the_bundle_goes(settings, demo_docs, query):
    """postprocess_nodes(nodes, "question") raised AttributeError: 'str' object has no attribute
    'query_str'; a string there is the query. A pruner given title-only nodes returns them."""
    nodes = [NodeWithScore(node=TextNode(text=d.text, id_=d.id), score=0.0) for d in demo_docs[:3]]
    post = AttnrankRerank(top_n=2, **settings)
    assert [n.node.id_ for n in post.postprocess_nodes(nodes, query)] == [
        n.node.id_ for n in post.postprocess_nodes(nodes, query_str=query)
    ]
    pruner = AttnrankPruner(keep_ratio=0.5, model=settings["model"])
    assert len(pruner.postprocess_nodes(nodes, query)) >= 1
    titled = [NodeWithScore(node=TextNode(text="", metadata={"title": "Only a title"}), score=1.0)]
    out = pruner.postprocess_nodes(titled, query)
    assert [(n.node.get_content(), n.node.metadata["kept_sentences"]) for n in out] == [("", [])]
    assert pruner.postprocess_nodes([NodeWithScore(node=TextNode(text="  "), score=1.0)], query) == []


def test_query_engine_with_echo_llm(settings, demo_index, query, offline_tokenizer):
    """Retriever -> rerank -> prune in a RetrieverQueryEngine whose mock LLM echoes its prompt: the
    answer holds exactly the context the postprocessors let through."""
    retriever = AttnrankRetriever(demo_index, similarity_top_k=5, depth=5, rerank=False)
    first = retriever.retrieve(query)
    assert len(first) == 5 and all("hybrid" in n.node.metadata["stage_scores"] for n in first)
    engine = RetrieverQueryEngine.from_args(
        retriever,
        llm=MockLLM(),
        response_mode="compact",
        node_postprocessors=[
            AttnrankRerank(top_n=2, **settings),
            AttnrankPruner(keep_ratio=0.5, model=settings["model"]),
        ],
    )
    response = engine.query(query)
    kept = response.source_nodes
    assert 1 <= len(kept) <= 2 and {n.node.node_id for n in kept} <= {n.node.node_id for n in first}
    for n in kept:
        assert n.node.metadata["pruned"] and n.node.get_content() in str(response)
    dropped = [n for n in first if n.node.node_id not in {k.node.node_id for k in kept}]
    assert all(n.node.get_content()[:60] not in str(response) for n in dropped)
    # the retriever's own reranking agrees with the postprocessor on the same candidates
    own = AttnrankRetriever(demo_index, similarity_top_k=2, depth=5, **settings).retrieve(query)
    assert [n.node.node_id for n in own] == [n.node.node_id for n in kept]


def test_bad_settings(settings, demo_index):
    with pytest.raises(InputError, match="top_n=0"):
        AttnrankRerank(top_n=0, **settings)
    with pytest.raises(InputError, match="similarity_top_k=6 exceeds depth=3"):
        AttnrankRetriever(demo_index, similarity_top_k=6, depth=3)


def test_retriever_old_names_still_read(demo_index, query):
    """``k`` and ``first_stage_k`` (the names before ``similarity_top_k`` and ``depth``) still work,
    with DeprecationWarnings, and mean the same."""
    with pytest.warns(DeprecationWarning) as caught:
        old = AttnrankRetriever(demo_index, k=2, first_stage_k=4, rerank=False)
    assert sorted(str(w.message) for w in caught) == [
        "AttnrankRetriever: first_stage_k= is deprecated, use depth=",
        "AttnrankRetriever: k= is deprecated, use similarity_top_k=",
    ]
    assert all(w.filename == __file__ for w in caught)  # the warning points at the caller
    assert (old.similarity_top_k, old.depth) == (2, 4)
    new = AttnrankRetriever(demo_index, similarity_top_k=2, depth=4, rerank=False)
    assert [n.node.node_id for n in old.retrieve(query)] == [n.node.node_id for n in new.retrieve(query)]
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="k=3 .* contradicts similarity_top_k=2"):
        AttnrankRetriever(demo_index, similarity_top_k=2, k=3, rerank=False)  # before: k won silently
    # explicit counts equal to their defaults count as given (the old names won silently)
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="k=3 .* contradicts similarity_top_k=4"):
        AttnrankRetriever(demo_index, similarity_top_k=4, k=3, rerank=False)
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="first_stage_k=6 .* contradicts depth=20"):
        AttnrankRetriever(demo_index, depth=20, first_stage_k=6, rerank=False)
    plain = AttnrankRetriever(demo_index, rerank=False)
    assert (plain.similarity_top_k, plain.depth) == (4, 20)


def test_retriever_without_rerank_refuses_reranker_settings(demo_index, settings):
    """With ``rerank=False`` nothing reranks: reranker settings (or a misspelt count such as
    ``top_k``) are an error naming them, as in the LangChain retriever, not silently dropped."""
    with pytest.raises(InputError, match=r"takes no top_k=; .* is similarity_top_k="):
        AttnrankRetriever(demo_index, similarity_top_k=2, depth=4, rerank=False, top_k=3)
    with pytest.raises(InputError, match=r"rerank=False.*model"):
        AttnrankRetriever(demo_index, similarity_top_k=2, depth=4, rerank=False, **settings)


def test_a_count_set_after_construction_is_checked(demo_index):
    """similarity_top_k raised above depth after construction silently returned depth nodes."""
    retriever = AttnrankRetriever(demo_index, similarity_top_k=2, depth=3, rerank=False)
    retriever.similarity_top_k = 5
    with pytest.raises(InputError, match="similarity_top_k=5 exceeds depth=3"):
        retriever.retrieve("Who portrayed Corliss Archer?")


def test_rerank_settings_of_other_types_round_trip_in_a_fresh_process(settings, demo_docs, query):
    """A model folder as a Path broke to_json; a Reweighting came back a dict the reranker could
    not take. The shared reranker is cleared, as a new process would have none."""
    import json
    from pathlib import Path

    from attnrank.integrations.shared import clear_shared
    from attnrank.rerank.reweight import Reweighting

    post = AttnrankRerank(top_n=3, **{**settings, "model": Path(settings["model"])}, reweight=Reweighting(sink=True))
    data = json.loads(post.to_json())
    assert data["reranker_settings"]["model"] == settings["model"]
    clear_shared()
    again = AttnrankRerank.from_dict(data)
    assert again.reranker is not post.reranker and again.reranker.reweight == Reweighting(sink=True)
    nodes = _nodes(demo_docs)
    ids = [n.node.node_id for n in post.postprocess_nodes(nodes, query_str=query)]
    assert [n.node.node_id for n in again.postprocess_nodes(nodes, query_str=query)] == ids


def test_config_objects_round_trip_and_a_pruner_config_is_not_replaced_by_the_defaults(settings, demo_docs, query):
    """A RerankConfig was stored as a plain dict (its rebuild failed on .strip()); a PruneConfig
    came back a dict that the shared pruner's key read as the default configuration, so a cached
    default pruner answered for method='focus'."""
    import json

    from attnrank.integrations.shared import clear_shared
    from attnrank.prune.config import PruneConfig
    from attnrank.rerank.config import RerankConfig

    config = RerankConfig.preset("qrhead", model=settings["model"], max_doc_words=40, state_cache_mb=0)
    post = AttnrankRerank(top_n=3, config=config)
    clear_shared()
    again = AttnrankRerank.from_dict(json.loads(post.to_json()))
    assert again.reranker.config == config and again.reranker is not post.reranker

    default = AttnrankPruner(model=settings["model"])
    focus = AttnrankPruner(config=PruneConfig(model=settings["model"], method="focus"))
    assert default._pruner.method == "query" and focus._pruner.method == "focus"
    rebuilt = AttnrankPruner.from_dict(json.loads(focus.to_json()))
    assert rebuilt._pruner is focus._pruner and rebuilt._pruner.config == focus._pruner.config
    with pytest.raises(InputError, match="config=.* is not a PruneConfig"):
        AttnrankPruner(config={"method": "focus"})


def test_aretrieve_runs_the_search_off_the_event_loop(settings, demo_index, query):
    """llama-index's base _aretrieve calls _retrieve on the event loop: seconds of search and
    reranking blocked every other coroutine."""
    import asyncio
    import threading

    class Watched(AttnrankRetriever):
        def _retrieve(self, query_bundle):
            self.__dict__.setdefault("_threads", []).append(threading.get_ident())
            return super()._retrieve(query_bundle)

    retriever = Watched(demo_index, similarity_top_k=2, depth=5, **settings)

    async def main():
        return threading.get_ident(), await retriever.aretrieve(query)

    loop_thread, nodes = asyncio.run(main())
    assert retriever.__dict__["_threads"] and retriever.__dict__["_threads"][0] != loop_thread
    assert [n.node.node_id for n in nodes] == [n.node.node_id for n in retriever.retrieve(query)]


def test_postprocessors_take_the_callback_manager_every_llamaindex_postprocessor_takes(settings):
    """callback_manager= fell into the stage settings: 'unknown RerankConfig option(s)'."""
    from llama_index.core.callbacks import CallbackManager

    cm = CallbackManager()
    assert AttnrankRerank(top_n=2, callback_manager=cm, **settings).callback_manager is cm
    assert AttnrankPruner(keep_ratio=0.5, callback_manager=cm, model=settings["model"]).callback_manager is cm
    assert isinstance(AttnrankRerank(top_n=2, **settings).callback_manager, CallbackManager)


def test_pruner_budget_is_checked_when_made(settings):
    with pytest.raises(InputError, match="budget_tokens=0"):  # was refused only at the first query
        AttnrankPruner(budget_tokens=0, model=settings["model"])
    with pytest.raises(InputError, match="neighbours=-1"):  # was refused only at the first query
        AttnrankPruner(neighbours=-1, model=settings["model"])
    with pytest.raises(InputError, match="both size the pruned context"):  # keep_ratio was dropped, in a note
        AttnrankPruner(budget_tokens=100, keep_ratio=0.5, model=settings["model"])
    # None given is no budget (refused, as LangChain's pruner refuses it), not the default 300 tokens
    with pytest.raises(InputError):
        AttnrankPruner(budget_tokens=None, model=settings["model"])
    assert AttnrankPruner(model=settings["model"]).budget_tokens == 300
    assert AttnrankPruner(keep_ratio=0.5, model=settings["model"]).budget_tokens is None


def test_pruner_reads_pre_split_sentences_from_the_metadata(settings, query):
    """As the LangChain pruner: the nodes' pre-split "sentences" reach the pruner."""
    text = "Alpha beta gamma. Delta epsilon zeta."
    nodes = [
        NodeWithScore(node=TextNode(text=text, metadata={"sentences": [text]}), score=1.0),
        NodeWithScore(node=TextNode(text=text), score=0.5),
    ]
    pruner = AttnrankPruner(budget_tokens=100_000, model=settings["model"])
    out = pruner.postprocess_nodes(nodes, query_str=query)
    assert [len(n.node.metadata["kept_sentences"]) for n in out] == [1, 2]


def test_the_pre_split_sentences_stay_out_of_the_llm_and_embedding_text(settings, query):
    """A corpus's "sentences" (every sentence of the passage, the pruned ones too) stayed in the
    text LlamaIndex renders for the LLM and the embedder: a pruned node still carried every
    sentence, and a retrieved one its passage twice. They stay in the metadata (the pruner reads
    them)."""
    from llama_index.core.schema import MetadataMode

    from attnrank.index.retriever import HybridRetriever

    sentences = [f"Sentence {w} mentions the {w} topic only." for w in ("alpha", "bravo", "charlie", "delta")]
    node = TextNode(text=" ".join(sentences), metadata={"sentences": sentences, "title": "T"})
    pruner = AttnrankPruner(keep_ratio=0.3, model=settings["model"])
    (out,) = pruner.postprocess_nodes([NodeWithScore(node=node, score=1.0)], query_str=query)
    kept = out.node.metadata["kept_sentences"]  # (positions in "sentences")
    removed = [s for i, s in enumerate(sentences) if i not in kept]
    assert kept and removed and out.node.metadata["sentences"] == sentences
    assert not [s for s in removed if s in out.node.text]
    for mode in (MetadataMode.LLM, MetadataMode.EMBED):
        rendered = out.node.get_content(metadata_mode=mode)
        assert "title: T" in rendered and not [s for s in removed if s in rendered], mode

    docs = [Document(f"d{i}", s, metadata={"sentences": [s]}) for i, s in enumerate(sentences)]
    index = HybridRetriever().index(docs, show_progress=False)
    nodes = AttnrankRetriever(index, similarity_top_k=2, depth=4, rerank=False).retrieve("alpha topic")
    reranked = AttnrankRerank(top_n=2, **settings).postprocess_nodes(nodes, query_str="alpha topic")
    for n in nodes + reranked:
        assert n.node.metadata["sentences"] == [n.node.text]
        for mode in (MetadataMode.LLM, MetadataMode.EMBED):
            assert n.node.get_content(metadata_mode=mode).count(n.node.text) == 1, mode
    # a loader's own "sentences" of another kind (a count) is no split: it stays in the text (it was hidden)
    counted = NodeWithScore(node=TextNode(text=sentences[0], metadata={"sentences": 1, "author": "x"}), score=1.0)
    (out,) = AttnrankRerank(top_n=1, **settings).postprocess_nodes([counted], query_str="alpha topic")
    assert "sentences: 1" in out.node.get_content(metadata_mode=MetadataMode.LLM)


def test_a_misspelt_reranker_setting_is_refused_before_the_index_loads(tmp_path):
    """The retriever loaded its index (kept in the process-wide cache) and only then found top_n."""
    with pytest.raises(InputError, match=r"AttnrankRetriever takes no top_n=; .* is similarity_top_k="):
        AttnrankRetriever(tmp_path / "no-index-here", similarity_top_k=2, top_n=3)
    with pytest.raises(InputError, match=r"unknown RerankConfig option\(s\) \['probe'\]"):  # the pruner's
        AttnrankRetriever(tmp_path / "no-index-here", similarity_top_k=2, probe="x")


def test_an_adapter_around_a_given_stage_refuses_pickling_and_one_from_settings_round_trips(settings, query):
    """LlamaIndex drops an unpicklable private attribute: a copy of an adapter built around a given
    reranker came back without it and failed at its first query (AttributeError)."""
    import pickle

    from attnrank.rerank.attention import AttentionReranker

    nodes = [NodeWithScore(node=TextNode(text="Paris is the capital of France.", id_="p"), score=1.0)]
    given = AttnrankRerank(reranker=AttentionReranker(**settings), top_n=1)
    with pytest.raises(InputError, match="AttnrankRerank built around a given reranker object cannot be pickled"):
        pickle.dumps(given)
    copy = pickle.loads(pickle.dumps(AttnrankRerank(top_n=1, **settings)))
    assert [n.node.node_id for n in copy.postprocess_nodes(nodes, query_str=query)] == ["p"]


def test_pruner_refuses_a_budget_no_sentence_fits(settings, demo_docs, query):
    """It returned the nodes emptied (the warning aside): the engine answered "Empty Response"."""
    with pytest.raises(InputError, match="no sentence of the passages fits the budget of 1 tokens"):
        AttnrankPruner(budget_tokens=1, model=settings["model"]).postprocess_nodes(
            _nodes(demo_docs, 2), query_str=query
        )


def test_nodes_that_are_not_nodes_with_scores_are_refused_in_one_line(query):
    """A TextNode in place of a NodeWithScore was an AttributeError ('TextNode' has no 'node')."""
    post = AttnrankRerank(config="signals", top_n=None)
    with pytest.raises(InputError, match="document #0 is a TextNode, not a LlamaIndex NodeWithScore"):
        post.postprocess_nodes([TextNode(text="Paris"), TextNode(text="Berlin")], query_str=query)


def test_any_iterable_of_nodes_is_reranked_and_a_wrong_reranker_object_is_refused_when_made(query):
    """A generator of nodes passed the input check and failed indexing (TypeError); reranker="icr"
    was taken, and failed at the first query (AttributeError)."""
    post = AttnrankRerank(config="signals", top_n=None)
    texts = ["Paris is the capital of France.", "Berlin is in Germany."]
    listed = post._postprocess_nodes([NodeWithScore(node=TextNode(text=t)) for t in texts], QueryBundle(query))
    generated = post._postprocess_nodes((NodeWithScore(node=TextNode(text=t)) for t in texts), QueryBundle(query))
    assert [n.node.get_content() for n in generated] == [n.node.get_content() for n in listed]
    with pytest.raises(InputError, match=re.escape("reranker= is a str, which has no rank()")):
        AttnrankRerank(reranker="icr")


def test_a_postprocessor_made_with_a_loaded_model_saves_a_stand_in_and_asks_for_the_model_back(tiny_path):
    """to_dict wrote the LLM's fields as a dict, which from_dict refused as "model is a dict", and
    to_json failed inside the JSON encoder on the model's weights."""
    import json

    from attnrank.llm.models import load_llm

    llm = load_llm(tiny_path)
    for cls in (AttnrankRerank, AttnrankPruner):
        post = cls(model=llm)
        assert json.loads(post.to_json())  # (JSON now)
        data = post.to_dict()
        with pytest.raises(
            InputError, match=rf"saved with a loaded model as model= .*{cls.__name__}\.from_dict\(data, model="
        ):
            cls.from_dict(data)
        again = cls.from_dict(data, model=llm)
        stage = again.reranker if cls is AttnrankRerank else again.pruner
        assert stage.llm is llm


def test_the_retriever_pickles_and_comes_back_with_its_index_and_reranker(settings, demo_index, query):
    """Its index and reranker held locks: a query engine holding it could not go to a worker
    process. The copy loads both again from the folder and the settings, shared as any adapter's;
    one built around an index object it cannot load again is refused in one line."""
    import pickle

    from attnrank.index.retriever import HybridRetriever

    retriever = AttnrankRetriever(demo_index, similarity_top_k=3, depth=5, **settings)
    copy = pickle.loads(pickle.dumps(retriever))
    assert (copy.similarity_top_k, copy.depth) == (3, 5)
    assert copy._index is retriever._index and copy._reranker is retriever._reranker
    assert [n.node.node_id for n in copy.retrieve(query)] == [n.node.node_id for n in retriever.retrieve(query)]
    plain = pickle.loads(pickle.dumps(AttnrankRetriever(demo_index, similarity_top_k=2, depth=5, rerank=False)))
    assert plain._reranker is None and len(plain.retrieve(query)) == 2
    given = AttnrankRetriever(HybridRetriever.load(demo_index), similarity_top_k=2, depth=5, rerank=False)
    with pytest.raises(InputError, match="AttnrankRetriever built around a given index object cannot be pickled"):
        pickle.dumps(given)
    import copy as copying

    shallow = copying.copy(given)  # (copy.copy went through __getstate__, and was refused too)
    assert shallow._index is given._index and shallow.similarity_top_k == 2
    # in a fresh process (nothing shared yet) the copy loads the index and builds the reranker again
    from attnrank.integrations.shared import clear_shared

    pickled = pickle.dumps(retriever)
    clear_shared()
    fresh = pickle.loads(pickled)
    assert fresh._index is not retriever._index and fresh._reranker is not retriever._reranker
    assert [n.node.node_id for n in fresh.retrieve(query)] == [n.node.node_id for n in retriever.retrieve(query)]


def test_another_librarys_count_name_is_named_with_the_adapters_own(tmp_path):
    """top_k= was refused as an unknown RerankConfig option, in a list of fields with no count in it."""
    with pytest.raises(InputError, match=r"AttnrankRerank takes no top_k=; .* is top_n="):
        AttnrankRerank(top_k=2)
    with pytest.raises(InputError, match=r"AttnrankRetriever takes no top_k=; .* is similarity_top_k="):
        AttnrankRetriever(index=str(tmp_path / "none"), top_k=3)
