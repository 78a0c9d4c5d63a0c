"""How likely a causal LM finds one continuation after each of several contexts.

:func:`continuation_logprob` scores ``log p(continuation | context)`` per token, in nats, for a
batch of contexts that share the continuation (the query-likelihood reranker of
:mod:`attnrank.rerank.likelihood` asks it for the query after every passage). The contexts are
left-padded so that every sequence ends with the continuation at the same positions: the model
then computes logits for those few positions only (``logits_to_keep``), not for the whole prompt
over the vocabulary. Position ids count real tokens only, so a padded sequence is scored as the
same sequence alone (but for attention that reads a token's index in the pass rather than its
position id: Llama 4's temperature tuning of its NoPE layers, whose steps of 8,192 positions a
pass of the default ``batch_tokens`` never reaches). Sequences computed in full go in batches of about ``batch_tokens`` tokens
(padding included), sorted by length so that little padding is computed; passes over kept states
take up to :data:`DEFAULT_PAST_TOKENS` kept tokens each (assembled one layer at a time).

Reusable context states: a context does not depend on the continuation, so with a
:class:`~attnrank.llm.states.StateCache` the keys and values of every layer over a context, and
the logits its last token gave (which predict any continuation's first token), are kept after the
first pass (:class:`ContextState`); a later call with the same context runs only the continuation
but its last token over them (:func:`_suffix_logprob`: the last token predicts nothing that is
scored) — for the query likelihood, a passage seen by an earlier query costs the new query's
tokens, not the passage's.
Models with sliding-window or non-attention layers (whose caches do not keep every token) are
always computed in full.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from attnrank.errors import InputError

from .context import ContextBuffer, ContextLayer
from .kvcache import cache_argument
from .models import LLM
from .recording import (
    ATTN_IMPLEMENTATION,
    attn_implementation,
    decoder_of,
    ensure_registered,
    forward_lock,
    padded_windows,
)
from .states import BlockState, StateCache, layer_kv, row_state, rows_share_the_pass

DEFAULT_BATCH_TOKENS = 2048
# Cached context tokens (padding included) for one suffix pass, assembled a layer at a time (one
# layer's are about 12 MB of SmolLM2-135M states in bfloat16); the pass itself computes only the
# suffixes. Room for 20 SciFact
# abstracts (cut at 300 words, titled: up to ~800 tokens each once padded to the longest) or 100
# DL19 passages in one pass: 8,192 split the first in two, 10 % slower (2 cores), and so did
# 12,288 where one long abstract was among the 20.
DEFAULT_PAST_TOKENS = 16384


@dataclass(frozen=True)
class ContextState(BlockState):
    """A context's kept states: every layer's keys and values over all its tokens
    (``[layers, kv_heads, tokens, head_dim]``), and the logits its last token gave (``[vocab]``,
    the model's dtype), which predict any continuation's first token.

    Why the logits: without them a later pass must run the context's last token again to predict
    the continuation's first, one more token per row than the continuation needs (a SciFact claim
    is 8-17 tokens). They cost the vocabulary in the model's dtype (96 KB for SmolLM2-135M in
    bfloat16) beside 22.5 KB of states per context token."""

    next_logits: torch.Tensor

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.next_logits.nbytes


def continuation_logprob(
    llm: LLM,
    contexts: Sequence[Sequence[int]],
    continuation: Sequence[int],
    *,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    states: StateCache | None = None,
    buffer: ContextBuffer | None = None,
) -> np.ndarray:
    """Log-probability (nats, float32) of each token of ``continuation`` following each of the
    token-id lists ``contexts``: shape [contexts, continuation tokens], input order (a context's
    mean log-probability per token is its row's mean). Each context needs at least one token, and
    context plus continuation must fit the model's context length. With ``states``, contexts seen
    before reuse their kept states and new ones are kept there; ``buffer`` lends the memory the
    reused states are assembled in (kept from call to call). ``batch_tokens`` bounds the passes
    computed in full; a pass over kept states holds up to :data:`DEFAULT_PAST_TOKENS` of them."""
    cont = [int(t) for t in continuation]
    if not cont:
        raise InputError("the continuation is empty; give at least one token to score")
    if batch_tokens < 1:
        raise InputError(f"batch_tokens={batch_tokens} must be >= 1")
    seqs = [[int(t) for t in c] + cont for c in contexts]
    if not seqs:
        return np.empty((0, len(cont)), dtype=np.float32)
    for i, s in enumerate(seqs):
        if len(s) == len(cont):
            raise InputError(f"context #{i} is empty; the first continuation token needs one token before it")
        if len(s) > llm.context_length:
            raise InputError(
                f"context #{i} with its continuation is {len(s)} tokens, over the {llm.context_length}-token "
                f"context of {llm.model_id}; shorten it (e.g. max_doc_words / max_doc_tokens)"
            )
    # one per pass where a row's scores would depend on the rows beside it (and the states kept under
    # its ids too): int8 linears scale a batch's input as one, and dynamic NTK / LongRoPE frequencies
    # follow the batch's longest sequence
    if rows_share_the_pass(llm.model, decoder_of(llm.model)):
        batch_tokens = 0
    if states is None or states.max_bytes == 0 or not reuses_states(llm):
        out = np.empty((len(seqs), len(cont)), dtype=np.float32)
        first = _first_of_each(seqs)  # (a copy in another batch could score otherwise in bfloat16)
        for batch in _batches(sorted(set(first)), [len(s) for s in seqs], batch_tokens):
            out[batch] = _batch_logprob(llm, [seqs[i] for i in batch], len(cont), False)[0]
        return out[first]
    return _reusing_states(llm, seqs, len(cont), batch_tokens, states, buffer)


def _reusing_states(
    llm: LLM, seqs: list[list[int]], n_cont: int, batch_tokens: int, states: StateCache, buffer: ContextBuffer | None
) -> np.ndarray:
    """:func:`continuation_logprob` with kept context states: sequences whose context has states in
    ``states`` run the continuation over them; the others run in full and keep theirs."""
    keys = context_keys(llm, [s[:-n_cont] for s in seqs])
    cont = seqs[0][-n_cont:]
    found = [_kept(states, k) for k in keys]
    out = np.empty((len(seqs), n_cont), dtype=np.float32)
    todo = [i for i, f in enumerate(found) if f is None]
    held = sum(f.nbytes for f in {k: f for k, f in zip(keys, found) if f is not None}.values())  # (a repeat once)
    # a context given twice (one passage under two ids) is computed, kept and counted once
    first = _first_of_each(seqs)  # (a copy of a context to compute is one to compute too: the same key)
    counted = {k for k, f in zip(keys, found) if f is not None}
    for batch in _batches(sorted({first[i] for i in todo}), [len(s) for s in seqs], batch_tokens):
        out[batch], kept = _batch_logprob(llm, [seqs[i] for i in batch], n_cont, True)
        for i, state in zip(batch, kept):
            states.put(keys[i], state)
            if keys[i] not in counted:
                counted.add(keys[i])
                held += state.nbytes
    for i in todo:
        out[i] = out[first[i]]
    states.check_room(held, f"the {len(seqs)} prompts of one query likelihood call")
    warm = {i: f for i, f in enumerate(found) if f is not None}
    for i, f in warm.items():  # the first token: predicted by the context's last, whose logits are kept
        out[i, 0] = torch.log_softmax(f.next_logits.float(), dim=-1)[cont[0]].item()
    past = [0 if f is None else f.n_tokens for f in found]
    target = torch.tensor(cont[1:], dtype=torch.long)
    for batch in _batches(list(warm) if n_cont > 1 else [], past, DEFAULT_PAST_TOKENS if batch_tokens else 0):
        out[batch, 1:] = _suffix_logprob(llm, [warm[i] for i in batch], cont[:-1], target, buffer)
    return out


def _kept(states: StateCache, key: str) -> ContextState | None:
    """The context states kept under ``key`` (a likelihood key: :func:`context_keys`), if any."""
    state = states.get(key)
    return state if isinstance(state, ContextState) else None


@contextmanager
def _grouped_sdpa(llm: LLM) -> Iterator[None]:
    """The passes run inside use attnrank's registered attention (:mod:`attnrank.llm.recording`,
    nothing captured): SDPA, except that a padded grouped-query pass on CPU runs SDPA's own
    grouped-query kernel with the additive mask made once per pass, where transformers' SDPA
    copies every key/value head once per query head of its group at every layer.

    Why: 4-5 % faster full passes and 7 % faster suffix passes over kept states (SciFact, DL19;
    bfloat16, 2 cores), with scores equal to transformers' SDPA to the last bit."""
    ensure_registered()
    with attn_implementation(decoder_of(llm.model).config, ATTN_IMPLEMENTATION):
        yield


