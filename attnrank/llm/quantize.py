"""Dynamic int8 for the LLM's linear layers on CPU (``dtype="int8"``).

Every ``nn.Linear`` inside the decoder layers (attention projections and MLP) becomes a dynamic
int8 linear: weights quantized once per output channel, activations per batch at run time, the
product computed by the CPU's int8 GEMM (fbgemm / oneDNN, using VNNI or AMX where the CPU has
them). Embeddings, norms, the attention softmax and ``lm_head`` stay float32, so the captured
attention rows are still float32 and generation keeps float32 logits.

Which implementation, and why (torch 2.13, torchao 0.18, on this project's 2-core x86 CPU; one
forward of 1,500 random tokens through the whole SmolLM2-135M, best of 3; reranking figures in
docs/results/rerank_int8.md): torchao's ``Int8DynamicActivationInt8WeightConfig`` is the
maintained API, but in eager mode on x86 it has no fused kernel (it quantizes activations with
separate element-wise ops and calls ``torch._int_mm``) and was no faster than float32 (1.69 s vs
1.73 s); it needs ``torch.compile`` to pay off (2x on one linear layer, after a 24 s compile of
that one shape). Importing torchao also makes transformers load it (and its CUDA-only libraries)
on every start. torch's own eager dynamic quantization
(``torch.ao.quantization.quantize_dynamic``) ran the same prefill in 1.15 s. It is deprecated in
favour of torchao but still shipped, so it is used here behind one function; a torch without it
gets a :class:`~attnrank.errors.ModelError` naming the fix.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch

from attnrank.errors import ModelError

from .modelconfig import meta_model
from .recording import decoder_of

logger = logging.getLogger(__name__)

INT8 = "int8"


def int8_available() -> bool:
    """Whether this torch has eager dynamic int8 quantization with a CPU engine."""
    ao = getattr(torch, "ao", None)
    quantization = getattr(ao, "quantization", None)
    engines = set(torch.backends.quantized.supported_engines)
    return hasattr(quantization, "quantize_dynamic") and bool(engines & {"x86", "fbgemm", "onednn"})


def check_int8() -> None:
    """Refuse ``dtype='int8'`` where this torch cannot run it (:func:`int8_available`)."""
    if not int8_available():
        raise ModelError(
            f"dtype='int8' needs torch's dynamic int8 quantization (torch.ao.quantization.quantize_dynamic "
            f"with an x86/fbgemm engine), which torch {torch.__version__} lacks; use dtype='float32' or 'bfloat16'"
        )


def quantize_int8(model: Any) -> int:
    """Replace the ``nn.Linear`` modules of ``model``'s decoder layers, in place, by dynamic int8
    linears (per-channel weights); returns how many were replaced. CPU only."""
    check_int8()
    layers = _decoder_layers(model)
    names = int8_targets(model)
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch warns on every call that the API moves to torchao (see above)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantize_dynamic(layers, {n: per_channel_dynamic_qconfig for n in names}, dtype=torch.qint8, inplace=True)
    logger.info("int8: %d linear layers in %d decoder layers quantized (dynamic, per channel)", len(names), len(layers))
    return len(names)


def is_int8(model: Any) -> bool:
    """Whether :func:`quantize_int8` quantized ``model``: its dynamic int8 linears quantize their
    input with one scale over the whole batch, so a row's outputs depend on the rows beside it."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

    return any(isinstance(m, DynamicInt8Linear) for m in model.modules())


def _is_linear(module: Any) -> bool:
    return type(module) is torch.nn.Linear


def int8_targets(model: Any) -> list[str]:
    """The names (``"layer.module"``) of the ``nn.Linear`` modules of ``model``'s decoder layers,
    which int8 quantizes; :class:`ModelError` where there are none, or no decoder layer list. Read
    from a model built on the meta device as well (:func:`check_int8_architecture`)."""
    layers = _decoder_layers(model)
    names = [f"{i}.{n}" for i, layer in enumerate(layers) for n, m in layer.named_modules() if _is_linear(m)]
    if not names:
        raise ModelError(f"{type(model).__name__}: no nn.Linear in its decoder layers, nothing to quantize to int8")
    return names


def check_int8_architecture(cfg: Any) -> None:
    """Refuse, from ``cfg`` alone (the model built on the meta device: no weights read), an
    architecture int8 cannot quantize (GPT-2's ``.h`` list, Conv1D projections): it was refused
    after the whole model had loaded."""
    int8_targets(meta_model(cfg))


def _decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The ``ModuleList`` of the language decoder's layers (``model.model.layers`` for Llama-like
    models): the decoder's own (``get_decoder()``), not the first list named ``*layers`` (a
    multimodal model's vision tower comes first, and int8 went to it)."""
    layers = getattr(decoder_of(model), "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) > 0:
        return layers
    raise ModelError(f"{type(model).__name__}: no decoder layer list found; int8 cannot be applied")
