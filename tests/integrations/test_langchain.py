"""The LangChain adapters inside LangChain's own objects (langchain-core 1.x, langchain-classic)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

pytest.importorskip("langchain_core", reason="needs the 'langchain' extra")
classic = pytest.importorskip(
    "langchain_classic.retrievers", reason="needs langchain-classic (test of the 'langchain' extra)"
)

from langchain_core.documents import Document as LCDocument

from attnrank.errors import InputError
from attnrank.integrations import langchain as lc
from attnrank.integrations.langchain import (
    AttnrankPruner,
    AttnrankReranker,
    AttnrankRetriever,
)
from attnrank.integrations.shared import shared_reranker
from attnrank.types import Document


def _lc_docs(demo_docs, n=6):
    return [
        LCDocument(page_content=d.text, id=d.id, metadata={"title": d.title, "source": "demo"}) for d in demo_docs[:n]
    ]


def _has_nan(value) -> bool:
    """Whether a metadata value holds a NaN float, however deeply nested in lists and dicts."""
    if isinstance(value, dict):
        return any(_has_nan(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_nan(v) for v in value)
    return isinstance(value, float) and math.isnan(value)


def test_reranker_agrees_with_attention_reranker(settings, demo_docs, query):
    comp = AttnrankReranker(top_n=4, **settings)
    out = comp.compress_documents(_lc_docs(demo_docs), query)
    ref = shared_reranker(**settings).rank(query, [Document(d.id, d.text, d.title) for d in demo_docs[:6]])
    assert [d.id for d in out] == ref.ids[:4]
    assert [d.metadata["relevance_score"] for d in out] == pytest.approx(ref.scores[:4], abs=0)
    assert [d.metadata["rank"] for d in out] == [1, 2, 3, 4]
    assert all(d.metadata["source"] == "demo" and "likelihood" in d.metadata["stage_scores"] for d in out)
    # same settings -> the same reranker object (one loaded model)
    assert AttnrankReranker(top_n=2, **settings).reranker is comp.reranker


def test_retriever_in_contextual_compression_retriever_and_batch(settings, demo_index, query):
    base = AttnrankRetriever(index=demo_index, k=5, depth=5, rerank=False)
    first = base.invoke(query)
    assert len(first) == 5 and all({"bm25", "dense", "hybrid"} <= set(d.metadata["stage_scores"]) for d in first)
    pipe = classic.ContextualCompressionRetriever(
        base_compressor=AttnrankReranker(top_n=3, **settings), base_retriever=base
    )
    docs = pipe.invoke(query)
    assert len(docs) == 3 and {d.id for d in docs} <= {d.id for d in first}
    scores = [d.metadata["relevance_score"] for d in docs]
    assert scores == sorted(scores, reverse=True)
    assert all({"hybrid", "likelihood"} <= set(d.metadata["stage_scores"]) for d in docs)  # stages kept
    # the retriever's own reranking gives the same result as the compression pipeline
    retriever = AttnrankRetriever(index=demo_index, k=3, depth=5, **settings)
    direct = retriever.invoke(query)
    assert [d.id for d in direct] == [d.id for d in docs]
    # the retriever's reranker reads its hits' vectors from the index: one per index, never the
    # reranker other adapters share (whose scores must not depend on which adapters exist)
    assert retriever.reranker.signals.index is not None and shared_reranker(**settings).signals.index is None
    assert AttnrankRetriever(index=demo_index, k=2, depth=5, **settings).reranker is retriever.reranker
    # .batch() runs the queries on LangChain's thread pool: results equal one-by-one invocation
    other = "Which network first aired Meet Corliss Archer?"
    batched = pipe.batch([query, other])
    assert [[d.id for d in r] for r in batched] == [[d.id for d in docs], [d.id for d in pipe.invoke(other)]]


def test_pruner_keeps_sentences_and_source(settings, demo_docs, query):
    lc = _lc_docs(demo_docs, 3)
    out = AttnrankPruner(budget_tokens=150, model=settings["model"]).compress_documents(lc, query)
    assert out, "a 150-token budget keeps some sentences"
    by_id = {d.id: d for d in lc}
    for d in out:
        src = by_id[d.id]
        assert d.metadata["source"] == "demo" and d.metadata["source_id"] == d.id and d.metadata["pruned"]
        assert d.metadata["kept_sentences"] and set(d.page_content.split()) <= set(src.page_content.split())
    assert sum(len(d.page_content) for d in out) < sum(len(d.page_content) for d in lc)
    # a source's own "source_id" stays (it was overwritten with the position)
    own = [
        LCDocument(page_content=d.page_content, metadata={**d.metadata, "source_id": f"chunk-{i}"})
        for i, d in enumerate(lc)
    ]
    out = AttnrankPruner(budget_tokens=150, model=settings["model"]).compress_documents(own, query)
    assert out and all(d.metadata["source_id"].startswith("chunk-") for d in out)


def test_pruner_in_pipeline_after_reranker(settings, demo_index, query):
    from langchain_classic.retrievers.document_compressors import (
        DocumentCompressorPipeline,
    )

    chain = DocumentCompressorPipeline(
        transformers=[AttnrankReranker(top_n=2, **settings), AttnrankPruner(keep_ratio=0.5, model=settings["model"])]
    )
    base = AttnrankRetriever(index=demo_index, k=4, depth=4, rerank=False)
    docs = classic.ContextualCompressionRetriever(base_compressor=chain, base_retriever=base).invoke(query)
    assert 1 <= len(docs) <= 2 and all(d.metadata["pruned"] and "relevance_score" in d.metadata for d in docs)


def test_bad_settings(settings, demo_index):
    with pytest.raises(InputError, match="top_n=0"):
        AttnrankReranker(top_n=0, **settings)
    with pytest.raises(InputError, match="k=9 exceeds depth=5"):
        AttnrankRetriever(index=demo_index, k=9, depth=5, **settings)
    with pytest.raises(InputError, match="depth=0 must be an integer >= 1"):
        AttnrankRetriever(index=demo_index, k=1, depth=0, rerank=False)
    with pytest.raises(InputError, match="no_such_option"):
        AttnrankReranker(no_such_option=1, **settings)
    later = AttnrankRetriever(index=demo_index, k=2, depth=3, rerank=False)
    later.k = 8  # set after construction: returned 3 documents silently
    with pytest.raises(InputError, match="k=8 exceeds depth=3"):
        later.invoke("capital")


def test_retriever_old_first_stage_k_still_read(demo_index):
    """``first_stage_k`` (the name before ``depth``) is read as ``depth``, with a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match="first_stage_k= is deprecated, use depth="):
        old = AttnrankRetriever(index=demo_index, k=2, first_stage_k=3, rerank=False)
    assert old.depth == 3
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="k=4 exceeds depth=3"):
        AttnrankRetriever(index=demo_index, k=4, first_stage_k=3, rerank=False)
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="first_stage_k=3 .* contradicts depth=5"):
        AttnrankRetriever(index=demo_index, k=2, depth=5, first_stage_k=3, rerank=False)  # before: depth won silently
    with pytest.warns(DeprecationWarning):
        assert AttnrankRetriever(index=demo_index, k=2, depth=3, first_stage_k=3, rerank=False).depth == 3
    # an explicit depth equal to its default counts as given (the old name won silently: depth 10)
    with pytest.warns(DeprecationWarning), pytest.raises(InputError, match="first_stage_k=10 .* contradicts depth=20"):
        AttnrankRetriever(index=demo_index, k=2, depth=20, first_stage_k=10, rerank=False)


