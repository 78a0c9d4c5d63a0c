"""The capture core: one prompt, prefilled once, read by every attention stage.

The reranker, the pruner, head detection and the benchmarks all score a *window* the same way
(ICR, Chen et al. ICLR 2025): the shared context (instruction + candidates) is prefilled once;
the real query suffix and the content-free "N/A" calibration suffix then run over that cached
context (in one pass, neither seeing the other), capturing only the chosen heads' attention rows
of the query span, only up to the deepest chosen layer (:class:`~attnrank.llm.attention.AttentionCapturer`). The result is a
:class:`~attnrank.llm.rows.WindowRows` over the context tokens.

``query_span``: ``"full"`` averages the rows over the whole suffix (instruction through chat
suffix, as ICR/QRHead), ``"last"`` takes only its last token (ICR's attention-sorting ablation;
with ``extra_ids`` this is AttentionRAG's answer-hint token, which the pruner's ``focus`` method
reads).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InputError
from .attention import AttentionCapturer, PrefixCache
from .blocks import BlockPrompt, check_positions
from .prompts import RerankPromptPair
from .rows import QUERY_SPANS, Span, WindowRows
from .states import (
    BlockState,
    ContextBuffer,
    StateCache,
    assemble,
    check_rotation,
    context_shape,
    encode_blocks,
    layer_kv,
    state_keys,
)
from .statestore import PassageStateStore


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
    rows = suffix_rows(capturer, prefix, suffixes, extra_ids, query_span)
    index = list(range(len(pair.doc_spans))) if doc_index is None else doc_index
    spans = list(pair.doc_spans) if spans is None else spans
    return WindowRows(index, spans, pair.prefix_ids, rows[0], rows[1] if calibrate else None)


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
    check_query_span(query_span)
    check_positions(positions)
    if positions == "rotated":  # computed (and cached) at the shared positions, then moved
        check_rotation(capturer, prefix)
    starts = prompt.starts("shared" if positions == "rotated" else positions)
    blocks = block_states(capturer, prompt, prefix, starts, fingerprint=fingerprint, states=states, store=store)
    target = prompt.starts("sequential") if positions == "rotated" else starts
    suffixes = [prompt.real_suffix_ids] + [prompt.calibration_suffix_ids] * calibrate
    room = sum(len(s) + len(extra_ids) for s in suffixes)
    order = prompt.order
    placed = [blocks[i] for i in order]
    shape = context_shape(capturer, prefix, placed, room)
    with (buffer or ContextBuffer()).take(shape, layer_kv(prefix.cache.layers[0])[0]) as memory:
        context = assemble(capturer, prefix, placed, [target[i] - starts[i] for i in order], room, memory)
        rows = suffix_rows(capturer, context, suffixes, extra_ids, query_span, prompt.suffix_start(positions))
    index = list(range(len(prompt.blocks)))
    return WindowRows(index, prompt.doc_spans, prompt.context_ids, rows[0], rows[1] if calibrate else None)


def block_states(
    capturer: AttentionCapturer,
    prompt: BlockPrompt,
    prefix: PrefixCache,
    starts: list[int],
    *,
    fingerprint: str,
    states: StateCache | None = None,
    store: PassageStateStore | None = None,
) -> list[BlockState]:
    """Every block's states (input order): from ``states``, else from ``store`` (then kept in
    ``states``), else encoded in batches (and kept in ``states``)."""
    keys = state_keys(capturer, fingerprint, prompt.prefix_ids, prompt.blocks, starts)
    found = [None if states is None else states.get(k) for k in keys]
    if store is not None:
        for i, key in enumerate(keys):
            if found[i] is None and (stored := store.get(prompt.doc_ids[i], key)) is not None:
                found[i] = stored
                if states is not None:
                    states.put(key, stored)
    missing = [i for i, s in enumerate(found) if s is None]
    if missing:
        new = encode_blocks(capturer, prefix, [prompt.blocks[i] for i in missing], [starts[i] for i in missing])
        for i, state in zip(missing, new):
            found[i] = state
            if states is not None:
                states.put(keys[i], state)
    return [s for s in found if s is not None]


def suffix_rows(
    capturer: AttentionCapturer,
    context: PrefixCache,
    suffixes: Sequence[Sequence[int]],
    extra_ids: Sequence[int],
    query_span: str,
    position: int | None = None,
) -> list[np.ndarray]:
    """Each suffix's (``extra_ids`` appended) attention rows over ``context``, in float64, all
    from one pass (:meth:`~attnrank.llm.attention.AttentionCapturer.capture_suffixes`)."""
    passes = [list(s) + list(extra_ids) for s in suffixes]
    starts = [len(ids) - 1 if query_span == "last" else 0 for ids in passes]
    rows = capturer.capture_suffixes(passes, starts, prefix=context, position_start=position)
    return list(rows.double().cpu().numpy())
