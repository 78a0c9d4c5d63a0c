"""Passage states for block attention: encode blocks, keep them in an LRU, move them.

A block's key/value states (:class:`BlockState`, decoder layers 0..deepest) are computed by
:func:`encode_blocks` — blocks packed, each attending to the shared prefix and to itself
(:mod:`attnrank.llm.blocks`) — and :func:`attnrank.llm.context.assemble` concatenates prefix and
blocks into the cache the query suffix runs over. :class:`StateCache` keeps recently used
states in memory under a byte budget, keyed by :func:`state_keys` (model fingerprint, layers,
dtype, prefix, block ids and start position), so a warm query computes only its own suffix.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from attnrank.errors import InputError, ModelError

from .attention import AttentionCapturer, PrefixCache
from .kernels import segment_mask
from .kvcache import sliding_window
from .quantize import is_int8
from .recording import packed_segments
from .rotary import nope_layers, rotary_follows_length, rotate_into, rotation

logger = logging.getLogger(__name__)

DEFAULT_BATCH_TOKENS = 4096  # padded block tokens per encoding batch (models that are not packed)
# Block tokens per packed sequence (0: pad instead). Packed blocks attend by one SDPA each
# (layouts.segmented_forward), so packing wastes nothing; longer packs feed the linear layers
# larger matrices. Cold encoding, bfloat16, 2 CPUs, median of 3-5 interleaved rounds (s/query):
# DL19 top-20 0.65 at 4096 against 0.90 at 1024 and 1.20 padded; SciFact top-20 2.46 against
# 2.45 and 3.63; DL19 top-100 2.35 against 2.71 and 2.87. (Under one block-diagonal mask per
# pack, as before, 1024-token packs took 0.99, 3.30 and 3.79: the masked products cost more
# than padding saved, except on DL19's short passages.)
DEFAULT_PACK_TOKENS = 4096


@dataclass(frozen=True)
class BlockState:
    """Keys and values of one block: ``[layers, kv_heads, tokens, head_dim]`` each."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def n_tokens(self) -> int:
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


def state_keys(
    capturer: AttentionCapturer,
    fingerprint: str,
    prefix_ids: Sequence[int],
    blocks: Sequence[Sequence[int]],
    starts: Sequence[int],
) -> list[str]:
    """What each block's states depend on: the model (fingerprint, dtype, layers kept), the
    prefix it attends to, its own ids and its first position (the shared part hashed once)."""
    shared = hashlib.sha256()
    dtype = next(capturer.model.parameters()).dtype
    shared.update(f"{fingerprint}|{dtype}|{capturer.deepest_layer}|".encode())
    shared.update(",".join(map(str, prefix_ids)).encode() + b"|")
    keys = []
    for block, start in zip(blocks, starts):
        h = shared.copy()
        h.update(f"{start}|".encode() + ",".join(map(str, block)).encode())
        keys.append(h.hexdigest())
    return keys