def test_retriever_configurable_fields(settings, demo_index, query):
    """LangChain rebuilds a configured runnable from its fields (``configurable_fields``): the
    rebuilt retriever keeps the index and the reranker, only ``k`` changes."""
    from langchain_core.runnables import ConfigurableField

    base = AttnrankRetriever(index=demo_index, k=2, depth=5, **settings)
    conf = base.configurable_fields(k=ConfigurableField(id="k"))
    assert [d.id for d in conf.invoke(query)] == [d.id for d in base.invoke(query)]
    three = conf.with_config(configurable={"k": 3}).invoke(query)
    ref = AttnrankRetriever(index=demo_index, k=3, depth=5, **settings).invoke(query)
    assert [d.id for d in three] == [d.id for d in ref] and len(ref) == 3
    assert all("likelihood" in d.metadata["stage_scores"] for d in three)  # still reranked


def test_pruner_metadata_has_no_nan_when_everything_fits(settings, demo_docs, query):
    """A budget covering the whole context keeps every sentence without running the model, so
    there are no sentence scores: ``sentence_scores`` is left out (before, a list of NaN), as the
    LlamaIndex pruner leaves scores out. A pruned context still reports one score per kept sentence."""
    lc = _lc_docs(demo_docs, 2)
    pruner = AttnrankPruner(budget_tokens=100_000, model=settings["model"])
    out = pruner.compress_documents(lc, query)
    assert [d.page_content for d in out] == [d.page_content for d in lc]  # nothing pruned
    for d in out:
        assert d.metadata["pruned"] and d.metadata["kept_sentences"]
        assert "sentence_scores" not in d.metadata and not _has_nan(d.metadata)
    for d in AttnrankPruner(keep_ratio=0.5, model=settings["model"]).compress_documents(lc, query):
        scores = d.metadata["sentence_scores"]
        assert len(scores) == len(d.metadata["kept_sentences"]) and all(math.isfinite(s) for s in scores)


