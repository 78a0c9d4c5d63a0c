"""Pruning results and budget selection (no model needed): :class:`PrunedContext`,
:class:`ScoredSentence`, budget checks and the greedy sentence selection of
:class:`attnrank.prune.pruner.ContextPruner` (budget semantics are described there).
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from ..types import Document, is_count

logger = logging.getLogger(__name__)


@dataclass
class ScoredSentence:
    """One context sentence: where it is, its size in prompt tokens, its score, whether kept.

    ``doc_index`` is the passage's input position; ``start``/``end`` its character range in
    that passage's text. ``score`` is NaN when everything was kept without scoring; ``chunk``
    numbers the prompt that scored it (0 unless the context was chunked). ``sentence_index``
    counts the passage's sentences; ``given_index`` is the sentence's position in the caller's
    pre-split list, which may hold empty entries that are skipped (None when segmented here);
    ``source_index``, the one of the two results report (``kept_sentences``), is that, else
    ``sentence_index``.
    """

    doc_index: int
    doc_id: str
    sentence_index: int
    text: str
    start: int
    end: int
    tokens: int
    score: float = math.nan
    kept: bool = False
    chunk: int = 0
    given_index: int | None = None

    @property
    def source_index(self) -> int:
        return self.sentence_index if self.given_index is None else self.given_index


@dataclass
class PrunedContext:
    """The result of :meth:`ContextPruner.prune`: every sentence (reading order) and the budget.

    ``budget_tokens`` is the budget in sentence tokens actually applied (from ``budget_tokens``
    or ``keep_ratio``, named by ``budget_source``); ``kept_tokens`` what was achieved.
    """

    query: str
    method: str
    docs: list[Document]
    sentences: list[ScoredSentence]
    budget_tokens: int
    budget_source: str  # "budget_tokens" or "keep_ratio"
    keep_ratio: float | None = None
    keep_titles: bool = True
    chunks: int = 1
    kept_all: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def kept(self) -> list[ScoredSentence]:
        """Kept sentences in reading order (passage input order, then sentence order)."""
        return [s for s in self.sentences if s.kept]

    @property
    def original_tokens(self) -> int:
        return sum(s.tokens for s in self.sentences)

    @property
    def kept_tokens(self) -> int:
        return sum(s.tokens for s in self.sentences if s.kept)

    @property
    def compression(self) -> float:
        """original_tokens / kept_tokens (inf when nothing was kept; 1 when there was nothing to keep:
        passages of titles alone)."""
        kept = self.kept_tokens
        return self.original_tokens / kept if kept else (math.inf if self.original_tokens else 1.0)

    @property
    def achieved_ratio(self) -> float:
        return self.kept_tokens / self.original_tokens if self.original_tokens else 1.0  # (titles alone: all kept)

    def check_kept(self) -> None:
        """:class:`InputError` where the passages had sentences and none fits the budget: an
        answer (or a printed context) from nothing would look like one from them."""
        if self.sentences and not self.kept:
            shortest = min(s.tokens for s in self.sentences)
            fix = f"raise the budget to at least {shortest} tokens"
            if self.budget_source == "keep_ratio" and self.original_tokens:  # (the ratio was given, not the budget)
                fix = f"{_raise('keep_ratio')} to at least {math.ceil(1000 * shortest / self.original_tokens) / 1000:g}"
            raise InputError(
                f"no sentence of the passages fits the budget of {self.budget_tokens} tokens (the shortest has "
                f"{shortest}); {fix}"
            )

    def documents(self) -> list[Document]:
        """Pruned passages in input order, as :class:`Document` (a scored input's score, rank and
        stage scores are not carried; its metadata is), those with no kept sentence left out.
        Adjacent kept sentences are copied with the original whitespace between them; gaps become
        one space, or a newline where the omitted text held one. Titles stay if ``keep_titles``: a
        passage of a title alone (no sentence to prune) stays as it is then, with no text (it was
        left out, even where everything was kept)."""
        out = []
        for i, doc in enumerate(self.docs):
            kept = [s for s in self.sentences if s.doc_index == i and s.kept]
            if not kept:
                if self.keep_titles and (doc.title or "").strip() and not any(s.doc_index == i for s in self.sentences):
                    meta = {**(doc.metadata or {}), "pruned": True, "kept_sentences": []}
                    out.append(Document(doc.id, "", doc.title, meta))
                continue
            parts = [kept[0].text]
            for prev, cur in zip(kept, kept[1:]):
                gap = doc.text[prev.end : cur.start]
                if cur.sentence_index == prev.sentence_index + 1 and not gap.strip():
                    parts.append(gap + cur.text)
                else:
                    parts.append(("\n" if "\n" in gap else " ") + cur.text)
            meta = {**(doc.metadata or {}), "pruned": True, "kept_sentences": [s.source_index for s in kept]}
            if is_split(meta.get("sentences")) and kept[0].given_index is None:  # set aside (unusable)
                # kept_sentences numbers the split that was scored: the list beside it must be that one
                # (a loader's own "sentences" of another kind, a count, is no split and stays)
                meta["sentences"] = [s.text for s in self.sentences if s.doc_index == i]
            out.append(Document(doc.id, "".join(parts), doc.title if self.keep_titles else "", meta))
        return out


def is_split(value: Any) -> bool:
    """Whether a metadata value is a list of sentences as the pruner takes one (any sequence or
    array, e.g. one read back from Parquet, that is not a text)."""
    return hasattr(value, "__len__") and hasattr(value, "__iter__") and not isinstance(value, (str, bytes, Mapping))


def check_budget(budget_tokens: int | None, keep_ratio: float | None) -> None:
    if budget_tokens is None and keep_ratio is None:
        raise InputError(
            "no budget given; pass budget_tokens=N (sentence tokens to keep, e.g. 300) "
            "or keep_ratio=R (fraction of the context, 0 < R <= 1)"
        )
    if budget_tokens is not None and keep_ratio is not None:  # (one was dropped, told in a note no adapter showed)
        raise InputError(
            f"budget_tokens={budget_tokens!r} and keep_ratio={keep_ratio!r} both size the pruned context; give one"
        )
    if budget_tokens is not None and not is_count(budget_tokens):
        raise InputError(
            f"budget_tokens={budget_tokens!r} must be a whole number of tokens >= 1; "
            "pass e.g. budget_tokens=300, or keep_ratio=R"
        )
    if keep_ratio is not None and (
        isinstance(keep_ratio, bool) or not (isinstance(keep_ratio, numbers.Real) and 0 < keep_ratio <= 1)
    ):
        raise InputError(
            f"keep_ratio={keep_ratio!r} is outside (0, 1]; pass the fraction of the "
            "context's sentence tokens to keep, e.g. keep_ratio=0.3"
        )


def check_neighbours(neighbours: int) -> None:
    if not is_count(neighbours, 0):
        raise InputError(
            f"neighbours={neighbours!r} must be an integer >= 0 (sentences of context kept on each side of a chosen one)"
        )


def resolve_budget(
    budget_tokens: int | None, keep_ratio: float | None, original: int, shortest: int = 1
) -> tuple[int, str]:
    """The token budget (and which argument gave it) of ``budget_tokens``, or of ``keep_ratio`` of
    the context's ``original`` sentence tokens; a ratio that keeps 0 tokens is refused, with the
    least ratio that keeps the ``shortest`` sentence (tokens), where the caller knows it."""
    if budget_tokens is not None:  # (check_budget refused both)
        return int(budget_tokens), "budget_tokens"
    if keep_ratio is None:
        raise InputError("give budget_tokens or keep_ratio")
    target = int(math.floor(keep_ratio * original + 1e-9))
    if target < 1 and original > 0:  # a budget of 0 keeps nothing: refused, as budget_tokens=0 is
        need = min(max(shortest, 1), original)  # (the ratio of 1 token alone fitted no sentence: refused again)
        raise InputError(
            f"keep_ratio={keep_ratio} of the context's {original} sentence tokens keeps 0 tokens; "
            f"{_raise('keep_ratio')} to at least {math.ceil(1000 * need / original) / 1000:g}, or give budget_tokens "
            "(--budget-tokens)"
        )
    return target, "keep_ratio"


def skipped_note(
    skipped: Sequence[ScoredSentence], kept: Sequence[ScoredSentence], target: int, budget_source: str
) -> list[str]:
    """A note where :func:`select` skipped, for want of room, a sentence that scored above the median
    kept one while weaker ones were kept after it (``skipped``): its evidence is not in the context,
    which nothing said (a sentence just above the weakest kept ones, skipped as the budget filled, is
    the greedy fill's ordinary work, not noted)."""
    if not skipped or not kept:
        return []
    middle = float(np.median([s.score for s in kept]))
    material = [s for s in skipped if s.score > middle]
    if not material:
        return []
    best = max(material, key=lambda s: s.score)
    return [
        f"{len(material)} sentence(s) scored above most kept ones but did not fit what was left of the budget of "
        f"{target} tokens, the best {best.tokens} tokens long (passage {best.doc_id!r}, sentence "
        f"{best.source_index}); {_raise(budget_source)} to keep it"
    ]


def _raise(budget_source: str) -> str:
    """The option to raise, in the words of the one the user gave (a keep ratio or a token budget)."""
    return "raise keep_ratio (--keep-ratio)" if budget_source == "keep_ratio" else "raise the budget (--budget-tokens)"


def select(scored: list[ScoredSentence], target: int, neighbours: int) -> list[ScoredSentence]:
    """Greedy by score (ties: reading order); a misfit is skipped; neighbours come if they fit.
    Returns the sentences skipped for want of room before a lower-scored one was kept."""
    used = 0
    skipped: list[int] = []
    missed: list[int] = []  # skipped since the last sentence kept
    for g in sorted(range(len(scored)), key=lambda j: (-scored[j].score, j)):
        if scored[g].kept:
            continue
        doc = scored[g].doc_index
        # clamped: a huge ``neighbours`` (a server request's) must not loop over sentences that do not exist
        group = [
            j
            for j in range(max(0, g - neighbours), min(len(scored), g + neighbours + 1))
            if scored[j].doc_index == doc and not scored[j].kept
        ]
        for candidate in (group, [g]):
            cost = sum(scored[j].tokens for j in candidate)
            if used + cost <= target:
                for j in candidate:
                    scored[j].kept = True
                used += cost
                break
        else:
            missed.append(g)
            continue
        skipped += missed
        missed = []
    return [scored[j] for j in skipped]
