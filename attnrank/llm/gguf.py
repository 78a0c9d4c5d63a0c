"""The packaged GGUF default, de-quantized once into a cached float32 folder.

transformers de-quantizes a GGUF on every load (~20-30 s on CPU), so the float32 weights, config
and tokenizer are written once to ``config.cache_dir()/models/<name>-<hash12>-<versions>/``
(atomically, verified bit for bit against the in-memory model) and later loads read that folder.
The versions of transformers and gguf that de-quantized it are part of its name: a copy written by
others keeps their tensor mapping (a fix to it never reached a cached model), and one written by a
newer transformers may not load in an older one.
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import logging
import os
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from attnrank import config
from attnrank.errors import ModelError
from attnrank.files import fsync_folder, fsync_tree, held_lock, remove_killed_builds, sibling

from .fingerprint import file_sha256
from .implementation import attention_implementation

logger = logging.getLogger(__name__)


# what the GGUF reader raises for a truncated or foreign file (not memory or other faults)
# (NotImplementedError: a quantization type gguf-py cannot de-quantize, a model type transformers cannot read)
GGUF_READ_ERRORS = (ValueError, KeyError, IndexError, TypeError, EOFError, OSError, struct.error, NotImplementedError)


def load_gguf_uncached(gguf: Path) -> tuple[Any, Any]:
    """(model, tokenizer) de-quantized straight from a GGUF by transformers (slow, float32)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        cfg = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            attn_implementation=attention_implementation(cfg, gguf.name),
            dtype=torch.float32,
        )
    except GGUF_READ_ERRORS as e:
        raise ModelError(
            f"cannot read {gguf} as a GGUF model ({type(e).__name__}: {e}); check that the file is "
            "complete (download it again) and holds an architecture transformers can de-quantize"
        ) from e
    logger.info("de-quantized %s in %.1f s", gguf.name, time.perf_counter() - start)
    return model.eval(), tokenizer


def cache_unwritable(folder: Path) -> OSError | None:
    """Why the de-quantized cache ``folder`` cannot be written here (its parent cannot be made, or
    takes no file: a read-only home, ``ATTNRANK_HOME`` under a file), tried before any work; None
    where it can."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        probe = sibling(folder, "tmp")
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as e:
        return e
    return None


def ensure_gguf_cache(gguf: Path, folder: Path, digest: str) -> None:
    """:func:`build_gguf_cache` unless ``folder`` holds a complete cache, with the build's lock held:
    two first loads at once de-quantize once (the second waits, then finds the cache)."""
    if cache_complete(folder):
        return
    folder.parent.mkdir(parents=True, exist_ok=True)
    with held_lock(folder.with_name(f".{folder.name}.lock")):
        if not cache_complete(folder):
            remove_killed_builds(folder, "a de-quantizing build")
            build_gguf_cache(gguf, folder, digest)
            older = other_copies(folder, digest)
            if older:  # (left: another environment on other versions may still read them; said once, here)
                logger.warning(
                    "other de-quantized copies of %s, written by other versions of transformers or gguf, take "
                    "%.0f MB: %s; delete them if no other Python environment here uses them",
                    gguf.name,
                    sum(map(_size, older)) / 1e6,
                    ", ".join(str(p) for p in older),
                )


def _size(folder: Path) -> int:
    """Bytes of the files in ``folder`` (0 for one removed meanwhile: another process may delete it)."""
    total = 0
    try:
        for f in folder.iterdir():
            total += f.stat().st_size if f.is_file() else 0
    except OSError:
        pass
    return total


def build_gguf_cache(gguf: Path, folder: Path, digest: str) -> None:
    """De-quantize ``gguf`` and write config, weights and tokenizer to ``folder`` atomically and
    durably (fsynced before the rename), with each file's size recorded for :func:`cache_complete`."""
    from safetensors.torch import save_file

    logger.info("de-quantizing %s once into %s (later loads read the cache)", gguf.name, folder)
    model, tokenizer = load_gguf_uncached(gguf)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = sibling(folder, "tmp")  # (its PID tells a killed build's leftover: remove_killed_builds)
    tmp.mkdir()
    try:
        save_file(_dedup_state_dict(model), str(tmp / "model.safetensors"), {"format": "pt"})
        cfg = copy.deepcopy(model.config)
        for attr in {"quantization_config", "_name_or_path"} & set(vars(cfg)):
            delattr(cfg, attr)  # a plain float32 checkpoint now, loadable offline
        cfg.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _verify_cache(model, tmp)
        sizes = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / _META).write_text(json.dumps({"source": str(gguf), "sha256": digest, "sizes": sizes}))
        fsync_tree(tmp)  # durable before it is renamed in: a power loss must not leave a torn cache
        if folder.exists() and not cache_complete(folder):  # a damaged copy: replace it
            shutil.rmtree(folder)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished first: keep its copy
            if not cache_complete(folder):
                raise
        fsync_folder(folder.parent)
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

    loaded: Any = AutoModelForCausalLM.from_pretrained(
        folder,
        local_files_only=True,
        dtype=torch.float32,
        attn_implementation=attention_implementation(model.config, folder.name),
        output_loading_info=True,
    )
    reloaded, info = loaded
    missing = sorted(info.get("missing_keys", []))
    ids = torch.arange(1, 9).unsqueeze(0) % model.config.get_text_config().vocab_size
    with torch.no_grad():
        same = torch.equal(model(ids).logits, reloaded.eval()(ids).logits)
    if missing or not same:
        raise ModelError(
            f"the de-quantized cache written to {folder} does not reproduce the "
            f"GGUF model (missing weights: {missing or 'none'}, logits equal: {same})"
        )