def reuses_states(llm: LLM) -> bool:
    """Whether a context's states can be kept and reused: every layer of ``llm`` keeps the keys
    and values of every token (no sliding window, no linear attention), of one head size (not
    DeepSeek's latent attention), and its rotary frequencies do not follow the longest position
    of the pass (dynamic NTK, LongRoPE), its linears are not dynamic int8 (whose input scale spans the
    pass, the query's tokens with the context's), and no layer reads another's keys (a suffix pass over kept
    states lends every layer one buffer, :class:`KeptStatesLayer`)."""
    layers = DynamicCache(config=llm.model.config).layers
    full = bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
    if not full:  # (Gemma 4, whose sliding layers keep no full cache, also has no one head_dim to read)
        return False
    decoder = decoder_of(llm.model)
    value_dim = getattr(decoder.config, "v_head_dim", None)  # multi-head latent attention (DeepSeek): values narrower
    try:  # (a head size set per layer: transformers raises a RuntimeError, which getattr's default misses)
        key_dim = getattr(decoder.config, "qk_head_dim", None) or getattr(decoder.config, "head_dim", None)
    except RuntimeError:
        return False
    same = value_dim is None or value_dim == key_dim  # (kept states are assembled in one head size)
    # (rows_share_the_pass: dynamic int8 scales each linear's input over the whole pass, so states
    # kept from a pass that ran the query too would depend on that query, and a suffix pass over
    # them scales apart; length-following rotary frequencies move with the pass's longest row)
    return same and not rows_share_the_pass(llm.model, decoder) and not shares_keys(decoder.config)


