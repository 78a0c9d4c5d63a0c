"""Round-robin windows: a candidate list too long for one prompt, scored in several.

A prompt must span at most ``max_prompt_tokens`` positions (the model's context, less room to
spare). When all candidates do not fit, they are dealt round-robin over the fewest windows that
do: candidate ``i`` goes to window ``i mod n``, so every window holds a similar mix of strong
and weak first-stage candidates and the attention each one gets is comparable across windows.
The full prompt and block attention cut their windows by the same rule (:func:`block_windows`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..errors import InputError, PromptTooLong
from ..llm.blocks import BlockPrompt, build_block_prompts
from ..llm.prompts import RerankPromptPair, build_rerank_prompts
from ..types import Document

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")


def fit_windows(
    n_docs: int,
    build: Callable[[list[int]], P],
    size: Callable[[P], int],
    capture: Callable[[P, list[int]], R],
    max_prompt_tokens: int,
    ids: Sequence[str] | None = None,
    sliding: bool = False,
) -> list[R]:
    """``capture`` of the one prompt ``build`` makes of all ``n_docs`` documents (by input index)
    when it spans at most ``max_prompt_tokens`` positions (``size``), else of each of the fewest
    round-robin windows that fit, with the input indices it holds. A document too long even alone
    is refused (named by ``ids``) before any window is tried; ``sliding``: the budget is a sliding
    window's, which raising max_prompt_tokens does not move (the refusal says so)."""
    everything = list(range(n_docs))
    whole = build(everything)
    if size(whole) <= max_prompt_tokens:
        return [capture(whole, everything)]
    # each alone first: one that never fits was found after every window count had been built
    # and tokenized (quadratic in the candidates)
    check_fit_alone(n_docs, build, size, max_prompt_tokens, ids, sliding, whole)
    for n_windows in range(math.ceil(size(whole) / max_prompt_tokens), n_docs + 1):
        groups = [list(range(w, n_docs, n_windows)) for w in range(n_windows)]
        prompts = [build(g) for g in groups]
        if max(size(p) for p in prompts) <= max_prompt_tokens:
            logger.info(
                "prompt of %d positions > %d: scored in %d round-robin windows",
                size(whole),
                max_prompt_tokens,
                n_windows,
            )
            return [capture(p, g) for p, g in zip(prompts, groups)]
    raise AssertionError("one document per window fits, as checked")  # pragma: no cover


def check_fit_alone(
    n_docs: int,
    build: Callable[[list[int]], P],
    size: Callable[[P], int],
    max_prompt_tokens: int,
    ids: Sequence[str] | None = None,
    sliding: bool = False,
    whole: P | None = None,
) -> None:
    """What :func:`fit_windows` refuses, without capturing anything: a document whose prompt alone
    spans more than ``max_prompt_tokens`` (tokenizing only; ``whole``: the prompt of all the
    documents where the caller has built it)."""
    if size(build(list(range(n_docs))) if whole is None else whole) <= max_prompt_tokens:
        return
    _check_alone([size(build([i])) for i in range(n_docs)], max_prompt_tokens, ids, sliding)


def _check_alone(sizes: list[int], max_prompt_tokens: int, ids: Sequence[str] | None, sliding: bool = False) -> None:
    """Refuse a document whose one-document prompt (``sizes[i]`` positions) exceeds the budget:
    name it, or say that none fits alone."""
    if all(s <= max_prompt_tokens for s in sizes):
        return
    limit, other = (
        (
            f"the {max_prompt_tokens} tokens a sliding-window layer of the heads reads",
            "choose heads of full-attention layers",
        )
        if sliding
        else (f"max_prompt_tokens={max_prompt_tokens}", "raise max_prompt_tokens")
    )
    if not any(s <= max_prompt_tokens for s in sizes):
        raise PromptTooLong(
            f"no document fits {limit} even alone (the shortest one-document prompt, query and instructions "
            f"included, spans {min(sizes)} positions)",
            f"lower max_doc_words/max_doc_tokens, shorten the query, or {other}",
        )
    worst = max(range(len(sizes)), key=sizes.__getitem__)
    name = f"#{worst}" + (f" ({ids[worst]!r})" if ids is not None else "")
    raise PromptTooLong(
        f"document {name} does not fit {limit} even alone ({sizes[worst]} positions with the query)",
        f"lower max_doc_words/max_doc_tokens or {other}",
    )


def prompt_extent(pair: RerankPromptPair, calibrate: bool) -> int:
    """Positions a full prompt spans: its real prompt's, or its calibration prompt's ("N/A") when
    that is calibrated and longer (after a one-word query)."""
    return max(len(pair.real.input_ids), len(pair.calibration.input_ids) if calibrate else 0)


