"""What pruning given passages refuses, found before the model loads with its tokenizer and config
alone: a token budget below every sentence. :meth:`~attnrank.prune.pruner.ContextPruner.prune`
finds it too, but the command line checked it only after the model had loaded
(:meth:`~attnrank.prune.context.PrunedContext.check_kept`, whose refusal is raised here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..llm.modelconfig import prompt_length_floor
from ..llm.models import load_tokenizer
from ..types import as_documents
from .config import PruneConfig
from .context import PrunedContext, resolve_budget
from .lookups import check_pruner_before_load
from .planning import PromptPlanner, hint_ids, prompt_settings, scored_sentences
from .segment import document_sentences
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
    if config.attention != "full":
        return
    floor = prompt_length_floor(config.model)
    if floor is None:
        return
    limit = floor if config.max_prompt_tokens is None else min(floor, config.max_prompt_tokens)
    documents = as_documents(docs)[0]
    sents = document_sentences(documents, None, config.max_sentence_words, warn=False)  # (the pruner warns)
    if not any(sents):
        return
    tok = load_tokenizer(config.model)
    planner = PromptPlanner(tok, prompt_settings(config), limit, hint_ids(tok, config), config.max_sentence_words)
    whole = planner.build(query, documents, sents, [make_piece(i, s, range(len(s))) for i, s in enumerate(sents) if s])
    if whole.length > limit:
        return
    scored = scored_sentences(documents, sents, [whole])
    original = sum(s.tokens for s in scored)
    target, source = resolve_budget(budget_tokens, keep_ratio, original)
    if target < original and min(s.tokens for s in scored) > target:  # (as the pruner finds it before its pass)
        PrunedContext(query.strip(), config.method, documents, scored, target, source, keep_ratio, True).check_kept()
