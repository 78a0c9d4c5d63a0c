"""The attention reranker on a tiny random Llama (GQA), checked against a brute-force reference:
eager attention with output_attentions=True over the full real and N/A prompts."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from _tiny import RERANK_QUERY, rerank_docs

from attnrank.errors import InputError
from attnrank.llm.attention import naive_attention_rows
from attnrank.llm.prompts import build_rerank_prompts
from attnrank.llm.rows import document_scores, token_scores
from attnrank.rerank.attention import AttentionReranker
from attnrank.types import Document, RankedResults, ScoredDocument

DOCS = rerank_docs()
QUERY = RERANK_QUERY


def reference_scores(llm, query, docs, heads=None, calibrate=True, last=False, use_filter=True):
    pair = build_rerank_prompts(llm.tokenizer, query, docs)
    rows = []
    for p in (pair.real, pair.calibration) if calibrate else (pair.real,):
        start = len(p.input_ids) - 1 if last else p.query_start
        r = naive_attention_rows(llm.model, torch.tensor([p.input_ids]), start, heads)
        rows.append(r[:, : p.query_start].double().numpy())
    delta = rows[0] - rows[1] if calibrate else rows[0]
    return document_scores(token_scores(delta), pair.doc_spans, use_filter=use_filter)


@pytest.mark.parametrize(
    "kw,ref_kw",
    [
        ({}, {}),
        ({"calibrate": False}, {"calibrate": False}),
        ({"query_span": "last"}, {"last": True}),
        ({"token_filter": False}, {"use_filter": False}),
        ({"heads": [(1, 3), (2, 0), (2, 1)]}, {"heads": [(1, 3), (2, 0), (2, 1)]}),
    ],
)
def test_scores_equal_brute_force_reference(llm, kw, ref_kw):
    ours = AttentionReranker(llm, **kw, signals=None).score(QUERY, DOCS)
    ref = reference_scores(llm, QUERY, DOCS, **ref_kw)
    np.testing.assert_allclose(ours, ref, atol=1e-6)
    assert np.isfinite(ours).all()


def test_rank_returns_sorted_typed_results_with_previous_stage(llm):
    first = RankedResults(
        QUERY,
        [ScoredDocument(d.id, 10.0 - i, i + 1, d.text, d.title, {"bm25": 10.0 - i}) for i, d in enumerate(DOCS)],
        query_id="q7",
    )
    res = AttentionReranker(llm, signals=None).rank(QUERY, first, k=3, return_evidence=True)
    assert isinstance(res, RankedResults) and res.stage == "attention" and res.query_id == "q7"
    assert len(res) == 3 and [r.rank for r in res] == [1, 2, 3]
    assert res.scores == sorted(res.scores, reverse=True)
    top = res[0]
    assert set(top.stage_scores) == {"bm25", "attention"} and top.stage_scores["attention"] == top.score
    tokens = top.evidence["attention_tokens"]
    assert tokens and all(isinstance(t, int) and np.isfinite(s) for t, s in tokens)


def test_head_subset_stops_early(llm):
    calls = []
    hook = llm.model.model.layers[3].register_forward_hook(lambda *a: calls.append(1))
    try:
        AttentionReranker(llm, heads="0-1,1-2", signals=None).score(QUERY, DOCS)
    finally:
        hook.remove()
    assert calls == []  # layers after the deepest selected one never run


def test_windows_when_prompt_is_too_long(llm, caplog):
    def n_tokens(docs):
        return len(build_rerank_prompts(llm.tokenizer, QUERY, docs).real.input_ids)

    limit = max(n_tokens(DOCS[0::2]), n_tokens(DOCS[1::2]))
    assert limit < n_tokens(DOCS)
    rr = AttentionReranker(llm, max_prompt_tokens=limit, signals=None)
    with caplog.at_level(logging.INFO, logger="attnrank.rerank.windows"):
        wins = rr.windows(QUERY, DOCS)
    assert len(wins) == 2 and "round-robin windows" in caplog.text
    assert sorted(i for w in wins for i in w.doc_index) == [0, 1, 2, 3]
    assert [w.doc_index for w in wins] == [[0, 2], [1, 3]]  # dealt by first-stage rank
    scores = rr.score(QUERY, DOCS)
    # each window is scored exactly as its documents alone
    np.testing.assert_allclose(scores[[0, 2]], reference_scores(llm, QUERY, [DOCS[0], DOCS[2]]), atol=1e-6)


def test_windows_fit_the_calibration_prompt_too_where_it_is_the_longer(llm):
    """After a one-word query the calibration prompt ("N/A") is the longer: windows sized by the
    real prompt alone ran it past max_prompt_tokens (past the model's context, at the limit)."""
    pair = build_rerank_prompts(llm.tokenizer, "x", DOCS)
    real, calibration = len(pair.real.input_ids), len(pair.calibration.input_ids)
    assert calibration > real
    assert len(AttentionReranker(llm, max_prompt_tokens=real, signals=None).windows("x", DOCS)) > 1
    assert len(AttentionReranker(llm, max_prompt_tokens=calibration, signals=None).windows("x", DOCS)) == 1
    uncalibrated = AttentionReranker(llm, max_prompt_tokens=real, signals=None, calibrate=False)
    assert len(uncalibrated.windows("x", DOCS)) == 1


def test_a_document_that_cannot_fit(llm):
    docs = [*DOCS, "A much longer passage than the others, " * 8]
    one = [len(build_rerank_prompts(llm.tokenizer, QUERY, [d]).real.input_ids) for d in docs]
    limit = max(one[:-1])  # every document fits alone but the long last one
    with pytest.raises(InputError, match=f"document #4 \\('4'\\) does not fit max_prompt_tokens={limit} even alone"):
        AttentionReranker(llm, max_prompt_tokens=limit, signals=None).score(QUERY, docs)
    # found before any window count is tried: they were all built (and tokenized) first
    from attnrank.rerank import windows

    built = []

    def build(g):
        built.append(len(g))
        return build_rerank_prompts(llm.tokenizer, QUERY, [docs[i] for i in g])

    with pytest.raises(InputError, match="does not fit"):
        windows.fit_windows(len(docs), build, lambda p: len(p.real.input_ids), lambda p, g: None, limit)
    assert built == [len(docs)] + [1] * len(docs)  # the whole prompt, then each document alone
    with pytest.raises(InputError, match=f"no document fits max_prompt_tokens={min(one) - 1} even alone"):
        AttentionReranker(llm, max_prompt_tokens=min(one) - 1, signals=None).score(QUERY, docs)


def test_bad_input(llm):
    rr = AttentionReranker(llm, signals=None)
    with pytest.raises(InputError, match="query '  ' is empty"):
        rr.rank("  ", DOCS)
    for invisible in ("\u200b", "\ufeff", "\u00ad\n"):  # (zero-width space, BOM, soft hyphen: no text)
        with pytest.raises(InputError, match="is empty"):
            rr.rank(invisible, DOCS)
    assert len(rr.rank(QUERY, [])) == 0
    with pytest.raises(InputError, match=r"head pairs 9-0 are out of range"):
        AttentionReranker(llm, heads="9-0", signals=None)
    with pytest.raises(InputError, match="query_span='middle'"):
        AttentionReranker(llm, query_span="middle", signals=None)
    with pytest.raises(InputError, match="2 queries but 1 document lists"):
        rr.rank_batch(["a", "b"], [DOCS])


def test_plain_strings_and_batch(llm):
    rr = AttentionReranker(llm, signals=None)
    out = rr.rank_batch([QUERY, "Italy"], [[d.text for d in DOCS], DOCS[:2]], query_ids=["a", "b"])
    assert [r.query_id for r in out] == ["a", "b"] and sorted(out[0].ids) == ["0", "1", "2", "3"]


def test_a_batch_of_one_text_or_a_dict_is_refused_not_read_as_queries(llm):
    """One str was split into a query per character (with as many document lists: wrong rankings,
    no error); a {id: text} dict gave a KeyError, and check_batch took its keys for the queries."""
    rr = AttentionReranker(llm, signals=None)
    for call in (rr.rank_batch, rr.check_batch):
        with pytest.raises(InputError, match="queries is one str, not a list"):
            call("ab", [DOCS, DOCS])
        with pytest.raises(InputError, match=r"queries is a dict; pass list\(queries.values\(\)\)"):
            call({"q1": QUERY}, [DOCS])
        with pytest.raises(InputError, match="query_ids is a str"):
            call([QUERY], [DOCS], query_ids="q")


def test_a_batch_of_one_flat_candidate_list_is_named_as_such(llm):
    """One flat list of candidates for a batch was "2 queries but 3 document lists" (its texts), or,
    as many as the queries, each text refused as one passage; check_batch read as many as the
    shorter of the two held, and passed."""
    rr = AttentionReranker(llm, signals=None)
    texts = [d.text for d in DOCS]
    for call in (rr.rank_batch, rr.check_batch):
        for flat in (texts, DOCS, texts[:2]):
            with pytest.raises(
                InputError, match=rf"one list of {len(flat)} candidates, not one list per query; .*\[candidates\] \* 2"
            ):
                call([QUERY, "Italy"], flat)
        with pytest.raises(InputError, match="2 queries but 1 document lists"):
            call([QUERY, "Italy"], [DOCS])


def test_document_ids_must_be_strings_as_an_index_requires(llm):
    """Ids 1 and "1" ranked as two documents, and None came back as a result's id."""
    rr = AttentionReranker(llm, signals=None)
    with pytest.raises(InputError, match=r"document #0's id 1 is a int, not a string"):
        rr.rank(QUERY, [Document(1, "x y"), Document("1", "x z")])  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"document #1's id None is a NoneType"):
        rr.score(QUERY, [Document("a", "x y"), Document(None, "x z")])  # type: ignore[arg-type]


