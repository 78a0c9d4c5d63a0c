"""Query likelihood (UPR) as a fused scorer feature, and the preset ``likelihood``."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import RERANK_QUERY, rerank_docs, tiny_llm

from attnrank.errors import InputError
from attnrank.llm.blocks import BlockMemo
from attnrank.llm.likelihood import continuation_logprob
from attnrank.llm.states import StateCache
from attnrank.rerank.attention import AttentionReranker
from attnrank.rerank.config import RerankConfig
from attnrank.rerank.fused import FusedWeights
from attnrank.rerank.likelihood import (
    passage_prompt,
    prompt_ids,
    query_ids,
    query_likelihood,
    query_prior,
)
from attnrank.rerank.signals import SignalComputer
from attnrank.types import Document


def _scores(*args, **kwargs) -> np.ndarray:
    """Each context's mean log-probability per token."""
    return continuation_logprob(*args, **kwargs).mean(1, dtype=np.float64)


def _ql(*args, **kwargs) -> np.ndarray:
    """UPR's score of each document: the mean of its query likelihood over the query's tokens."""
    return query_likelihood(*args, **kwargs).mean(1, dtype=np.float64)


def test_each_passage_is_scored_in_its_own_prompt(llm):
    """A passage's score is the query's likelihood after its own UPR prompt: the other candidates
    and their order do not change it."""
    docs = rerank_docs()
    tok = llm.tokenizer
    scores = _ql(llm, RERANK_QUERY, docs)
    ctx = [tok(passage_prompt(d.title, d.text), add_special_tokens=False)["input_ids"] for d in docs]
    cont = tok(" " + RERANK_QUERY, add_special_tokens=False)["input_ids"]
    np.testing.assert_allclose(scores, _scores(llm, ctx, cont), atol=1e-6)
    reversed_scores = _ql(llm, RERANK_QUERY, docs[::-1])
    np.testing.assert_allclose(reversed_scores[::-1], scores, atol=1e-5)
    np.testing.assert_allclose(_ql(llm, RERANK_QUERY, docs[:1]), scores[:1], atol=1e-5)


def test_token_likelihoods_and_the_prior_are_the_querys_tokens_after_each_prompt(llm):
    """Per token: the query's tokens after each passage's prompt, and after the prompt with an
    empty passage (the prior, the same for every passage)."""
    docs = rerank_docs()[:4]
    tok = llm.tokenizer
    ids = query_ids(tok, RERANK_QUERY)
    assert ids == tok(" " + RERANK_QUERY, add_special_tokens=False)["input_ids"]
    tokens = query_likelihood(llm, RERANK_QUERY, docs)
    assert tokens.shape == (len(docs), len(ids)) and tokens.dtype == np.float32
    ctx = [tok(passage_prompt(d.title, d.text), add_special_tokens=False)["input_ids"] for d in docs]
    np.testing.assert_allclose(tokens, continuation_logprob(llm, ctx, ids), atol=1e-6)
    prior = query_prior(llm, RERANK_QUERY)
    empty = tok(passage_prompt(None, ""), add_special_tokens=False)["input_ids"]
    np.testing.assert_allclose(prior, continuation_logprob(llm, [empty], ids)[0], atol=1e-6)
    assert prior.shape == (len(ids),) and not np.allclose(tokens - prior, 0, atol=1e-3)  # a passage moves them


def test_a_bos_token_leads_each_prompt_where_the_tokenizer_puts_one(llm):
    """A tokenizer that starts every text with BOS (as Llama's and Gemma's do) gets it before each
    prompt, as the model saw text in training; one that adds nothing gets the plain prompts."""
    from dataclasses import replace

    from _tiny import tiny_tokenizer
    from tokenizers import processors

    docs = rerank_docs()[:3]
    tok = tiny_tokenizer()
    bos = tok.bos_token_id
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)]
    )
    assert tok("a")["input_ids"][0] == bos
    cont = tok(" " + RERANK_QUERY, add_special_tokens=False)["input_ids"]
    plain = [tok(passage_prompt(d.title, d.text), add_special_tokens=False)["input_ids"] for d in docs]
    with_bos = _scores(llm, [[bos, *c] for c in plain], cont)
    without = _scores(llm, plain, cont)
    assert not np.allclose(with_bos, without)  # the lead token changes the score
    np.testing.assert_allclose(_ql(replace(llm, tokenizer=tok), RERANK_QUERY, docs), with_bos, atol=1e-6)
    np.testing.assert_allclose(_ql(llm, RERANK_QUERY, docs), without, atol=1e-6)


