"""Block attention's contexts: the prefix and the blocks' states assembled into the cache a
query's suffixes run over (:func:`assemble`), one window or several side by side.

Several windows (a long candidate list is cut into windows, :mod:`attnrank.rerank.windows`) are
assembled as one batch, each padded to the longest, so that one suffix pass serves them all
(:meth:`~attnrank.llm.attention.AttentionCapturer.capture_suffixes_each`). :class:`ContextBuffer`
keeps the memory they are assembled in from one query to the next.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from attnrank.errors import InputError

from .attention import AttentionCapturer, PrefixCache
from .kvcache import has_sliding_layers, layer_window, sliding_window
from .rotary import nope_layers, rotate_into, rotation
from .states import BlockState, check_one_head_size, layer_kv, prefix_states, rows_share_the_pass

# Most bytes of contexts assembled side by side for one suffix pass (more windows run in several
# passes). Five 8,000-token windows of SmolLM2-135M in bfloat16 (100 SciFact abstracts) take
# about 750 MB; that memory stays with its ContextBuffer between queries.
DEFAULT_BATCH_BYTES = 1 << 30


class ContextBuffer:
    """Memory for assembled contexts, kept from one window to the next (one user at a time).

    Why: a fresh buffer of a window's states (over 100 MB at 20 SciFact abstracts) is
    page-faulted in as it is first written, which took about 4x as long as the copy into memory
    already touched (bfloat16, 2 CPUs). :meth:`take` lends the kept memory, grown as needed; a
    second user while it is lent (another thread) gets fresh memory instead of waiting. The cost:
    the largest batch of windows' states stays allocated with its owner (about 150 MB per
    8,000-token window of SmolLM2-135M in bfloat16), beside the state cache's budget."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._memory: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self._memory is None else sum(t.nbytes for t in self._memory)

    @contextmanager
    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Two tensors of ``shape`` (keys, values; ``like``'s dtype and device), uninitialised,
        valid until the block ends."""
        if not self._lock.acquire(blocking=False):
            yield like.new_empty(shape), like.new_empty(shape)
            return
        try:
            n = math.prod(shape)
            memory = self._memory
            if (
                memory is None
                or memory[0].numel() < n
                or memory[0].dtype != like.dtype
                or memory[0].device != like.device
            ):
                self._memory = None  # (freed before the larger one is allocated)
                # never an inference tensor, even when taken inside inference mode: kept memory is
                # written again by later callers, which may run outside it (torch refuses that)
                with torch.inference_mode(False):
                    memory = self._memory = (like.new_empty(n), like.new_empty(n))
            yield memory[0][:n].view(shape), memory[1][:n].view(shape)
        finally:
            self._lock.release()


def one_window_per_pass(capturer: AttentionCapturer, prefix: PrefixCache) -> bool:
    """Whether this model's windows must run one per suffix pass: sliding-window layers (their
    caches keep a window of the context), a rotary embedding whose frequencies follow the
    longest position in the batch (dynamic NTK, LongRoPE), which would let one window's length
    change another's positions, or dynamic int8 linears (one input scale over the batch)."""
    return has_sliding_layers(prefix.cache) or rows_share_the_pass(capturer.model, capturer.decoder)


def windows_shape(
    capturer: AttentionCapturer, prefix: PrefixCache, windows: Sequence[Sequence[BlockState]], room: int = 0
) -> tuple[int, int, int, int, int]:
    """The shape of :func:`assemble_windows`'s keys (and values):
    ``[layers, windows, kv_heads, longest window's tokens + room, head_dim]``."""
    k0 = check_one_head_size(prefix)
    length = max(_length(prefix, states) for states in windows)
    return (capturer.deepest_layer + 1, len(windows), int(k0.shape[1]), length + room, int(k0.shape[3]))


def window_nbytes(capturer: AttentionCapturer, prefix: PrefixCache, states: Sequence[BlockState], room: int = 0) -> int:
    """Bytes of one window's assembled keys and values."""
    k0 = layer_kv(prefix.cache.layers[0])[0]
    return 2 * math.prod(windows_shape(capturer, prefix, [states], room)) * k0.element_size()


