"""What the context's token strings (``tokenizer.convert_ids_to_tokens``) say: each token's surface
bytes and text, read off the window's vocabulary style (GPT-2 byte-level, SentencePiece, or as
given), and its normalized term, per token (``"piece"``) or per whole word (``"word"``), as
re-weighting's cross-document IDF step counts them (:mod:`attnrank.rerank.reweight`), with the
terms of a query tokenized as the documents' tokens show them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..errors import InputError
from ..llm.texts import tokenize

IDF_UNITS = ("piece", "word")


def _byte_decoder() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: printable bytes map to themselves, the other
    bytes to ``chr(256 + n)`` in byte order (``Ġ`` = space, ``Ċ`` = newline)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return {c: b for b, c in table.items()}


_BYTE_DECODER = _byte_decoder()
# <|im_start|>, <s>, </s>, <start_of_turn>, and DeepSeek's full-width <｜begin▁of▁sentence｜> (whose ▁
# would otherwise read a byte-level window as SentencePiece)
_SPECIAL = re.compile(r"<\|[^<>]*\|>|<｜[^<>]*｜>|</?[A-Za-z_]+>")
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte pieces


def token_bytes(token_strings: Sequence[str | None]) -> list[bytes]:
    """The surface bytes of each token; special tokens give ``b""``.

    The vocabulary style is read off the window: SentencePiece if any token holds ``▁``
    (``▁`` → space, ``<0xNN>`` → that byte), else GPT-2 byte-level if every token is in the
    byte-level alphabet, else the strings as they are.
    """
    toks = ["" if t is None or _SPECIAL.fullmatch(t) else t for t in token_strings]
    if any("▁" in t for t in toks):
        return [
            bytes([int(m.group(1), 16)]) if (m := _BYTE_FALLBACK.fullmatch(t)) else t.replace("▁", " ").encode("utf-8")
            for t in toks
        ]
    if all(c in _BYTE_DECODER for t in toks for c in t):
        return [bytes(_BYTE_DECODER[c] for c in t) for t in toks]
    return [t.encode("utf-8") for t in toks]


def token_texts(token_strings: Sequence[str | None]) -> list[str]:
    """Surface text of each token (see :func:`token_bytes`); a split multi-byte character
    shows as U+FFFD."""
    return [b.decode("utf-8", "replace") for b in token_bytes(token_strings)]


def normalize_text(text: str) -> str:
    """Lower-cased letters and digits of ``text`` (whitespace and punctuation dropped)."""
    return "".join(c for c in text.lower() if c.isalnum())


def has_content(text: str) -> bool:
    """Whether ``text`` holds a letter, a digit or a split character (U+FFFD): not only punctuation or space."""
    return any(c.isalnum() or c == "\ufffd" for c in text)


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "\ufffd"


def token_terms(token_strings: Sequence[str | None], unit: str = "piece") -> list[str]:
    """The normalized term of each token (``""`` for none: punctuation, whitespace, special).

    ``"piece"``: the token's own normalized text. ``"word"``: the normalized text of the whole
    word the token belongs to; a word starts at a token beginning with whitespace or
    punctuation, or after a token ending with one, and punctuation-only tokens belong to none.
    """
    if unit not in IDF_UNITS:
        raise InputError(f"unit={unit!r} is not one of {IDF_UNITS}")
    raw = token_bytes(token_strings)
    texts = [b.decode("utf-8", "replace") for b in raw]
    if unit == "piece":
        return [normalize_text(t) for t in texts]
    terms = [""] * len(texts)
    word: list[int] = []

    def close() -> None:
        term = normalize_text(b"".join(raw[i] for i in word).decode("utf-8", "replace"))
        for i in word:
            terms[i] = term
        word.clear()

    for i, text in enumerate(texts):
        if not has_content(text):
            close()
            continue
        if word and (not _word_char(text[0]) or not _word_char(texts[i - 1][-1])):
            close()
        word.append(i)
    close()
    return terms


def query_terms(token_strings: Sequence[str | None], unit: str = "piece") -> set[str]:
    """The set of non-empty terms (:func:`token_terms`) of a tokenized query."""
    return {t for t in token_terms(token_strings, unit) if t}


def tokenized_query_terms(tokenizer: Any, query: str, unit: str = "piece") -> set[str]:
    """Query terms as the documents' tokens would show them: the union over the query
    tokenized alone and after a space (word-initial pieces differ in byte-level BPE)."""
    terms: set[str] = set()
    for text in (query.strip(), " " + query.strip()):
        ids = tokenize(tokenizer, text)["input_ids"]
        terms |= query_terms(tokenizer.convert_ids_to_tokens(ids), unit)
    return terms
