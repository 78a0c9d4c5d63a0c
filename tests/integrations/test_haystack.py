"""The Haystack 3 components in a Haystack pipeline, through a YAML round trip."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("haystack", reason="needs the 'haystack' extra")

import yaml
from haystack import Document, Pipeline

from attnrank.errors import InputError
from attnrank.integrations.shared import shared_reranker
from attnrank.types import Document as ADocument
from haystack_integrations.components.rankers.attnrank import AttnrankRanker
from haystack_integrations.components.retrievers.attnrank import AttnrankRetriever


def test_pipeline_yaml_round_trip_and_run(settings, demo_index, query):
    kwargs = {k: v for k, v in settings.items() if k != "model"}
    pipe = Pipeline()
    pipe.add_component("retriever", AttnrankRetriever(str(demo_index), top_k=5, depth=5, rerank=False))
    pipe.add_component("ranker", AttnrankRanker(model=settings["model"], top_k=2, reranker_kwargs=kwargs))
    pipe.connect("retriever.documents", "ranker.documents")
    text = pipe.dumps()
    data = yaml.safe_load(text)  # plain YAML: basic types only
    assert (
        data["components"]["ranker"]["type"]
        == "haystack_integrations.components.rankers.attnrank.ranker.AttnrankRanker"
    )
    loaded = Pipeline.loads(text)  # no allowlist configuration needed
    assert loaded.dumps() == text
    loaded.warm_up()
    assert loaded.get_component("ranker")._reranker is shared_reranker(**settings)  # one model for all adapters
    out = loaded.run({"retriever": {"query": query}, "ranker": {"query": query}}, include_outputs_from={"retriever"})
    first, ranked = out["retriever"]["documents"], out["ranker"]["documents"]
    assert len(first) == 5 and len(ranked) == 2
    ref = shared_reranker(**settings).rank(query, [ADocument(d.id, d.content, d.meta["title"]) for d in first])
    assert [d.id for d in ranked] == ref.ids[:2]
    assert [d.score for d in ranked] == pytest.approx(ref.scores[:2], abs=0)
    assert all(d.meta["rank"] == i and "hybrid" in d.meta["stage_scores"] for i, d in enumerate(ranked, 1))
    # the retriever's own reranking (same settings; it reads its hits' vectors from the index) agrees
    own = AttnrankRetriever(str(demo_index), top_k=2, depth=5, model=settings["model"], reranker_kwargs=kwargs)
    assert [d.id for d in own.run(query)["documents"]] == [d.id for d in ranked]


def test_retriever_depth_and_old_name(demo_index, query):
    """``depth`` is stored in the YAML; a pipeline saved with ``first_stage_k`` (its old name)
    still loads, with a DeprecationWarning, and returns the same documents."""
    new = AttnrankRetriever(str(demo_index), top_k=3, depth=4, rerank=False)
    assert new.to_dict()["init_parameters"]["depth"] == 4 and "first_stage_k" not in new.to_dict()["init_parameters"]
    data = new.to_dict()
    data["init_parameters"]["first_stage_k"] = data["init_parameters"].pop("depth")
    with pytest.warns(DeprecationWarning, match="first_stage_k= is deprecated, use depth="):
        old = AttnrankRetriever.from_dict(data)
    assert old.depth == 4
    assert [d.id for d in old.run(query)["documents"]] == [d.id for d in new.run(query)["documents"]]
    with pytest.raises(InputError, match="top_k=5 exceeds depth=4"):
        AttnrankRetriever(str(demo_index), top_k=5, depth=4, rerank=False)
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="first_stage_k=6 .* contradicts depth=4"):
        AttnrankRetriever(str(demo_index), top_k=3, depth=4, first_stage_k=6, rerank=False)  # before: 6 won
    # an explicit depth equal to its default counts as given (the old name won silently: depth 6)
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="first_stage_k=6 .* contradicts depth=20"):
        AttnrankRetriever(str(demo_index), top_k=3, depth=20, first_stage_k=6, rerank=False)
    assert AttnrankRetriever(str(demo_index), top_k=3, rerank=False).to_dict()["init_parameters"]["depth"] == 20


def test_ranker_run_top_k_and_errors(settings):
    ranker = AttnrankRanker(model=settings["model"], top_k=None, reranker_kwargs={"max_doc_words": 40})
    docs = [
        Document(id="a", content="Paris is the capital of France.", meta={"title": "Paris"}),
        Document(id="b", content="Bananas are yellow."),
    ]
    top = [d.id for d in ranker.run("capital of France?", docs, top_k=1)["documents"]]
    out = ranker.run("capital of France?", docs)["documents"]
    assert sorted(d.id for d in out) == ["a", "b"] and out[0].score >= out[1].score
    assert top == [out[0].id]  # top_k keeps the best of the full ranking
    assert docs[0].score is None  # inputs untouched
    with pytest.raises(InputError, match="top_k=0"):
        ranker.run("q", docs, top_k=0)
    with pytest.raises(InputError, match="basic types"):
        AttnrankRanker(reranker_kwargs={"reweight": object()})


def test_reranker_kwargs_heads_are_used(settings):
    """``heads`` given in ``reranker_kwargs`` (the component's ``heads`` left at None) is used, not
    silently replaced by the preset's heads; given both ways, differently, it is an error."""
    ranker = AttnrankRanker(model=settings["model"], reranker_kwargs={"max_doc_words": 40, "heads": [[0, 1]]})
    ranker.warm_up()
    assert ranker._reranker.head_list == [(0, 1)]
    with pytest.raises(InputError, match=r"reranker_kwargs\['heads'\]='0-1'.*heads='all'"):
        AttnrankRanker(model=settings["model"], heads="all", reranker_kwargs={"heads": "0-1"})


def test_reranker_kwargs_reweight_dict(settings):
    """``reweight`` as a dict of :class:`Reweighting` fields (basic types, so the pipeline
    serializes) becomes the reranker's re-weighting; an unknown step is one clear error."""
    kwargs = {"max_doc_words": 40, "reweight": {"sink": True}}
    ranker = AttnrankRanker(model=settings["model"], top_k=1, reranker_kwargs=kwargs)
    again = AttnrankRanker.from_dict(ranker.to_dict())
    assert again.to_dict() == ranker.to_dict()
    assert again._settings == ranker._settings  # what the reranker is built from, not only what is saved
    ranker.warm_up()
    assert ranker._reranker.reweight is not None and ranker._reranker.reweight.sink
    docs = [Document(content="Paris is the capital of France."), Document(content="Bananas are yellow.")]
    assert len(ranker.run("capital of France?", docs)["documents"]) == 1
    with pytest.raises(InputError, match=r"reweight.*no_such_step"):
        AttnrankRanker(model=settings["model"], reranker_kwargs={"reweight": {"no_such_step": True}})


def test_a_misspelt_reranker_option_is_refused_when_the_component_is_made(settings, demo_index):
    """It was saved in the pipeline's YAML and refused only at warm_up or the first run (the
    LangChain and LlamaIndex adapters refuse it when made)."""
    with pytest.raises(InputError, match="max_doc_wrds"):
        AttnrankRanker(model=settings["model"], reranker_kwargs={"max_doc_wrds": 40})
    with pytest.raises(InputError, match="top_n"):
        AttnrankRetriever(str(demo_index), top_k=3, depth=4, reranker_kwargs={"top_n": 3})


def test_retriever_without_reranking_refuses_reranker_settings(demo_index):
    """rerank=False with a model, heads, scorer or reranker_kwargs silently ignored them (the
    LangChain and LlamaIndex retrievers refuse them)."""
    for kw in ({"model": "x"}, {"heads": "1-0"}, {"scorer": "learned"}, {"reranker_kwargs": {"top_n": 3}}):
        with pytest.raises(InputError, match="rerank=False but reranker settings were given"):
            AttnrankRetriever(str(demo_index), top_k=3, depth=4, rerank=False, **kw)
    assert AttnrankRetriever(str(demo_index), top_k=3, depth=4, rerank=False).rerank is False


def test_retriever_run_refuses_a_top_k_past_its_depth(demo_index):
    """run(top_k=...) past the depth searched and reranked top_k candidates, not depth, without a
    word (the init refuses it, as the LangChain and LlamaIndex retrievers do)."""
    retriever = AttnrankRetriever(str(demo_index), top_k=3, depth=4)
    with pytest.raises(InputError, match="top_k=5 exceeds depth=4"):
        retriever.run("capital of France?", top_k=5)


def test_retriever_fields_set_later_are_checked_with_or_without_reranking(demo_index):
    """With rerank=False, top_k set to None or depth to None after construction was a TypeError,
    top_k=0 returned nothing and -2 was refused as a "k"; run(top_k=21) past the depth was taken."""
    for field, value, message in (
        ("top_k", None, "top_k=None must be an integer >= 1"),
        ("top_k", 0, "top_k=0 must be an integer >= 1"),
        ("top_k", -2, "top_k=-2 must be an integer >= 1"),
        ("depth", None, "depth=None must be an integer >= 1"),
        ("depth", 0, "depth=0 must be an integer >= 1"),
    ):
        retriever = AttnrankRetriever(str(demo_index), top_k=3, depth=4, rerank=False)
        setattr(retriever, field, value)
        with pytest.raises(InputError, match=re.escape(message)):
            retriever.run("capital of France?")
    retriever = AttnrankRetriever(str(demo_index), top_k=3, depth=4, rerank=False)
    with pytest.raises(InputError, match="top_k=5 exceeds depth=4"):
        retriever.run("capital of France?", top_k=5)
    assert len(retriever.run("capital of France?")["documents"]) == 3


def test_numpy_counts_are_kept_as_ints(tmp_path):
    """A NumPy integer count is accepted (is_count), and was kept: serialising the pipeline failed."""
    import json

    import numpy as np

    ranker = AttnrankRanker(top_k=np.int64(3))
    assert type(ranker.top_k) is int
    json.dumps(ranker.to_dict())


def test_heads_given_as_tuples_dump_as_plain_yaml(demo_index):
    """Pairs given as tuples were stored as given: Pipeline.dumps() wrote !!python/tuple tags, which
    yaml.safe_load refuses, against the components' promise of basic types only."""
    pipe = Pipeline()
    pipe.add_component("ranker", AttnrankRanker(heads=[(0, 1), (1, 2)], reranker_kwargs={"reweight": {}}))
    pipe.add_component(
        "retriever", AttnrankRetriever(str(demo_index), heads=((0, 1),), reranker_kwargs={"max_doc_words": 40})
    )
    data = yaml.safe_load(pipe.dumps())
    assert data["components"]["ranker"]["init_parameters"]["heads"] == [[0, 1], [1, 2]]
    assert data["components"]["retriever"]["init_parameters"]["heads"] == [[0, 1]]
    again = Pipeline.loads(pipe.dumps()).get_component("ranker")
    assert again._settings["heads"] == AttnrankRanker(heads=[(0, 1), (1, 2)])._settings["heads"]


def test_the_components_leave_the_scorer_to_the_preset():
    """The components always passed their default scorer="sum", which turned preset "learned"
    (given in reranker_kwargs) into the plain head sum over all heads, still named "learned"."""
    from attnrank.rerank.config import RerankConfig

    settings = dict(AttnrankRanker(reranker_kwargs={"config": "learned"})._settings)
    config = RerankConfig.preset(settings.pop("config"), **settings)
    assert config.scorer == "learned" and config == RerankConfig.preset("learned")
    # an explicit "sum" with preset learned is refused: saved, "sum" reads back as the preset's
    # (components saved before wrote it by default), so it would change meaning on load
    for name in ("learned", " Learned "):  # (a preset name is read as preset_for reads it)
        with pytest.raises(InputError, match="scorer='sum' with a learned-weights configuration"):
            AttnrankRanker(scorer="sum", reranker_kwargs={"config": name})
    assert AttnrankRanker(scorer="sum")._settings["scorer"] == "sum"  # with another preset: applied
    # the same configuration given as a dict (as to_dict writes one) was not looked into: "sum" was taken,
    # and read back as None after a save, the learned weights scored instead
    from attnrank.integrations.shared import stored_settings

    as_dict = stored_settings({"config": RerankConfig.preset("learned")})["config"]
    assert isinstance(as_dict, dict)
    with pytest.raises(InputError, match="scorer='sum' with a learned-weights configuration"):
        AttnrankRanker(scorer="sum", reranker_kwargs={"config": as_dict})


def test_components_saved_before_the_scorer_default_changed_load_as_they_were_meant(demo_index):
    """Saved components wrote scorer "sum" (the old default), which now counts as given: a saved
    retriever with rerank=False refused it, and a saved ranker's preset "learned" scored the sum."""
    from attnrank.rerank.config import RerankConfig

    retriever = AttnrankRetriever(str(demo_index), top_k=3, depth=4, rerank=False).to_dict()
    retriever["init_parameters"]["scorer"] = "sum"
    assert AttnrankRetriever.from_dict(retriever).rerank is False
    ranker = AttnrankRanker(reranker_kwargs={"config": "learned"}).to_dict()
    ranker["init_parameters"]["scorer"] = "sum"
    settings = dict(AttnrankRanker.from_dict(ranker)._settings)
    assert RerankConfig.preset(settings.pop("config"), **settings).scorer == "learned"


def test_async_warm_up_loads_off_the_event_loop(settings, demo_index, monkeypatch):
    """Haystack's run_async warms components up on its event loop: a model or index load stalled
    every other coroutine of the process (a web server's requests) while it ran."""
    import asyncio
    import threading

    from haystack_integrations.components.rankers.attnrank import ranker as ranker_module
    from haystack_integrations.components.retrievers.attnrank import retriever as retriever_module

    loaded_in: list[str] = []
    for module, name in ((ranker_module, "shared_reranker"), (retriever_module, "shared_index")):
        real = getattr(module, name)

        def recording(*a, _real=real, **k):
            loaded_in.append(threading.current_thread().name)
            return _real(*a, **k)

        monkeypatch.setattr(module, name, recording)
    kwargs = {k: v for k, v in settings.items() if k != "model"}
    ranker = AttnrankRanker(model=settings["model"], reranker_kwargs=kwargs)
    retriever = AttnrankRetriever(str(demo_index), top_k=2, depth=5, rerank=False)

    async def warm() -> None:
        await asyncio.gather(ranker.warm_up_async(), retriever.warm_up_async())

    asyncio.run(warm())
    assert ranker._reranker is shared_reranker(**settings) and retriever._index is not None
    assert len(loaded_in) == 2 and threading.main_thread().name not in loaded_in


def test_a_retriever_reads_rerank_as_set_now(settings, demo_index, query):
    """run() reranked whenever a reranker had been loaded: rerank=False set after a warm-up still reranked."""
    kwargs = {k: v for k, v in settings.items() if k != "model"}
    comp = AttnrankRetriever(str(demo_index), top_k=3, depth=5, model=settings["model"], reranker_kwargs=kwargs)
    plain = AttnrankRetriever(str(demo_index), top_k=3, depth=5, rerank=False).run(query)["documents"]

    def stages(docs) -> list:
        return [(d.id, sorted(d.meta["stage_scores"])) for d in docs]

    reranked = stages(comp.run(query)["documents"])
    assert reranked != stages(plain)  # (the reranker's own stage scores)
    comp.rerank = False
    assert stages(comp.run(query)["documents"]) == stages(plain)
    comp.rerank = True
    assert stages(comp.run(query)["documents"]) == reranked


def test_the_ranker_takes_documents_without_meta_and_refuses_texts_in_one_line(query):
    """Document(meta=None) was an AttributeError; texts or one Document alone, tracebacks."""
    ranker = AttnrankRanker(top_k=None, reranker_kwargs={"config": "signals"})
    ranker.warm_up()
    out = ranker.run(
        query, [Document(content="Paris is the capital of France.", meta=None), Document(content="Bananas.")]
    )
    assert [d.content for d in out["documents"]][0] == "Paris is the capital of France."
    empty = Document(content=None, meta=None)  # (no text, and Haystack keeps its meta None: an AttributeError)
    out = ranker.run(query, (d for d in [Document(content="Bananas."), empty]))  # (any iterable, read once)
    assert [d.id for d in out["documents"]] == [Document(content="Bananas.").id, empty.id]
    assert out["documents"][1].score is None and out["documents"][1].meta == {}
    for docs, message in [
        (["Paris", "Berlin"], "document #0 is a str, not a Haystack Document"),
        (Document(content="Paris"), "the documents are one Document, not a list of them"),
    ]:
        with pytest.raises(InputError, match=message):
            ranker.run(query, docs)
