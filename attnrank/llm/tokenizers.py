"""Model ids and tokenizers, read without loading a model's weights.

:func:`checked_model_id` names a model as :func:`~attnrank.llm.models.load_llm` loads it (a
``~`` path expanded, a path that does not exist refused); :func:`load_tokenizer` reads its fast
tokenizer alone (a local folder's once while its files keep their sizes and times, shared with
the loaded model's), for the checks that run before any weights load.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from attnrank import config
from attnrank.errors import ModelError

from .fingerprint import gguf_source
from .gguf import GGUF_READ_ERRORS, cache_complete, gguf_cache_dir


def checked_model_id(model: str | os.PathLike[str] | None) -> str:
    """The id :func:`load_llm` loads ``model`` under (a local path expanded), checked without
    loading: a path that does not exist, or a file that is not a ``.gguf``, is a ModelError, and so
    is an empty name (an unset ``$MODEL`` ran the packaged default and saved under its name)."""
    model_id = (os.fspath(model) if model is not None else config.DEFAULT_LLM).strip()
    if not model_id:
        raise ModelError(f"model {model!r} is empty; give a model id or path, or none for the packaged default")
    if config.looks_like_path(model_id):
        if not Path(model_id).expanduser().exists():
            raise ModelError(f"model {model_id!r}: no such local model folder or .gguf file")
        model_id = str(Path(model_id).expanduser())
    path = Path(model_id)
    if path.is_file() and not model_id.endswith(".gguf"):  # what gguf_source takes as a GGUF
        raise ModelError(
            f"model {model_id!r} is a file, not a model folder or .gguf file; pass the folder that "
            f"holds config.json and the weights (e.g. {str(path.parent)!r})"
        )
    return model_id


def load_tokenizer(model: str | None = None) -> Any:
    """Only the tokenizer of ``model`` (fast; a GGUF's comes from its de-quantized cache if any),
    the model named as :func:`load_llm` reads it (a ``~`` path expanded, spaces stripped). A local
    folder's is shared with later calls and with the model's :attr:`LLM.tokenizer`: do not change it."""
    model_id = checked_model_id(model)
    gguf = gguf_source(model_id)
    if gguf is None:
        source, local_only = config.model_source(model_id)
        return read_tokenizer(source, model_id, local_files_only=local_only)
    cached = gguf_cache_dir(gguf)
    if cache_complete(cached):
        return read_tokenizer(cached, model_id, local_files_only=True)
    return read_tokenizer(gguf.parent, model_id, gguf_file=gguf.name)


def read_tokenizer(source: str | Path, model_id: str, **kwargs: Any) -> Any:
    """Load a tokenizer, insist on a fast one (offsets), and give it a pad token. A local folder's
    is read once while its files (but for weights) keep their sizes and times, and shared.

    Why: a command's checks before the model loads read the tokenizer, and the load again (``ask``:
    three reads of SmolLM2's, 0.1-0.3 s each)."""
    folder = Path(source)
    if "gguf_file" in kwargs or not folder.is_dir():
        return _from_pretrained(source, model_id, **kwargs)
    return _folder_tokenizer(str(folder.resolve()), model_id, _files_signature(folder), tuple(sorted(kwargs.items())))


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".msgpack", ".h5")


def _files_signature(folder: Path) -> tuple[tuple[str, int, int, int, int], ...]:
    """Name, size, inode, modification and change times of each file of ``folder`` but its weights.
    Why the last two beside the first: a file replaced by a rename is another inode, and one
    rewritten in place at its size with its modification time set back (``cp -p``, ``rsync -t``,
    or within a coarse clock's tick) has a new change time, which no user can set."""
    files = []
    for path in folder.iterdir():
        if not path.name.endswith(_WEIGHT_SUFFIXES):
            try:
                st = path.stat()
            except OSError:  # (a dangling link: no file the tokenizer reads)
                continue
            files.append((path.name, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(sorted(files))


@functools.lru_cache(maxsize=4)
def _folder_tokenizer(folder: str, model_id: str, signature: tuple[Any, ...], kwargs: tuple[Any, ...]) -> Any:
    return _from_pretrained(folder, model_id, **dict(kwargs))


def _from_pretrained(source: str | Path, model_id: str, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    # (a GGUF's tokenizer is read from the file: what its reader raises for a truncated one too)
    # (tokenizers raises a bare Exception for a tokenizer.json it cannot read, e.g. a newer one's)
    errors = GGUF_READ_ERRORS if "gguf_file" in kwargs else (Exception,)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    except errors as e:
        raise ModelError(
            f"cannot load the tokenizer of {model_id!r}: {e} (a tokenizer.json of a newer tokenizers: upgrade it)"
            if type(e) is Exception
            else f"cannot load the tokenizer of {model_id!r}: {e}"
        ) from e
    return checked_tokenizer(tokenizer, model_id)


def checked_tokenizer(tokenizer: Any, model_id: str) -> Any:
    """``tokenizer`` if fast (offsets), given a pad token where it has none."""
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(
            f"the tokenizer of {model_id!r} ({type(tokenizer).__name__}) is not a "
            "fast tokenizer; token offsets (return_offsets_mapping) are required"
        )
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def clear_tokenizer_cache() -> None:
    """Forget the local folders' tokenizers read in this process."""
    _folder_tokenizer.cache_clear()