def test_pruner_returns_documents_of_titles_alone_and_drops_empty_ones(settings, query):
    """A retrieval of title-only (or empty) documents made compress_documents raise "no text to
    prune", where the same documents beside one with text came back (titles) or were left out."""
    pruner = AttnrankPruner(budget_tokens=40, model=settings["model"])
    titled = LCDocument(page_content="", metadata={"title": "Only a title"})
    out = pruner.compress_documents([titled, LCDocument(page_content=" \n ")], query)
    assert [(d.page_content, d.metadata["title"], d.metadata["kept_sentences"]) for d in out] == [
        ("", "Only a title", [])
    ]
    assert pruner.compress_documents([LCDocument(page_content=" \n ")], query) == []


def test_pruner_budget_is_checked_when_made(settings):
    with pytest.raises(InputError, match="budget_tokens=0"):  # was refused only at the first query
        AttnrankPruner(budget_tokens=0, model=settings["model"])
    with pytest.raises(InputError, match="neighbours=-1"):  # was refused only at the first query
        AttnrankPruner(neighbours=-1, model=settings["model"])
    with pytest.raises(InputError, match="both size the pruned context"):  # keep_ratio was dropped, in a note
        AttnrankPruner(budget_tokens=100, keep_ratio=0.5, model=settings["model"])
    with pytest.raises(InputError, match="keep_ratio=1.5"):
        AttnrankPruner(keep_ratio=1.5, model=settings["model"])
    # checked as given: pydantic made True a budget of 1 token, "300" 300 and True a keep_ratio of 1.0
    for given, match in (
        ({"budget_tokens": True}, "budget_tokens=True"),
        ({"budget_tokens": "300"}, "budget_tokens='300'"),
        ({"keep_ratio": True}, "keep_ratio=True"),
        ({"neighbours": True}, "neighbours=True"),
    ):
        with pytest.raises(InputError, match=match):
            AttnrankPruner(model=settings["model"], **given)


def test_pruner_reads_pre_split_sentences_from_the_metadata(settings, query):
    """A corpus's pre-split "sentences" (kept in the metadata, as attnrank ask prunes by them)
    were dropped on the way to the pruner, which segmented the text again."""
    text = "Alpha beta gamma. Delta epsilon zeta."
    pruner = AttnrankPruner(budget_tokens=100_000, model=settings["model"])  # everything fits: no model runs
    one = LCDocument(page_content=text, metadata={"sentences": [text]})
    two = LCDocument(page_content=text, metadata={})
    # a loader's own "sentences" (a count, a dict) is no split: segmented, not a TypeError
    count = LCDocument(page_content=text, metadata={"sentences": 3})
    keys = LCDocument(page_content=text, metadata={"sentences": {text: 1}})
    array = LCDocument(page_content=text, metadata={"sentences": np.array([text])})  # (read back from Parquet)
    part = LCDocument(page_content=text, metadata={"sentences": ["Delta epsilon zeta."]})  # leaves text out
    part_array = LCDocument(page_content=text, metadata={"sentences": np.array(["Delta epsilon zeta."])})
    out = pruner.compress_documents([one, two, count, keys, array, part, part_array], query)
    assert [len(d.metadata["kept_sentences"]) for d in out] == [1, 2, 2, 2, 1, 2, 2]
    assert out[6].metadata["sentences"] == ["Alpha beta gamma.", "Delta epsilon zeta."]  # (from Parquet)
    # kept_sentences counts the split that was scored, and "sentences" beside it is that split (the
    # corpus's unusable list came back, and kept_sentences [0, 1] pointed past its one entry)
    assert out[5].metadata["sentences"] == ["Alpha beta gamma.", "Delta epsilon zeta."]
    assert out[2].metadata["sentences"] == 3 and out[0].metadata["sentences"] == [text]  # not a split / used