def shares_keys(config: Any) -> bool:
    """Whether ``config`` declares layers that read another layer's keys and values (Gemma 3n and
    Gemma 4's ``num_kv_shared_layers``, the ``kv_source_layers`` of Kolibri and Mistral Large 4)."""
    sources = getattr(config, "kv_source_layers", None) or []
    return bool(getattr(config, "num_kv_shared_layers", 0)) or any(i != s for i, s in enumerate(sources))


def context_keys(llm: LLM, contexts: Sequence[Sequence[int]]) -> list[str]:
    """What a context's states depend on: the model's weights (:attr:`LLM.weights_key`: the
    fingerprint, dtype or quantization) and the context's token ids (at positions from 0)."""
    shared = hashlib.sha256(f"likelihood|{llm.weights_key}|".encode())
    keys = []
    for ids in contexts:
        h = shared.copy()
        h.update(",".join(map(str, ids)).encode())
        keys.append(h.hexdigest())
    return keys


def _first_of_each(seqs: list[list[int]]) -> list[int]:
    """For each sequence, the index of its first copy in ``seqs`` (a passage given under two ids
    is computed once and both read its scores)."""
    first: dict[tuple[int, ...], int] = {}
    return [first.setdefault(tuple(s), i) for i, s in enumerate(seqs)]


def _batches(rows: list[int], lengths: list[int], budget: int) -> Iterator[list[int]]:
    """``rows`` shortest first, as many of the next-shortest per batch as fit ``budget`` padded tokens."""
    order = sorted(rows, key=lambda i: lengths[i])
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and lengths[order[end]] * (end + 1 - start) <= budget:
            end += 1
        yield order[start:end]
        start = end


def _batch_logprob(llm: LLM, seqs: list[list[int]], n_cont: int, keep: bool) -> tuple[np.ndarray, list[ContextState]]:
    """The scores of ``seqs`` (context + continuation each) in one left-padded pass, and with
    ``keep`` each context's states (:class:`ContextState`, what :func:`_suffix_logprob` reuses)."""
    width = max(map(len, seqs))
    pad = llm.tokenizer.pad_token_id
    pad = 0 if pad is None else int(pad)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, s in enumerate(seqs):  # left padding: every continuation ends at the last position
        ids[row, width - len(s) :] = torch.tensor(s)
        mask[row, width - len(s) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    device = llm.device
    with forward_lock(llm.model), torch.inference_mode(), _grouped_sdpa(llm):
        output = llm.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            logits_to_keep=n_cont + 1,
            use_cache=keep,
        )
        kept = []
        if keep:
            cache = getattr(output, "cache", None)  # transformers 5.x; before: past_key_values
            if cache is None:
                cache = output.past_key_values
            layers = [layer_kv(layer) for layer in cache.layers]
            for row, s in enumerate(seqs):  # the context's tokens, from width - len(s)
                state = row_state(layers, row, width - len(s), len(s) - n_cont)
                # (the context's last position; sliced from the end, as _token_logprobs reads them)
                logits = output.logits[row, -n_cont - 1].clone()
                kept.append(ContextState(state.keys, state.values, logits))
    # the last position's logits predict past the continuation (one token in hundreds: kept, so
    # that the pass's shapes, and bfloat16's rounding, stay those of the recorded figures)
    return _token_logprobs(output.logits[:, :-1], ids[0, -n_cont:]), kept


