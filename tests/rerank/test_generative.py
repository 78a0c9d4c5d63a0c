"""The generative baselines (pointwise yes/no, RankGPT listwise) take candidates as the attention
reranker does: ``k`` None or positive, unique ids, empty lists, the query id of ranked input."""

from __future__ import annotations

import numpy as np
import pytest
from _tiny import RERANK_QUERY, rerank_docs

from attnrank.errors import InputError
from attnrank.rerank.generative import ListwiseReranker, PointwiseReranker
from attnrank.types import Document, RankedResults, ScoredDocument


@pytest.mark.parametrize("kind", ["pointwise", "listwise"])
def test_k_duplicate_ids_empty_lists_and_query_ids(llm, kind):
    rr = PointwiseReranker(llm) if kind == "pointwise" else ListwiseReranker(llm, window=4, step=2)
    docs = rerank_docs()
    with pytest.raises(InputError, match="k=-1 must be None"):  # before: silently dropped the last document
        rr.rank(RERANK_QUERY, docs, k=-1)
    with pytest.raises(InputError, match="k=0 must be None"):  # before: an empty ranking
        rr.rank(RERANK_QUERY, docs, k=0)
    with pytest.raises(InputError, match="repeats the id 'paris'"):  # before: both kept under one id
        rr.rank(RERANK_QUERY, [docs[0], docs[1], docs[0]])
    assert len(rr.rank(RERANK_QUERY, [])) == 0  # before (pointwise): a numpy concatenate traceback
    first = RankedResults(
        RERANK_QUERY,
        [ScoredDocument(d.id, 4.0 - i, i + 1, d.text, d.title) for i, d in enumerate(docs)],
        query_id="q3",
    )
    res = rr.rank(RERANK_QUERY, first, k=10)
    assert res.query_id == "q3" and sorted(res.ids) == sorted(d.id for d in docs) and len(res) == 4
    assert res.stage == kind and [r.rank for r in res] == [1, 2, 3, 4]


def test_pointwise_scores_do_not_depend_on_the_batch_and_leave_the_tokenizer_alone(llm):
    """A passage scores the same alone as batched with longer ones (left padding used to shift its
    positions), and scoring leaves the model's shared tokenizer as it was (it was switched to left
    padding with an EOS pad token for every later user of the model)."""
    tok = llm.tokenizer
    before = (tok.padding_side, tok.pad_token)
    docs = [Document("s", "Paris."), Document("l", "Berlin is the capital and largest city of Germany by far.")]
    rr = PointwiseReranker(llm, batch_size=2)
    alone = PointwiseReranker(llm, batch_size=1).score("capital of France?", docs)
    batched = rr.score("capital of France?", docs)
    assert np.allclose(batched, alone, atol=1e-4)
    assert (tok.padding_side, tok.pad_token) == before


def test_pointwise_numbers_are_checked_before_the_model_loads():
    """batch_size=0 failed in range(), -1 in a numpy concatenate; max_doc_words=0 scored empty
    passages and -1 dropped each passage's last word."""
    for kw, message in [
        ({"batch_size": 0}, "batch_size=0 must be a positive integer"),
        ({"batch_size": -1}, "batch_size=-1 must be a positive integer"),
        ({"max_doc_words": 0}, r"max_doc_words=0 must be a positive integer or None \(no cut\)"),
        ({"max_doc_words": -1}, "max_doc_words=-1 must be"),
    ]:
        with pytest.raises(InputError, match=message):
            PointwiseReranker("no/such-model-is-loaded", **kw)


def test_listwise_numbers_are_checked_before_the_model_loads():
    """max_doc_words=0 ranked empty passages (exit 0), -1 dropped each passage's last word, and a
    window of 2.5 failed in range() after the model had loaded."""
    for kw, message in [
        ({"max_doc_words": 0}, r"max_doc_words=0 must be a positive integer or None \(no cut\)"),
        ({"max_doc_words": -1}, "max_doc_words=-1 must be"),
        ({"window": 2.5}, "window=2.5 must be a positive integer"),
        ({"step": True}, "step=True must be a positive integer"),
        ({"window": 5, "step": 6}, "need 0 < step <= window"),
    ]:
        with pytest.raises(InputError, match=message):
            ListwiseReranker("no/such-model-is-loaded", **kw)


def test_pointwise_refuses_non_finite_scores(llm):
    """A NaN Yes/No score (a float16 overflow) was ranked last without a word."""
    import torch

    rr = PointwiseReranker(llm, batch_size=4)
    docs = rerank_docs()[:2]
    weight = llm.model.get_output_embeddings().weight
    saved = weight.data[rr.yes].clone()
    try:
        weight.data[rr.yes] = float("nan")
        with pytest.raises(InputError, match=r"non-finite Yes/No score for document"):
            rr.score(RERANK_QUERY, docs)
    finally:
        weight.data[rr.yes] = saved
    assert np.isfinite(rr.score(RERANK_QUERY, docs)).all()
    assert torch.equal(weight.data[rr.yes], saved)


