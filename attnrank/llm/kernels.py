"""The layer outputs and the mask of attnrank's registered attention (:mod:`attnrank.llm.attention`).

:func:`sdpa_forward` is transformers' SDPA except where a faster exact path exists on CPU;
:func:`eager_forward` serves soft-capped logits (Gemma 2), which SDPA cannot compute;
:func:`masked_scores` gives the float32 masked logits both the capture and the eager path read;
:func:`additive_mask` is the registered mask function and :func:`segment_mask` the mask of
segments that must not see each other (:mod:`attnrank.llm.layouts` computes what such masks give
without the products they mask out). In bfloat16 on a CPU without AMX, packed segments and padded
windows run few query rows over many keys by
:func:`few_rows_attention` (matrix products, as transformers' eager attention), which was 1.3x to
2.7x faster per layer than CPU SDPA's flash kernel at the capture's shapes on an AMD EPYC; on an
Intel Xeon with AMX, SDPA was the faster one (:func:`default_kernel`). There, a suffix over a long
cached context (warm block attention) runs by :func:`context_split_attention`: the context
without a mask, the suffix's own keys apart, merged by log-sum-exp. The kernels' effect on the
scores is measured in ``docs/results/rerank_kernels.md``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask


def additive_mask(*args: Any, dtype: torch.dtype = torch.float32, **kwargs: Any) -> torch.Tensor | None:
    """transformers' SDPA mask (None where SDPA's own causal flag serves), as an additive mask in
    the attention's ``dtype`` (0 = attend, the dtype's minimum = masked) on CPU.

    Why: CPU SDPA turns a boolean mask into an additive one at every call, that is at every layer
    of a pass; made once per pass instead, a suffix of 30 tokens over 40k cached ones ran about
    1.4x faster per layer (bfloat16, 2 cores)."""
    mask = sdpa_mask(*args, **kwargs)
    if mask is None or mask.dtype != torch.bool or mask.device.type != "cpu":
        return mask
    return to_additive(mask, dtype)


def segment_mask(
    lengths: torch.Tensor, n_prefix: int, dtype: torch.dtype, trunk: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """For one sequence of segments of ``lengths`` after a cached prefix of ``n_prefix`` tokens:
    the additive mask ``[1, 1, n, n_prefix + n]`` under which each token attends to the prefix and
    to the tokens of its own segment up to itself (never to another segment), and each token's
    place in its segment (``[n]``, for position ids). Packed blocks and the capture's suffixes.

    ``trunk``: the first ``trunk`` tokens are a segment every other segment continues (it attends
    to the trunk too, and its places count on from the trunk's end): suffixes that begin alike
    share the rows of their common beginning."""
    lengths = torch.cat([lengths.new_tensor([trunk]), lengths]) if trunk else lengths
    owner = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    index = torch.arange(len(owner), device=lengths.device)
    offset = index - (torch.cumsum(lengths, 0) - lengths)[owner]
    own = (owner[:, None] == owner[None, :]) & (index[None, :] <= index[:, None])
    if trunk:
        own[:, :trunk] |= index[None, :trunk] <= index[:, None]  # everyone sees the trunk (causally)
        offset = torch.where(owner > 0, offset + trunk, offset)
    mask = torch.cat([own.new_ones(len(owner), n_prefix), own], dim=1)[None, None]
    return to_additive(mask, dtype), offset


def to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = attend) as an additive one in ``dtype``."""
    return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device), torch.finfo(dtype).min)


def masked_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None,
    first_row: int,
    total_rows: int,
) -> torch.Tensor:
    """Float32 masked logits [b, h, rows, n_keys] for query rows ``first_row:`` of a pass of
    ``total_rows`` queries whose keys end with those queries (causal, lower-right aligned).

    The scaling is applied to the few query rows and the mask added in place: over tens of
    thousands of cached keys each pass over the logits costs as much as the product."""
    scores = torch.matmul(q.float() * scaling, k.float().transpose(-1, -2))
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    n_keys = k.shape[-2]
    if mask is None:
        rows = torch.arange(first_row, total_rows, device=q.device)[:, None] + (n_keys - total_rows)
        mask = torch.arange(n_keys, device=q.device)[None, :] <= rows
    else:
        mask = mask[:, :, first_row:, :n_keys]
    if mask.dtype == torch.bool:
        return scores.masked_fill_(~mask, float("-inf"))
    return scores.add_(mask)