def test_retriever_rerank_is_read_when_queried(settings, demo_index, query, monkeypatch):
    """``rerank`` as a configurable field: rerank=False raised "reranker settings were given"
    (LangChain rebuilds the retriever with its reranker), and setting ``.rerank = False`` was
    ignored. A rerank=False query returns the first stage's top k; the reranker is kept for the
    queries that rerank."""
    from langchain_core.runnables import ConfigurableField

    first = [d.id for d in AttnrankRetriever(index=demo_index, k=2, depth=5, rerank=False).invoke(query)]
    base = AttnrankRetriever(index=demo_index, k=2, depth=5, **settings)
    reranked = [d.id for d in base.invoke(query)]
    assert reranked != first  # (else the test could not tell them apart)
    conf = base.configurable_fields(rerank=ConfigurableField(id="rerank"))
    off = conf.invoke(query, config={"configurable": {"rerank": False}})
    assert [d.id for d in off] == first and all("likelihood" not in d.metadata["stage_scores"] for d in off)
    on = conf.invoke(query, config={"configurable": {"rerank": True}})
    assert [d.id for d in on] == reranked and all("likelihood" in d.metadata["stage_scores"] for d in on)
    assert [d.id for d in conf.invoke(query)] == reranked
    base.rerank = False  # set after construction
    assert [d.id for d in base.invoke(query)] == first and base.reranker is not None
    base.rerank = True
    assert [d.id for d in base.invoke(query)] == reranked
    # made without a reranker, switched on later: the default reranker (here the test's) is built
    plain = AttnrankRetriever(index=demo_index, k=2, depth=5, rerank=False)
    assert plain.reranker is None
    monkeypatch.setattr(lc, "shared_reranker", lambda **kw: base.reranker if kw == {"index": plain.index} else None)
    plain.rerank = True
    assert [d.id for d in plain.invoke(query)] == reranked and plain.reranker is base.reranker
    with pytest.raises(InputError, match=r"takes no top_n=; the number of results it returns is k="):  # misspelt
        AttnrankRetriever(index=demo_index, k=2, depth=5, rerank=False, top_n=3)
    with pytest.raises(InputError, match=r"rerank=False.*model"):  # settings nothing would read: refused
        AttnrankRetriever(index=demo_index, k=2, depth=5, rerank=False, model="m")


def test_retriever_takes_k_and_depth_per_call(settings, demo_index, query):
    """invoke(query, k=2) returned the field's k results: LangChain drops the keywords of invoke
    for a retriever whose method takes none (its vector-store retrievers read k per call)."""
    import asyncio

    retriever = AttnrankRetriever(index=demo_index, k=4, depth=5, rerank=False)
    assert len(retriever.invoke(query)) == 4
    assert [d.id for d in retriever.invoke(query, k=2)] == [d.id for d in retriever.invoke(query)][:2]
    assert len(asyncio.run(retriever.ainvoke(query, k=3))) == 3
    with pytest.raises(InputError, match=r"k=6 .*depth=5|depth=5"):
        retriever.invoke(query, k=6)
    with pytest.raises(InputError, match=r"not \['top_k'\]"):
        retriever.invoke(query, top_k=2)
    assert len(retriever.invoke(query, verbose=True)) == 4  # LangChain's own keyword, passed on to us too