def gguf_cache_dir(gguf: Path, digest: str | None = None) -> Path:
    """Where ``gguf``'s de-quantized copy is cached: named by the file's SHA-256 (``digest``, computed
    if not given) and by the versions of the libraries that de-quantize it (:func:`reader_versions`)."""
    digest = digest or file_sha256(gguf)
    return config.cache_dir() / "models" / f"{gguf.stem}-{digest[:12]}-{reader_versions()}"


def reader_versions() -> str:
    """The versions of transformers and gguf installed here, as a cache folder's name holds them
    ("transformers-5.1.0-gguf-0.17.1"; "none" for a package that is not installed)."""
    out = []
    for name in ("transformers", "gguf"):
        try:
            out.append(f"{name}-{importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name}-none")
    return "-".join(out)


def other_copies(folder: Path, digest: str) -> list[Path]:
    """Complete de-quantized copies of the same GGUF (``digest``) beside ``folder``, written by other
    versions of transformers or gguf (or, without a version in their name, before it was added)."""
    stem = folder.name.removesuffix(f"-{reader_versions()}")
    found = []
    for p in sorted(folder.parent.iterdir()):
        if p == folder or not p.name.startswith(stem) or not p.is_dir() or not cache_complete(p):
            continue
        try:
            if json.loads((p / _META).read_text(encoding="utf-8")).get("sha256") == digest:
                found.append(p)
        except (OSError, ValueError, AttributeError):
            continue
    return found


_META = "attnrank.json"


def cache_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a whole de-quantized cache: its files, each of the size recorded
    when it was written (a cache written before sizes were recorded: its files present). A file
    cut short (a power loss before the cache was fsynced) made every load fail on it."""
    needed = ("config.json", "model.safetensors", "tokenizer_config.json", _META)
    if not all((folder / f).is_file() for f in needed):
        return False
    try:
        sizes = json.loads((folder / _META).read_text(encoding="utf-8")).get("sizes", {})
        return all((folder / name).stat().st_size == size for name, size in sizes.items())
    except (OSError, ValueError, AttributeError):
        return False


# GGUF metadata value types (gguf spec): fixed-size scalars by struct code, 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_shape(gguf: Path) -> tuple[int, int]:
    """``(layers, heads per layer)`` from a GGUF's metadata (``<arch>.block_count`` and
    ``<arch>.attention.head_count``), reading only the header up to them: milliseconds, where a
    full metadata parse reads the whole tokenizer vocabulary first."""
    return _read_header(gguf, ("block_count", "attention.head_count"))  # type: ignore[return-value]


def gguf_context_length(gguf: Path) -> int:
    """The model's context length from a GGUF's metadata (``<arch>.context_length``), as :func:`gguf_shape` reads."""
    return _read_header(gguf, ("context_length",))[0]


def gguf_plain_context_length(gguf: Path) -> int | None:
    """The context length from a GGUF's metadata where every position of it is one plain attention
    window: None where the model's keys, read up to the tokenizer's (llama.cpp writes them first),
    set a sliding window, an attention chunk or rotary scaling (then a prompt's room needs the
    model), or hold no context length. A key of those written after the tokenizer's is not seen:
    the room is then the context's, which the loaded model narrows (a looser check, never a
    refusal the model would not make)."""
    found: dict[str, Any] = {}
    for key, value in _header(gguf):
        if key.startswith("tokenizer."):
            break
        found[key] = value
    arch = found.get("general.architecture")
    length = found.get(f"{arch}.context_length")
    if not isinstance(arch, str) or not isinstance(length, int):
        return None
    own = [k for k in found if k.startswith(f"{arch}.")]
    windowed = any(word in k for k in own for word in ("sliding_window", "chunk", "rope.scaling"))
    return None if windowed else length


def _read_header(gguf: Path, names: tuple[str, ...]) -> tuple[int, ...]:
    """The integer values of ``<arch>.NAME`` for ``names``, reading the header only up to them."""
    found: dict[str, Any] = {}
    for key, value in _header(gguf):
        found[key] = value
        arch = found.get("general.architecture")
        values = [found.get(f"{arch}.{name}") for name in names]
        if all(isinstance(v, int) for v in values):
            return tuple(values)  # type: ignore[arg-type]
    raise ModelError(f"{gguf}: its metadata has no {' or '.join(names)}")


def _header(gguf: Path) -> Iterator[tuple[str, Any]]:
    """A GGUF's metadata, key by key (read only as far as the caller goes)."""
    with open(gguf, "rb") as f:
        magic, _version, _tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF":
            raise ModelError(f"{gguf} is not a GGUF file")
        for _ in range(n_kv):
            key = _gguf_string(f)
            yield key, _gguf_value(f, struct.unpack("<I", f.read(4))[0])


def _gguf_string(f: Any) -> str:
    (n,) = struct.unpack("<Q", f.read(8))
    if n > os.fstat(f.fileno()).st_size - f.tell():  # a corrupt length: never allocate it
        raise ModelError(f"{f.name}: a metadata string of {n} bytes runs past the end of the file (corrupt GGUF)")
    return f.read(n).decode("utf-8", errors="replace")


def _gguf_value(f: Any, kind: int) -> Any:
    if kind in _SCALARS:
        code = "<" + _SCALARS[kind]
        return struct.unpack(code, f.read(struct.calcsize(code)))[0]
    if kind == 8:
        return _gguf_string(f)
    if kind == 9:  # an array: element type, count, elements (skipped: no count we need is an array)
        item, n = struct.unpack("<IQ", f.read(12))
        if item in _SCALARS:
            f.seek(struct.calcsize("<" + _SCALARS[item]) * n, os.SEEK_CUR)
        else:
            for _ in range(n):
                _gguf_value(f, item)
        return None
    raise ModelError(f"unknown GGUF metadata type {kind}")