def eager_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    softcap: float,
) -> torch.Tensor:
    """Layer output for soft-capped logits (Gemma 2), which SDPA cannot compute."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    probs = torch.softmax(masked_scores(query, key, mask, scaling, softcap, 0, query.shape[2]), -1)
    return torch.matmul(probs.to(value.dtype), value).transpose(1, 2).contiguous()


def sdpa_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' SDPA, except for a masked grouped-query pass on CPU: that runs SDPA's own
    grouped-query kernel, where transformers would copy every key/value head once per query head
    of its group (same output; a suffix over 40k cached tokens ran 3.5x faster per layer). A pass
    of a few query rows over many keys (a suffix over kept states) goes further: the query heads
    of a group become rows of one head (:func:`_group_rows`), so each key/value head is read once."""
    rows, keys = query.shape[2], key.shape[2]
    if mask is None and 1 < rows < keys:
        # (Gemma 4's KV-shared layers cut their queries to the kept logits' rows after the mask
        # was skipped as causal: SDPA's causal flag would align them upper-left, on the first keys)
        causal = torch.ones(rows, keys, dtype=torch.bool, device=query.device).tril(keys - rows)
        mask = to_additive(causal[None, None], query.dtype)
    grouped = query.shape[1] != key.shape[1]
    if grouped and mask is not None and query.device.type == "cpu" and kwargs.get("position_bias") is None:
        dropout = kwargs.get("dropout", 0.0)
        same_batch = query.shape[0] == key.shape[0]  # (where only the keys carry it, SDPA broadcasts the query)
        if (
            not dropout
            and same_batch
            and mask.shape[1] == 1
            and query.shape[2] * query.shape[1] // key.shape[1] <= FOLDED_ROWS
        ):
            return _group_rows(query, key, value, mask, scaling)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous()
    return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling, **kwargs)[0]


# Query rows (a group's heads times the pass's tokens) up to which a grouped pass folds its heads
# into rows: 13-30 % faster over kept states (20 suffixes of 8-17 tokens over 110-440 keys; bfloat16,
# 2 cores), slower for a full prompt (1.5x at 2,500 tokens), whose keys are read once per many rows.
FOLDED_ROWS = 128


