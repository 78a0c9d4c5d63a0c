"""``ask``'s and ``prune``'s checks before the model loads, found with the tokenizer alone, and
the library's refusals in ``ask``'s option names."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from ..errors import InputError, SentenceTooLong
from ..prune.config import PruneConfig
from ..types import RankedResults
from .prune_options import SHARED_PRUNE_FLAGS, prune_names


def check_before_load(
    retriever, question: str, cfg, prune_cfg, *, depth: int, k: int, budget, ratio, no_rerank: bool, no_prune: bool
) -> tuple[RankedResults, float] | None:
    """What ask's stages would refuse of the first stage's candidates, found with the tokenizer
    before the model loads: a passage no reranking prompt holds, and a budget that no sentence of
    the passages pruned could fit (the top ``k`` where nothing reranks; else every candidate, of
    which reranking keeps ``k``). The first stage searches for it only where a check applies; its
    hits and seconds are returned then, for the pipeline to use."""
    from ..prune.precheck import check_budget_fits, check_budget_fits_any
    from ..rerank.precheck import check_query_before_load, early_prompt_limit

    rerank_check = not no_rerank and early_prompt_limit(cfg) is not None
    prune_check = not no_prune and (budget is not None or no_rerank)
    if not (rerank_check or prune_check):
        return None
    start = time.perf_counter()
    hits = retriever.search(question, depth)
    searched = hits, time.perf_counter() - start
    found = hits.results
    if rerank_check:  # a passage no prompt holds
        check_query_before_load(cfg, question, found)
    try:
        if prune_check and no_rerank:  # the passages pruned are known: the first stage's top k
            check_budget_fits(prune_cfg, question, found[:k], budget_tokens=budget, keep_ratio=ratio)
        elif prune_check:
            check_budget_fits_any(prune_cfg, question, found, budget_tokens=budget)
    except InputError as e:  # (in ask's words, as its refusals after the load)
        raise InputError(ask_message(e, no_prune, k)) from None
    return searched


@contextmanager
def prune_words() -> Iterator[None]:
    """The library's refusals inside, in prune's option names (:func:`prune_names`)."""
    try:
        yield
    except InputError as e:
        raise InputError(prune_names(str(e))) from None


def ask_message(error: Exception, no_prune: bool, k: int) -> str:
    """``error`` (the generator's, the pruner's or the reranker's refusal) in ``ask``'s words: its
    option names for the library's arguments, and only advice ``ask`` can follow (``k``: its -k).

    A sentence no pruning prompt holds: ask sets no pruning prompt size or sentence cut (``prune``
    does), so the ways out are the input, whole passages (--no-prune) or another model."""
    if isinstance(error, SentenceTooLong):
        fault = re.sub(r"max_prompt_tokens=(\d+)", r"the pruning prompt's \1 tokens", error.fault)
        ways = [error.remedy.replace("the query", "the question")] if error.remedy else []
        ways += ["answer from whole passages (--no-prune)", "use a model with a longer context"]
        return f"{fault}; {', or '.join(ways)}"
    message = str(error)
    harder = "prune the context harder (smaller budget_tokens) or pass fewer passages"  # (the generator's advice)
    prune = (
        "prune the context (drop --no-prune)" if no_prune else "prune the context harder (a smaller --budget-tokens)"
    )
    fewer = "lower -k" if k > 1 else "use a model with a longer context" if no_prune else ""
    message = message.replace(harder, f"{prune} or {fewer}" if fewer else prune)
    message = message.replace("lower max_new_tokens", "lower --max-new-tokens").replace(
        "max_new_tokens=", "--max-new-tokens "
    )
    return prune_names(message, SHARED_PRUNE_FLAGS)  # (the pruner's arguments ask has flags for)


def check_prune_window(config: PruneConfig) -> None:
    """``prune``'s ``--max-prompt-tokens`` that no pruning prompt fits, with the model's tokenizer
    alone (before the index loads and searches, and the model loads)."""
    if config.max_prompt_tokens is None:
        return
    from ..llm.tokenizers import load_tokenizer
    from ..prune.planning import check_prune_frame

    try:
        check_prune_frame(load_tokenizer(config.model), config, config.max_prompt_tokens)
    except InputError as e:
        raise typer.BadParameter(prune_names(str(e))) from None