@pytest.mark.parametrize("empty", ["", "  \n\t", "\u200b", "\ufeff \u00ad"])
def test_an_empty_document_is_refused_not_scored(llm, empty):
    reranker = AttentionReranker(llm, heads="all", signals=None)
    docs = [Document("a", "Paris is the capital of France."), Document("b", empty)]
    with pytest.raises(InputError, match=r"document #1 \('b'\) has no text"):
        reranker.rank("capital of France?", docs)
    with pytest.raises(InputError, match="has no text"):
        reranker.score("capital of France?", docs)
    assert len(reranker.rank("capital of France?", [docs[0], Document("c", empty, "A title")])) == 2


def test_candidates_of_ids_alone_are_told_to_bring_their_texts(llm):
    """A run read back (ScoredDocuments of ids and scores) was told to "drop empty documents", which
    leaves nothing to rerank."""
    from attnrank.types import ScoredDocument

    reranker = AttentionReranker(llm, signals=None)
    run = [ScoredDocument(d, 2.0 - i, i + 1) for i, d in enumerate(("1065627", "20"))]
    with pytest.raises(InputError, match=r"none of the 2 documents has text \(e.g. '1065627'\); .* look them up"):
        reranker.rank("capital of France?", run)


@pytest.mark.parametrize("mode", ["full", "block"])
def test_a_lone_surrogate_in_the_query_or_a_document_is_one_input_error(llm, mode):
    """Tokenizers fail on a lone surrogate with a TypeError, block mode's hashing with a
    UnicodeEncodeError; the reranker names the text instead."""
    reranker = AttentionReranker(llm, heads="all", signals=None, attention=mode)
    docs = [Document("a", "Paris is the capital of France."), Document("b", "abc \ud800 def")]
    with pytest.raises(InputError, match=r"document #1 .* not valid Unicode"):
        reranker.rank("capital of France?", docs)
    with pytest.raises(InputError, match=r"query #0 .* not valid Unicode"):
        reranker.rank("capital \ud800?", docs[:1])