def test_passages_are_cut_to_the_words_and_the_context():
    small = tiny_llm(layers=1, max_positions=200)
    long = Document("long", "word " * 500)
    cut = _ql(small, "a question?", [long, Document("short", " ".join(["word"] * 20))])  # cut to fit, no error
    assert np.isfinite(cut).all()
    by_words = _ql(small, "a question?", [long], max_doc_words=20)
    np.testing.assert_allclose(by_words, cut[1:], atol=1e-5)  # 20 words: the short passage's prompt
    with pytest.raises(InputError, match="too long for a passage beside it"):
        _ql(small, "q " * 300, [long])


def test_kept_prompt_ids_are_the_ones_tokenizing_gives_under_every_limit(llm):
    """The memo serves a passage's prompt ids only while its limit could not cut it; a prompt
    the token limit did cut is never kept (its ids follow the limit, which follows the query)."""
    tok, memo = llm.tokenizer, BlockMemo()
    docs = [*rerank_docs(), Document("long", "word " * 120, title="A title")]
    every = [4000] * len(docs)
    fresh = prompt_ids(tok, docs, 300, every, None)
    assert prompt_ids(tok, docs, 300, every, memo) == fresh
    assert len(memo) == len(docs)
    assert prompt_ids(tok, docs, 300, every, memo) == fresh  # served from the memo
    for words, limit in [(300, 50), (300, 3), (10, 4000), (10, 20)]:
        limits = [limit] * len(docs)
        assert prompt_ids(tok, docs, words, limits, memo) == prompt_ids(tok, docs, words, limits, None)
    mixed = [4000, 3] * (len(docs) // 2) + [4000] * (len(docs) % 2)
    assert prompt_ids(tok, docs, 300, mixed, memo) == [
        prompt_ids(tok, [d], 300, [n], None)[0] for d, n in zip(docs, mixed)
    ]
    cut = BlockMemo()
    prompt_ids(tok, docs[-1:], 300, [30], cut)  # the long passage cut to 30 tokens: not kept
    assert len(cut) == 0


def test_the_memo_tells_a_title_of_none_from_the_title_none(llm):
    """Keyed by f"{title}\\0{text}", Document(title=None) and Document(title="None") shared one
    entry: the second was scored with the first's prompt."""
    tok, memo = llm.tokenizer, BlockMemo()
    untitled, titled = Document("a", "the cat sat", title=None), Document("b", "the cat sat", title="None")
    prompt_ids(tok, [untitled], 300, [4000], memo)
    assert prompt_ids(tok, [titled], 300, [4000], memo) == prompt_ids(tok, [titled], 300, [4000], None)
    assert prompt_ids(tok, [Document("c", "the cat sat", title="")], 300, [4000], memo) == prompt_ids(
        tok, [untitled], 300, [4000], None
    )


def test_preset_sums_the_z_scores_of_bm25_dense_and_likelihood(llm):
    docs = rerank_docs()
    rr = AttentionReranker(llm, config="likelihood")
    assert rr.uses_llm and not rr.uses_attention and "features=['bm25', 'dense', 'likelihood']" in repr(rr)
    texts = [d.full_text for d in docs]
    signals = SignalComputer(backend=rr.signals.backend)(RERANK_QUERY, texts, ["bm25", "dense"])
    ql = _ql(llm, RERANK_QUERY, docs, max_doc_words=rr.config.max_doc_words)
    z = {k: (v - v.mean()) / v.std() for k, v in {**signals, "likelihood": ql}.items()}
    expected = z["bm25"] + z["dense"] + z["likelihood"]
    np.testing.assert_allclose(rr.score(RERANK_QUERY, docs), expected, rtol=1e-9, atol=1e-9)
    res = rr.rank(RERANK_QUERY, docs)
    assert [d.id for d in res] == [docs[i].id for i in np.argsort(-expected, kind="stable")]
    by_id = {d.id: i for i, d in enumerate(docs)}
    assert all(d.stage_scores["likelihood"] == pytest.approx(ql[by_id[d.id]]) for d in res)


def test_passages_seen_by_an_earlier_query_reuse_their_states(llm):
    """The preset keeps each prompt's states in the reranker's state cache: another query over the
    same passages reuses them and scores as computed in full; ``state_cache_mb=0`` keeps none."""
    docs = rerank_docs()
    rr = AttentionReranker(llm, config="likelihood")
    first = rr.score(RERANK_QUERY, docs)
    assert len(rr.states) == len(docs) and rr.states.hits == 0
    other = "which passage is about cats?"
    again = rr.score(other, docs[::-1])
    assert rr.states.hits == len(docs)
    full = _ql(llm, other, docs[::-1], max_doc_words=rr.config.max_doc_words)
    res = rr.rank(other, docs[::-1])
    by_id = {d.id: full[i] for i, d in enumerate(docs[::-1])}
    assert all(d.stage_scores["likelihood"] == pytest.approx(by_id[d.id], abs=1e-5) for d in res)
    assert not np.allclose(first, again[::-1])
    none = AttentionReranker(llm, config=RerankConfig.preset("likelihood", state_cache_mb=0))
    np.testing.assert_allclose(none.score(RERANK_QUERY, docs), first, atol=1e-5)
    assert len(none.states) == 0 and none.signals.cache_vectors == 0  # nothing kept between queries


def test_preset_reads_the_passage_cuts_and_refuses_attention_options():
    cfg = RerankConfig.preset("likelihood", max_doc_words=50)
    assert cfg.uses_likelihood and cfg.uses_llm and not cfg.uses_attention and cfg.max_doc_words == 50
    with pytest.raises(InputError, match="heads='all' configure"):
        RerankConfig.preset("likelihood", heads="all")
    assert not RerankConfig.preset("signals").uses_llm and RerankConfig.preset("fused").uses_llm


def test_weights_may_name_likelihood_beside_attention(llm):
    """Weights over attention and the likelihood: both computed, both kept beside the fused score."""
    weights = FusedWeights(["attention", "bm25", "likelihood"], [1.0, 0.5, 2.0], base_weights=[0.5, 2.0])
    assert weights.uses_llm and weights.text_signals == ["bm25"]
    assert weights.without_attention().features == ["bm25", "likelihood"]
    docs = rerank_docs()
    # nothing kept: a second call over kept states would round float32 otherwise (to ~1e-7 nats,
    # ~1e-5 here, where z-scores divide by the tiny model's small spread of likelihoods)
    rr = AttentionReranker(llm, "0-1,2-3", signals=weights, state_cache_mb=0)
    res = rr.rank(RERANK_QUERY, docs)
    att = AttentionReranker(llm, "0-1,2-3", config="fused", signals=None).score(RERANK_QUERY, docs)
    ql = _ql(llm, RERANK_QUERY, docs, max_doc_words=rr.config.max_doc_words)
    bm25 = SignalComputer()(RERANK_QUERY, [d.full_text for d in docs], ["bm25"])["bm25"]
    expected = weights.score({"attention": att, "bm25": bm25, "likelihood": ql})
    np.testing.assert_allclose(rr.score(RERANK_QUERY, docs), expected, rtol=1e-9, atol=1e-9)
    assert all({"attention", "likelihood", "fused"} == set(d.stage_scores) for d in res)
    with pytest.raises(InputError, match="must be among"):
        FusedWeights(["likelihood", "perplexity"], [1.0, 1.0])


def test_a_passage_cut_to_the_context_is_scored_alike_beside_a_long_title():
    """Each passage's text limit is what the context leaves beside its own title: a candidate
    with a long title must not cut the other passages shorter (UPR scores each on its own)."""
    small = tiny_llm(layers=1, max_positions=256)
    a = Document("a", "alpha beta gamma delta " * 40)
    titled = Document("b", "short text", title="a long title " * 8)
    alone = query_likelihood(small, "a question?", [a])
    np.testing.assert_allclose(query_likelihood(small, "a question?", [a, titled])[:1], alone, atol=1e-6)


def test_a_texts_leading_whitespace_is_not_in_its_prompt():
    """The token cut counts a text without its leading whitespace; the prompt kept it, so a cut
    text overran the context by that whitespace's tokens and the whole query failed."""
    small = tiny_llm(layers=1, max_positions=256)
    padded, bare = Document("a", " \n" * 40 + "a" * 300), Document("a", "a" * 300)
    np.testing.assert_array_equal(_ql(small, "a question?", [padded]), _ql(small, "a question?", [bare]))
    assert passage_prompt("T", "  text") == passage_prompt("T", "text")


def test_a_passages_fields_score_alike_however_their_edges_are_padded(llm):
    """The prompt kept a title's whitespace (18 of SciFact's titles end in a space) and a text's
    trailing whitespace (62 LoCoMo turns), which the attention prompts strip: a passage scored
    otherwise for its padding, and a title of spaces was a title line of spaces."""
    padded = [Document("a", "Paris is the capital of France. \n", title=" Paris "), Document("b", "Rome.", title="  ")]
    bare = [Document("a", "Paris is the capital of France.", title="Paris"), Document("b", "Rome.")]
    np.testing.assert_array_equal(
        query_likelihood(llm, "a question?", padded), query_likelihood(llm, "a question?", bare)
    )
    assert (
        passage_prompt(" T \n", "text \t")
        == passage_prompt("T", "text")
        == "Passage: T\ntext\n" + ("Please write a question based on this passage.\nQuestion:")
    )
    assert passage_prompt("   ", "text") == passage_prompt(None, "text")


@pytest.mark.parametrize("query", ["   ", "", "capital \ud800?"])
def test_the_likelihood_functions_refuse_a_query_with_no_text_or_bad_unicode(llm, query):
    with pytest.raises(InputError, match="query"):
        query_likelihood(llm, query, rerank_docs())
    with pytest.raises(InputError, match="query"):
        query_prior(llm, query)


def test_a_query_too_long_for_the_prior_says_to_shorten_the_query():
    """query_prior's query past the context was refused by the generic check, which advised cutting
    the passage (max_doc_words / max_doc_tokens): the prior's passage is empty."""
    small = tiny_llm(layers=1, max_positions=256)
    with pytest.raises(
        InputError, match=r"the query is \d+ tokens, too long for the 256-token context.*shorten the query"
    ):
        query_prior(small, "q " * 300)


def test_max_doc_tokens_zero_is_refused_not_read_as_no_limit(llm):
    with pytest.raises(InputError, match="max_doc_tokens=0 must be >= 1"):
        query_likelihood(llm, "a question?", rerank_docs(), max_doc_tokens=0)


def test_a_title_longer_than_the_context_leaves_is_named_with_the_room(llm):
    from attnrank.errors import InputError
    from attnrank.rerank.likelihood import query_likelihood
    from attnrank.types import Document

    docs = [Document("short", "text", "A title"), Document("huge", "text", "word " * 20_000)]
    with pytest.raises(InputError, match=r"the title of document 'huge' is \d+ tokens, more than the \d+ the"):
        query_likelihood(llm, "a query", docs)


def test_the_rerankers_likelihood_takes_documents_as_score_does_and_none_at_all(llm):
    """Strings were an AttributeError there ('str' has no title); no candidate with a state cache
    an IndexError (the continuation read off the first sequence)."""
    rr = AttentionReranker(llm, config="likelihood", state_cache_mb=0)  # both calls cold: the same shapes
    docs = rerank_docs()
    plain = [Document(str(i), d.text) for i, d in enumerate(docs)]  # a string becomes a document: its id its position
    np.testing.assert_allclose(rr.likelihood(RERANK_QUERY, [d.text for d in docs]), rr.likelihood(RERANK_QUERY, plain))
    with pytest.raises(InputError, match="no text"):
        rr.likelihood(RERANK_QUERY, [Document("e", "  ")])
    states = StateCache(1 << 20)
    assert continuation_logprob(llm, [], [5, 6], states=states).shape == (0, 2)


def test_a_non_finite_likelihood_names_the_document_and_the_dtype():
    """A NaN likelihood (an overflow) reached the fusion, whose message asked the user to give the
    signal a value."""
    llm = tiny_llm(layers=2)
    reranker = AttentionReranker(llm, state_cache_mb=0)
    docs = rerank_docs()[:2]
    llm.model.get_output_embeddings().weight.data[:] = float("nan")
    with pytest.raises(InputError, match=r"query likelihood of document '.+' is nan; check the model's dtype"):
        reranker.rank(RERANK_QUERY, docs)


def test_a_batch_names_a_query_too_long_for_the_likelihood_before_any_work(embedded):
    """It was refused inside the likelihood of its own turn: the earlier queries were scored,
    their results lost, and the message named no query."""
    rr = AttentionReranker(tiny_llm(layers=1, max_positions=256), config="likelihood")
    docs = rerank_docs()
    with pytest.raises(InputError, match=r"^query #2: the query is \d+ tokens, too long"):
        rr.rank_batch(["a", "b", "q " * 150], [docs] * 3)
    assert embedded == [] and len(rr.states) == 0
    with pytest.raises(InputError, match="too long for a passage"):  # one query: before its signals
        rr.rank("q " * 150, docs)
    assert embedded == []


def test_forget_passages_makes_the_next_query_a_first_visit(llm):
    """Benchmarks cleared the passage states alone: a 'cold' query then found its passages
    tokenized and embedded by the warm-up query, and was timed faster than a first visit."""
    rr = AttentionReranker(llm, config="likelihood")
    docs = rerank_docs()
    first = rr.rank(RERANK_QUERY, docs)
    assert len(rr.states) and len(rr._prompt_memo) and rr.signals.vectors
    rr.forget_passages()
    assert not len(rr.states) and not len(rr._prompt_memo) and not rr.signals.vectors and not len(rr._blocks_memo)
    assert rr._prompt_memo.nbytes == 0 and rr.states.nbytes == 0
    misses = rr.states.misses
    again = rr.rank(RERANK_QUERY, docs)  # a first visit: every prompt's states computed again
    assert rr.states.misses == misses + len(docs) and [d.id for d in again] == [d.id for d in first]
