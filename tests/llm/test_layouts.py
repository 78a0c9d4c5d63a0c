"""The layouts' layer outputs (packed segments, windows padded in front, padded rows in groups)
equal transformers' SDPA over the whole batch under the pass's mask, on both the SDPA and the
few-rows paths, whichever this CPU takes by default."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from attnrank.llm import kernels, layouts
from attnrank.llm.kernels import KERNELS, attention_kernel, segment_mask
from attnrank.llm.layouts import grouped_forward, padding_groups, segmented_forward, windowed_forward

FEW_ROWS = kernels.few_rows_attention
SPLIT = kernels.context_split_attention


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)])  # grouped-query and plain
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segmented_forward_equals_sdpa_under_the_segment_mask(heads, dtype, kernel, monkeypatch):
    """Per-segment SDPA gives what one SDPA over everything gives under segment_mask: each
    segment sees the prefix and itself causally, never another segment."""
    calls = []
    monkeypatch.setattr(kernels, "few_rows_attention", lambda *a: calls.append(1) or FEW_ROWS(*a))
    torch.manual_seed(0)
    n_heads, n_kv = heads
    lengths, n_prefix = [3, 7, 1, 7], 5
    n = sum(lengths)
    q = torch.randn(1, n_heads, n, 8, dtype=dtype)
    k, v = torch.randn(1, n_kv, n_prefix + n, 8, dtype=dtype), torch.randn(1, n_kv, n_prefix + n, 8, dtype=dtype)
    mask, _ = segment_mask(torch.tensor(lengths), n_prefix, dtype)
    module = types.SimpleNamespace(num_key_value_groups=n_heads // n_kv, is_causal=True)
    want = sdpa_attention_forward(module, q, k, v, mask, scaling=8**-0.5)[0]
    masks: dict[int, torch.Tensor] = {}
    with attention_kernel(kernel):
        got = segmented_forward(q, k, v, n_prefix, lengths, 8**-0.5, masks)
        assert torch.equal(segmented_forward(q, k, v, n_prefix, lengths, 8**-0.5, masks), got)
    assert got.shape == want.shape == (1, n, n_heads, 8)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want.float(), atol=tol)
    assert sorted(masks) == [1, 3, 7]  # one mask per length, kept for the pass's other layers
    # one few-rows call per segment, twice, where bfloat16 runs that kernel; else SDPA only
    assert len(calls) == (2 * len(lengths) if dtype == torch.bfloat16 and kernel == "few-rows" else 0)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("heads", [(6, 2), (4, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("max_logits", [kernels.FEW_ROWS_MAX_LOGITS, 0])  # 0: bfloat16 takes SDPA too
@pytest.mark.parametrize("split_keys", [kernels.CONTEXT_SPLIT_MIN_KEYS, 0])  # 0: every bfloat16 SDPA splits
@pytest.mark.parametrize("flash", [True, False])  # False: a torch without the split's flash op
def test_windowed_forward_equals_sdpa_under_the_padded_mask(
    heads, dtype, max_logits, split_keys, flash, kernel, monkeypatch
):
    """Windows padded in front to one context length, then two suffixes after a shared trunk: each
    batch row's output is what SDPA over the whole batch gives under the pass's mask."""
    monkeypatch.setattr(kernels, "FEW_ROWS_MAX_LOGITS", max_logits)
    monkeypatch.setattr(kernels, "CONTEXT_SPLIT_MIN_KEYS", split_keys)
    if not flash:
        monkeypatch.setattr(kernels, "flash_for_cpu", lambda: None)
    calls, splits = [], []
    monkeypatch.setattr(kernels, "few_rows_attention", lambda *a: calls.append(1) or FEW_ROWS(*a))
    monkeypatch.setattr(kernels, "context_split_attention", lambda *a: splits.append(1) or SPLIT(*a))
    torch.manual_seed(0)
    n_heads, n_kv = heads
    n_context, pads = 30, [0, 12, 29]
    mask, _ = segment_mask(torch.tensor([4, 3]), n_context, dtype, trunk=2)
    mask = mask.repeat(len(pads), 1, 1, 1)
    for i, pad in enumerate(pads):
        mask[i, :, :, :pad] = torch.finfo(dtype).min
    n = mask.shape[2]
    q = torch.randn(len(pads), n_heads, n, 8, dtype=dtype)
    k = torch.randn(len(pads), n_kv, n_context + n, 8, dtype=dtype)
    v = torch.randn(len(pads), n_kv, n_context + n, 8, dtype=dtype)
    module = types.SimpleNamespace(num_key_value_groups=n_heads // n_kv, is_causal=True)
    want = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask.float(), scaling=8**-0.5)[0]
    with attention_kernel(kernel):
        got = windowed_forward(q, k, v, mask, pads, 8**-0.5)
    assert got.shape == want.shape == (len(pads), n, n_heads, 8)
    tol = 1e-6 if dtype == torch.float32 else 3e-2
    assert torch.allclose(got.float(), want, atol=tol)
    # bfloat16 within the budget takes the few-rows kernel (one call per window) where it is in
    # force, all else SDPA
    few_rows = dtype == torch.bfloat16 and max_logits and kernel == "few-rows"
    assert len(calls) == (len(pads) if few_rows else 0)
    # the rest of bfloat16 splits where the context is long enough (here: only with the limit at 0)
    split = dtype == torch.bfloat16 and not few_rows and not split_keys and flash
    assert len(splits) == (len(pads) if split else 0)


def test_padding_groups_cover_the_rows_in_order_and_part_where_padding_costs_more_than_a_call():
    """Contiguous groups over every row; rows of one length stay together, rows whose padding
    would cost more products than a call (GROUP_CALL_PRODUCTS) part, and cheap padding does not."""
    call = layouts.GROUP_CALL_PRODUCTS
    pads = [900, 890, 880, 400, 390, 0]
    for per_key in (1, call // 100, call):
        groups = padding_groups(pads, 1000, per_key)
        assert groups[0][0] == 0 and groups[-1][1] == len(pads)
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(groups, groups[1:] + [(len(pads), 0)]))
    assert padding_groups([0, 0, 0], 1000, call) == [(0, 3)]
    assert padding_groups(pads, 1000, 1) == [(0, 6)]  # 1 product per row and key: never worth a call
    assert padding_groups(pads, 1000, call // 100) == [(0, 3), (3, 5), (5, 6)]
    assert padding_groups(pads, 1000, call) == [(i, i + 1) for i in range(6)]  # ten keys cost a call
    assert padding_groups([5, 5, 5, 0], 1000, call) == [(0, 3), (3, 4)]  # rows of one padding never part
    many = sorted(range(0, 20_000, 2), reverse=True)  # 10,000 rows, all paddings different
    groups = padding_groups(many, 20_001, call)
    assert groups[0][0] == 0 and groups[-1][1] == len(many)
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
    assert max(b - a for a, b in groups) <= layouts.GROUP_SPAN


@pytest.mark.parametrize("heads", [(6, 2), (4, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("groups", [[(0, 4)], [(0, 2), (2, 3), (3, 4)], [(0, 1), (1, 4)]])
def test_grouped_forward_equals_sdpa_under_the_padded_mask(heads, dtype, groups):
    """Contexts padded in front by different lengths, then a causal suffix each: computed by groups
    of rows over the keys past each group's least padding, every row's output is what SDPA over
    the whole batch gives under the pass's mask."""
    torch.manual_seed(0)
    n_heads, n_kv = heads
    n_context, pads, n = 40, [39, 30, 12, 0], 5
    mask, _ = segment_mask(torch.tensor([n]), n_context, dtype)
    mask = mask.repeat(len(pads), 1, 1, 1)
    for i, pad in enumerate(pads):
        mask[i, :, :, :pad] = torch.finfo(dtype).min
    q = torch.randn(len(pads), n_heads, n, 8, dtype=dtype)
    k = torch.randn(len(pads), n_kv, n_context + n, 8, dtype=dtype)
    v = torch.randn(len(pads), n_kv, n_context + n, 8, dtype=dtype)
    module = types.SimpleNamespace(num_key_value_groups=n_heads // n_kv, is_causal=True)
    want = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask.float(), scaling=8**-0.5)[0]
    for start, end in groups:  # the padding a group cuts off is never read: NaN there spoils nothing
        cut = min(pads[start:end])
        k[start:end, :, :cut], v[start:end, :, :cut] = float("nan"), float("nan")
    got = grouped_forward(module, q, k, v, mask, pads, groups, 8**-0.5)
    assert got.shape == want.shape == (len(pads), n, n_heads, 8)
    assert torch.isfinite(got).all()
    tol = 1e-6 if dtype == torch.float32 else 3e-2
    assert torch.allclose(got.float(), want, atol=tol)


