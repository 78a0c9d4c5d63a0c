"""Sentence token spans: a token straddling two sentences counts for the first only, so spans
never overlap; a sentence with no token of its own is refused."""

from __future__ import annotations

import bisect

import pytest

from attnrank.errors import InputError
from attnrank.prune.segment import locate_sentences
from attnrank.prune.spans import _sentence_spans, make_piece
from attnrank.types import Document

TEXT = "The answer is inside. Here."
# SmolLM2's tokens of TEXT, as character ranges: "The", " answer", " is", " inside", ".", " Here", "."
TOKENS = [(0, 3), (3, 10), (10, 13), (13, 20), (20, 21), (21, 26), (26, 27)]


def spans_of(sentences: list[str]) -> list[tuple[int, int]]:
    sents = locate_sentences(TEXT, sentences)
    starts, ends = [s for s, _ in TOKENS], [e for _, e in TOKENS]

    def locate(i, piece, sent):  # as sentence_spans locates them: tokens ending after the start, up to the end
        return bisect.bisect_right(ends, sent.start), bisect.bisect_left(starts, sent.end)

    piece = make_piece(0, sents, range(len(sents)))
    return _sentence_spans(locate, [Document("p", TEXT)], [piece], [sents])[0]


def test_sentences_at_token_boundaries_get_their_own_tokens():
    assert spans_of(["The answer is inside.", "Here."]) == [(0, 5), (5, 7)]


def test_a_token_shared_by_two_sentences_counts_for_the_first():
    assert spans_of(["The answer is ins", "ide. Here."]) == [(0, 4), (4, 7)]


def test_a_sentence_inside_the_token_before_is_refused():
    """'ide' lies inside the token ' inside' that the sentence before already counts: its span
    overlapped it ((3, 4) inside (0, 4)), and the passage's tokens were counted twice."""
    with pytest.raises(InputError, match="sentence 1 of passage 'p' has no token of its own"):
        spans_of(["The answer is ins", "ide", ". Here."])