def test_max_prompt_tokens_past_the_model_context_is_refused():
    from _tiny import tiny_llm

    short = tiny_llm(layers=2, max_positions=256)
    # before: accepted, and a prompt past position 256 was scored with untrained positions
    with pytest.raises(InputError, match="max_prompt_tokens=1000 exceeds the 256-token context"):
        AttentionReranker(short, None, signals=None, max_prompt_tokens=1000)
    assert AttentionReranker(short, None, signals=None, max_prompt_tokens=256).max_prompt_tokens == 256


def test_a_model_folder_given_as_a_path_is_loaded(tmp_path):
    """A pathlib.Path to a model folder was neither a str nor an LLM, so the packaged default
    model was loaded in its place (silently); the reranker, pruner, generator and pipeline load it."""
    from _tiny import save_tiny

    from attnrank.generate import Generator
    from attnrank.pipeline import Pipeline
    from attnrank.prune.pruner import ContextPruner

    folder = save_tiny(tmp_path / "tiny")
    for stage in (AttentionReranker(folder, signals=None), ContextPruner(folder), Generator(folder)):
        assert stage.llm.model_id == str(folder)
    pipe = Pipeline.from_model(None, model=folder, rerank=False, prune=False)
    assert pipe.generator is not None and pipe.generator.llm.model_id == str(folder)