def test_a_query_that_needs_gradients_is_not_split(monkeypatch):
    """The flash op gives no gradient through its log-sum-exp, so a pass with autograd on (head
    fine-tuning) takes one SDPA, and its gradients reach the query."""
    monkeypatch.setattr(kernels, "CONTEXT_SPLIT_MIN_KEYS", 0)
    splits = []
    monkeypatch.setattr(kernels, "context_split_attention", lambda *a: splits.append(1) or SPLIT(*a))
    torch.manual_seed(0)
    mask, _ = segment_mask(torch.tensor([3]), 20, torch.bfloat16)
    q = torch.randn(1, 4, 3, 8, dtype=torch.bfloat16, requires_grad=True)
    k, v = torch.randn(1, 2, 23, 8, dtype=torch.bfloat16), torch.randn(1, 2, 23, 8, dtype=torch.bfloat16)
    with kernels.attention_kernel("sdpa"):  # the split serves the SDPA kernel (AMX CPUs' default)
        windowed_forward(q, k, v, mask, [0], 8**-0.5).float().sum().backward()
        assert not splits
        assert q.grad is not None and bool(q.grad.abs().sum() > 0)
        windowed_forward(q.detach(), k, v, mask, [0], 8**-0.5)
    assert splits == [1]  # the same pass without gradients splits
