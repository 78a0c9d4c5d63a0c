from __future__ import annotations

import math
import re

import numpy as np
import pytest

from attnrank.errors import InputError
from attnrank.types import Document, RankedResults, ScoredDocument, as_documents, is_blank, rank_documents


def test_results_are_sorted_and_reranked_from_one():
    res = RankedResults("q", [ScoredDocument("a", 0.1, 1), ScoredDocument("b", 0.9, 2), ScoredDocument("c", 0.5, 3)])
    assert res.ids == ["b", "c", "a"] and [r.rank for r in res] == [1, 2, 3]
    assert res.top_k(2).ids == ["b", "c"]


def test_ties_keep_previous_order():
    res = RankedResults("q", [ScoredDocument("x", 1.0, 2), ScoredDocument("y", 1.0, 1)])
    assert res.ids == ["y", "x"]


def test_rank_documents_keeps_stage_scores_and_metadata():
    docs = [Document("a", "t1", metadata={"sentences": ["t1"]}), Document("b", "t2")]
    first = rank_documents("q", docs, [2.0, 1.0], stage="bm25")
    second = rank_documents("q", first.documents(), [0.1, 0.3], stage="attention", previous=first.results)
    assert second.ids == ["b", "a"]
    assert second[1].stage_scores == {"bm25": 2.0, "attention": 0.1}
    assert second.documents()[1].metadata == {"sentences": ["t1"]}


def test_a_nan_score_ranks_last_and_leaves_the_others_in_order():
    """Before: NaN compares false both ways, so sorting left 'c' (3.0) behind 'a' (1.0) at rank 3."""
    nan = float("nan")
    res = RankedResults("q", [ScoredDocument("a", 1.0, 1), ScoredDocument("b", nan, 2), ScoredDocument("c", 3.0, 3)])
    assert res.ids == ["c", "a", "b"] and [r.rank for r in res] == [1, 2, 3]
    assert math.isnan(res[2].score)  # kept as NaN, not turned into a number


def test_top_k_refuses_a_negative_k():
    """Before: top_k(-1) sliced results[:-1] and silently dropped the last result."""
    res = RankedResults("q", [ScoredDocument("a", 2.0, 1), ScoredDocument("b", 1.0, 2)])
    with pytest.raises(InputError, match=r"k=-1\): k must be an integer >= 0"):
        res.top_k(-1)
    assert res.top_k(0).ids == [] and res.top_k(5).ids == ["a", "b"] and res.top_k(np.int64(1)).ids == ["a"]


def test_rank_documents_refuses_scores_that_do_not_match_the_documents():
    """Before: zip() dropped the documents without a score, silently returning fewer results."""
    docs = [Document("a", "t1"), Document("b", "t2"), Document("c", "t3")]
    with pytest.raises(InputError, match="3 documents but 2 scores"):
        rank_documents("q", docs, [2.0, 1.0], stage="bm25")
    first = rank_documents("q", docs[:2], [2.0, 1.0], stage="bm25")
    with pytest.raises(InputError, match="3 documents but 2 previous"):
        rank_documents("q", docs, [1.0, 2.0, 3.0], stage="attention", previous=first.results)


def test_one_string_is_not_split_into_a_passage_per_character():
    """Before: as_documents("Paris is big") gave 12 one-character documents, so a reranker or the
    pipeline silently ranked characters."""
    with pytest.raises(InputError, match="the candidates are one str, not a list of them"):
        as_documents("Paris is big")
    with pytest.raises(InputError, match="one Document, not a list"):
        as_documents(Document("a", "Paris is big"))
    assert [d.text for d in as_documents(["Paris is big"])[0]] == ["Paris is big"]


def test_a_dict_or_set_of_candidates_is_refused_not_ranked_by_its_keys():
    """list() of {id: text} is its keys: the ids were ranked as the texts, exit 0; a set came in
    hash order, another each run."""
    with pytest.raises(InputError, match=r"the candidates are a dict; pass a list, e.g. \[Document\(i, t\)"):
        as_documents({"d1": "Paris is the capital of France.", "d2": "Berlin"})
    with pytest.raises(InputError, match="the candidates are a frozenset"):
        as_documents(frozenset({"Paris", "Berlin"}))


def test_is_count_takes_python_and_numpy_integers_not_bools_floats_or_small_ones():
    from attnrank.types import is_count

    assert is_count(1) and is_count(np.int64(3)) and is_count(0, 0) and is_count(np.uint8(0), 0)
    assert not any(is_count(v) for v in (0, -1, True, 1.0, "2", None, np.float32(2)))
    assert not is_count(-1, 0)


def test_counts_given_as_numpy_integers_are_stored_as_python_integers():
    """A configuration given a NumPy integer kept it, and writing the configuration as JSON failed."""
    import dataclasses
    import json

    from attnrank.prune.config import PruneConfig
    from attnrank.rerank.adapter import AdapterConfig
    from attnrank.rerank.config import RerankConfig

    rc = RerankConfig(max_doc_words=np.int64(300), attention="block", state_cache_mb=np.int32(8))
    pc = PruneConfig(
        max_sentence_words=np.int64(40), max_prompt_tokens=np.int64(512), attention="block", state_cache_mb=np.int16(4)
    )
    ac = AdapterConfig(rank=np.int64(4), steps=np.int64(10))
    for cfg, keys in (
        (rc, ("max_doc_words", "state_cache_mb")),
        (pc, ("max_sentence_words", "max_prompt_tokens")),
        (ac, ("rank", "steps")),
    ):
        assert all(type(getattr(cfg, k)) is int for k in keys)
        json.dumps({k: getattr(cfg, k) for k in keys})
    assert dataclasses.replace(rc, max_doc_words=None).max_doc_words is None