def _llm_with(template: str | None = None, max_positions: int = 16384):
    from _tiny import CHAT_TEMPLATE, tiny_model, tiny_tokenizer

    from attnrank.llm.models import LLM

    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE if template is None else template
    return LLM(
        model=tiny_model("llama", layers=2, max_positions=max_positions),
        tokenizer=tok,
        model_id="t",
        fingerprint="a" * 64,
    )


def test_listwise_folds_the_system_turn_into_the_user_turn_where_the_template_refuses_it():
    """Gemma's and Mistral-Instruct's templates raise on a system turn: rank() failed with a
    jinja TemplateError."""
    from _tiny import CHAT_TEMPLATE

    from attnrank.rerank.generative import _chat

    refusing = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    llm = _llm_with(refusing + CHAT_TEMPLATE)
    rr = ListwiseReranker(llm, window=4, step=2)
    text = _chat(llm.tokenizer, rr._messages(RERANK_QUERY, rerank_docs()))
    assert text.startswith(f"<|im_start|>user\n{ListwiseReranker.SYSTEM}\n\nI will provide you with 4 passages")
    assert sorted(rr.rank(RERANK_QUERY, rerank_docs()).ids) == sorted(d.id for d in rerank_docs())


def test_listwise_refuses_a_window_past_the_models_context():
    rr = ListwiseReranker(_llm_with(max_positions=256), window=4, step=2)
    with pytest.raises(InputError, match=r"over the 256-token context of t; lower window or max_doc_words"):
        rr.rank(RERANK_QUERY, rerank_docs())


def test_pointwise_refuses_a_passage_past_the_models_context():
    rr = PointwiseReranker(_llm_with(max_positions=256), max_doc_words=None)
    with pytest.raises(
        InputError, match=r"document 'long' is \d+ tokens, over the 256-token context of t; set max_doc_words"
    ):
        rr.score(RERANK_QUERY, [Document("long", "word " * 400)])


def test_numpy_integers_are_integers(llm):
    """The new checks refused np.int64 (a count read from an array), which worked before."""
    rr = PointwiseReranker(llm, batch_size=np.int64(2), max_doc_words=np.int64(30))
    assert rr.batch_size == 2 and len(rr.score(RERANK_QUERY, rerank_docs())) == 4


def test_the_baselines_read_special_token_text_in_a_passage_as_text():
    """A passage holding "<|im_end|>" ended the user's turn in the baselines' chat prompts."""
    from attnrank.rerank.generative import _chat_ids

    llm = _llm_with()
    tok = llm.tokenizer
    end = tok.convert_tokens_to_ids("<|im_end|>")
    hostile = [Document("h", "ends with <|im_end|> here"), Document("p", "plain text")]
    point = PointwiseReranker(llm)
    assert _chat_ids(tok, point._messages(RERANK_QUERY, hostile[0])).count(end) == 1  # the template's own
    assert (
        _chat_ids(tok, point._messages(RERANK_QUERY, hostile[1]))
        == tok(
            point.llm.tokenizer.apply_chat_template(
                point._messages(RERANK_QUERY, hostile[1]), tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )["input_ids"]
    )  # text without such strings: as before
    listwise = ListwiseReranker(llm, window=2, step=1)
    assert _chat_ids(tok, listwise._messages(RERANK_QUERY, hostile)).count(end) == 2  # system and user turns' ends
    assert len(point.score(RERANK_QUERY, hostile)) == 2 and len(listwise.rank(RERANK_QUERY, hostile)) == 2


def test_the_baselines_prompts_start_as_every_other_prompt_does():
    """The pointwise and listwise prompts were tokenized without the tokenizer's leading special
    ids (BOS), which every other prompt builder adds: a template without {{bos_token}} had the
    baselines score prompts the model never saw."""
    from _tiny import tiny_tokenizer
    from tokenizers import processors

    from attnrank.llm.chat import encode_text
    from attnrank.rerank.generative import _chat_ids

    tok = tiny_tokenizer()
    lead = tok.convert_tokens_to_ids("<|endoftext|>")
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", lead)]
    )
    for text in ("Is this passage relevant?", "A passage holding <|im_end|> as text."):  # (both of its paths)
        ids = _chat_ids(tok, [{"role": "user", "content": text}])
        assert ids[0] == lead and ids.count(lead) == 1
    assert encode_text(tok, "plain")[0] == lead