def prefix_states(capturer: AttentionCapturer, prefix: PrefixCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The prefix's (keys, values) per layer 0..deepest, ``[1, kv_heads, P, head_dim]`` each."""
    return [layer_kv(layer) for layer in prefix.cache.layers[: capturer.deepest_layer + 1]]


def layer_kv(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache layer's (keys, values); an error for layers without them (linear attention)."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
        raise InputError(
            f"block attention needs key/value caches, and this model's {type(layer).__name__} has none; "
            "use attention='full'"
        )
    return keys, values


def rows_share_the_pass(model: Any, decoder: Any) -> bool:
    """Whether a sequence's outputs depend on the other sequences of its pass: rotary frequencies
    that follow the pass's longest position (dynamic NTK, LongRoPE), or dynamic int8 linears (one
    input scale over the pass). Such a model runs each block, window, suffix or context alone."""
    return rotary_follows_length(decoder) or is_int8(model)


def check_one_head_size(prefix: PrefixCache) -> torch.Tensor:
    """The first layer's keys of ``prefix``, refused (ModelError) where keys and values differ in
    width (DeepSeek's multi-head latent attention), or where layers differ in key/value heads or
    head size (Gemma 4's full-attention layers beside its sliding ones): block states are
    assembled as one array of every layer. Checked before any block is encoded or stored."""
    k0, v0 = layer_kv(prefix.cache.layers[0])
    if v0.shape[3] != k0.shape[3]:
        raise ModelError(
            f"block attention assembles keys and values of one head size, and this model's are {k0.shape[3]} and "
            f"{v0.shape[3]} wide (multi-head latent attention, as DeepSeek's); use attention='full'"
        )
    for i, layer in enumerate(prefix.cache.layers[1:], start=1):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor) or not isinstance(values, torch.Tensor):
            continue  # (past the deepest layer the prefill ran: never read)
        if keys.shape[1::2] != k0.shape[1::2] or values.shape[1::2] != v0.shape[1::2]:
            raise ModelError(
                f"block attention assembles every layer's states as one array, and this model's layer {i} has "
                f"{keys.shape[1]} key/value heads of size {keys.shape[3]} where layer 0 has {k0.shape[1]} of size "
                f"{k0.shape[3]} (as Gemma 4's full-attention layers); use attention='full'"
            )
    return k0


def encode_blocks(
    capturer: AttentionCapturer,
    prefix: PrefixCache,
    blocks: Sequence[Sequence[int]],
    starts: Sequence[int],
    *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    pack_tokens: int | None = None,
) -> list[BlockState]:
    """Each block's states, computed attending to ``prefix`` and itself only (block attention).

    Blocks are sorted by length and either packed, without padding, into sequences of up to
    ``pack_tokens`` tokens (:func:`_encode_packed`), or batched (right-padded, masked) up to
    ``batch_tokens`` padded tokens. ``pack_tokens=None`` packs :data:`DEFAULT_PACK_TOKENS`; 0
    never packs; a model with sliding-window layers (whose caches drop early tokens) is never
    packed, and one whose rotary frequencies follow the pass's longest position (dynamic NTK,
    LongRoPE) or whose linear layers are dynamic int8 encodes each block alone: beside a block at
    later positions, or beside larger activations, a block's states would differ from those it gets
    alone, under the same cache key. ``starts[i]`` is block ``i``'s
    first position id."""
    if len(blocks) != len(starts):
        raise InputError(f"{len(blocks)} blocks but {len(starts)} start positions")
    if any(len(b) == 0 for b in blocks):
        raise InputError("a block is empty; every passage needs at least one token")
    window = check_block_window(capturer, prefix.length, max((len(b) for b in blocks), default=0))
    order = sorted(range(len(blocks)), key=lambda i: len(blocks[i]))
    pack = DEFAULT_PACK_TOKENS if pack_tokens is None else pack_tokens
    # (int8: a dynamic int8 linear's input scale spans the pass, so a block's states would depend
    # on its neighbours, which the cache key does not hold)
    alone = rows_share_the_pass(capturer.model, capturer.decoder)
    if alone or window is not None:  # (sliding-window caches keep the latest tokens of the pass)
        pack = 0
    out: list[BlockState | None] = [None] * len(blocks)
    batch: list[int] = []
    for i in order:
        full = alone or (
            sum(len(blocks[j]) for j in batch) + len(blocks[i]) > pack
            if pack
            else len(blocks[i]) * (len(batch) + 1) > batch_tokens
        )
        if batch and full:
            (_encode_packed if pack else _encode_batch)(capturer, prefix, blocks, starts, batch, out)
            batch = []
        batch.append(i)
    if batch:
        (_encode_packed if pack else _encode_batch)(capturer, prefix, blocks, starts, batch, out)
    return [s for s in out if s is not None]


def check_block_window(capturer: AttentionCapturer, prefix_length: int, longest: int) -> int | None:
    """Refuse a block of ``longest`` tokens after a ``prefix_length``-token prefix that reaches the
    model's sliding window (its cache would drop the block's first tokens: states of the wrong
    tokens, kept and reused later), before any block is encoded; returns the window (None: none)."""
    window = sliding_window(DynamicCache(config=capturer.decoder.config))
    if window is not None and prefix_length + longest >= window:
        raise InputError(
            f"a passage of {longest} tokens after the {prefix_length}-token instruction reaches this model's "
            f"sliding window of {window}; rerank shorter passages (max_doc_tokens), or use attention='full'"
        )
    return window


def _encode_packed(
    capturer: AttentionCapturer,
    prefix: PrefixCache,
    blocks: Sequence[Sequence[int]],
    starts: Sequence[int],
    batch: list[int],
    out: list[BlockState | None],
) -> None:
    """The blocks of ``batch`` as one sequence: each token attends to the prefix and to the tokens
    of its own block up to itself (BlockRank's structured mask), at its block's own positions.
    Nothing is computed for padding or for the mask's cross-block zeros: each block's attention
    is its own SDPA (:func:`~attnrank.llm.recording.packed_segments`); the mask serves layers
    that path cannot (soft-capped logits)."""
    device = capturer.model.device
    lengths = torch.tensor([len(blocks[i]) for i in batch], device=device)
    ids = torch.tensor([[t for i in batch for t in blocks[i]]], dtype=torch.long, device=device)
    mask, offset = segment_mask(lengths, prefix.length, next(capturer.model.parameters()).dtype)
    begin = torch.tensor([starts[i] for i in batch], device=device)
    positions = (torch.repeat_interleave(begin, lengths) + offset)[None]
    cache = DynamicCache(config=capturer.decoder.config)
    for layer, (k, v) in enumerate(prefix_states(capturer, prefix)):
        cache.update(k, v, layer)
    with packed_segments(lengths.tolist(), prefix.length):
        capturer.run(ids, cache, position_ids=positions, attention_mask=mask)
    layers = [layer_kv(layer) for layer in cache.layers[: capturer.deepest_layer + 1]]
    firsts = (torch.cumsum(lengths, 0) - lengths).tolist()  # each block's first index in the sequence
    for i, a, n in zip(batch, firsts, lengths.tolist()):
        out[i] = row_state(layers, 0, prefix.length + a, n)


def _encode_batch(
    capturer: AttentionCapturer,
    prefix: PrefixCache,
    blocks: Sequence[Sequence[int]],
    starts: Sequence[int],
    batch: list[int],
    out: list[BlockState | None],
) -> None:
    device = capturer.model.device
    n_prefix, width = prefix.length, max(len(blocks[i]) for i in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(batch), n_prefix + width), dtype=torch.bool, device=device)
    mask[:, :n_prefix] = True
    for r, i in enumerate(batch):
        ids[r, : len(blocks[i])] = torch.as_tensor(list(blocks[i]), dtype=torch.long)
        mask[r, n_prefix : n_prefix + len(blocks[i])] = True
    positions = torch.tensor([starts[i] for i in batch], device=device)[:, None] + torch.arange(width, device=device)
    cache = DynamicCache(config=capturer.decoder.config)
    for layer, (k, v) in enumerate(prefix_states(capturer, prefix)):
        cache.update(k.expand(len(batch), -1, -1, -1), v.expand(len(batch), -1, -1, -1), layer)
    capturer.run(ids, cache, position_ids=positions, attention_mask=mask)
    layers = [layer_kv(layer) for layer in cache.layers[: capturer.deepest_layer + 1]]
    for r, i in enumerate(batch):
        out[i] = row_state(layers, r, n_prefix, len(blocks[i]))