def test_a_misspelt_reranker_setting_is_refused_before_the_index_loads(tmp_path):
    """The retriever loaded its index (kept in the process-wide cache) and only then found top_n."""
    with pytest.raises(InputError, match=r"AttnrankRetriever takes no top_n=; the number of results it returns is k="):
        AttnrankRetriever(index=tmp_path / "no-index-here", k=2, top_n=3)
    with pytest.raises(InputError, match=r"unknown RerankConfig option\(s\) \['heads_x'\]"):
        AttnrankRetriever(index=tmp_path / "no-index-here", k=2, heads_x=3)


def test_pruner_refuses_a_budget_no_sentence_fits(settings, demo_docs, query):
    """It returned [] (the warning aside): the chain answered from no passage as if pruned."""
    with pytest.raises(InputError, match="no sentence of the passages fits the budget of 1 tokens"):
        AttnrankPruner(budget_tokens=1, model=settings["model"]).compress_documents(_lc_docs(demo_docs, 2), query)


def test_malformed_documents_are_refused_in_one_line_and_a_nan_title_is_no_title(query):
    """Texts in place of Documents, one Document alone, and a retriever's non-numeric score were
    tracebacks (AttributeError, ValueError); a data frame's missing title (NaN) was read as "nan"."""
    rr = AttnrankReranker(config="signals", top_n=None)
    for docs, message in [
        (["Paris", "Berlin"], "document #0 is a str, not a LangChain Document; wrap each text"),
        (LCDocument(page_content="Paris"), "the documents are one Document, not a list of them"),
        (
            [LCDocument(page_content=t, metadata={"stage_scores": {}, "relevance_score": "high"}) for t in "ab"],
            "a document's first-stage score 'high'",
        ),
    ]:
        with pytest.raises(InputError, match=re.escape(message)):
            rr.compress_documents(docs, query)
    texts = ["Paris is the capital of France.", "Berlin is in Germany.", "Bananas are yellow."]
    scores = {
        title: [
            d.metadata["relevance_score"]
            for d in rr.compress_documents(
                [LCDocument(page_content=t, metadata={"title": title}) for t in texts], query
            )
        ]
        for title in (math.nan, None)
    }
    assert scores[math.nan] == scores[None]


def test_the_retriever_keeps_a_corpus_metadata_field_named_id(tmp_path, query):
    """The LangChain retriever wrote the attnrank id over a corpus's own "id" field (the Document's
    id carries attnrank's); the LlamaIndex and Haystack retrievers kept it."""
    from attnrank.index.retriever import HybridRetriever

    docs = [
        Document("d1", "Rome is the capital of Italy.", "", {"id": "ext-42"}),
        Document("d2", "Paris is in France."),
    ]
    HybridRetriever().index(docs, show_progress=False).save(tmp_path / "ix")
    hit = AttnrankRetriever(index=str(tmp_path / "ix"), k=1, depth=2, rerank=False).invoke("capital of Italy")[0]
    assert hit.id == "d1" and hit.metadata["id"] == "ext-42"


def test_any_iterable_of_documents_is_ranked_and_a_wrong_stage_object_is_refused_when_made(query):
    """A generator passed the input check and failed indexing (TypeError); reranker="icr" or a
    pruner in the reranker's place was taken, and failed at the first query (AttributeError)."""
    rr = AttnrankReranker(config="signals", top_n=None)
    texts = ["Paris is the capital of France.", "Berlin is in Germany."]
    listed = rr.compress_documents([LCDocument(page_content=t) for t in texts], query)
    generated = rr.compress_documents((LCDocument(page_content=t) for t in texts), query)
    assert [d.page_content for d in generated] == [d.page_content for d in listed]
    for make, message in (
        (lambda: AttnrankReranker(reranker="icr"), "reranker= is a str, which has no rank()"),
        (lambda: AttnrankReranker(reranker=object()), "reranker= is a object, which has no rank()"),
        (lambda: AttnrankPruner(pruner="query"), "pruner= is a str, which has no prune()"),
    ):
        with pytest.raises(InputError, match=re.escape(message)):
            make()


