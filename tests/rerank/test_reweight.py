"""Attention re-weighting (attnrank.rerank.reweight) on hand-made windows with known outputs, and
inside the AttentionReranker on a tiny random Llama."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _tiny import RERANK_QUERY, rerank_docs

from attnrank.errors import InputError
from attnrank.llm.rows import WindowRows, document_scores, token_scores
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.position import SlotProfile
from attnrank.rerank.reweight import (
    Reweighting,
    content_mask,
    idf_weights,
    normalized_entropy,
    reweighted_document_scores,
    sink_filtered_rows,
)
from attnrank.rerank.terms import token_terms, tokenized_query_terms
from attnrank.types import Document

# -- sink filtering ---------------------------------------------------------------------------
SINK_TOKENS = [
    "<|im_start|>",
    "Here",
    ":",
    "ĊĊ",  # 0-3: template, outside the spans
    "[",
    "1",
    "]",
    "Ġcat",
    "Ġdog",
    ".",
    "ĊĊ",  # 4-10: doc 0 is 4..9
    "[",
    "2",
    "]",
    "Ġcow",
    "ĊĊ",
]  # 11-15: doc 1 is 11..14
SINK_SPANS = [(4, 10), (11, 15)]
CONTENT = [7, 8, 14]


def _sink_rows():
    real = np.full((2, 16), 0.02)
    null = np.full((2, 16), 0.03)
    real[:, 0] = null[:, 0] = 0.5  # the BOS sink
    real[0, CONTENT], null[0, CONTENT] = [0.10, 0.05, 0.05], [0.05, 0.05, 0.10]
    real[1, CONTENT], null[1, CONTENT] = [0.30, 0.10, 0.00], [0.10, 0.10, 0.20]
    return real, null


def test_content_mask_drops_special_labels_delimiters_punctuation_and_outside_spans():
    mask = content_mask(SINK_TOKENS, SINK_SPANS)
    assert np.flatnonzero(mask).tolist() == CONTENT


def test_sink_removal_renormalizes_each_head_separately_for_real_and_null():
    real, null = _sink_rows()
    mask = content_mask(SINK_TOKENS, SINK_SPANS)
    rows = sink_filtered_rows(real, null, mask)
    expected = np.zeros((2, 16))
    expected[0, CONTENT] = np.array([0.50, 0.25, 0.25]) - [0.25, 0.25, 0.50]
    expected[1, CONTENT] = np.array([0.75, 0.25, 0.00]) - [0.25, 0.25, 0.50]
    np.testing.assert_allclose(rows, expected, atol=1e-12)
    np.testing.assert_allclose(sink_filtered_rows(real, None, mask)[:, CONTENT].sum(1), [1.0, 1.0])
    zero = sink_filtered_rows(np.where(mask, 0.0, real), None, mask)  # no attention on content
    assert not zero.any()


def test_sink_filtering_refuses_non_finite_attention_as_the_plain_path_does():
    """A NaN inside the content made the head's total NaN, and the head became a zero row."""
    real, null = _sink_rows()
    mask = content_mask(SINK_TOKENS, SINK_SPANS)
    for bad_real in (True, False):
        r, n = real.copy(), null.copy()
        (r if bad_real else n)[0, CONTENT[0]] = np.nan
        with pytest.raises(InputError, match="non-finite attention score"):
            sink_filtered_rows(r, n, mask)


def test_sink_scores_through_the_entry():
    real, null = _sink_rows()
    w = WindowRows([0, 1], SINK_SPANS, list(range(16)), real, null)
    scores = reweighted_document_scores(w, SINK_TOKENS, set(), Reweighting(sink=True), use_filter=False)
    np.testing.assert_allclose(scores, [0.75 + 0.0, -0.75], atol=1e-12)  # doc 0: cat .25+.5, dog 0


# -- token texts and terms ---------------------------------------------------------------------


def test_deepseek_full_width_special_tokens_are_special():
    """DeepSeek's BOS <｜begin▁of▁sentence｜> holds ▁: the window was read as SentencePiece, so Ġ
    and Ċ were never decoded (terms 'ġthe', and 'ĊĊ' counted as content by sink filtering)."""
    toks = ["<｜begin▁of▁sentence｜>", "Ġthe", "ĊĊ", "Ġcat"]
    assert token_terms(toks) == ["", "the", "", "cat"]
    assert content_mask(toks, [(0, 4)], labelled=False).tolist() == [False, True, False, True]