def row_state(layers: list[tuple[torch.Tensor, torch.Tensor]], row: int, at: int, n: int) -> BlockState:
    """The states of the ``n`` tokens from ``at`` in batch row ``row`` of a pass's cache (every
    layer's keys and values, copied, so the pass's cache can be freed)."""
    keys = torch.stack([k[row, :, at : at + n] for k, _ in layers]).clone()
    values = torch.stack([v[row, :, at : at + n] for _, v in layers]).clone()
    return BlockState(keys, values)


class StateCache:
    """Least-recently-used passage states in memory, at most ``max_bytes`` in all (0 disables).
    Safe to share between threads (a lock guards each lookup and insertion)."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise InputError(f"state cache budget {max_bytes} bytes must be >= 0 (0 disables the cache)")
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, BlockState] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = self.misses = 0
        self._warned = False

    def __len__(self) -> int:
        return len(self._items)

    def check_room(self, nbytes: int, what: str) -> None:
        """Warn (once per cache) when the states one call keeps, ``nbytes`` for ``what``, do not
        fit the budget: the call then evicts its own first states, and a repeat of it, evicting
        in turn what it needs next, reuses almost none."""
        if self.max_bytes == 0 or nbytes <= self.max_bytes or self._warned:
            return
        self._warned = True
        need = -(-nbytes // (1 << 20))
        logger.warning(
            "%s keep %d MB of states, over the %d MB state cache: a repeat reuses almost none of them; "
            "raise state_cache_mb (--state-cache-mb) to at least %d",
            what,
            need,
            self.max_bytes >> 20,
            need,
        )

    def get(self, key: str) -> BlockState | None:
        with self._lock:
            state = self._items.get(key)
            if state is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return state

    def put(self, key: str, state: BlockState) -> None:
        if state.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.nbytes -= old.nbytes
            self._items[key] = state
            self.nbytes += state.nbytes
            while self.nbytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self.nbytes -= dropped.nbytes

    @property
    def n_tokens(self) -> int:
        """Block tokens held (all layers of a token count once)."""
        with self._lock:
            return sum(s.n_tokens for s in self._items.values())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0

    def stats(self) -> dict[str, int]:
        """What the cache holds and how often it served: passages (``held``), their ``tokens``,
        their ``bytes`` of ``budget_bytes``, and lookups that found states (``hits``) or not (``misses``)."""
        with self._lock:
            tokens = sum(s.n_tokens for s in self._items.values())
            held, nbytes, hits, misses = len(self._items), self.nbytes, self.hits, self.misses
        return {
            "held": held,
            "tokens": tokens,
            "bytes": nbytes,
            "budget_bytes": self.max_bytes,
            "hits": hits,
            "misses": misses,
        }


def rotate_keys(capturer: AttentionCapturer, state: BlockState, delta: int) -> BlockState:
    """``state`` moved ``delta`` positions on: its keys rotated by the model's rotary embedding
    (``R(p)R(δ) = R(p+δ)``) except in NoPE layers (:func:`nope_layers`), values unchanged. Exact for the first layer's keys of a model with
    standard rotary embeddings (see :func:`check_rotation`)."""
    if delta == 0:
        return state
    k = state.keys
    out = torch.empty_like(k)
    rotate_into(out, k, *rotation(capturer, delta, k))
    nope = [i for i in nope_layers(capturer) if i < k.shape[0]]
    if nope:
        out[nope] = k[nope]
    return BlockState(out, state.values)


# per decoder object, held weakly: keyed by id() a freed model's verdict would pass to the next
# model allocated at its address
_ROTATION_OK: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def check_rotation(capturer: AttentionCapturer, prefix: PrefixCache) -> None:
    """Refuse ``"rotated"`` positions for a model whose rotary embedding does not compose as
    :func:`rotate_keys` assumes: a probe block's keys in the first layer with rotary embeddings
    (NoPE layers before it see no position), rotated by 7 positions, must equal the keys computed
    7 positions on (checked once per model), and the embedding must not scale its cosines and
    sines (YaRN's attention scaling, which a rotation by δ would apply twice). A rotary embedding per
    layer type (Gemma 3's local and global bases) or over part of each head (partial rotary:
    Phi, StableLM) is refused without that comparison: one rotation of whole heads cannot serve it."""
    key = capturer.decoder
    if key not in _ROTATION_OK:
        rotary = getattr(capturer.decoder, "rotary_emb", None)
        if rotary is not None and "layer_type" in inspect.signature(rotary.forward).parameters:
            _ROTATION_OK[key] = False
        else:
            probe = [[1, 2, 3, 4]]
            at = encode_blocks(capturer, prefix, probe, [prefix.length])[0]
            if (
                rotation(capturer, 7, at.keys)[0].shape[-1] != at.keys.shape[-1]  # partial rotary
                or float(getattr(rotary, "attention_scaling", 1.0) or 1.0) != 1.0  # YaRN: cos and sin scaled
            ):
                _ROTATION_OK[key] = False
            else:
                # the first layer with rotary embeddings: a NoPE layer before it sees no position,
                # so its input is the same at both places and its keys compare exactly
                nope = set(nope_layers(capturer))
                first = next((i for i in range(at.keys.shape[0]) if i not in nope), None)
                if first is None:  # no layer the scorer reads has a position: nothing to rotate
                    _ROTATION_OK[key] = True
                else:
                    moved = encode_blocks(capturer, prefix, probe, [prefix.length + 7])[0].keys[first]
                    turned = rotate_keys(capturer, at, 7).keys[first]
                    scale = float(moved.abs().max()) or 1.0
                    tolerance = 1e-4 if moved.dtype == torch.float32 else 3e-2  # half precision rounds
                    _ROTATION_OK[key] = float((turned - moved).float().abs().max()) <= tolerance * scale
    if not _ROTATION_OK[key]:
        raise InputError(
            f"block_positions='rotated': the rotary embedding of {type(capturer.decoder).__name__} does not "
            "compose as standard RoPE (partial, scaled or per-layer-type rotary); use 'shared' or 'sequential'"
        )