def test_score_of_no_documents_is_empty_for_every_preset(llm):
    """rank(q, []) was empty for every preset, but score(q, []) raised for the attention presets."""
    for rr in (
        AttentionReranker(llm, "all", signals=None),
        AttentionReranker(llm, config="fused"),
        AttentionReranker(llm, config="signals"),
        AttentionReranker(llm, config="likelihood"),
    ):
        assert rr.score("q", []).shape == (0,) and len(rr.rank("q", [])) == 0, rr.config.name


def test_a_model_with_latent_attention_reranks_and_block_attention_names_why_not():
    """DeepSeek-style models (values narrower than keys) failed with a RuntimeError in every
    reranking over a prefix and in the query likelihood's kept states."""
    from _tiny import tiny_latent_attention_model, tiny_tokenizer

    from attnrank.errors import ModelError
    from attnrank.llm.models import LLM

    llm = LLM(
        model=tiny_latent_attention_model(), tokenizer=tiny_tokenizer(), model_id="tiny-mla", fingerprint="c" * 64
    )
    docs = rerank_docs()
    assert len(AttentionReranker(llm, "all", signals=None, max_doc_words=20).rank(RERANK_QUERY, docs)) == len(docs)
    rr = AttentionReranker(llm, config="likelihood", max_doc_words=20)
    first = rr.likelihood(RERANK_QUERY, docs)
    np.testing.assert_allclose(rr.likelihood(RERANK_QUERY, docs), first, atol=1e-6)  # states are not kept: recomputed
    with pytest.raises(ModelError, match="keys and values of one head size.*use attention='full'"):
        AttentionReranker(llm, "all", signals=None, attention="block", block_positions="shared", max_doc_words=20).rank(
            RERANK_QUERY, docs
        )


def test_the_calibration_query_and_a_bad_query_in_a_batch_are_refused_first(llm):
    """A query "N/A" (the calibration query) scored every candidate 0: the first-stage order,
    labelled as attention's. A batch's bad query #2 was found after queries #0 and #1 had run."""
    from _tiny import rerank_docs

    reranker = AttentionReranker(llm, None, signals=None)
    docs = rerank_docs()[:2]
    with pytest.raises(InputError, match="is the calibration query"):
        reranker.rank(" N/A ", docs)
    for entry in (reranker.score, reranker.windows):  # (they returned all zeros, and fed them to head training)
        with pytest.raises(InputError, match="is the calibration query"):
            entry("N/A", docs)
    uncalibrated = AttentionReranker(llm, None, signals=None, calibrate=False)
    assert uncalibrated.score("N/A", docs).shape == (2,)  # nothing to cancel it against: a query like any
    calls = []
    original = reranker.windows
    reranker.windows = lambda *a, **k: calls.append(1) or original(*a, **k)  # type: ignore[method-assign]
    with pytest.raises(InputError, match=r"query #2: query '' is empty"):
        reranker.rank_batch(["capital of France?", "yellow fruit?", ""], [docs, docs, docs])
    assert calls == []


def test_reranking_drops_an_earlier_attention_stages_token_evidence(llm):
    """Results that held one reranker's per-token evidence kept it through another's reranking
    without return_evidence, and were explained as the new scores (off by ~0.03 each)."""
    first = RankedResults(
        QUERY, [ScoredDocument(d.id, 1.0 - i / 10, i + 1, d.text, d.title) for i, d in enumerate(DOCS)]
    )
    with_evidence = AttentionReranker(llm, signals=None).rank(QUERY, first, return_evidence=True)
    assert all("attention_tokens" in d.evidence for d in with_evidence)
    again = AttentionReranker(llm, heads="0-1,1-2", signals=None).rank(QUERY, with_evidence)
    assert not any("attention_tokens" in d.evidence or "attention_counted" in d.evidence for d in again)
    fresh = AttentionReranker(llm, heads="0-1,1-2", signals=None).rank(QUERY, with_evidence, return_evidence=True)
    for d in fresh:  # asked for: this stage's own, adding up to its score
        assert (
            abs(
                sum(v for (_, v), c in zip(d.evidence["attention_tokens"], d.evidence["attention_counted"]) if c)
                - d.score
            )
            < 1e-3
        )