# -- IDF ----------------------------------------------------------------------------------------
IDF_TOKENS = [
    "ĊĊ",
    "[",
    "1",
    "]",
    "Ġcat",
    "Ġsat",  # 0-5: doc 0 is 1..5
    "ĊĊ",
    "[",
    "2",
    "]",
    "Ġcat",
    "Ġran",  # 6-11: doc 1 is 7..11
    "ĊĊ",
    "[",
    "3",
    "]",
    "Ġcat",
    "Ġdog",
    "ĊĊ",
]  # 12-18: doc 2 is 13..17
IDF_SPANS = [(1, 6), (7, 12), (13, 18)]
EPS = 0.5


def test_idf_weights_of_a_three_document_window():
    terms = token_terms(IDF_TOKENS, "piece")
    docs = [range(s + 3, e) for s, e in IDF_SPANS]  # without the "[i]" labels
    w = idf_weights(terms, docs, eps=EPS, query_terms={"cat", "dog"})
    everywhere = (math.log(4 / 4) + EPS) / (math.log(4 / 2) + EPS)
    np.testing.assert_allclose(w[[4, 10, 16]], everywhere)
    assert w[17] == 1.0  # "dog": one document keeps weight 1
    assert w[5] == w[11] == 1.0  # not query terms
    w_all = idf_weights(terms, docs, eps=EPS)
    np.testing.assert_allclose(w_all[[5, 11, 17]], 1.0)
    np.testing.assert_allclose(w_all[4], everywhere)


def test_idf_through_the_entry_in_both_units():
    real = np.full((1, 19), 0.1)
    w = WindowRows([0, 1, 2], IDF_SPANS, list(range(19)), real)
    everywhere = (math.log(4 / 4) + EPS) / (math.log(4 / 2) + EPS)
    for unit in ("piece", "word"):
        cfg = Reweighting(idf=True, idf_unit=unit, idf_eps=EPS)
        scores = reweighted_document_scores(w, IDF_TOKENS, {"cat", "dog"}, cfg, use_filter=False)
        np.testing.assert_allclose(scores, [0.4 + 0.1 * everywhere] * 2 + [0.3 + 0.1 * everywhere + 0.1])


# -- entropy --------------------------------------------------------------------------------------


def test_normalized_entropy():
    assert normalized_entropy(np.array([0.1, 0.1, 0.1, 0.1])) == pytest.approx(1.0)
    assert normalized_entropy(np.array([0.0, 0.0, 0.4, -0.1])) == 0.0
    assert normalized_entropy(np.array([-1.0, -2.0])) == 1.0  # nothing positive
    assert normalized_entropy(np.array([0.3])) == 1.0


@pytest.fixture()
def entropy_window():
    real = np.array([[0.1, 0.1, 0.1, 0.1, 0.0, 0.0, 0.4, 0.0]])
    return WindowRows([0, 1], [(0, 4), (4, 8)], list(range(8)), real)


ENTROPY_TOKENS = ["Ġa", "Ġb", "Ġc", "Ġd", "Ġe", "Ġf", "Ġg", "Ġh"]


def score(window, cfg, terms=frozenset()):
    return reweighted_document_scores(window, ENTROPY_TOKENS, set(terms), cfg, use_filter=False)


def test_entropy_blend_uniform_unchanged_one_hot_zero(entropy_window):
    np.testing.assert_allclose(score(entropy_window, Reweighting(entropy=True, entropy_beta=1.0)), [0.4, 0.0])
    np.testing.assert_allclose(score(entropy_window, Reweighting(entropy=True, entropy_beta=0.0)), [0.4, 0.4])


def test_entropy_temper(entropy_window):
    plain = score(entropy_window, Reweighting())
    np.testing.assert_array_equal(
        score(entropy_window, Reweighting(entropy=True, entropy_mode="temper", temper_gamma=1.0)), plain
    )
    tempered = score(entropy_window, Reweighting(entropy=True, entropy_mode="temper", temper_gamma=0.5))
    np.testing.assert_allclose(tempered, [4 * math.sqrt(0.1), math.sqrt(0.4)])


# -- all off, slot correction, validation -------------------------------------------------------------


def test_all_off_equals_plain_icr_aggregation():
    rng = np.random.default_rng(0)
    real, null = rng.random((3, 19)), rng.random((3, 19))
    w = WindowRows([0, 1, 2], IDF_SPANS, list(range(19)), real, null)
    for flt in (True, False):
        expected = document_scores(token_scores(w.rows), IDF_SPANS, use_filter=flt)
        got = reweighted_document_scores(w, IDF_TOKENS, {"cat"}, Reweighting(), use_filter=flt)
        np.testing.assert_array_equal(got, expected)


