"""What a model's configuration says, read without its weights (a GGUF's from its header), and
the checks that a model is one attnrank can read attention from: a decoder-only causal LM whose
attention modules name their layer. :mod:`attnrank.llm.models` loads what these accept."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnrank import config
from attnrank.errors import AttnrankError, InputError, ModelError

from .fingerprint import gguf_source
from .gguf import gguf_context_length, gguf_plain_context_length, gguf_shape
from .recording import decoder_of

# Bidirectional encoders whose *LMHeadModel only becomes causal with is_decoder=True.
_ENCODER_TYPES = set(
    [
        "bert",
        "roberta",
        "xlm-roberta",
        "xlm-roberta-xl",
        "camembert",
        "electra",
        "ernie",
        "rembert",
        "data2vec-text",
        "bert-generation",
        "big_bird",
        "megatron-bert",
        "roc_bert",
        "roformer",
        "xmod",
    ]
)

# Positions an attention prompt leaves unused by default (LLM.prompt_budget: the context less this)
PROMPT_MARGIN = 64
# What reading a model's config or GGUF header raises when it cannot be read here (loading reports why)
_UNREADABLE = (AttnrankError, OSError, ValueError, TypeError, AttributeError, struct.error)


def model_shape(model: str | None = None) -> tuple[int, int] | None:
    """``(layers, heads per layer)`` of ``model`` from its config alone, without its weights (a
    GGUF's from its metadata); None when the config cannot be read here (loading reports why).

    Read once per model per process, like the models :func:`~attnrank.llm.models.load_llm` keeps (a command checks
    several head options against one model); a failed read is not remembered."""
    try:
        return _config_facts(_name(model))[0]
    except _UNREADABLE:
        return None


def model_context_length(model: str | None = None) -> int | None:
    """The longest prompt ``model`` takes (:attr:`~attnrank.llm.models.LLM.context_length`) from its config alone,
    without its weights (a GGUF's from its metadata); None when it cannot be read here. Read once
    per model per process, with :func:`model_shape`."""
    try:
        return _config_facts(_name(model))[1]
    except _UNREADABLE:
        return None


def _name(model: str | None) -> str:
    """``model`` as loading reads its name: blank is the default model, ``~`` the home folder
    (a ``~/x.gguf`` was read as no GGUF, so the checks made before a load were skipped)."""
    name = (model or "").strip() or config.DEFAULT_LLM
    return str(Path(name).expanduser()) if name.startswith("~") else name


@functools.lru_cache(maxsize=8)
def _config_facts(model_id: str) -> tuple[tuple[int, int], int | None]:
    """((layers, heads), context length or None) of one read of the config; it raises when the
    shape cannot be read, so only successes are cached."""
    return from_config(
        model_id,
        lambda path: (gguf_shape(path), _or_none(gguf_context_length, path)),
        lambda c: ((int(c.num_hidden_layers), int(c.num_attention_heads)), text_context_length(c)),
    )


def _or_none(read: Callable[[Path], int], path: Path) -> int | None:
    try:
        return read(path)
    except _UNREADABLE:
        return None


def from_config(model_id: str, from_gguf: Callable[[Path], Any], from_text_config: Callable[[Any], Any]) -> Any:
    """What ``from_gguf`` reads of a GGUF file's header, or ``from_text_config`` of any other
    model's text config; no weights are read."""
    gguf = gguf_source(model_id)
    if gguf is not None:
        return from_gguf(gguf)
    return from_text_config(text_config(read_config(*config.model_source(model_id), model_id)))


def prompt_length_floor(model: str | None = None) -> int | None:
    """A floor, read from ``model``'s config alone, of the positions one attention prompt may span
    by default: its context less 64 (:attr:`~attnrank.llm.models.LLM.prompt_budget`), and where
    its config sets a sliding window or attention chunk, that less one (the most a head there
    reads, :func:`~attnrank.llm.context.read_window`). A GGUF file's from its metadata, where that
    sets no window, chunk or rotary scaling (:func:`~attnrank.llm.gguf.gguf_plain_context_length`).
    None for a config that cannot be read here or sets these per layer, or rotary frequencies that
    follow a pass's length (their budget needs the model)."""
    name = _name(model)
    gguf = gguf_source(name)
    if gguf is not None:  # (the packaged model's: a prompt's room before it loads, where its metadata gives it)
        try:
            length = gguf_plain_context_length(gguf)
        except (OSError, ModelError, struct.error):
            return None
        return None if length is None else length - PROMPT_MARGIN
    try:
        cfg = text_config(read_config(*config.model_source(name), name))
    except _UNREADABLE:
        return None
    try:  # (a field set per layer, transformers' per_layer_config: reading it whole raises a RuntimeError)
        fields = {k: getattr(cfg, k, None) for k in ("rope_parameters", "rope_scaling")}
        windows = [getattr(cfg, k, None) for k in ("sliding_window", "attention_chunk_size")]
    except RuntimeError:
        return None
    rope = str(fields)
    if "dynamic" in rope or "longrope" in rope:  # (also where rope parameters are given per layer type)
        return None
    floor = text_context_length(cfg) - PROMPT_MARGIN
    for window in windows:
        if isinstance(window, int) and window > 0:
            floor = min(floor, window - 1)
    return floor


def text_context_length(text_config: Any) -> int:
    """``max_position_embeddings`` of a text config; 4096 if unset."""
    return int(getattr(text_config, "max_position_embeddings", 0) or 4096)


def check_causal_lm_config(cfg: Any, model_id: str) -> None:
    """Raise :class:`ModelError` unless ``cfg`` describes a supported decoder-only causal LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = getattr(cfg, "model_type", "?")
    archs = list(getattr(cfg, "architectures", None) or [])
    arch = ", ".join(archs) or model_type
    causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    causal_names = {causal} if isinstance(causal, str) else set(causal or ())
    is_causal = (
        causal is not None
        and not getattr(cfg, "is_encoder_decoder", False)
        and not (model_type in _ENCODER_TYPES and not getattr(cfg, "is_decoder", False))
        and (not archs or any(a in causal_names or a.endswith("ForCausalLM") for a in archs))
    )
    if not is_causal:
        raise ModelError(
            f"{model_id!r} is a {model_type!r} model (architecture {arch}), not a "
            "decoder-only causal LM; attention reranking needs a decoder-only "
            "causal LM such as Llama, Qwen2, Mistral or Gemma"
        )
    quantized = getattr(cfg, "quantization_config", None) or {}
    method = str(
        quantized.get("quant_method", "?") if isinstance(quantized, dict) else getattr(quantized, "quant_method", "?")
    )
    # (loaded, it needed its library, and where installed ran quantized whatever dtype was asked; a
    # GGUF's is attnrank's own de-quantization)
    if quantized and method.lower() != "gguf":
        raise ModelError(
            f"{model_id!r} ({arch}) is pre-quantized ({method}); attnrank loads float weights (and quantizes them "
            "itself with --dtype int8): give the model's unquantized weights"
        )
    if not getattr(text_config(cfg), "num_attention_heads", None):
        raise ModelError(
            f"{model_id!r} ({arch}): its config has no num_attention_heads, so its "
            "attention heads cannot be addressed; this architecture is unsupported"
        )


def check_decoder_layers(model: Any) -> Any:
    """``model``'s decoder, whose layers attnrank's capture reads from its ``layers`` list;
    :class:`InputError` where it keeps them elsewhere."""
    import torch

    decoder = decoder_of(model)
    if not isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList):
        raise InputError(
            f"{type(model).__name__} keeps its decoder layers elsewhere than in a `layers` list (found "
            f"{type(decoder).__name__}; GPT-2, Falcon, Bloom and GPT-J name theirs `h`): attnrank reads the "
            "attention of Llama-style decoders; use such a model (Llama, Qwen2, Mistral, Gemma, SmolLM, ...)"
        )
    return decoder


def meta_model(cfg: Any) -> Any:
    """The causal LM of ``cfg`` built on the meta device: its modules, no weights read or allocated."""
    import torch  # (heavy: only where a check needs the model's modules)
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


def check_attention_architecture(model: str | None) -> None:
    """:func:`check_decoder_layers` from ``model``'s config alone (built on the meta device: no
    weights read): such a model was refused at the first query, after the whole model had loaded. A
    GGUF file, or a config that cannot be read or built here, is left to the load."""
    name = _name(model)
    if gguf_source(name) is not None:
        return
    try:
        meta = meta_model(read_config(*config.model_source(name), name))
    except (*_UNREADABLE, ImportError, RuntimeError, KeyError):
        return
    check_decoder_layers(meta)


def check_attention_modules(model: Any, model_id: str) -> None:
    """Raise :class:`ModelError` unless the decoder has attention modules and each has a
    ``layer_idx`` (the capture tells layers apart by it). Attention modules: those named
    ``self_attn`` or of a class named ``...Attention`` (GPT-NeoX's ``attention``, Falcon's
    ``self_attention``), in the decoder only (a multimodal model's vision tower has its own)."""
    decoder = decoder_of(model)
    mods = [
        (n, m)
        for n, m in decoder.named_modules()
        if n.endswith("self_attn") or (n and type(m).__name__.endswith("Attention"))
    ]
    bad = [n for n, m in mods if not isinstance(getattr(m, "layer_idx", None), int)]
    if not mods or bad:
        what = f"attention module {bad[0]} has no layer_idx" if bad else "no attention module ('*.self_attn')"
        raise ModelError(
            f"{model_id!r} ({type(model).__name__}): {what}, which attention "
            "capture needs; this architecture is unsupported"
        )
    sinks = [n for n, m in mods if getattr(m, "sinks", None) is not None]
    if sinks:  # (refused at its first query before: after the load, under every preset)
        raise ModelError(
            f"{model_id!r} ({type(model).__name__}): attention module {sinks[0]} has attention sinks (a learned "
            "logit each head's softmax also spreads over: GPT-OSS), which attnrank's attention does not compute; "
            "use another model"
        )


def read_config(source: str | Path, local_files_only: bool, model_id: str) -> Any:
    """The transformers config of ``source`` (a folder or hub id; no weights are read), or a
    :class:`ModelError` naming ``model_id`` when it cannot be read."""
    from transformers import AutoConfig  # ~1 s to import: only for a folder or hub id

    try:
        return AutoConfig.from_pretrained(source, local_files_only=local_files_only)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the config of {model_id!r}: {e}") from e


def text_config(cfg: Any) -> Any:
    """The text decoder's part of ``cfg``: its own sub-config in a multimodal model, else ``cfg``."""
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def clear_config_cache() -> None:
    """Forget the shapes and context lengths read from models' configs (:func:`model_shape`)."""
    _config_facts.cache_clear()
