"""The registered attention function's layer outputs equal transformers' SDPA."""

from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from attnrank.llm.kernels import sdpa_forward


@pytest.mark.parametrize("mask_kind", ["bool", "additive", None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_query_sdpa_equals_transformers(mask_kind, dtype):
    torch.manual_seed(0)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    n_q, n_k = 5, 40  # a suffix of 5 tokens over 35 cached ones
    q = torch.randn(1, 6, n_q, 8, dtype=dtype)
    k, v = torch.randn(1, 2, n_k, 8, dtype=dtype), torch.randn(1, 2, n_k, 8, dtype=dtype)
    allowed = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)[None, None]
    allowed[..., 3] = False  # a padded key: the mask must be honoured, not assumed causal
    mask = {
        "bool": allowed,
        "additive": torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min),
        None: None,
    }[mask_kind]
    ours = sdpa_forward(module, q, k, v, mask, 8**-0.5)
    theirs = sdpa_attention_forward(module, q, k, v, mask, scaling=8**-0.5)[0]
    assert ours.shape == theirs.shape == (1, n_q, 6, 8)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    assert torch.allclose(ours.float(), theirs.float(), atol=tol)
