"""Document texts cut to a word limit (attnrank.llm.truncation); token limits: test_prompts.py."""

from __future__ import annotations

import logging

import pytest

from attnrank.errors import InputError
from attnrank.llm.truncation import Truncation, truncate_texts
from attnrank.types import Document


def test_texts_over_the_word_limit_are_cut_after_the_last_kept_word_and_recorded(caplog):
    docs = [Document("a", "one two  three\nfour five", "Title"), Document("b", "short text")]
    with caplog.at_level(logging.INFO, logger="attnrank.llm.truncation"):
        texts, cuts = truncate_texts(None, docs, 3, None)
    assert texts == ["one two  three", "short text"]  # the spacing inside the kept words is kept
    assert cuts == [Truncation(0, "a", "words", 5, 3)]
    assert "truncated 1 document text(s) of 2: a 5->3 words" in caplog.text
    assert truncate_texts(None, docs, None, None) == ([d.text for d in docs], [])


@pytest.mark.parametrize("kw", [{"max_words": 0, "max_tokens": None}, {"max_words": None, "max_tokens": -1}])
def test_a_limit_below_one_is_refused_naming_it(kw):
    name = "max_doc_words" if kw["max_words"] is not None else "max_doc_tokens"
    with pytest.raises(InputError, match=rf"{name}=-?\d+ must be >= 1"):
        truncate_texts(None, [Document("a", "text")], **kw)


def test_a_token_cut_counts_the_text_the_prompts_hold_not_its_leading_whitespace():
    """The prompts strip a text; its leading whitespace counted against max_doc_tokens, and a cut
    could keep nothing else (recorded "13->2 tokens", the passage scored on its slot label alone)."""
    from _tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    texts, cuts = truncate_texts(tok, [Document("a", "\n\nhello world"), Document("b", "ok")], None, 4)
    # a prefix of the text, its leading whitespace kept: a cut text's characters count from the text's
    # start as an uncut one's do (the blocks' offsets lost the whitespace's length, and sentence
    # spans mapped to tokens that many characters off)
    assert texts == ["\n\nhell", "ok"]
    assert cuts == [Truncation(0, "a", "tokens", len(tok("hello world")["input_ids"]), 4)]
    # whitespace alone over the limit cuts nothing (and read past the text's tokens: an IndexError)
    texts, cuts = truncate_texts(tok, [Document("a", "     hi")], None, 5)
    assert texts == ["     hi"] and cuts == []