def test_slot_correction_through_the_entry(entropy_window):
    profile = SlotProfile(2, (3.0, 1.0), (0.0, 0.0), "m", "f", 1, "2026-01-01T00:00:00+00:00")
    got = reweighted_document_scores(
        entropy_window, ENTROPY_TOKENS, set(), Reweighting(slot_correction=True), use_filter=False, slot_profile=profile
    )
    np.testing.assert_allclose(got, [0.4 - 1.0, 0.4 + 1.0])
    with pytest.raises(InputError, match="needs a slot_profile"):
        reweighted_document_scores(entropy_window, ENTROPY_TOKENS, set(), Reweighting(slot_correction=True))


def test_bad_settings_and_inputs(entropy_window):
    with pytest.raises(InputError, match="idf_unit='char'"):
        Reweighting(idf_unit="char")
    with pytest.raises(InputError, match="idf_eps=0"):
        Reweighting(idf_eps=0)
    with pytest.raises(InputError, match="idf_eps=inf must be finite"):  # inf/inf: NaN weights, no token kept
        Reweighting(idf_eps=float("inf"))
    with pytest.raises(InputError, match="entropy_beta=inf must be finite"):
        Reweighting(entropy_beta=float("inf"))
    with pytest.raises(InputError, match="temper_gamma=1.5"):
        Reweighting(temper_gamma=1.5)
    with pytest.raises(InputError, match="entropy_mode='x'"):
        Reweighting(entropy_mode="x")
    for name, value in (
        ("idf_eps", None),
        ("entropy_beta", "1"),
        ("temper_gamma", True),
    ):  # (a TypeError, or True as 1)
        with pytest.raises(InputError, match=f"{name}={value!r} must be a number"):
            Reweighting(**{name: value})
    with pytest.raises(InputError, match="3 token strings for 8"):
        reweighted_document_scores(entropy_window, ["a", "b", "c"], set(), Reweighting(sink=True))
    # a string turned sink filtering on; a string for the whole setting failed once the model had loaded
    with pytest.raises(InputError, match="sink='false' must be True or False"):
        Reweighting(sink="false")  # type: ignore[arg-type]
    from attnrank.rerank.config import RerankConfig

    with pytest.raises(InputError, match="reweight='sink' is not a Reweighting or None"):
        RerankConfig(heads="auto-or-all", reweight="sink")  # type: ignore[arg-type]


# -- inside the reranker -------------------------------------------------------------------------

DOCS = rerank_docs()
QUERY = RERANK_QUERY


def test_reranker_all_off_is_identical_to_no_reweight(llm):
    plain = AttentionReranker(llm, signals=None).score(QUERY, DOCS)
    np.testing.assert_array_equal(
        AttentionReranker(llm, reweight=Reweighting(), signals=None).score(QUERY, DOCS), plain
    )


@pytest.mark.parametrize(
    "cfg",
    [
        Reweighting(sink=True),
        Reweighting(sink=True, idf=True, idf_unit="word", entropy=True),
        Reweighting(idf=True, idf_query_only=False, entropy=True, entropy_mode="temper"),
    ],
)
def test_reranker_applies_reweighting(llm, cfg):
    rr = AttentionReranker(llm, reweight=cfg, signals=None)
    scores = rr.score(QUERY, DOCS)
    assert scores.shape == (4,) and np.isfinite(scores).all()
    # the reranker's scores are the re-weighted ones of its own window, not the plain ICR sums
    (w,) = rr.windows(QUERY, DOCS)
    tokens = llm.tokenizer.convert_ids_to_tokens(w.input_ids)
    terms = tokenized_query_terms(llm.tokenizer, QUERY, cfg.idf_unit)
    expected = np.zeros(4)
    expected[w.doc_index] = reweighted_document_scores(w, tokens, terms, cfg)
    np.testing.assert_allclose(scores, expected)
    assert not np.allclose(scores, AttentionReranker(llm, signals=None).score(QUERY, DOCS))
    res = rr.rank(QUERY, DOCS, return_evidence=True)
    assert len(res) == 4 and res[0].evidence["attention_tokens"]


def test_reranker_refuses_slot_correction_without_profile(llm):
    with pytest.raises(InputError, match="needs slot_profile="):
        AttentionReranker(llm, reweight=Reweighting(slot_correction=True), signals=None)


