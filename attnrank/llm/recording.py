"""The attention function attnrank registers with transformers, and what one pass records.

:func:`capture_attention` is registered under :data:`ATTN_IMPLEMENTATION` (with
:func:`~attnrank.llm.kernels.additive_mask` as its mask function). It computes every layer's
output as SDPA does and, while a :class:`CaptureSession` is active (:data:`ACTIVE_SESSION`), the
float32 softmax rows of the session's chosen heads and query rows only; :func:`stop_at` ends the
forward inside the deepest needed layer; under :func:`packed_segments` each packed segment
attends to the prefix and itself only (:func:`~attnrank.llm.layouts.segmented_forward`).
:class:`~attnrank.llm.attention.AttentionCapturer` drives it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from attnrank.errors import AttnrankError, ModelError

from .kernels import additive_mask, eager_forward, masked_scores, sdpa_forward
from .layouts import grouped_forward, padding_groups, segmented_forward, windowed_forward

ATTN_IMPLEMENTATION = "attnrank_capture"


class NonFiniteAttentionError(AttnrankError, ValueError):
    """A captured attention row holds NaN or inf (bad weights, overflow, or a fully masked row)."""


class StopForward(Exception):
    """Raised by the hook on the deepest needed decoder layer to end the forward pass early."""


@dataclass
class CaptureSession:
    """What one capture pass records: chosen heads per layer, query rows, and the captured rows.

    ``spans`` are the pass's query rows, each a tuple of row ranges ``[a, b)`` (a suffix that
    shares its beginning with another owns two), the same in every sequence of the batch; "mean"
    keeps, per layer, each span's rows averaged (``[batch, spans, heads, n_keys]``), "argmax"
    (batch of one, one range running to the pass's end) each row's top-1 key (``[heads, rows]``)."""

    layer_heads: dict[int, torch.Tensor]
    spans: list[tuple[tuple[int, int], ...]]
    n_keys: int
    rows: dict[int, torch.Tensor] = field(default_factory=dict)
    reduce: str = "mean"

    def record(
        self,
        module: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        mask: torch.Tensor | None,
        scaling: float,
        softcap: float | None,
    ) -> None:
        heads = self.layer_heads.get(getattr(module, "layer_idx", -1))
        if heads is None:
            return
        heads = heads.to(query.device)
        groups = query.shape[1] // key.shape[1]  # GQA: query head h reads KV head h // groups
        first = min(a for ranges in self.spans for a, _ in ranges)
        q = query[:, heads, first:]
        k = key[:, heads // groups]
        scores = masked_scores(q, k, mask, scaling, softcap, first, query.shape[2])
        if self.reduce == "argmax":  # softmax is monotone: the top-1 key is the logits' argmax
            nan = torch.isnan(scores[0]).flatten(1).any(dim=1)  # argmax would return a NaN's index
            if bool(nan.any()):
                raise NonFiniteAttentionError(
                    f"attention of layer {module.layer_idx}, head {int(heads[int(nan.nonzero()[0, 0])])} is not "
                    "finite (NaN); check the model weights and dtype (float16 overflow: load it in bfloat16 "
                    "or float32)"
                )
            offset = self.n_keys - scores.shape[-1]  # a sliding-window layer sees the last keys
            self.rows[module.layer_idx] = scores[0].argmax(dim=-1) + offset  # [n_heads, n_rows]
            return
        probs = torch.softmax(scores, dim=-1)  # [batch, n_heads, rows, n_keys_seen]
        # Keys seen are the last ones of the sequence (a sliding-window layer sees fewer).
        out = probs.new_zeros(probs.shape[0], len(self.spans), len(heads), self.n_keys)
        for i, ranges in enumerate(self.spans):
            # a span of several ranges (a suffix continuing a shared trunk): the ranges' sums over
            # their count, not a concatenation, which copied tens of thousands of keys per row
            total = sum(probs[:, :, a - first : b - first].sum(dim=2) for a, b in ranges)
            out[:, i, :, self.n_keys - probs.shape[-1] :] = total / sum(b - a for a, b in ranges)
        self.rows[module.layer_idx] = out


ACTIVE_SESSION: ContextVar[CaptureSession | None] = ContextVar("attnrank_capture_session", default=None)
# The deepest layer of the running pass: its attention function ends the forward. Why there and
# not after the layer: nothing reads that layer's output, only its cached keys/values and captured
# rows, so its attention output, output projection and MLP (about 85% of a layer) are skipped.
_STOP_LAYER: ContextVar[int | None] = ContextVar("attnrank_stop_layer", default=None)


@dataclass
class PackedSegments:
    """The running pass packs segments after ``n_prefix`` cached tokens (see :func:`packed_segments`)."""

    n_prefix: int
    lengths: list[int]
    masks: dict[int, torch.Tensor] = field(default_factory=dict)  # per segment length, shared by the layers

    def serves(self, key: torch.Tensor, softcap: float | None, kwargs: dict[str, Any]) -> bool:
        """Whether this layer's keys are the prefix and the segments, in a layer SDPA can compute
        (no soft-capping, sinks, position bias or dropout); otherwise the pass's mask serves."""
        plain = softcap is None and not kwargs.get("dropout") and kwargs.get("s_aux") is None
        return plain and kwargs.get("position_bias") is None and key.shape[2] == self.n_prefix + sum(self.lengths)


_SEGMENTS: ContextVar[PackedSegments | None] = ContextVar("attnrank_packed_segments", default=None)


@dataclass
class PaddedWindows:
    """The running pass's batch rows are windows padded in front to ``n_context`` cached tokens
    (row ``i`` by ``pads[i]``; see :func:`padded_windows`)."""

    pads: list[int]
    n_context: int
    grouped: bool = False  # rows in groups over shared keys (grouped_forward), not each alone
    _groups: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def groups(self, query: torch.Tensor, key: torch.Tensor) -> list[tuple[int, int]]:
        """:func:`~attnrank.llm.layouts.padding_groups` of this layer's shapes, made once per pass."""
        per_key = query.shape[1] * query.shape[2]
        if per_key not in self._groups:
            self._groups[per_key] = padding_groups(self.pads, key.shape[2], per_key)
        return self._groups[per_key]

    def serves(self, query: torch.Tensor, key: torch.Tensor, softcap: float | None, kwargs: dict[str, Any]) -> bool:
        """Whether this layer's keys are the padded contexts and the pass's own, in a layer SDPA
        can compute; otherwise the pass's mask serves."""
        plain = softcap is None and not kwargs.get("dropout") and kwargs.get("s_aux") is None
        whole = key.shape[2] == self.n_context + query.shape[2] and key.shape[0] == len(self.pads)
        return plain and kwargs.get("position_bias") is None and whole


_WINDOWS: ContextVar[PaddedWindows | None] = ContextVar("attnrank_padded_windows", default=None)


@contextmanager
def packed_segments(lengths: list[int], n_prefix: int) -> Iterator[None]:
    """For the passes run inside: the input is segments of ``lengths`` tokens after a cache of
    ``n_prefix`` tokens, each attending to that prefix and to itself only. The pass must still
    carry :func:`~attnrank.llm.kernels.segment_mask`'s mask (layers this path cannot serve use it)."""
    token = _SEGMENTS.set(PackedSegments(n_prefix, list(lengths)))
    try:
        yield
    finally:
        _SEGMENTS.reset(token)


@contextmanager
def padded_windows(pads: list[int], n_context: int, *, grouped: bool = False) -> Iterator[None]:
    """For the passes run inside: batch row ``i`` is a context of ``n_context`` cached tokens whose
    first ``pads[i]`` are padding, then the pass's own rows; each row attends to all of its context
    past the padding and, as the pass's mask says, to the pass's own rows
    (:func:`~attnrank.llm.layouts.windowed_forward`). The pass's mask must still mask the padding
    (layers this path cannot serve use it). ``grouped``: rows of similar padding attend together
    (:func:`~attnrank.llm.layouts.grouped_forward`: many short contexts) rather than each alone
    (long windows, each with its own kernel)."""
    token = _WINDOWS.set(PaddedWindows(list(pads), n_context, grouped))
    try:
        yield
    finally:
        _WINDOWS.reset(token)


def capture_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention function: plain SDPA, plus the rows of the active capture."""
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:  # (left out by SDPA and the rows)
        raise ModelError(
            f"{type(module).__name__} has attention sinks (a learned logit each head's softmax also "
            "spreads over: GPT-OSS), which attnrank's attention does not compute; use another model"
        )
    if kwargs.get("indices") is not None:  # (DeepSeek-V3.2's sparse attention: SDPA would attend densely)
        raise ModelError(
            f"{type(module).__name__} attends to a top-k selection of keys (sparse attention indices), which "
            "attnrank's attention does not compute; use another model"
        )
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    session = ACTIVE_SESSION.get()
    if session is not None and kwargs.get("position_bias") is not None:
        # (the layer's output is right: transformers' SDPA adds the bias; the recorded rows would not)
        raise ModelError(
            f"{type(module).__name__} adds a relative position bias to its attention scores (position_bias: "
            "Inkling), which attnrank's captured attention rows do not add; rerank it by its query likelihood "
            "(the default preset) or use another model"
        )
    if session is not None:
        session.record(module, query, key, attention_mask, scaling, softcap)
    stop = _STOP_LAYER.get()
    if stop is not None and getattr(module, "layer_idx", None) == stop:
        raise StopForward  # the deepest layer: its output is never read
    segments, windows = _SEGMENTS.get(), _WINDOWS.get()
    if segments is not None and segments.serves(key, softcap, kwargs):
        out = segmented_forward(query, key, value, segments.n_prefix, segments.lengths, scaling, segments.masks)
    elif windows is not None and attention_mask is not None and windows.serves(query, key, softcap, kwargs):
        if windows.grouped:
            out = grouped_forward(
                module, query, key, value, attention_mask, windows.pads, windows.groups(query, key), scaling
            )
        else:
            out = windowed_forward(query, key, value, attention_mask, windows.pads, scaling)
    elif softcap is None:
        out = sdpa_forward(module, query, key, value, attention_mask, scaling, **kwargs)
    else:
        out = eager_forward(query, key, value, attention_mask, scaling, softcap)
    return out, None


def ensure_registered() -> None:
    # The mask function must be registered too: for an unknown name transformers builds no mask
    # at all, and SDPA with is_causal=True over a KV cache would align the mask upper-left.
    if ATTN_IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, capture_attention)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, additive_mask)


_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def decoder_of(model: Any) -> Any:
    """The decoder of a causal LM (``get_decoder()``), or ``model`` itself if it is one. Where
    ``get_decoder()`` gives the causal LM back but its ``model`` holds the ``layers`` (Llama 4's text
    model, whose ``base_model_prefix`` names another attribute), that ``model``: every attention path
    refused it, saying its layers were not in a ``layers`` list."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    inner = getattr(decoder, "model", None) if decoder is model else None
    if not _holds_layers(decoder) and inner is not None and _holds_layers(inner):
        return inner
    return decoder


def _holds_layers(module: Any) -> bool:
    return isinstance(getattr(module, "layers", None), torch.nn.ModuleList)


def forward_lock(model: Any) -> threading.RLock:
    """The (reentrant) lock every forward pass attnrank runs on ``model`` holds; a model and its
    decoder share one.

    A capture switches the model config's attention implementation and hooks its deepest layer
    for the length of one pass. Another thread's pass over the same model meanwhile would run
    through both (and be stopped at that layer), and its end would restore the other's setting
    half-way through a capture; so the passes of one model run one at a time, whichever thread
    (server worker, a framework's thread pool, a user's own threads) starts them."""
    decoder = decoder_of(model)
    with _LOCKS_GUARD:
        lock = _LOCKS.get(decoder)
        if lock is None:
            lock = _LOCKS[decoder] = threading.RLock()
        return lock


@contextmanager
def attn_implementation(config: Any, name: str) -> Iterator[None]:
    """Switch the decoder config's attention implementation for one pass, then restore it."""
    previous = config._attn_implementation_internal
    config._attn_implementation_internal = name
    try:
        yield
    finally:
        config._attn_implementation_internal = previous


@contextmanager
def stop_at(layer: torch.nn.Module, index: int) -> Iterator[None]:
    """End the forward inside decoder layer ``index``'s attention function, or (for attention
    modules without a ``layer_idx``) after the layer."""

    def hook(*_: object) -> None:
        raise StopForward

    handle = layer.register_forward_hook(hook)
    token = _STOP_LAYER.set(index)
    try:
        yield
    except StopForward:
        pass
    finally:
        _STOP_LAYER.reset(token)
        handle.remove()
