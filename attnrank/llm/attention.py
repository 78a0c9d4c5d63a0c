"""Fast, selective attention capture from a causal LM.

Attention-based rerankers read a few attention heads of an LLM: ICR ("Attention in Large Language
Models Yields Efficient Zero-Shot Re-Rankers", Chen et al., ICLR 2025) averages the attention of
all heads from the query tokens to each passage and calibrates it with a content-free ("N/A")
query; QRHead ("Query-focused retrieval heads", Zhang et al., EMNLP 2025) uses a small set of
selected heads. Both only need, for chosen (layer, head) pairs, the softmax rows of the query
tokens averaged over those tokens.

:class:`AttentionCapturer` gets them without ``output_attentions=True``: through the attention
function :mod:`attnrank.llm.recording` registers with transformers' ``AttentionInterface``, which
computes the layer output with SDPA and, only for the chosen heads and query rows, the float32 rows
``softmax(q k^T * scaling + mask)``. The forward pass stops after the deepest layer that has a
chosen head (inside that layer's attention, once its keys and values are cached and its rows
recorded: its output projection and MLP are never computed), and a shared prefix can be prefilled once into a KV cache and reused by several
suffixes (ICR's calibration). :func:`naive_attention_rows` is the slow eager reference.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from attnrank.errors import InputError, ModelError

from .headspec import check_head_range, head_pair
from .kernels import segment_mask
from .kvcache import cache_argument, has_sliding_layers, is_recurrent
from .modelconfig import check_decoder_layers
from .recording import (
    ACTIVE_SESSION,
    ATTN_IMPLEMENTATION,
    CaptureSession,
    NonFiniteAttentionError,
    attn_implementation,
    ensure_registered,
    forward_lock,
    padded_windows,
    stop_at,
)

HeadSpec = list[tuple[int, int]] | None  # None = all heads of all layers (up to max_layer)
REDUCTIONS = ("mean", "argmax")  # AttentionCapturer.capture(reduce=...)


def _validate_heads(heads: HeadSpec, n_layers: int, n_heads: int, max_layer: int | None) -> list[tuple[int, int]]:
    if max_layer is not None and not 0 <= max_layer < n_layers:
        raise InputError(
            f"max_layer={max_layer} is out of range: the model has {n_layers} layers; "
            f"pass 0 <= max_layer <= {n_layers - 1} or None"
        )
    if heads is None:
        last = n_layers - 1 if max_layer is None else max_layer
        return [(layer, head) for layer in range(last + 1) for head in range(n_heads)]
    pairs = sorted({head_pair(h) for h in heads})  # (int() cut 1.7 to 1 without a word)
    if not pairs:
        raise InputError("the head list is empty; pass at least one (layer, head) pair, or None for all heads")
    check_head_range(pairs, n_layers, n_heads, max_layer)
    return pairs


def _positions(start: int, n: int, device: torch.device) -> torch.Tensor:
    if start < 0:
        raise InputError(f"position_start={start} must be >= 0")
    return torch.arange(start, start + n, device=device).unsqueeze(0)


def _as_ids(input_ids: torch.Tensor | list[int], device: torch.device) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device)
    ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] == 0:
        raise InputError(f"input_ids must hold one non-empty sequence (shape [n] or [1, n]); got {tuple(ids.shape)}")
    return ids


@dataclass(frozen=True)
class PrefixCache:
    """A prefilled shared prefix: its KV cache for layers 0..``deepest_layer``. Never mutated;
    each suffix pass runs on a :meth:`fork`.

    ``lengths``: a batch of contexts (block attention's windows, :func:`~attnrank.llm.context.assemble_windows`):
    sequence ``i`` holds padding, then its ``lengths[i]`` tokens, up to ``length``; None: one sequence."""

    cache: DynamicCache
    length: int
    deepest_layer: int
    decoder_id: int
    lengths: tuple[int, ...] | None = None

    @property
    def batch(self) -> int:
        return 1 if self.lengths is None else len(self.lengths)

    def fork(self) -> DynamicCache:
        """A cache sharing the prefix tensors (updates concatenate into new ones, so the prefix
        is never polluted), without copying them; the states of a convolution or recurrent layer
        (hybrid models: LFM2) are updated in place, so those are copied."""
        forked = copy.copy(self.cache)
        forked.layers = [
            copy.deepcopy(layer) if is_recurrent(layer) else copy.copy(layer) for layer in self.cache.layers
        ]
        return forked


class AttentionCapturer:
    """Captures the attention rows of chosen (layer, head) pairs of a causal LM (batch of one).

    ``heads`` lists (layer, head) pairs (None: all heads of layers 0..``max_layer``). The forward
    runs up to ``deepest_layer`` only: the deepest chosen layer, or ``max_layer`` if given (a
    prefix prefilled to ``max_layer`` can then serve capturers of shallower heads). Dropout is not
    disabled here: put the model in ``eval()`` mode.
    """

    def __init__(self, model: Any, heads: HeadSpec = None, max_layer: int | None = None):
        ensure_registered()
        self.model = model
        self.decoder = check_decoder_layers(model)
        self.num_layers = int(self.decoder.config.num_hidden_layers)
        self.num_heads = int(self.decoder.config.num_attention_heads)
        self.heads = _validate_heads(heads, self.num_layers, self.num_heads, max_layer)
        self.deepest_layer = max(layer for layer, _ in self.heads) if max_layer is None else max_layer
        self._cache_kwarg = cache_argument(self.decoder)
        self._layer_heads = {
            layer: torch.tensor([h for l2, h in self.heads if l2 == layer], dtype=torch.long)
            for layer in sorted({layer for layer, _ in self.heads})
        }

    def prefill(self, input_ids: torch.Tensor | list[int]) -> PrefixCache:
        """Run a shared prefix once (layers 0..deepest_layer, nothing captured) and keep its cache."""
        ids = _as_ids(input_ids, self.model.device)
        cache = DynamicCache(config=self.decoder.config)
        self._forward(ids, cache, None)
        return PrefixCache(cache, ids.shape[1], self.deepest_layer, id(self.decoder))

    def capture(
        self,
        input_ids: torch.Tensor | list[int],
        *,
        prefix: PrefixCache | None = None,
        query_start: int = 0,
        reduce: str = "mean",
        position_start: int | None = None,
        grad: bool = False,
    ) -> torch.Tensor:
        """Attention rows of the chosen heads, averaged over the query rows ``query_start:`` of
        this pass: float32 ``[len(self.heads), prefix length + len(input_ids)]``, rows in the order
        of ``self.heads``, columns the absolute key positions (prefix first).

        ``reduce="argmax"`` instead returns, for every query row, each head's top-1 attended key
        (absolute position): int64 ``[len(self.heads), len(input_ids) - query_start]``. This is
        what Wu et al.'s copy-paste retrieval score reads at each decoding step; it is computed
        per layer from ``[heads, rows, keys]`` logits, never from full attention matrices.

        ``position_start``: the position id of this pass's first token (default: right after the
        prefix). Block attention sets it, because its assembled context holds more tokens than
        its positions count (:mod:`attnrank.llm.blocks`).

        ``grad=True`` runs the pass with autograd on (not in inference mode), so the returned rows
        keep their graph back to any trainable parameters (QRRanker-style head fine-tuning,
        :mod:`attnrank.rerank.adapter`); the default captures under ``torch.inference_mode``."""
        if reduce not in REDUCTIONS:
            raise InputError(f"reduce={reduce!r} is not one of {REDUCTIONS}")
        ids = _as_ids(input_ids, self.model.device)
        if not 0 <= query_start < ids.shape[1]:
            raise InputError(
                f"query_start={query_start} is out of range for a pass of {ids.shape[1]} tokens; "
                f"pass 0 <= query_start <= {ids.shape[1] - 1}"
            )
        cache = None
        if prefix is not None:
            self._check_prefix(prefix)
            if prefix.batch != 1:
                raise InputError(f"this prefix cache holds {prefix.batch} contexts; capture reads one")
            cache = prefix.fork()
        n_keys = ids.shape[1] + (prefix.length if prefix is not None else 0)
        session = CaptureSession(self._layer_heads, [((query_start, ids.shape[1]),)], n_keys, reduce=reduce)
        positions = None if position_start is None else _positions(position_start, ids.shape[1], ids.device)
        self._forward(ids, cache, session, position_ids=positions, grad=grad)
        rows = self._collect(session)
        return rows if reduce == "argmax" else rows[0, 0]

    def capture_suffixes(
        self,
        suffixes: Sequence[Sequence[int]],
        query_starts: Sequence[int],
        *,
        prefix: PrefixCache,
        position_start: int | None = None,
    ) -> torch.Tensor:
        """Several suffixes over one prefix in one pass: each attends to the prefix and to itself,
        never to another, and each starts at ``position_start`` (default: right after the prefix).
        Returns float32 ``[len(suffixes), len(self.heads), prefix.length]``: row ``i`` is what
        :meth:`capture` gives for suffix ``i`` and ``query_starts[i]``, over the prefix's keys.

        One pass reads the prefix's keys and values once for all suffixes, where a pass per
        suffix reads them once each (ICR's real and calibration suffixes over a long context)."""
        if prefix.batch != 1:
            raise InputError(f"this prefix cache holds {prefix.batch} contexts; use capture_suffixes_each")
        start = prefix.length if position_start is None else position_start
        return self.capture_suffixes_each(suffixes, query_starts, prefix=prefix, position_starts=[start])[0]

    def capture_suffixes_each(
        self,
        suffixes: Sequence[Sequence[int]],
        query_starts: Sequence[int],
        *,
        prefix: PrefixCache,
        position_starts: Sequence[int],
    ) -> list[torch.Tensor]:
        """:meth:`capture_suffixes` over each context of a batched prefix (``prefix.lengths``, block
        attention's windows) in one pass: per context, float32 ``[len(suffixes), len(self.heads),
        its length]``; ``position_starts[i]`` is the first suffix position in context ``i``.

        Why one pass: the suffix rows are few (about 40 for ICR's two suffixes), so a pass per
        window spends as long reading the layers' weights as computing with them; in one pass
        the weights are read once for every window (5 windows at 100 SciFact abstracts)."""
        if len(suffixes) != len(query_starts) or not suffixes:
            raise InputError(f"{len(suffixes)} suffixes need as many query starts (got {len(query_starts)})")
        self._check_prefix(prefix)
        lengths = [prefix.length] if prefix.lengths is None else list(prefix.lengths)
        if len(position_starts) != len(lengths):
            raise InputError(f"{len(lengths)} contexts need as many position starts (got {len(position_starts)})")
        for s, start in zip(suffixes, query_starts):
            if not 0 <= start < len(s):
                raise InputError(f"query_start={start} is out of range for a suffix of {len(s)} tokens")
        n_prefix = prefix.length
        # Layers that keep a window, or run over the sequence in order (convolution, recurrence),
        # would let one suffix see another in a packed pass: one pass per suffix.
        if has_sliding_layers(prefix.cache) or any(is_recurrent(layer) for layer in prefix.cache.layers):
            if len(lengths) != 1:
                raise InputError(
                    "a model with sliding-window, convolution or recurrent layers takes one context per pass"
                )
            rows = [
                self.capture(list(s), prefix=prefix, query_start=q, position_start=position_starts[0])[:, :n_prefix]
                for s, q in zip(suffixes, query_starts)
            ]
            return [torch.stack(rows)]
        # The tokens all suffixes begin with (ICR's late instruction, before "Query: ..." and
        # "Query: N/A") run once, as a trunk each suffix continues: exact (same tokens, same
        # positions, same context) and a third fewer rows for ICR's two suffixes.
        trunk = _common_start(suffixes) if len(suffixes) > 1 else 0
        rests = [list(s[trunk:]) for s in suffixes]
        device = self.model.device
        sizes = torch.tensor([len(r) for r in rests], device=device)
        firsts = (torch.cumsum(sizes, 0) - sizes + trunk).tolist()  # each rest's first row in the pass
        spans = []
        for n, first, start in zip(sizes.tolist(), firsts, query_starts):
            own = ((first + max(start - trunk, 0), first + n),)
            spans.append((((start, trunk),) if start < trunk else ()) + own)
        ids = torch.tensor([list(suffixes[0][:trunk]) + [t for r in rests for t in r]], dtype=torch.long, device=device)
        mask, offset = segment_mask(sizes, n_prefix, next(self.model.parameters()).dtype, trunk)
        pads = [n_prefix - length for length in lengths]
        if len(lengths) > 1:  # each context's padding (before its own tokens) is masked out
            mask = mask.repeat(len(lengths), 1, 1, 1)
            for i, pad in enumerate(pads):
                mask[i, :, :, :pad] = torch.finfo(mask.dtype).min
            ids = ids.expand(len(lengths), -1)
        positions = torch.tensor(position_starts, device=device)[:, None] + offset[None]
        session = CaptureSession(self._layer_heads, spans, n_prefix + ids.shape[1])
        with padded_windows(pads, n_prefix):
            self._forward(ids, prefix.fork(), session, position_ids=positions, attention_mask=mask)
        batch = self._collect(session)
        return [batch[i, :, :, pad:n_prefix] for i, pad in enumerate(pads)]

    def run(
        self,
        input_ids: torch.Tensor,
        cache: DynamicCache,
        *,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> None:
        """Run a batch ``[B, n]`` through layers 0..deepest_layer into ``cache`` (nothing captured).

        ``attention_mask`` is the 2-D ``[B, cache length + n]`` padding mask (True = a real token);
        ``position_ids`` ``[B, n]`` the rotary positions."""
        self._forward(input_ids, cache, None, position_ids=position_ids, attention_mask=attention_mask)

    def _check_prefix(self, prefix: PrefixCache) -> None:
        if prefix.decoder_id != id(self.decoder) or prefix.deepest_layer < self.deepest_layer:
            raise InputError(
                f"this prefix cache holds layers 0..{prefix.deepest_layer} of another or shallower run, but "
                f"this capturer needs layers 0..{self.deepest_layer} of this model; prefill it with this "
                "capturer (or one built with max_layer >= the deepest layer of every capturer sharing it)"
            )

    def _forward(
        self,
        ids: torch.Tensor,
        cache: DynamicCache | None,
        session: CaptureSession | None,
        *,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        grad: bool = False,
    ) -> None:
        token = ACTIVE_SESSION.set(session)
        extra: dict[str, Any] = {self._cache_kwarg: cache}
        if position_ids is not None:
            extra["position_ids"] = position_ids
        if attention_mask is not None:
            extra["attention_mask"] = attention_mask
        try:
            with (
                forward_lock(self.decoder),
                torch.enable_grad() if grad else torch.inference_mode(),
                attn_implementation(self.decoder.config, ATTN_IMPLEMENTATION),
                stop_at(self.decoder.layers[self.deepest_layer], self.deepest_layer),
            ):
                self.decoder(input_ids=ids, use_cache=cache is not None, **extra)
        finally:
            ACTIVE_SESSION.reset(token)

    def _collect(self, session: CaptureSession) -> torch.Tensor:
        for layer, heads in self._layer_heads.items():
            rows = session.rows.get(layer)
            if rows is None:
                raise ModelError(
                    f"layer {layer} of {type(self.decoder).__name__} computed no attention through transformers' "
                    "AttentionInterface (a convolution, recurrent or linear-attention layer, or a model that "
                    "does not use the interface), so its heads cannot be captured; choose heads of its "
                    "attention layers"
                )
            if session.reduce == "argmax":  # key indices, not probabilities (NaN refused in record)
                continue
            finite = torch.isfinite(rows).all(dim=-1)  # [batch, spans, heads]
            if not bool(finite.all()):
                head = int(heads[int((~finite).nonzero()[0, -1])])
                raise NonFiniteAttentionError(
                    f"attention of layer {layer}, head {head} is not finite (NaN/inf); check the model "
                    "weights and dtype (float16 overflow: load it in bfloat16 or float32)"
                )
        return torch.cat(
            [session.rows[layer] for layer in self._layer_heads], dim=0 if session.reduce == "argmax" else 2
        )


def _common_start(suffixes: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all ``suffixes`` share, leaving each at least one of its own."""
    n = min(len(s) for s in suffixes) - 1
    for i in range(max(n, 0)):
        if any(s[i] != suffixes[0][i] for s in suffixes):
            return i
    return max(n, 0)


def naive_attention_rows(
    model: Any, input_ids: torch.Tensor | list[int], query_start: int, heads: HeadSpec = None
) -> torch.Tensor:
    """Slow reference for tests and benchmarks: a full eager forward with ``output_attentions=True``
    (all layers, all heads, full attention matrices), then the rows ``query_start:`` averaged.
    Same output layout as :meth:`AttentionCapturer.capture` without a prefix."""
    decoder = check_decoder_layers(model)
    pairs = _validate_heads(heads, int(decoder.config.num_hidden_layers), int(decoder.config.num_attention_heads), None)
    ids = _as_ids(input_ids, model.device)
    with forward_lock(decoder), torch.inference_mode(), attn_implementation(decoder.config, "eager"):
        attentions = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    return torch.stack([attentions[layer][0, head, query_start:].float().mean(dim=0) for layer, head in pairs])
