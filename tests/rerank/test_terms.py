"""Token texts and terms (attnrank.rerank.terms): byte-level and SentencePiece pieces read as
text, their per-piece and per-word terms, and a query's terms as the documents' tokens show them."""

from __future__ import annotations

from _tiny import tiny_tokenizer

from attnrank.rerank.terms import token_terms, token_texts, tokenized_query_terms


def test_piece_vs_word_terms():
    toks = ["Ġca", "t", "Ġdo", "g", ".", "ĠCat"]
    assert token_terms(toks, "piece") == ["ca", "t", "do", "g", "", "cat"]
    assert token_terms(toks, "word") == ["cat", "cat", "dog", "dog", "", "cat"]
    # a new word after punctuation inside a token run, and bytes of one character split in two
    assert token_terms(["Ġco", "-", "op", "Ġcaf", "Ã", "©"], "word") == ["co", "", "op", "café", "café", "café"]
    assert token_texts(["Ġcaf", "Ã", "©"])[0] == " caf"


def test_sentencepiece_terms_and_byte_fallback():
    toks = ["<s>", "▁Par", "is", "▁is", "<0x0A>", "▁big"]
    assert token_texts(toks) == ["", " Par", "is", " is", "\n", " big"]
    assert token_terms(toks, "word") == ["", "paris", "paris", "is", "", "big"]


def test_tokenized_query_terms_matches_document_pieces():
    tok = tiny_tokenizer()
    assert tokenized_query_terms(tok, "Capital of France?", "word") == {"capital", "of", "france"}
    assert "c" in tokenized_query_terms(tok, "Capital of France?", "piece")