def _group_rows(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Grouped-query attention with each group's query heads as rows of one head: ``query``
    [B, H, Q, D] as [B, KV, H/KV·Q, D] against ``key``/``value`` [B, KV, T, D], the mask [B, 1, Q, T]
    repeated per head (head h uses key/value head h // (H/KV), as transformers repeats them). Each
    row is computed as before; the output is [B, Q, H, D]."""
    b, heads, rows, dim = query.shape
    kv = key.shape[1]
    group = heads // kv
    folded = query.reshape(b, kv, group * rows, dim)
    masks = mask.expand(b, group, rows, mask.shape[-1]).reshape(b, 1, group * rows, mask.shape[-1])
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=masks, scale=scaling)
    return out.view(b, heads, rows, dim).transpose(1, 2).contiguous()


# The most logits few_rows_attention holds at once (heads x rows x keys; 64 MiB in bfloat16).
FEW_ROWS_MAX_LOGITS = 1 << 25
KERNELS = ("sdpa", "few-rows")
_KERNEL: ContextVar[str | None] = ContextVar("attnrank_attention_kernel", default=None)


@cache
def default_kernel() -> str:
    """The kernel of bfloat16 passes on this CPU, one of ``KERNELS``: ``"sdpa"`` where the CPU has
    AMX tiles, else ``"few-rows"`` (:func:`few_rows_attention`).

    Why by the CPU's features and not by timing both: a timed choice could differ between two runs
    on one machine, and with it the scores (Spearman 0.94-0.999 between the kernels per query,
    ``docs/results/rerank_kernels.md``). Measured per query, both kernels in turn (SmolLM2-135M,
    2 threads, block mode, cold): on an AMD EPYC without AMX the few-rows kernel was 1.11x-1.29x
    faster (``docs/results/rerank_kernels.md``); on an Intel Xeon with AMX, SDPA was 1.04x-1.15x
    faster (``docs/results/rerank_kernels_xeon.md``). On full prompts they were within 8% of each other."""
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)  # torch's own probe (private, hence guarded)
    return "sdpa" if amx is not None and amx() else "few-rows"


@contextmanager
def attention_kernel(name: str) -> Iterator[None]:
    """For the passes run inside: bfloat16 CPU layers by ``name`` (one of ``KERNELS``) instead of
    :func:`default_kernel` (``scripts/bench_rerank.py --kernels`` compares the two; tests run both)."""
    if name not in KERNELS:
        raise ValueError(f"attention kernel {name!r} is not one of {KERNELS}")
    token = _KERNEL.set(name)
    try:
        yield
    finally:
        _KERNEL.reset(token)


def serves_few_rows(query: torch.Tensor, n_keys: int) -> bool:
    """Whether :func:`few_rows_attention` computes this layer: bfloat16 on CPU, the kernel in force
    is ``"few-rows"`` (:func:`attention_kernel`, else :func:`default_kernel`), and its logits for one
    sequence of the batch (``query`` ``[b, heads, rows, head_dim]``) fit ``FEW_ROWS_MAX_LOGITS``."""
    if query.dtype != torch.bfloat16 or query.device.type != "cpu":
        return False
    if (_KERNEL.get() or default_kernel()) != "few-rows":
        return False
    return query.shape[1] * query.shape[2] * n_keys <= FEW_ROWS_MAX_LOGITS


def few_rows_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, own_mask: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Output ``[rows, heads, head_dim]`` of query rows ``[heads, rows, head_dim]`` over keys
    ``[kv_heads, n, head_dim]`` whose last ``rows`` are the rows' own, under ``own_mask``
    (``[1, rows, rows]``, additive, over those own keys; every earlier key is visible).

    By two matrix products with the logits and probabilities in bfloat16, as transformers' eager
    attention computes them (the softmax accumulates in float32), grouped-query heads sharing their
    key head's product. Why: for a suffix's few rows over thousands of cached keys, CPU SDPA's
    flash kernel ran at a third of the matrix products' rate on an AMD EPYC without AMX (44 rows
    over 8,000 keys, bfloat16, 2 cores: 6.1 ms against 2.7 ms per layer); with AMX it is the other
    way round (:func:`default_kernel`)."""
    heads, rows, dim = query.shape
    kv_heads = key.shape[0]
    groups = heads // kv_heads
    scores = torch.matmul((query * scaling).reshape(kv_heads, groups * rows, dim), key.transpose(-1, -2))
    scores[:, :, -rows:].view(kv_heads, groups, rows, rows).add_(own_mask[:, None])
    probs = torch.softmax(scores, -1)
    return torch.matmul(probs, value).view(heads, rows, value.shape[-1]).transpose(0, 1)


@cache
def flash_for_cpu() -> Any:
    """CPU SDPA's flash kernel as an op that also returns each row's log-sum-exp, or None where
    this torch has no such op or it does not give, on a small probe, SDPA's output and the
    logits' log-sum-exp. Why the probe: the op is private to torch (the public SDPA hides the
    log-sum-exp that :func:`context_split_attention` merges by), so its presence and its
    signature are checked once rather than assumed."""
    try:
        op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        generator = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, n, 8, generator=generator) for n in (3, 5, 5))
        out, lse = op(q, k, v, scale=0.5)
        logits = q @ k.transpose(-1, -2) * 0.5
        same = torch.allclose(out, F.scaled_dot_product_attention(q, k, v, scale=0.5), atol=1e-5)
        same = same and torch.allclose(lse.reshape(1, 2, 3), torch.logsumexp(logits, -1), atol=1e-5)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
    return op if same else None


