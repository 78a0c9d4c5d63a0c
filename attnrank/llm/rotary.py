"""Rotary position embeddings applied to cached keys: moving a block's states to new positions.

Rotary embeddings compose, ``R(a)R(b) = R(a+b)``: keys computed at position ``p`` and rotated by
``δ`` are the keys computed at ``p+δ`` (exactly in the first layer; block attention's
``"rotated"`` positions, :mod:`attnrank.llm.blocks`). :func:`rotation` reads the model's own
rotary embedding at ``δ``; :func:`rotate_into` applies it; :func:`nope_layers` names the layers
without one, whose keys stay as they are. :func:`rotary_follows_length` and :func:`rotary_switch`
tell the rotary frequencies that follow a pass's longest position (dynamic NTK, LongRoPE), with
which states computed in one pass differ from those of a longer one.
"""

from __future__ import annotations

from typing import Any

import torch

from attnrank.errors import InputError

from .attention import AttentionCapturer


def rotation(capturer: AttentionCapturer, delta: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary embedding's float32 (cos, sin) of position ``delta``, ``[head_dim]`` each, on
    the device of ``like`` (keys ``[..., head_dim]``)."""
    rotary = getattr(capturer.decoder, "rotary_emb", None)
    if rotary is None:
        raise InputError(
            f"block_positions='rotated' needs rotary position embeddings; {type(capturer.decoder).__name__} "
            "has none; use 'shared' or 'sequential'"
        )
    pos = torch.tensor([[delta]], device=like.device)
    cos, sin = rotary(torch.zeros(1, 1, like.shape[-1], device=like.device, dtype=torch.float32), position_ids=pos)
    return cos[0, 0].float(), sin[0, 0].float()


def nope_layers(capturer: AttentionCapturer) -> list[int]:
    """Indices of the decoder layers that apply no rotary embedding (NoPE layers: Llama 4's and
    SmolLM3's ``no_rope_layers``, where 0 marks one; EXAONE 4's full-attention layers, where it
    has sliding-window ones). Their keys never see a position, so a block moved to other
    positions keeps them as they were encoded."""
    cfg = capturer.decoder.config
    nope = [i for i, f in enumerate(getattr(cfg, "no_rope_layers", None) or []) if not f]
    if getattr(cfg, "model_type", "") == "exaone4" and getattr(cfg, "sliding_window", None) is not None:
        # (its attention applies rotary "if self.sliding_window is None or self.is_sliding")
        nope += [i for i, t in enumerate(getattr(cfg, "layer_types", None) or []) if t != "sliding_attention"]
    return sorted(set(nope))


def rotate_into(out: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """``out = k·cos + rotate_half(k)·sin`` (the rotary convention; ``cos``, ``sin``: float32
    ``[head_dim]``). Half-precision keys are multiplied by the rotation matrix, accumulated in
    float32 and rounded once (at 100 SciFact abstracts, bfloat16, 2 CPUs: 2x faster than the
    elementwise form, which rounds twice); float32 keys elementwise, without temporaries (as fast)."""
    half = k.shape[-1] // 2
    if k.dtype in (torch.bfloat16, torch.float16):
        matrix = torch.diag(cos)  # row i, column j: what k_i adds to out_j
        idx = torch.arange(half, device=cos.device)
        matrix[idx + half, idx] = -sin[:half]
        matrix[idx, idx + half] = sin[half:]
        out.copy_(torch.matmul(k, matrix.to(k.dtype)))
        return
    cos, sin = cos.to(k.dtype), sin.to(k.dtype)
    torch.mul(k, cos, out=out)
    out[..., :half].addcmul_(k[..., half:], sin[:half], value=-1)
    out[..., half:].addcmul_(k[..., :half], sin[half:])


def rotary_follows_length(decoder: Any) -> bool:
    """Whether ``decoder``'s rotary frequencies follow the longest position of a pass (dynamic
    NTK, LongRoPE): states computed in one pass then differ from those of a longer one."""
    rope = str(getattr(getattr(decoder, "rotary_emb", None), "rope_type", "default"))
    return "dynamic" in rope or rope == "longrope"


def rotary_switch(decoder: Any) -> int | None:
    """For rotary frequencies that follow a pass's longest position (:func:`rotary_follows_length`),
    the positions a pass may span before they switch to another set (LongRoPE's
    ``original_max_position_embeddings``, dynamic NTK's original length), else None. A prompt
    within them reads one set of frequencies in each of its passes (prefill, suffixes, blocks)."""
    if not rotary_follows_length(decoder):
        return None
    emb = decoder.rotary_emb
    if str(emb.rope_type) == "longrope":
        params = getattr(emb.config, "rope_parameters", None) or getattr(emb.config, "rope_scaling", None) or {}
        value = params.get("original_max_position_embeddings") or getattr(
            emb.config, "original_max_position_embeddings", None
        )
    else:
        value = getattr(emb, "original_max_seq_len", None)
    return int(value) if value else None
