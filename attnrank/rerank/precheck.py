"""What an attention preset refuses of a run's prompts, found before the model loads with its
tokenizer and config alone: a passage whose full prompt (query and instructions included) spans
more than one prompt may even alone. :meth:`~attnrank.rerank.attention.AttentionReranker.check_batch`
finds it too, but only once the model has loaded; its refusal is the one raised here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InputError, PromptTooLong
from ..llm.modelconfig import PROMPT_MARGIN, model_context_length, prompt_length_floor
from ..llm.prompts import build_rerank_prompts
from ..llm.tokenizers import checked_model_id, load_tokenizer
from ..types import as_documents
from .config import RerankConfig
from .inputs import check_documents
from .likelihood import check_queries_fit
from .windows import check_fit_alone


def check_prompts_before_load(
    config: RerankConfig,
    queries: Sequence[str],
    docs_per_query: Sequence[Sequence[Any]],
    query_ids: Sequence[str] | None = None,
) -> None:
    """Refuse, as the reranker of ``config`` would once loaded
    (:meth:`~attnrank.rerank.attention.AttentionReranker.check_batch`), a query of
    ``queries`` (named by its id in ``query_ids``, else its number) one of whose documents
    ``docs_per_query`` does not fit a full-attention prompt even alone (``max_prompt_tokens``, else
    the context less 64).

    Left to the reranker where it may judge otherwise: no attention (signals, the likelihood, whose
    queries :func:`~attnrank.rerank.likelihood.check_queries_fit` checks), block attention (its
    blocks are cut and checked as they are built), and a model whose config alone does not give
    its prompt budget (sliding windows, chunked attention, length-following rotary frequencies, or
    an unreadable config: :func:`~attnrank.llm.modelconfig.prompt_length_floor`).
    Each prompt is measured without its calibration twin, so nothing is refused here that the
    reranker would accept (a one-word query's "N/A" prompt may be longer)."""
    limit = early_prompt_limit(config)
    if limit is None:
        return
    tok = load_tokenizer(config.model)
    for i, (query, docs) in enumerate(zip(queries, docs_per_query)):
        try:
            _check_query(tok, config, limit, query, docs)
        except InputError as e:
            name = f"query {'#' + str(i) if query_ids is None else repr(query_ids[i])}"
            if isinstance(e, PromptTooLong):  # (its fault apart still: a caller may give its own advice)
                raise PromptTooLong(f"{name}: {e.fault}", e.fix) from None
            raise InputError(f"{name}: {e}") from None


def check_query_before_load(config: RerankConfig, query: str, docs: Sequence[Any]) -> None:
    """:func:`check_prompts_before_load` of one query, refused as
    :meth:`~attnrank.rerank.attention.AttentionReranker.rank` refuses it (no query named)."""
    limit = early_prompt_limit(config)
    if limit is not None:
        _check_query(load_tokenizer(config.model), config, limit, query, docs)


def check_queries_before_load(config: RerankConfig, queries: dict[str, str]) -> None:
    """Where ``config`` reads the query likelihood: every query of ``queries`` (``{id: text}``)
    leaves a passage room in the model's context (:func:`~attnrank.rerank.likelihood.check_queries_fit`),
    found with its tokenizer and config before the model loads (a query of 25,000 tokens was
    refused only after the load; in ``attnrank batch``, after Ray had started and a checkpoint
    begun). A model whose config gives no context length is left to the loaded reranker."""
    if not config.uses_likelihood or not queries:
        return
    context = model_context_length(config.model)
    if context is not None:
        check_queries_fit(load_tokenizer(config.model), context, checked_model_id(config.model), queries)


def early_prompt_limit(config: RerankConfig) -> int | None:
    """The positions one prompt of ``config``'s reranker may span, where the model's config alone
    gives them (None: the checks of this module are left to the loaded reranker)."""
    if not config.uses_attention or config.attention != "full":
        return None
    floor, context = prompt_length_floor(config.model), model_context_length(config.model)
    if floor is None or context is None or floor != context - PROMPT_MARGIN:
        return None
    return config.max_prompt_tokens or floor


def _check_query(tok: Any, config: RerankConfig, limit: int, query: str, docs: Sequence[Any]) -> None:
    """One query's documents, each in a prompt of its own where all of them do not fit ``limit``."""
    documents = as_documents(docs)[0]
    if not documents or not isinstance(query, str) or not query.strip():  # (the reranker's own refusals)
        return
    check_documents(documents)
    check_fit_alone(
        len(documents),
        lambda group: build_rerank_prompts(tok, query, [documents[j] for j in group], **config.prompt_kw),
        lambda pair: len(pair.real.input_ids),
        limit,
        [d.id for d in documents],
    )