def test_prompts_stay_within_one_set_of_rotary_frequencies_where_they_follow_the_pass_length():
    """LongRoPE (and dynamic NTK) pick their frequencies by a pass's longest position: a context
    prefilled below the switch and a query run past it read different ones (8e-5 off an eager
    pass over the whole prompt on a tiny model; far more on Phi-3.5, whose long factors are far
    from 1). The default window stays within the switch, and a budget past it is refused."""
    from _tiny import tiny_longrope_model, tiny_tokenizer

    from attnrank.llm.models import LLM
    from attnrank.prune.pruner import ContextPruner

    llm = LLM(tiny_longrope_model(max_positions=2000, switch=300), tiny_tokenizer(), "tiny-phi3", "p" * 64)
    assert llm.prompt_budget == 300 and llm.context_length - 64 > 300
    for cls, options in ((AttentionReranker, {"config": "qrhead", "heads": "all"}), (ContextPruner, {})):
        with pytest.raises(InputError, match="max_prompt_tokens=500 exceeds the 300 positions over which the rotary"):
            cls(llm, max_prompt_tokens=500, **options)
    rr = AttentionReranker(llm, config="qrhead", heads="all")
    assert rr.max_prompt_tokens == 300
    docs = [Document(str(i), f"Passage {i} tells of the capital of France and its river. " * 2) for i in range(6)]
    wins = rr.windows("capital of France?", docs)
    assert len(wins) > 1 and all(len(w.input_ids) < 300 for w in wins)  # cut into windows within the switch


def test_a_window_the_calibration_prompt_does_not_fit_is_refused_before_the_model_loads(tiny_dir, monkeypatch):
    """The check before the load built the prompt's frame without calibration, which the head sum
    adds (2 positions here): a window of the frame's size passed, refused once the model had loaded."""
    from attnrank.llm import models
    from attnrank.rerank.config import RerankConfig
    from attnrank.rerank.resolve import check_window

    fits = next(
        n
        for n in range(100, 400)
        if _fits(check_window, RerankConfig.preset("icr", model=str(tiny_dir), max_prompt_tokens=n))
    )
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    with pytest.raises(InputError, match=f"max_prompt_tokens={fits - 1} leaves no room for a passage"):
        AttentionReranker(str(tiny_dir), config="icr", max_prompt_tokens=fits - 1)
    without = RerankConfig.preset("icr", model=str(tiny_dir), max_prompt_tokens=fits - 1, calibrate=False)
    assert _fits(check_window, without)  # the calibration prompt is the longer one
    assert loads == []


def _fits(check, config) -> bool:
    try:
        check(config)
    except InputError:
        return False
    return True


def test_heads_outside_the_model_are_refused_before_it_loads(tmp_path, monkeypatch):
    """The CLI checked them against the model's config; the Python API (and the framework
    adapters) loaded the weights first."""
    from _tiny import save_tiny

    from attnrank.llm import models

    path = str(save_tiny(tmp_path / "m"))  # 2 layers, 4 heads
    loads: list[object] = []
    monkeypatch.setattr(models, "_load_cached", lambda *a: loads.append(a))
    with pytest.raises(InputError, match=r"head pairs 99-0 are out of range: this model has 2 layers"):
        AttentionReranker(path, heads="1-0,99-0", config="icr")
    heads = tmp_path / "heads.json"
    heads.write_text('{"heads": ["0-9"]}')
    with pytest.raises(InputError, match=r"head pairs 0-9 are out of range"):
        AttentionReranker(path, heads=str(heads), config="icr")
    from attnrank.prune.pruner import ContextPruner

    with pytest.raises(InputError, match=r"head pairs 99-0 are out of range"):  # the pruner's too
        ContextPruner(path, heads="99-0")
    assert loads == []


def test_rank_refuses_an_evidence_flag_and_a_query_id_of_other_types():
    """return_evidence="no" returned evidence (a truthy string); query_id=3 was kept as an int and
    query_id="" passed, for write_run to refuse after the work."""
    from attnrank.rerank.attention import AttentionReranker

    rr = AttentionReranker(config="signals")
    docs = ["Paris is the capital of France.", "Berlin is cold."]
    with pytest.raises(InputError, match=r"return_evidence='no' is a str; give True or False"):
        rr.rank("capital?", docs, return_evidence="no")
    for bad in (3, "", "  "):
        with pytest.raises(InputError, match=r"query_id=.* is not a non-empty string"):
            rr.rank("capital?", docs, query_id=bad)
    assert rr.rank("capital?", docs, query_id="q1").query_id == "q1"