def _suffix_logprob(
    llm: LLM, states: list[ContextState], suffix: list[int], target: torch.Tensor, buffer: ContextBuffer | None
) -> np.ndarray:
    """The scores of ``target`` (a continuation but its first token) after contexts whose states
    are kept: each row runs ``suffix`` (the continuation but its last token, which would predict
    past it and which nothing attends to) over its context's states, left-padded to the longest.
    Each layer's states are copied into ``buffer``'s memory as the pass reaches the layer
    (:class:`KeptStatesLayer`), with room after them for the suffix's own, and rows of similar
    length attend together over the keys past their padding
    (:func:`~attnrank.llm.layouts.grouped_forward`)."""
    n_past, n_new = max(s.n_tokens for s in states), len(suffix)
    first = states[0].keys
    layers, kv_heads, _, dim = first.shape
    pads = [n_past - s.n_tokens for s in states]
    mask = torch.zeros((len(states), n_past + n_new), dtype=torch.long)
    for row, pad in enumerate(pads):
        mask[row, pad:] = 1
    ids = torch.tensor([suffix] * len(states), dtype=torch.long)
    positions = torch.tensor([s.n_tokens for s in states])[:, None] + torch.arange(n_new)
    device = llm.device
    shape = (len(states), kv_heads, n_past + n_new, dim)
    with (buffer or ContextBuffer()).take(shape, first.to(device)[:0]) as (keys, values):
        for row, pad in enumerate(pads):
            keys[row, :, :pad] = 0  # padding: masked, but never left as uninitialised memory
            values[row, :, :pad] = 0
        cache = DynamicCache(config=llm.model.config)
        for layer in range(layers):
            cache.layers[layer] = KeptStatesLayer(keys, values, states, layer)
        with (
            forward_lock(llm.model),
            torch.inference_mode(),
            _grouped_sdpa(llm),
            padded_windows(pads, n_past, grouped=True),
        ):
            logits = llm.model(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                logits_to_keep=n_new,
                use_cache=True,
                **{cache_argument(llm.model): cache},
            ).logits
    return _token_logprobs(logits, target)


class KeptStatesLayer(ContextLayer):
    """Layer ``layer`` of a suffix pass over kept context states (``states``, one per batch row,
    padded in front to the longest): this layer's states are copied into ``keys``/``values``
    (``[rows, kv_heads, longest + suffix, head_dim]``, the padding zeroed beforehand) only when the
    pass reaches the layer, and every layer of the pass writes into that one buffer.

    Why: assembled for all layers at once, the states of twenty SciFact abstracts (about 200 MB in
    bfloat16) went out to memory and came back for each layer's attention; one layer's (7 MB),
    copied just before its attention, are still in the CPU's cache when it reads them, and the
    buffer is a thirtieth of the size. A warm query of 20 SciFact abstracts ran 7 % faster (30
    queries, both in turn, bfloat16, 2 cores, Intel Xeon with AMX), and 5.4 % with the row groups
    of :func:`~attnrank.llm.layouts.grouped_forward` against the code before both (40 queries,
    another hour; docs/benchmarks.md); DL19's twenty short passages gained 1-2 %, a hundred of
    them nothing, LoCoMo's turns nothing. Sound only because each layer's keys are read by that
    layer's attention alone, as :func:`reuses_states` requires (no layer reads another's keys)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, states: Sequence[BlockState], layer: int):
        super().__init__(keys, values, max(s.n_tokens for s in states))
        self.states, self.layer = states, layer

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n_past = self.get_seq_length()
        for row, state in enumerate(self.states):
            pad = n_past - state.n_tokens
            self.buffer_keys[row, :, pad:n_past] = state.keys[self.layer]
            self.buffer_values[row, :, pad:n_past] = state.values[self.layer]
        return super().update(key_states, value_states, *args, **kwargs)


def _token_logprobs(logits: torch.Tensor, target: torch.Tensor) -> np.ndarray:
    """log p (float32, [rows, n]) of each of the n tokens of ``target``, the same for every row,
    from ``logits`` whose last n positions predict them (the logits at position t predict token
    t + 1; sliced from the end, so a model that returns every position's logits is read the same).

    Row by row: one row's float32 log-probabilities over the vocabulary stay in the CPU's cache,
    where the whole batch's would not (20 rows of 20 query tokens: 79 MB for a 49k vocabulary);
    3.4x faster than one log-softmax over the batch, the same values to the last bit."""
    n, rows = len(target), logits.shape[0]
    target = target.to(logits.device).unsqueeze(-1)
    out = torch.empty((rows, n), dtype=torch.float32, device=logits.device)
    for row in range(rows):
        logp = torch.log_softmax(logits[row, -n:].float(), dim=-1)
        out[row] = logp.gather(-1, target).squeeze(-1)
    return out.cpu().numpy()
