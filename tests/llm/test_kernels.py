"""The registered attention function's layer outputs equal transformers' SDPA (and, for packed
segments and padded windows, SDPA under their masks), on both the SDPA and the few-rows paths,
whichever this CPU takes by default."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from attnrank.llm import kernels
from attnrank.llm.kernels import (
    KERNELS,
    attention_kernel,
    default_kernel,
    sdpa_forward,
    segment_mask,
    segmented_forward,
    windowed_forward,
)

FEW_ROWS = kernels.few_rows_attention
SPLIT = kernels.context_split_attention
GROUP_ROWS = kernels._group_rows


@pytest.mark.parametrize("mask_kind", ["bool", "additive", None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_q", [5, 50])  # 3 heads x 5 rows: folded into rows (_group_rows); x 50: not
def test_grouped_query_sdpa_equals_transformers(mask_kind, dtype, n_q, monkeypatch):
    folded = []
    monkeypatch.setattr(kernels, "_group_rows", lambda *a: folded.append(1) or GROUP_ROWS(*a))
    torch.manual_seed(0)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    n_k = n_q + 35  # a suffix of n_q tokens over 35 cached ones
    q = torch.randn(2, n_q, 6, 8, dtype=dtype).transpose(1, 2)  # (as the attention layers hand it over)
    k, v = torch.randn(2, 2, n_k, 8, dtype=dtype), torch.randn(2, 2, n_k, 8, dtype=dtype)
    allowed = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)[None, None].repeat(2, 1, 1, 1)
    allowed[0, ..., 3] = False  # padded keys, other in each row: the mask must be honoured, not assumed causal
    allowed[1, ..., :6] = False
    mask = {
        "bool": allowed,
        "additive": torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min),
        None: None,
    }[mask_kind]
    ours = sdpa_forward(module, q, k, v, mask, 8**-0.5)
    theirs = sdpa_attention_forward(module, q, k, v, mask, scaling=8**-0.5)[0]
    assert ours.shape == theirs.shape == (2, n_q, 6, 8)
    assert bool(folded) == (mask_kind is not None and n_q == 5)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(ours.float(), theirs.float(), atol=tol)


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


def test_the_split_finds_its_flash_op_and_it_passes_the_probe():
    """On the pinned torch the private op the split merges by exists and returns SDPA's output and
    the log-sum-exp (otherwise every bfloat16 suffix would silently take the slower path)."""
    assert kernels.flash_for_cpu() is not None


@pytest.mark.parametrize("heads", [(6, 2), (4, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_context_split_attention_equals_softmax_attention(heads, dtype):
    """The context part (unmasked, by the flash kernel) and the own part (under its mask) merged by
    log-sum-exp give softmax attention over all keys, computed here in float64."""
    torch.manual_seed(0)
    n_heads, n_kv = heads
    rows, n_context = 5, 300
    q = torch.randn(n_heads, rows, 8, dtype=dtype)
    k, v = torch.randn(n_kv, n_context + rows, 8, dtype=dtype) * 3, torch.randn(n_kv, n_context + rows, 8, dtype=dtype)
    own, _ = segment_mask(torch.tensor([2, 3]), 0, dtype)  # two segments: a row sees only its own
    got = SPLIT(q, k, v, own[0], 8**-0.5)
    groups = n_heads // n_kv
    logits = q.double() @ k.double().repeat_interleave(groups, 0).transpose(-1, -2) * 8**-0.5
    logits[:, :, n_context:] += own[0].double().clamp_min(-1e30)
    want = (torch.softmax(logits, -1) @ v.double().repeat_interleave(groups, 0)).transpose(0, 1)
    assert got.shape == want.shape == (rows, n_heads, 8)
    assert got.dtype == dtype
    assert torch.allclose(got.double(), want, atol=1e-5 if dtype == torch.float32 else 2e-2)


def test_the_default_kernel_follows_the_cpu_and_can_be_overridden(monkeypatch):
    """AMX tiles: SDPA; none: the few-rows kernel. The choice is the CPU's, never a timing's, so a
    machine scores alike on every run; attention_kernel overrides it for the passes inside."""
    try:
        default_kernel.cache_clear()
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
        assert default_kernel() == "sdpa"
        default_kernel.cache_clear()
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        assert default_kernel() == "few-rows"
        q = torch.zeros(1, 9, 4, 8, dtype=torch.bfloat16)
        assert kernels.serves_few_rows(q, 100)
        assert not kernels.serves_few_rows(q.float(), 100)  # float32 always takes SDPA
        with attention_kernel("sdpa"):
            assert not kernels.serves_few_rows(q, 100)
            with attention_kernel("few-rows"):
                assert kernels.serves_few_rows(q, 100)
            assert not kernels.serves_few_rows(q, 100)
        with pytest.raises(ValueError, match="'flash' is not one of"), attention_kernel("flash"):
            pass
    finally:
        default_kernel.cache_clear()  # the real CPU's answer again for the tests after this one
