"""The capture core: one prompt, prefilled once, read by every attention stage.

The reranker, the pruner, head detection and the benchmarks all score a *window* the same way
(ICR, Chen et al. ICLR 2025): the shared context (instruction + candidates) is prefilled once;
the real query suffix and the content-free "N/A" calibration suffix then run over that cached
context (in one pass, neither seeing the other), capturing only the chosen heads' attention rows
of the query span, only up to the deepest chosen layer (:class:`~attnrank.llm.attention.AttentionCapturer`). The result is a
:class:`~attnrank.llm.rows.WindowRows` over the context tokens.

``query_span``: ``"full"`` averages the rows over the whole suffix (instruction through chat
suffix, as ICR/QRHead), ``"last"`` takes only its last token (ICR's attention-sorting ablation
with ``calibrate=False, token_filter=False``, which are on by default;
with ``extra_ids`` this is AttentionRAG's answer-hint token, which the pruner's ``focus`` method
reads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import TypeVar

import numpy as np
import torch

from ..errors import InputError
from .attention import AttentionCapturer, PrefixCache
from .blocks import BlockPrompt, check_positions
from .context import (
    DEFAULT_BATCH_BYTES,
    ContextBuffer,
    assemble_windows,
    one_window_per_pass,
    window_nbytes,
    windows_shape,
)
from .prompts import RerankPromptPair
from .rows import QUERY_SPANS, Span, WindowRows
from .states import (
    BlockState,
    StateCache,
    check_one_head_size,
    check_rotation,
    encode_blocks,
    layer_kv,
    rows_share_the_pass,
    state_keys,
)
from .statestore import PassageStateStore

T = TypeVar("T")


def check_query_span(query_span: str) -> str:
    if query_span not in QUERY_SPANS:
        raise InputError(f"query_span={query_span!r} is not one of {QUERY_SPANS}")
    return query_span


def capture_window(
    capturer: AttentionCapturer,
    pair: RerankPromptPair,
    *,
    calibrate: bool = True,
    query_span: str = "full",
    extra_ids: Sequence[int] = (),
    doc_index: list[int] | None = None,
    spans: list[Span] | None = None,
) -> WindowRows:
    """Prefill ``pair``'s context once and capture the real (and, with ``calibrate``, the "N/A")
    suffix's attention rows to it, in float64.

    ``extra_ids`` are appended to both suffixes (e.g. an answer hint); ``doc_index`` defaults to
    ``0..D-1`` and ``spans`` to the prompt's document spans (the pruner passes sentence spans).
    """
    check_query_span(query_span)
    prefix = capturer.prefill(pair.prefix_ids)
    suffixes = [pair.real_suffix_ids] + [pair.calibration_suffix_ids] * calibrate
    (rows,) = suffix_rows(capturer, prefix, suffixes, extra_ids, query_span)
    index = list(range(len(pair.doc_spans))) if doc_index is None else doc_index
    labelled = spans is None  # the prompt's document spans begin with their slot label; sentence spans do not
    spans = list(pair.doc_spans) if spans is None else spans
    return WindowRows(index, spans, pair.prefix_ids, rows[0], rows[1] if calibrate else None, labelled=labelled)


def capture_blocks(
    capturer: AttentionCapturer,
    prompt: BlockPrompt,
    prefix: PrefixCache,
    *,
    fingerprint: str,
    positions: str = "shared",
    calibrate: bool = True,
    query_span: str = "full",
    states: StateCache | None = None,
    store: PassageStateStore | None = None,
    extra_ids: Sequence[int] = (),
    buffer: ContextBuffer | None = None,
) -> WindowRows:
    """Block attention (:mod:`attnrank.llm.blocks`): each block's states from ``states`` or
    computed attending to ``prefix`` and itself; the suffixes then run over the assembled
    context and their rows are captured as in :func:`capture_window`.

    ``prefix`` is the prefilled :attr:`BlockPrompt.prefix_ids` (it is the same for every query,
    so callers keep it). The rows cover ``prompt.context_ids``, in prompt order. ``store``:
    states built at index time, read before encoding what neither cache holds; ``extra_ids``
    are appended to both suffixes (the pruner's answer hint); ``buffer`` lends the memory the
    context is assembled in (fresh memory if None)."""
    return capture_block_windows(
        capturer,
        [prompt],
        prefix,
        fingerprint=fingerprint,
        positions=positions,
        calibrate=calibrate,
        query_span=query_span,
        states=states,
        store=store,
        extra_ids=extra_ids,
        buffer=buffer,
    )[0]


def capture_block_windows(
    capturer: AttentionCapturer,
    prompts: Sequence[BlockPrompt],
    prefix: PrefixCache,
    *,
    fingerprint: str,
    positions: str = "shared",
    calibrate: bool = True,
    query_span: str = "full",
    states: StateCache | None = None,
    store: PassageStateStore | None = None,
    extra_ids: Sequence[int] = (),
    buffer: ContextBuffer | None = None,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> list[WindowRows]:
    """:func:`capture_blocks` of several windows of one query (same suffixes), each as if alone.

    The blocks no cache holds are encoded together (packs span the windows); the windows are
    then assembled side by side, up to ``batch_bytes`` of contexts at a time, and each such batch
    is read by one suffix pass (:meth:`~attnrank.llm.attention.AttentionCapturer.capture_suffixes_each`)."""
    check_query_span(query_span)
    check_positions(positions)
    if not prompts:
        return []
    first = prompts[0]
    shared = (first.prefix_ids, first.real_suffix_ids, first.calibration_suffix_ids)
    if any((p.prefix_ids, p.real_suffix_ids, p.calibration_suffix_ids) != shared for p in prompts):
        raise InputError("the windows of one block-attention pass must share their prefix and suffixes")
    check_one_head_size(prefix)  # before any block is encoded and kept
    if positions == "rotated":  # computed (and cached) at the shared positions, then moved
        check_rotation(capturer, prefix)
    starts = [p.starts("shared" if positions == "rotated" else positions) for p in prompts]
    found = window_states(capturer, prompts, prefix, starts, fingerprint=fingerprint, states=states, store=store)
    suffixes = [prompts[0].real_suffix_ids] + [prompts[0].calibration_suffix_ids] * calibrate
    room = sum(len(s) + len(extra_ids) for s in suffixes)
    windows = []  # (prompt, its blocks in prompt order, their shifts)
    for prompt, start, blocks in zip(prompts, starts, found):
        target = prompt.starts("sequential") if positions == "rotated" else start
        windows.append((prompt, [blocks[i] for i in prompt.order], [target[i] - start[i] for i in prompt.order]))
    out: list[WindowRows] = []
    alone = one_window_per_pass(capturer, prefix)
    for batch in _batches(windows, lambda w: window_nbytes(capturer, prefix, w[1], room), batch_bytes, alone):
        placed = [w[1] for w in batch]
        shape = windows_shape(capturer, prefix, placed, room)
        with (buffer or ContextBuffer()).take(shape, layer_kv(prefix.cache.layers[0])[0]) as memory:
            context = assemble_windows(capturer, prefix, placed, [w[2] for w in batch], room, memory)
            at = [w[0].suffix_start(positions) for w in batch]
            rows = suffix_rows(capturer, context, suffixes, extra_ids, query_span, at)
        for (prompt, _, _), r in zip(batch, rows):
            index = list(range(len(prompt.blocks)))
            null = r[1] if calibrate else None
            out.append(WindowRows(index, prompt.doc_spans, prompt.context_ids, r[0], null, labelled=False))
    return out


def _batches(items: list[T], size: Callable[[T], int], limit: int, one_each: bool) -> Iterator[list[T]]:
    """``items`` in order, in runs that take at most ``limit`` padded to their largest item
    (``len(run) * max(size)``; an item alone may exceed it), or one at a time (``one_each``)."""
    batch: list[T] = []
    largest = 0
    for item in items:
        n = size(item)
        if batch and (one_each or (len(batch) + 1) * max(largest, n) > limit):
            yield batch
            batch, largest = [], 0
        batch.append(item)
        largest = max(largest, n)
    if batch:
        yield batch


def window_states(
    capturer: AttentionCapturer,
    prompts: Sequence[BlockPrompt],
    prefix: PrefixCache,
    starts: Sequence[list[int]],
    *,
    fingerprint: str,
    states: StateCache | None = None,
    store: PassageStateStore | None = None,
) -> list[list[BlockState]]:
    """Every window's block states (input order): from ``states``, else from ``store`` (then
    kept in ``states``), else encoded, those of all windows together (and kept in ``states``)."""
    ids = [block for p in prompts for block in p.blocks]  # every window's blocks, one flat list
    at = [start for window in starts for start in window]
    keys = state_keys(capturer, fingerprint, prompts[0].prefix_ids, ids, at)
    found = [None if states is None else states.get(k) for k in keys]
    if store is not None:
        doc_ids = [d for p in prompts for d in p.doc_ids]
        for j, key in enumerate(keys):
            if found[j] is None and (stored := store.get(doc_ids[j], key, len(ids[j]))) is not None:
                found[j] = stored
                if states is not None:
                    states.put(key, stored)
    missing = {keys[j]: j for j, s in enumerate(found) if s is None}  # (a block in two windows: once)
    if missing:
        todo = list(missing.values())
        made = dict(zip(missing, encode_blocks(capturer, prefix, [ids[j] for j in todo], [at[j] for j in todo])))
        if states is not None:
            for key, state in made.items():
                states.put(key, state)
        found = [made[k] if s is None else s for k, s in zip(keys, found)]
    if states is not None:
        held = {k: s for k, s in zip(keys, found) if s is not None}
        states.check_room(
            sum(s.nbytes for s in held.values()), f"the {len(held)} passages of one block-attention query"
        )
    bounds = list(accumulate((len(p.blocks) for p in prompts), initial=0))
    return [[s for s in found[lo:hi] if s is not None] for lo, hi in zip(bounds, bounds[1:])]


def suffix_rows(
    capturer: AttentionCapturer,
    context: PrefixCache,
    suffixes: Sequence[Sequence[int]],
    extra_ids: Sequence[int],
    query_span: str,
    positions: Sequence[int] | None = None,
) -> list[list[np.ndarray]]:
    """Per context of ``context`` (a batch of windows, or one), each suffix's (``extra_ids``
    appended) attention rows over it, in float64, all from one pass
    (:meth:`~attnrank.llm.attention.AttentionCapturer.capture_suffixes_each`; one per suffix for
    dynamic int8 linears, whose input scale spans the pass, and for rotary frequencies that follow
    the pass's length). ``positions``:
    each context's first suffix position (default: right after the context)."""
    passes = [list(s) + list(extra_ids) for s in suffixes]
    starts = [len(ids) - 1 if query_span == "last" else 0 for ids in passes]
    at = [context.length] if positions is None else list(positions)
    # one input scale per pass (int8), or rotary frequencies that follow the pass's longest position
    # (dynamic NTK, LongRoPE): the real query's rows moved with the "N/A" beside it, and back
    if rows_share_the_pass(capturer.model, capturer.decoder):
        each = [
            capturer.capture_suffixes_each([p], [s], prefix=context, position_starts=at) for p, s in zip(passes, starts)
        ]
        rows = [torch.cat([one[c] for one in each]) for c in range(len(each[0]))]
    else:
        rows = capturer.capture_suffixes_each(passes, starts, prefix=context, position_starts=at)
    return [list(r.double().cpu().numpy()) for r in rows]
