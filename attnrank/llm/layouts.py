"""Layer outputs of the batch layouts block attention and kept states make, computed without the
products their masks throw away: :func:`segmented_forward` (segments packed after a shared
prefix, each attending to the prefix and itself), :func:`windowed_forward` (contexts padded in
front, each row alone) and :func:`grouped_forward` (the same, rows of similar padding together,
:func:`padding_groups`). Each equals SDPA over the whole batch under the pass's mask; the kernels
they run are :mod:`attnrank.llm.kernels`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from . import kernels


def segmented_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    n_prefix: int,
    lengths: Sequence[int],
    scaling: float,
    masks: dict[int, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Layer output ``[b, rows, heads, head_dim]`` of packed segments (query rows ``lengths`` long
    each, in order; keys ``n_prefix`` cached ones, then the rows' own): each segment attends to
    the prefix and causally to itself, as under :func:`~attnrank.llm.kernels.segment_mask`, but by
    one SDPA per segment over ``prefix + own keys`` instead of one over everything with the other
    segments masked.

    Why: a masked SDPA still computes every masked product. Twenty DL19 passages (about 120 tokens
    each) packed into 1,024-token sequences made about ten times the products block attention
    needs, as many as the full prompt's causal attention. ``masks`` caches each length's additive
    mask across the layers of one pass. bfloat16 on CPU runs
    :func:`~attnrank.llm.kernels.few_rows_attention` where it serves."""
    masks = {} if masks is None else masks
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])  # (MLA: v dims)
    grouped = query.shape[1] != key.shape[1]
    prefix_k, prefix_v = key[:, :, :n_prefix], value[:, :, :n_prefix]
    at = 0
    for n in lengths:
        mask = masks.get(n)
        if mask is None:
            own = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
            mask = masks[n] = kernels.to_additive(torch.cat([own.new_ones(n, n_prefix), own], dim=1), query.dtype)
        keys = torch.cat([prefix_k, key[:, :, n_prefix + at : n_prefix + at + n]], dim=2)
        values = torch.cat([prefix_v, value[:, :, n_prefix + at : n_prefix + at + n]], dim=2)
        rows = query[:, :, at : at + n]
        if kernels.serves_few_rows(rows, n_prefix + n):
            for b in range(query.shape[0]):
                out[b, at : at + n] = kernels.few_rows_attention(
                    rows[b], keys[b], values[b], mask[None, :, n_prefix:], scaling
                )
        else:
            attended = F.scaled_dot_product_attention(
                rows, keys, values, attn_mask=mask, scale=scaling, enable_gqa=grouped
            )
            out[:, at : at + n] = attended.transpose(1, 2)
        at += n
    return out


def windowed_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    pads: Sequence[int],
    scaling: float,
) -> torch.Tensor:
    """Layer output ``[b, rows, heads, head_dim]`` of a batch of contexts padded in front (row
    ``i`` by ``pads[i]`` keys, masked out by ``mask``), each row's rows attending to its whole
    context after the padding and, as ``mask`` says, to the pass's own rows: per batch row, one
    attention over the keys after its padding, the same as one SDPA over the batch under ``mask``
    without the padding's products (by :func:`~attnrank.llm.kernels.few_rows_attention` or
    :func:`~attnrank.llm.kernels.context_split_attention` where they serve)."""
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])  # (MLA: v dims)
    grouped = query.shape[1] != key.shape[1]
    own = mask[:, :, :, mask.shape[-1] - query.shape[2] :]
    for i, pad in enumerate(pads):
        if kernels.serves_few_rows(query, key.shape[2] - pad):
            out[i] = kernels.few_rows_attention(query[i], key[i, :, pad:], value[i, :, pad:], own[i], scaling)
            continue
        if kernels.serves_context_split(query, key.shape[2] - pad):
            out[i] = kernels.context_split_attention(query[i], key[i, :, pad:], value[i, :, pad:], own[i], scaling)
            continue
        rows = F.scaled_dot_product_attention(
            query[i : i + 1],
            key[i : i + 1, :, pad:],
            value[i : i + 1, :, pad:],
            attn_mask=mask[i : i + 1, :, :, pad:],
            scale=scaling,
            enable_gqa=grouped,
        )
        out[i] = rows[0].transpose(0, 1)
    return out


