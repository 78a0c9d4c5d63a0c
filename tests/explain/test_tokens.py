"""What each token adds to a passage's text (attnrank.explain.tokens.token_texts)."""

from __future__ import annotations

import pytest

from attnrank.explain.tokens import token_texts


@pytest.fixture(scope="module")
def byte_fallback_tokenizer():
    """A SentencePiece-style BPE with byte fallback (as Llama 2, Mistral and Gemma ship): characters
    outside its vocabulary become runs of byte tokens, decoded together."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(256))],
        initial_alphabet=list("abcdefghijklmnopqrstuvwxyz▁é"),
    )
    tk.train_from_iterator(["the capital of france is paris", "café naïve the cat sat"] * 50, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("text", ["the cat 😀😀 sat", "paris 日本 the", "[1] Café\nthe cat 😀 日本 paris"])
def test_byte_fallback_pieces_spell_the_text_once(byte_fallback_tokenizer, text):
    """Byte fallback decodes a whole run of byte tokens to U+FFFDs while any of them is incomplete,
    taking back a character already shown: the page read "the cat 😀�😀😀 sat"."""
    ids = byte_fallback_tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = token_texts(byte_fallback_tokenizer, ids)
    assert "".join(pieces) == byte_fallback_tokenizer.decode(ids) == text and "\ufffd" not in "".join(pieces)
