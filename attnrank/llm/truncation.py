"""Document texts shortened to fit a prompt: to a number of words, then of tokens.

The reranking prompt (:mod:`attnrank.llm.prompts`) and the block prompt
(:mod:`attnrank.llm.blocks`) cut each document the same way: ``max_doc_words`` whitespace-separated
words first (ICR's ``--truncate_by_space``), then ``max_doc_tokens`` tokens of the model's
tokenizer; each cut is recorded as a :class:`Truncation` and logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnrank.errors import InputError
from attnrank.types import Document

from .texts import tokenize

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Truncation:
    """One document shortened to fit: its original input index, id, unit and lengths."""

    doc_index: int
    doc_id: str
    unit: str  # "words" or "tokens"
    original: int
    kept: int


_WORD = re.compile(r"\S+")


def _cut_to_tokens(tokenizer: Any, text: str, offsets: Sequence[tuple[int, int]], max_tokens: int) -> tuple[str, int]:
    """``text`` (its token ``offsets``) cut at a token end so that the cut, tokenized on its own,
    is at most ``max_tokens`` tokens; returns the cut and its token count. Cutting after the
    ``max_tokens``-th token is not enough: re-tokenizing can split the new last word differently,
    and a character spread over several byte tokens is kept whole, so the cut moves back a token
    at a time until it fits (a first character longer than ``max_tokens`` tokens is kept whole
    all the same)."""
    for keep in range(max_tokens, 0, -1):
        cut = text[: offsets[keep - 1][1]]
        n = len(tokenize(tokenizer, cut)["input_ids"])
        if n <= max_tokens:
            return cut, n
    return cut, n


def truncate_texts(
    tokenizer: Any, docs: Sequence[Document], max_words: int | None, max_tokens: int | None
) -> tuple[list[str], list[Truncation]]:
    """Each document's text cut to ``max_words`` words then ``max_tokens`` tokens (title kept)."""
    for name, value in (("max_doc_words", max_words), ("max_doc_tokens", max_tokens)):
        if value is not None and value < 1:
            raise InputError(f"{name}={value} must be >= 1 (or None for no limit)")
    texts, cuts = [], []
    for i, doc in enumerate(docs):
        text = doc.text
        if max_words is not None:
            words = list(_WORD.finditer(text))
            if len(words) > max_words:
                text = text[: words[max_words - 1].end()]
                cuts.append(Truncation(i, doc.id, "words", len(words), max_words))
        if max_tokens is not None:
            # count what the prompts hold: they strip the text, so its leading whitespace counted
            # against the limit, and a cut could keep nothing else ("13->2 tokens", no text)
            rest = text.lstrip() or text  # (a text of whitespace alone is refused before, as empty)
            offsets = tokenize(tokenizer, rest, offsets=True)["offset_mapping"]
            n = len(offsets)
            if n > max_tokens:
                cut, kept = _cut_to_tokens(tokenizer, rest, offsets, max_tokens)
                # (the leading whitespace kept: characters count from the text's start, as an uncut
                # text's do, and the prompts strip it all the same)
                text = text[: len(text) - len(rest)] + cut
                cuts.append(Truncation(i, doc.id, "tokens", n, kept))
        texts.append(text)
    if cuts:
        logger.info(
            "truncated %d document text(s) of %d: %s",
            len(cuts),
            len(docs),
            ", ".join(f"{c.doc_id} {c.original}->{c.kept} {c.unit}" for c in cuts[:10])
            + (" ..." if len(cuts) > 10 else ""),
        )
    return texts, cuts