# What one more SDPA call over a group of rows costs in products (query rows x keys x heads):
# about 60 us against 0.86 ns per product (a folded grouped-query SDPA, bfloat16, 2 cores,
# Intel Xeon with AMX: 20 suffixes of 23 tokens over 250-720 kept tokens).
GROUP_CALL_PRODUCTS = 70_000
# The most runs of equal padding one group spans (bounds padding_groups' work per pass).
GROUP_SPAN = 64


def padding_groups(pads: Sequence[int], n_keys: int, products_per_key: int) -> list[tuple[int, int]]:
    """Batch rows ``[start, end)`` that :func:`grouped_forward` computes together: contiguous runs
    of rows padded in front by ``pads`` (of ``n_keys`` keys each), chosen to minimise the products
    computed (each group over the keys after its least-padded row's padding, ``products_per_key``
    per row and key) plus ``GROUP_CALL_PRODUCTS`` per group, among groups of whole runs of equal
    padding and at most :data:`GROUP_SPAN` runs each (rows sorted by padding group best).
    Dynamic programming over the runs: at most runs x ``GROUP_SPAN`` steps per pass."""
    runs: list[tuple[int, int]] = []  # (first row, pad) of each run of equal padding
    for row, pad in enumerate(pads):
        if not runs or runs[-1][1] != pad:
            runs.append((row, pad))
    bounds = [row for row, _ in runs] + [len(pads)]
    best = [0.0] + [float("inf")] * len(runs)  # best[r]: the cost of runs [0, r)
    cut = [0] * (len(runs) + 1)
    for end in range(1, len(runs) + 1):
        keys = 0  # those of the group's least-padded row
        for start in range(end - 1, max(end - GROUP_SPAN, 0) - 1, -1):
            keys = max(keys, n_keys - runs[start][1])
            rows = bounds[end] - bounds[start]
            cost = best[start] + rows * keys * products_per_key + GROUP_CALL_PRODUCTS
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(runs)
    while end:
        groups.append((bounds[cut[end]], bounds[end]))
        end = cut[end]
    return groups[::-1]


def grouped_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    pads: Sequence[int],
    groups: Sequence[tuple[int, int]],
    scaling: float,
) -> torch.Tensor:
    """Layer output ``[b, rows, heads, head_dim]`` of a batch of contexts padded in front (row ``i``
    by ``pads[i]`` keys, masked out by ``mask``): what :func:`~attnrank.llm.kernels.sdpa_forward`
    gives over the whole batch, computed per group of rows (``groups``, as :func:`padding_groups`
    makes them) over the keys after the group's least padding. The keys cut off are masked for
    every row of the group, so each row's output is the same (up to the order of the kernel's sums).

    Off a CPU, one SDPA over the whole batch (the cost of a call is a CPU's, measured there).

    Why: the kept states of twenty SciFact abstracts (250-720 tokens) padded to the longest left
    a third of a suffix pass's attention products on padding; by groups, a layer ran 2.1 ms
    against 2.7 ms (bfloat16, 2 cores, Intel Xeon with AMX)."""
    if (len(groups) == 1 and min(pads) == 0) or query.device.type != "cpu":  # (the call cost is a CPU's)
        return kernels.sdpa_forward(module, query, key, value, mask, scaling)
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    for start, end in groups:
        cut = min(pads[start:end])
        out[start:end] = kernels.sdpa_forward(
            module,
            query[start:end],
            key[start:end, :, cut:],
            value[start:end, :, cut:],
            mask[start:end, :, :, cut:],
            scaling,
        )
    return out
