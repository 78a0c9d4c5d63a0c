"""What pruning given passages refuses, found before the model loads with its tokenizer and config
alone: a token budget below every sentence. :meth:`~attnrank.prune.pruner.ContextPruner.prune`
finds it too, but the command line checked it only after the model had loaded
(:meth:`~attnrank.prune.context.PrunedContext.check_kept`, whose refusal is raised here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InputError
from ..llm.modelconfig import prompt_length_floor
from ..llm.tokenizers import load_tokenizer
from ..types import Document, as_documents
from .config import PruneConfig
from .context import PrunedContext, ScoredSentence, resolve_budget
from .lookups import check_pruner_before_load
from .planning import PromptPlanner, hint_ids, prompt_settings, scored_sentences
from .segment import Sentence, document_sentences
from .spans import make_piece


def check_budget_fits(
    config: PruneConfig,
    query: str,
    docs: Sequence[Any],
    *,
    budget_tokens: int | None,
    keep_ratio: float | None,
) -> None:
    """Refuse a budget (``budget_tokens``, or ``keep_ratio`` of the context's sentence tokens)
    below every sentence of ``docs``, each counted as the pruner counts it: in one full-attention
    prompt of the whole context. Left to the pruner where it may plan otherwise: block attention,
    a context past the floor of one prompt's length (scored in chunks, whose edges may count a
    sentence's tokens otherwise), or a model whose config alone does not give that floor
    (:func:`~attnrank.llm.modelconfig.prompt_length_floor`)."""
    check_pruner_before_load(config)  # (what the pruner refuses before its load first, as it does)
    documents = as_documents(docs)[0]
    sents = document_sentences(documents, None, config.max_sentence_words, warn=False)  # (the pruner warns)
    if budget_tokens is not None and _a_sentence_fits(sents, budget_tokens):
        return
    counted = _SentenceCounter(config, query).count(documents, sents)
    if not counted:
        return
    original, shortest = sum(s.tokens for s in counted), min(s.tokens for s in counted)
    target, source = resolve_budget(budget_tokens, keep_ratio, original, shortest)
    if target < original and shortest > target:  # (as the pruner finds it before its pass)
        PrunedContext(query.strip(), config.method, documents, counted, target, source, keep_ratio, True).check_kept()


def check_budget_fits_any(config: PruneConfig, query: str, candidates: Sequence[Any], *, budget_tokens: int) -> None:
    """Refuse a token budget below every sentence of every one of ``candidates``, of which the
    passages pruned are some, known only once a model chose them (``attnrank ask`` reranks, then
    prunes its top ``-k``): no choice of them could keep a sentence. Each is counted in a prompt of
    its own (a sentence's tokens do not depend on the passages beside it); left to the pruner where
    :func:`check_budget_fits` leaves it, or where a candidate has no sentence (titles alone: a
    context of those keeps them with no sentence, and is not refused)."""
    check_pruner_before_load(config)
    documents = as_documents(candidates)[0]
    sents = document_sentences(documents, None, config.max_sentence_words, warn=False)
    if _a_sentence_fits(sents, budget_tokens):
        return
    counter, shortest = _SentenceCounter(config, query), None
    for doc, own in zip(documents, sents):
        counted = counter.count([doc], [own])
        if not counted:
            return
        least = min(s.tokens for s in counted)
        shortest = least if shortest is None else min(shortest, least)
    if shortest is not None and shortest > budget_tokens:
        raise InputError(
            f"no sentence of the {len(documents)} candidates fits the budget of {budget_tokens} tokens (the "
            f"shortest has {shortest}), whichever of them are kept; raise the budget to at least {shortest} tokens"
        )


# Tokens a sentence of n UTF-8 bytes spans at most, beyond n: a byte-level or byte-fallback
# tokenizer makes at most one token of a byte, and the prompt may add a marker or two before it.
_SLACK = 8


def _a_sentence_fits(sents: list[list[Sentence]], budget_tokens: int) -> bool:
    """Whether one of the documents' sentences ``sents`` fits ``budget_tokens`` whatever the
    tokenizer (its UTF-8 bytes and :data:`_SLACK`): then nothing is refused, and no tokenizer loads."""
    return any(len(s.text.encode("utf-8")) + _SLACK <= budget_tokens for each in sents for s in each)


class _SentenceCounter:
    """Sentences' tokens as the pruner of ``config`` counts them in one full-attention prompt for
    ``query``: the prompt's limit read once, the tokenizer and planner made at the first count (a
    check that finds nothing to count loads none)."""

    def __init__(self, config: PruneConfig, query: str):
        self.config, self.query = config, query
        floor = prompt_length_floor(config.model) if config.attention == "full" else None
        self.limit = None if floor is None else min(floor, config.max_prompt_tokens or floor)
        self._planner: PromptPlanner | None = None

    def count(self, documents: list[Document], sents: list[list[Sentence]]) -> list[ScoredSentence] | None:
        """The sentences ``sents`` of ``documents`` with their tokens in one prompt of them all;
        None where the pruner may plan otherwise (see :func:`check_budget_fits`)."""
        if self.limit is None or not any(sents):
            return None
        if self._planner is None:
            cfg, tok = self.config, load_tokenizer(self.config.model)
            self._planner = PromptPlanner(
                tok, prompt_settings(cfg), self.limit, hint_ids(tok, cfg), cfg.max_sentence_words
            )
        pieces = [make_piece(i, s, range(len(s))) for i, s in enumerate(sents) if s]
        whole = self._planner.build(self.query, documents, sents, pieces)
        return None if whole.length > self.limit else scored_sentences(documents, sents, [whole])
