"""Where each sentence of a pruning prompt lies, in tokens (full and block-attention prompts)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InputError, ModelError
from ..llm.blocks import BlockPrompt
from ..llm.prompts import RerankPromptPair, _block
from ..types import Document
from .segment import Sentence

Span = tuple[int, int]


@dataclass
class Piece:
    """A passage, or a run of its sentences, placed in one prompt."""

    doc_index: int
    sent_ids: list[int]
    lo: int  # character range in the passage text: first sentence start .. last sentence end
    hi: int


def make_piece(doc_index: int, sents: list[Sentence], ids) -> Piece:
    ids = list(ids)
    return Piece(doc_index, ids, sents[ids[0]].start, sents[ids[-1]].end)


def sentence_spans(
    pair: RerankPromptPair, texts: list[Document], pieces: list[Piece], sents: list[list[Sentence]]
) -> list[list[Span]]:
    """Token span ``[s, e)`` of every sentence of every piece in the context of ``pair``.

    Each block ``[p] title\\ntext`` is found verbatim in the prompt text (in prompt order), the
    sentence's characters shifted into it, and mapped to the tokens that overlap them. A token
    straddling two sentences counts for the first one only, so spans never overlap.
    """
    prompt = pair.real
    starts = [a for a, _ in prompt.offsets[: prompt.query_start]]
    ends = [b for _, b in prompt.offsets[: prompt.query_start]]
    text_at: dict[int, int] = {}
    cursor = 0
    for position, i in enumerate(prompt.order, start=1):
        block = _block(position, texts[i].title, texts[i].text)
        at = prompt.text.find(block, cursor)
        if at < 0:  # pragma: no cover - the prompt layout changed
            raise ModelError(f"passage block [{position}] not found in the pruning prompt")
        text_at[i] = at + len(block) - len(texts[i].text)
        cursor = at + len(block)

    def locate(i: int, p: Piece, sent: Sentence) -> Span:
        lo, hi = text_at[i] + sent.start - p.lo, text_at[i] + sent.end - p.lo
        # first token ending after the sentence start .. first token starting at/after its end
        return bisect.bisect_right(ends, lo), bisect.bisect_left(starts, hi)

    return _sentence_spans(locate, texts, pieces, sents)


def block_sentence_spans(
    prompt: BlockPrompt, texts: list[Document], pieces: list[Piece], sents: list[list[Sentence]]
) -> list[list[Span]]:
    """The same as :func:`sentence_spans` for a block-attention prompt (one block per piece)."""
    return _sentence_spans(lambda i, p, sent: prompt.text_token_span(i, sent.start, sent.end), texts, pieces, sents)


def _sentence_spans(
    locate: Callable[[int, Piece, Sentence], Span],
    texts: list[Document],
    pieces: list[Piece],
    sents: list[list[Sentence]],
) -> list[list[Span]]:
    """Every piece's sentence spans from ``locate(piece index, piece, sentence)``; a token
    straddling two sentences counts for the first one only, so spans never overlap."""
    out = []
    for i, p in enumerate(pieces):
        spans: list[Span] = []
        for k in p.sent_ids:
            s, e = locate(i, p, sents[p.doc_index][k])
            if spans and s < spans[-1][1]:
                s = spans[-1][1]
            if s >= e:  # every token of the sentence is also the one before's: it cannot be kept or cut alone
                raise InputError(
                    f"sentence {k} of passage {texts[i].id!r} has no token of its own (it lies inside the last token "
                    "of the sentence before: split inside a word?); split sentences at word boundaries"
                )
            spans.append((s, e))
        out.append(spans)
    return out