def test_the_compressors_pickle_and_come_back_sharing_their_stage(settings, query):
    """Pickling failed on a lock inside ("cannot pickle '_thread.lock' object"): a chain holding a
    compressor could not go to a worker process. One built around a given object is refused."""
    import pickle

    from attnrank.rerank.attention import AttentionReranker

    docs = [LCDocument(page_content="Paris is the capital of France."), LCDocument(page_content="Bananas.")]
    rr = AttnrankReranker(top_n=1, **settings)
    copy = pickle.loads(pickle.dumps(rr))
    assert copy.top_n == 1 and copy.reranker is rr.reranker  # (one shared reranker per settings)
    assert copy.compress_documents(docs, query) == rr.compress_documents(docs, query)
    pruner = AttnrankPruner(budget_tokens=8, model=settings["model"])
    assert pickle.loads(pickle.dumps(pruner)).pruner is pruner.pruner
    with pytest.raises(InputError, match="AttnrankReranker built around a given reranker object cannot be pickled"):
        pickle.dumps(AttnrankReranker(reranker=AttentionReranker(**settings)))


def test_the_retriever_pickles_and_comes_back_with_its_index_and_reranker(settings, demo_index, query):
    """A retriever held locks (its index's and its reranker's): a chain holding it could not go to a
    worker process. The copy loads both again from the folder and the settings, shared as any
    adapter's; one built around an object it cannot load again is refused in one line."""
    import pickle

    from attnrank.index.retriever import HybridRetriever

    retriever = AttnrankRetriever(index=demo_index, k=3, depth=5, **settings)
    copy = pickle.loads(pickle.dumps(retriever))
    assert (copy.k, copy.depth, copy.rerank) == (3, 5, True)
    assert copy.index is retriever.index and copy.reranker is retriever.reranker
    assert [d.id for d in copy.invoke(query)] == [d.id for d in retriever.invoke(query)]
    plain = pickle.loads(pickle.dumps(AttnrankRetriever(index=demo_index, k=2, depth=5, rerank=False)))
    assert plain.reranker is None and len(plain.invoke(query)) == 2
    # LangChain rebuilds a configured retriever from its fields (the loaded objects): still picklable
    configured = _configured(retriever, k=2)
    assert type(configured) is AttnrankRetriever and configured is not retriever and configured.k == 2
    assert pickle.loads(pickle.dumps(configured)).reranker is retriever.reranker
    # in a fresh process (nothing shared yet) the copy loads the index and builds the reranker again
    from attnrank.integrations.shared import clear_shared

    pickled = pickle.dumps(retriever)
    clear_shared()
    fresh = pickle.loads(pickled)
    assert fresh.index is not retriever.index and fresh.reranker is not retriever.reranker
    assert [d.id for d in fresh.invoke(query)] == [d.id for d in retriever.invoke(query)]
    loaded = HybridRetriever.load(demo_index)
    with pytest.raises(InputError, match="built around a given index object cannot be pickled"):
        pickle.dumps(AttnrankRetriever(index=loaded, k=2, depth=5, rerank=False))
    with pytest.raises(InputError, match="built around a given reranker object cannot be pickled"):
        pickle.dumps(AttnrankRetriever(index=demo_index, reranker=_OwnReranker(), k=2, depth=5))


class _OwnReranker:
    def rank(self, query, docs, k=None):
        raise AssertionError("not called")


def _configured(retriever, k):
    """The retriever as LangChain rebuilds it for a call configured with ``k`` (``configurable_fields``)."""
    from langchain_core.runnables import ConfigurableField

    return retriever.configurable_fields(k=ConfigurableField(id="k"))._prepare({"configurable": {"k": k}})[0]


def test_another_librarys_count_name_is_named_with_the_adapters_own(tmp_path):
    """top_k= (and LangChain's own search_kwargs={"k": 3}) was refused as an unknown RerankConfig
    option, in a list of fields with no count in it."""
    for bad in ({"top_k": 2}, {"k": 2}):
        with pytest.raises(InputError, match=rf"AttnrankReranker takes no {next(iter(bad))}=; .* is top_n="):
            AttnrankReranker(**bad)
    for bad in ({"top_k": 3}, {"search_kwargs": {"k": 3}}):
        with pytest.raises(InputError, match=rf"AttnrankRetriever takes no {next(iter(bad))}=; .* is k="):
            AttnrankRetriever(index=str(tmp_path / "none"), **bad)