# The fewest keys (the rows' own included) a bfloat16 layer needs for context_split_attention.
# Below it the split's own part and merge cost more than the mask saves: 40 rows over 2,000 keys
# took 0.66 ms split against 0.60 ms as one SDPA; over 4,000, 1.05 against 1.20 (Intel Xeon with
# AMX, 2 cores). Warm queries (block attention, bfloat16, SmolLM2-135M, both in turn per query):
# DL19 K=20 (about 2,500 keys) 0.97x, DL19 K=50 1.12x, K=100 1.25x; SciFact K=20 1.14x, K=50
# 1.18x, K=100 1.15x-1.27x. In float32 the split only gained from about 12,000 keys, so float32
# keeps one SDPA.
CONTEXT_SPLIT_MIN_KEYS = 4096


def serves_context_split(query: torch.Tensor, n_keys: int) -> bool:
    """Whether :func:`context_split_attention` computes this layer: bfloat16 on CPU, a torch with
    the flash op it needs, and at least ``CONTEXT_SPLIT_MIN_KEYS`` keys, some before the rows' own
    (``query`` ``[b, heads, rows, head_dim]``, ``n_keys`` including the rows' own). Never for a
    query that needs gradients: the flash op's log-sum-exp, which the merge weighs by, has none."""
    return (
        query.device.type == "cpu"
        and not query.requires_grad
        and query.dtype == torch.bfloat16
        and n_keys >= CONTEXT_SPLIT_MIN_KEYS
        and n_keys > query.shape[2]
        and flash_for_cpu() is not None
    )


def context_split_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, own_mask: torch.Tensor, scaling: float
) -> torch.Tensor:
    """What :func:`few_rows_attention` returns (same arguments and output), computed in two parts
    merged by their log-sum-exps: the keys before the rows' own, which every row sees, by CPU
    SDPA's flash kernel without a mask (the grouped-query heads of a key head stacked as one
    head's rows), and the rows' own keys under ``own_mask`` by two small float32 products.

    Why: CPU SDPA under a mask reads the mask and cannot skip a block of it, and the context's
    part of the mask is all zeros. A suffix of 40 rows over 25,000 cached keys (bfloat16, 2 cores,
    Intel Xeon with AMX) took 4.7-5.1 ms per layer this way against 8.2 ms as one masked SDPA
    (:data:`CONTEXT_SPLIT_MIN_KEYS` says where it serves). The result differs from one SDPA only
    by the rounding of the context part's output to the input dtype before the merge."""
    heads, rows, dim = query.shape
    kv_heads = key.shape[0]
    groups = heads // kv_heads
    n = key.shape[1] - rows
    stacked = query.reshape(1, kv_heads, groups * rows, dim)
    context, context_lse = flash_for_cpu()(stacked, key[None, :, :n], value[None, :, :n], scale=scaling)
    logits = torch.matmul(stacked[0].float(), key[:, n:].float().transpose(-1, -2)) * scaling
    logits = (logits.view(kv_heads, groups, rows, rows) + own_mask.float()[:, None]).view(kv_heads, -1, rows)
    own_lse = torch.logsumexp(logits, -1)
    own = torch.matmul(torch.exp(logits - own_lse[..., None]), value[:, n:].float())
    top = torch.maximum(context_lse[0], own_lse)
    w_context, w_own = torch.exp(context_lse[0] - top)[..., None], torch.exp(own_lse - top)[..., None]
    merged = (context[0].float() * w_context + own * w_own) / (w_context + w_own)
    return merged.to(query.dtype).reshape(heads, rows, value.shape[-1]).transpose(0, 1)