def test_content_mask_keeps_a_leading_citation_in_unlabelled_spans():
    """Sentence spans (the pruner's) carry no [i] label: a sentence beginning with a citation such
    as "[3]" keeps its "3", where a passage span's leading label is dropped."""
    tokens = ["<s>", "[", "3", "]", "ĠSmith", "Ġshowed", "."]
    spans = [(1, 7)]
    assert np.flatnonzero(content_mask(tokens, spans)).tolist() == [4, 5]
    assert np.flatnonzero(content_mask(tokens, spans, labelled=False)).tolist() == [2, 4, 5]


def test_a_block_passage_that_begins_with_a_citation_keeps_it():
    """Blocks carry no [i] slot label (llm.blocks.block_text): the sink filter and the IDF step
    must not drop a block's own leading "[3]" as if it were one."""
    tokens = ["<s>", "[", "3", "]", "ĠSmith", "Ġshowed", ".", "ĊĊ", "Ġcats", "Ġpurr"]
    spans = [(1, 7), (8, 10)]
    real = np.zeros((1, len(tokens)))
    real[0, 2] = 0.6  # the citation's number draws the attention
    real[0, [4, 8]] = 0.2
    block = WindowRows([0, 1], spans, list(range(len(tokens))), real, labelled=False)
    full = WindowRows([0, 1], spans, list(range(len(tokens))), real)
    for cfg in (Reweighting(sink=True), Reweighting(sink=True, idf=True)):
        in_block = reweighted_document_scores(block, tokens, set(), cfg, use_filter=False)
        as_labelled = reweighted_document_scores(full, tokens, set(), cfg, use_filter=False)
        assert in_block[0] > as_labelled[0]  # the "3" counts for the block's passage


def test_a_slot_profile_of_an_adapted_model_is_named_when_used_without_the_adapter(caplog):
    """Only another model id or fingerprint warned: a profile measured on a model with a head
    adapter corrected the plain model's slots by the adapted model's bias, without a word."""
    import logging

    from attnrank.rerank.reweight import check_setup

    profile = SlotProfile(2, (0.1, 0.2), (0.01, 0.01), "m", "f" * 64, 5, "2026-12-05", adapter="a" * 12)
    with caplog.at_level(logging.WARNING, logger="attnrank.rerank.reweight"):
        check_setup(profile, "m", "f" * 64)
    assert "measured with the head adapter aaaaaaaaaaaa used with a model without one" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnrank.rerank.reweight"):
        check_setup(profile, "m", "f" * 64, "a" * 12)
    assert not caplog.text


def test_a_passage_with_no_content_token_ranks_below_every_real_one_under_sink_filtering(llm):
    """Sink-filtered scores straddle 0 over the real passages, so a passage of punctuation alone
    (whose tokens sink filtering reads none of), left at 0, ranked above about half of them."""
    docs = [
        Document("a", "Paris is the capital of France."),
        Document("b", "Berlin is in Germany."),
        Document("dots", "... !!!"),
        Document("c", "Bananas are yellow."),
    ]
    for reweight in (Reweighting(sink=True), Reweighting(sink=True, entropy=True)):
        res = AttentionReranker(llm, signals=None, heads="all", reweight=reweight).rank("capital of France?", docs)
        assert res.ids[-1] == "dots"
        assert res.scores[-1] < min(res.scores[:-1])
    every = [Document("x", "..."), Document("y", "!!!")]  # nothing to put them below: left as they were
    res = AttentionReranker(llm, signals=None, heads="all", reweight=Reweighting(sink=True)).rank("capital?", every)
    assert list(res.scores) == [0.0, 0.0]


def test_a_passage_with_no_content_token_ranks_last_across_windows_too(llm):
    """Put below the lowest of its own window only, a punctuation passage still outranked real
    ones of other windows once the windows' scores were merged (here 7th of 11)."""
    texts = [
        "Rivers run to the sea.",
        "Towns grow by rivers.",
        "Bananas are yellow.",
        "A river has banks.",
        "Cats sleep a lot.",
        "Mountains are tall.",
        "Rivers carry silt downstream.",
        "Apples fall.",
        "The Nile is a river.",
        "Tea is hot.",
    ]
    docs = [Document(f"d{i}", t) for i, t in enumerate(texts)]
    docs.insert(2, Document("dots", "... !!!"))
    rr = AttentionReranker(llm, signals=None, heads="all", reweight=Reweighting(sink=True), max_prompt_tokens=200)
    assert len(rr.windows("rivers?", docs)) > 1
    res = rr.rank("rivers?", docs)
    assert res.ids[-1] == "dots" and res.scores[-1] < min(res.scores[:-1])
