"""Which of transformers' attention implementations a causal LM is loaded with."""

from __future__ import annotations

from typing import Any

from attnrank.errors import ModelError


def attention_implementation(cfg: Any, model_id: str) -> str:
    """The attention implementation ``cfg``'s causal LM is loaded with: ``"sdpa"``, or ``"eager"``
    for a family whose class declares no SDPA but calls transformers' attention functions (Gemma 2
    and VaultGemma, whose soft-capped logits SDPA cannot compute). attnrank's registered
    attention (:mod:`attnrank.llm.recording`) serves every pass it runs either way; the loaded one
    serves only what it leaves to the model (generation). A family that computes attention in its
    own code (Bloom, MPT, GPT-Neo, ...), or has none (Mamba, RWKV), gives attnrank no attention to read: :class:`ModelError`,
    before any weight is read."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        cls: Any = MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]
    except (KeyError, ValueError, ImportError):  # (a remote-code or unmapped config: left to the load)
        return "sdpa"
    if getattr(cls, "_supports_sdpa", False):
        return "sdpa"
    if getattr(cls, "_supports_attention_backend", False):
        return "eager"
    raise ModelError(
        f"{model_id!r} ({cls.__name__}) does not compute attention through transformers' attention functions "
        "(it has code of its own for it, or no attention), which attnrank reads attention through; use a model "
        "of another family (Llama, Qwen2, Mistral, Gemma, SmolLM, ...)"
    )