def test_text_of_only_invisible_characters_is_blank():
    for blank in ("", " \n\t", "\u200b", "\ufeff", "\u00ad", "\u200b \u2060\x00"):
        assert is_blank(blank), repr(blank)
    for text in ("a", " x ", "\u200bword", "\u00e9", "...", "\u4e2d"):
        assert not is_blank(text), repr(text)


@pytest.mark.parametrize(
    "doc, message",
    [
        (Document("a", None), "document #0 ('a') has a text that is not text (None, of type NoneType)"),
        (Document("a", math.nan), "has a text that is not text (nan, of type float)"),
        (Document("a", "Paris", math.nan), "has a title that is not text (nan, of type float); give a string or None"),
    ],
)
def test_a_reranked_or_pruned_document_needs_text_fields_that_are_strings(doc, message, llm):
    """A text None crashed the reranker (AttributeError) and the pruner (TypeError); with a title,
    it was scored as the word "None", and a data frame's missing title (NaN) as the word "nan"."""
    from attnrank.prune.pruner import ContextPruner
    from attnrank.types import check_texts

    with pytest.raises(InputError, match=re.escape(message)):
        check_texts([doc, Document("b", "Berlin.")])
    with pytest.raises(InputError, match=re.escape(message)):
        ContextPruner(llm).prune("capital?", [doc], budget_tokens=20)
    check_texts([Document("a", "Paris", None)])  # (no title: None is one)


def test_a_score_that_is_no_number_is_one_line():
    """RankedResults(...) with the score "0.5" (or None) failed as a bare TypeError inside its sort."""
    for bad in ("0.5", None, True):
        with pytest.raises(InputError, match=r"result 'a' has the score .* give each a number"):
            RankedResults("q", [ScoredDocument("a", bad, 1)])
    assert RankedResults("q", [ScoredDocument("a", np.float32(0.5), 1)]).scores == [0.5]


def test_candidates_mixing_scored_and_plain_documents_are_refused():
    """One plain document beside scored ones made every candidate unscored: their scores dropped."""
    with pytest.raises(
        InputError, match=r"mix scored documents \(e.g. 'b'\) with unscored ones \(e.g. #0, a Document\)"
    ):
        as_documents([Document("a", "x"), ScoredDocument("b", 5.0, 1, "y")])


def test_results_do_not_share_metadata_with_the_documents_they_came_from():
    """A result's metadata was the caller's own dict: an edit of one reached the other, and every later result."""
    doc = Document("a", "Paris is the capital", metadata={"src": "x"})
    ranked = rank_documents("q", [doc], [1.0], stage="s")
    ranked[0].metadata["note"] = "edited"
    assert doc.metadata == {"src": "x"}
    ranked[0].document.metadata["more"] = 1
    assert ranked[0].metadata == {"src": "x", "note": "edited"}


def test_results_that_repeat_an_id_are_refused():
    """RankedResults kept ["a", "a"], which the reranker and write_run refuse."""
    with pytest.raises(InputError, match="the results repeat the id 'a'"):
        RankedResults("q", [ScoredDocument("a", 1.0, 1), ScoredDocument("a", 0.5, 2)])


def test_another_librarys_document_is_named_with_its_module():
    """A LangChain or Haystack Document was "a Document, not a Document"."""
    from attnrank.index.retriever import HybridRetriever

    theirs = type("Document", (), {"__module__": "otherlib.documents", "page_content": "Paris."})()
    with pytest.raises(InputError, match=r"document #0 is a otherlib.documents.Document, not attnrank's Document"):
        HybridRetriever().index([theirs], show_progress=False)
    with pytest.raises(InputError, match=r"document #0 is a otherlib.documents.Document; pass attnrank's Document"):
        as_documents([theirs])


def test_metadata_none_is_none_and_a_text_is_refused():
    """metadata=None was a TypeError deep in an index or a ranking ('NoneType' object is not
    iterable), a string a ValueError (dictionary update sequence)."""
    from attnrank.index.retriever import HybridRetriever

    Doc = Document
    docs = [Doc("a", "Paris is in France.", metadata=None), Doc("b", "Berlin is in Germany.")]
    assert docs[0].metadata == {} and ScoredDocument("a", 1.0, 1, metadata=None).document.metadata == {}
    hits = HybridRetriever(fusion="rrf").index(docs, show_progress=False).search("Paris", 1)
    assert hits[0].id == "a" and hits[0].metadata == {}
    with pytest.raises(InputError, match=r"document 'a': metadata 'source=x.md' is a str; give a dict"):
        Doc("a", "x", metadata="source=x.md")  # type: ignore[arg-type]


def test_a_text_whose_position_is_another_candidates_id_is_named_as_such():
    """[Document("1", ...), "Berlin."] was refused as "document #1 repeats the id '1'", an id the
    caller never gave twice (the server's /v1/prune said what happened)."""
    with pytest.raises(
        InputError, match=r"document #1 is a text, named by its position '1', which is the id of document #0"
    ):
        as_documents([Document("1", "Paris."), "Berlin."])
    assert [d.id for d in as_documents([Document("x", "Paris."), "Berlin."])[0]] == ["x", "1"]
