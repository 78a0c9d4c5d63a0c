"""The registered attention function's layer outputs equal transformers' SDPA, on both the SDPA
and the few-rows paths, whichever this CPU takes by default (the layouts built on these kernels:
test_layouts.py)."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from attnrank.llm import kernels
from attnrank.llm.kernels import attention_kernel, default_kernel, sdpa_forward, segment_mask

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
    # no mask: causal, aligned lower-right as a suffix over cached keys is (Gemma 4's KV-shared
    # layers); transformers' causal flag would align it on the first keys
    causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)[None, None]
    theirs = sdpa_attention_forward(module, q, k, v, causal if mask is None else mask, scaling=8**-0.5)[0]
    assert ours.shape == theirs.shape == (2, n_q, 6, 8)
    assert bool(folded) == (n_q == 5)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(ours.float(), theirs.float(), atol=tol)


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