def block_extent(prompt: BlockPrompt, positions: str) -> int:
    """Positions a block prompt spans: its suffix's start (by the ``positions`` scheme) plus the
    longer of its two suffixes."""
    suffix = max(len(prompt.real_suffix_ids), len(prompt.calibration_suffix_ids))
    return prompt.suffix_start(positions) + suffix


def block_windows(
    whole: BlockPrompt,
    order: str,
    positions: str,
    max_prompt_tokens: int,
    max_context_tokens: int | None = None,
    max_read_tokens: int | None = None,
) -> list[tuple[BlockPrompt, list[int]]]:
    """The block prompts of the windows :func:`fit_windows` cuts ``whole`` (every candidate's block,
    arranged by ``order``) into, each with the input indices it holds (:func:`block_extent`).
    Where a model has sliding-window layers, at most ``max_context_tokens`` prefix and block
    tokens in one window (its window less one: the positions alone let shared positions put more
    blocks in a window than such a model's cache keeps, refused only after every block had been
    encoded), and at most ``max_read_tokens`` with the suffix (:func:`~attnrank.llm.context.read_window`,
    where a captured head sits in a sliding layer). Why the suffix counts: the query's rows come
    after every block in the cache, and a sliding layer's row reads its latest keys only; the
    prefix and the first blocks were read by no query row, recorded as zero attention, and the
    passage ranked as if read."""
    n = len(whole.blocks)
    limits = check_blocks_alone(whole, max_context_tokens, max_read_tokens)
    if not limits:
        size = lambda prompt: block_extent(prompt, positions)  # noqa: E731
    else:

        def size(prompt: BlockPrompt) -> int:  # (a window over the sliding window's tokens: cut further)
            context = len(prompt.prefix_ids) + sum(len(b) for b in prompt.blocks)
            extent = block_extent(prompt, positions)
            fits = all(context + extra <= limit for limit, extra, _ in limits)
            return extent if fits else max(extent, max_prompt_tokens + 1)

    return fit_windows(
        n,
        lambda g: whole if len(g) == n else whole.select(g, order),
        size,
        lambda prompt, g: (prompt, g),
        max_prompt_tokens,
        whole.doc_ids or None,
    )


def check_blocks_alone(
    whole: BlockPrompt, max_context_tokens: int | None, max_read_tokens: int | None
) -> list[tuple[int, int, str]]:
    """Refuse a block that no window holds under :func:`block_windows`' sliding-window limits (with
    the prefix, and with the query's suffix where ``max_read_tokens`` is given), naming it; returns
    the limits as (tokens, suffix tokens counted, what the limit is)."""
    suffix = max(len(whole.real_suffix_ids), len(whole.calibration_suffix_ids))
    limits = [
        (limit, extra, fix)
        for limit, extra, fix in (
            (max_context_tokens, 0, "this model's sliding window of {} takes at most {} before the query"),
            (max_read_tokens, suffix, "a sliding-window layer of the heads reads at most {1} with the query"),
        )
        if limit is not None
    ]
    prefix = len(whole.prefix_ids)
    for limit, extra, fix in limits:
        too_long = [i for i, b in enumerate(whole.blocks) if prefix + len(b) + extra > limit]
        if too_long:
            i = too_long[0]
            name = repr(whole.doc_ids[i]) if whole.doc_ids else f"#{i}"
            with_ = " and the query's suffix" if extra else ""
            raise InputError(
                f"document {name} with the block prompt's prefix{with_} is {prefix + len(whole.blocks[i]) + extra} "
                f"tokens; {fix.format(limit + 1, limit)}; shorten it (max_doc_words / max_doc_tokens), or use "
                "attention='full'"
            )
    return limits


def check_frame(
    tokenizer: object, prompt_kw: dict, max_prompt_tokens: int, *, calibrate: bool, block_positions: str | None
) -> None:
    """Refuse a budget that no prompt fits: the prompt of a one-word query and one one-word
    passage (instructions and chat template, ``prompt_kw`` as the prompts are built; block
    attention with ``block_positions``, else the full prompt) spans more. Found here, when a
    reranker is built, rather than at its first query."""
    docs = [Document("frame", "x")]
    if block_positions is not None:
        frame = block_extent(build_block_prompts(tokenizer, "x", docs, **prompt_kw), block_positions)
    else:
        frame = prompt_extent(build_rerank_prompts(tokenizer, "x", docs, **prompt_kw), calibrate)
    if frame > max_prompt_tokens:
        raise InputError(
            f"max_prompt_tokens={max_prompt_tokens} leaves no room for a passage: the prompt's instructions with "
            f"a one-word query and passage already span {frame} positions; raise max_prompt_tokens (None: "
            "LLM.prompt_budget, the model's context less 64)"
        )