def _length(prefix: PrefixCache, states: Sequence[BlockState]) -> int:
    return prefix.length + sum(s.n_tokens for s in states)


def assemble(
    capturer: AttentionCapturer,
    prefix: PrefixCache,
    states: Sequence[BlockState],
    shifts: Sequence[int] | None = None,
    room: int = 0,
    memory: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PrefixCache:
    """The context cache ``prefix + states`` (in the given order) for the suffix passes.

    ``shifts[i]``: positions to move block ``i``'s keys on (:func:`~attnrank.llm.states.rotate_keys`), rotated straight
    into place. ``room``: free tokens after the context, so that a suffix pass of up to that many
    tokens writes its states there (:class:`ContextLayer`) instead of copying the whole context,
    as a plain cache's concatenation does: at 100 SciFact abstracts the context's states are over a
    gigabyte. ``memory``: (keys, values) ``[layers, kv_heads, tokens + room, head_dim]`` to assemble into
    (:meth:`ContextBuffer.take`), instead of fresh memory."""
    batched = None if memory is None else (memory[0][:, None], memory[1][:, None])
    return assemble_windows(capturer, prefix, [states], None if shifts is None else [shifts], room, batched)


def context_limit(capturer: AttentionCapturer, cache: DynamicCache | None = None) -> int | None:
    """The most prefix and block tokens one block-attention context may hold: a model with
    sliding-window layers keeps fewer than its window (the cache's own: Llama 4's chunked layers
    have no ``config.sliding_window``; ``cache``: one of the model's, where the caller has one),
    None for a model without such layers."""
    window = sliding_window(cache if cache is not None else DynamicCache(config=capturer.decoder.config))
    return None if window is None else window - 1


def read_window(capturer: AttentionCapturer) -> int | None:
    """The most tokens one full prompt may hold for every captured head to read all of it: one
    less than the smallest sliding window among the layers holding a captured head (a sliding layer
    keeps and attends to its latest keys only), None where no captured head sits in one. Why: a
    passage further back than the window was read by no head of such a layer, recorded as zero
    attention, and ranked as if read and found irrelevant (Gemma 3: 5 of 6 layers slide over 512 or
    1,024 tokens)."""
    config = capturer.decoder.config
    cache = DynamicCache(config=config)
    types = list(getattr(config, "layer_types", None) or [])
    sizes = []
    for layer in {layer for layer, _ in capturer.heads}:
        window = layer_window(cache.layers[layer]) if layer < len(cache.layers) else None
        if window is not None:
            sizes.append(window)
        elif layer < len(types) and types[layer] in ("sliding_attention", "chunked_attention"):
            # (a layer keeping no cache of its own, Gemma 4's KV-shared ones, still attends within its window)
            size = getattr(config, "sliding_window", None) if types[layer] == "sliding_attention" else None
            size = size or getattr(config, "attention_chunk_size", None)
            if size:
                sizes.append(int(size))
    return min(sizes) - 1 if sizes else None


def assemble_windows(
    capturer: AttentionCapturer,
    prefix: PrefixCache,
    windows: Sequence[Sequence[BlockState]],
    shifts: Sequence[Sequence[int]] | None = None,
    room: int = 0,
    memory: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PrefixCache:
    """:func:`assemble` of several windows side by side: a cache of batch ``len(windows)``, each
    window's context padded in front (with zeros, never read: the suffix pass skips them) to the
    longest; its :attr:`~attnrank.llm.attention.PrefixCache.lengths` are the windows' own lengths
    (one window: None). Why in front: each window's keys and its suffix's then lie together, so
    the suffix pass attends over a view of its own keys only, not over the padding
    (:func:`~attnrank.llm.layouts.windowed_forward`). ``memory``: (keys, values) of
    :func:`windows_shape`."""
    lengths = [_length(prefix, states) for states in windows]
    cache = DynamicCache(config=capturer.decoder.config)
    sliding, limit = has_sliding_layers(cache), context_limit(capturer, cache)
    if limit is not None and max(lengths) > limit:
        raise InputError(
            f"the block-attention context holds {max(lengths)} tokens; this model's sliding window of {limit + 1} "
            f"takes at most {limit} before the query; rerank fewer or shorter passages, or use attention='full'"
        )
    if sliding and len(windows) > 1:
        raise InputError("a model with sliding-window layers takes one block-attention window per pass")
    context = prefix_states(capturer, prefix)
    # One buffer for every layer, so that each block is copied (and rotated) in one call for all
    # of its layers: a call per block and layer cost more than the copying at 100 passages.
    k0, v0 = context[0]
    shape = windows_shape(capturer, prefix, windows, room)
    keys, values = (k0.new_empty(shape), v0.new_empty(shape)) if memory is None else memory
    if keys.shape != shape or keys.dtype != k0.dtype or values.shape != shape or values.dtype != v0.dtype:
        raise InputError(
            f"the context memory is {tuple(keys.shape)} {keys.dtype}, this context needs {shape} {k0.dtype}"
        )
    length = max(lengths)
    for w, states in enumerate(windows):
        moves = list(shifts[w]) if shifts is not None else [0] * len(states)
        pad = length - lengths[w]
        _fill(capturer, context, prefix.length, states, moves, keys[:, w, :, pad:], values[:, w, :, pad:])
        keys[:, w, :, :pad] = 0
        values[:, w, :, :pad] = 0
    for layer in range(len(context)):
        if type(cache.layers[layer]) is DynamicLayer and room > 0:
            cache.layers[layer] = ContextLayer(keys[layer], values[layer], length)
        else:
            cache.update(keys[layer][:, :, :length], values[layer][:, :, :length], layer)
    own = None if len(windows) == 1 else tuple(lengths)
    return PrefixCache(cache, length, capturer.deepest_layer, prefix.decoder_id, own)


def _fill(
    capturer: AttentionCapturer,
    context: list[tuple[torch.Tensor, torch.Tensor]],
    n_prefix: int,
    states: Sequence[BlockState],
    shifts: Sequence[int],
    keys: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """Write the prefix (``context``) and the blocks, rotated by ``shifts``, into one window's
    ``[layers, kv_heads, tokens, head_dim]`` keys and values."""
    for layer, (k, v) in enumerate(context):
        keys[layer, :, :n_prefix], values[layer, :, :n_prefix] = k[0], v[0]
    turns: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    nope = [i for i in nope_layers(capturer) if i < len(context)]  # keys without a position: not rotated
    at = n_prefix
    for state, shift in zip(states, shifts):
        n = state.n_tokens
        if shift:
            if shift not in turns:
                turns[shift] = rotation(capturer, shift, keys)
            rotate_into(keys[:, :, at : at + n], state.keys.to(keys.dtype), *turns[shift])
            if nope:
                keys[nope, :, at : at + n] = state.keys[nope].to(keys.dtype)
        else:
            keys[:, :, at : at + n] = state.keys
        values[:, :, at : at + n] = state.values
        at += n


class ContextLayer(DynamicLayer):
    """A cache layer holding an assembled context in a buffer with room for a suffix pass after it.

    A suffix pass writes its keys/values after the context and attends over a view of the buffer:
    nothing is copied, and the context itself is never written. Passes over forks of one context
    (:meth:`PrefixCache.fork`) share the room, so they must run one after the other."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self.buffer_keys, self.buffer_values = keys, values
        self.keys, self.values = keys[:, :, :length], values[:, :, :length]
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if end > self.buffer_keys.shape[-2] or key_states.shape[0] != self.buffer_keys.shape[0]:
            return super().update(key_states, value_states, *args, **kwargs)  # no room: concatenate
        self.buffer_keys[:, :, start:end] = key_states
        self.buffer_values[:, :, start:end] = value_states
        self.keys, self.values = self.buffer_keys[:, :, :end], self.buffer_values[:, :, :end]
        return self.keys, self.values
