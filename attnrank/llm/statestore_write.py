"""Writing and removing on-disk passage-state stores (the format: :mod:`attnrank.llm.statestore`).

:func:`write_store` encodes every passage's block states into memory-mapped arrays in a temporary
sibling folder, renamed into place once complete; :func:`remove_store` removes only a folder that
holds a store attnrank wrote and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnrank.config import STATE_STORAGES
from attnrank.errors import InputError
from attnrank.types import Document

from ..files import fsync_folder, fsync_tree, hold_writer_lock, remove_stale_folders, sibling
from .attention import AttentionCapturer
from .blocks import block_prefix_ids, encode_blocks_text
from .states import check_block_window, check_one_head_size, encode_blocks, state_keys
from .statestore import ARRAYS, ENCODER, FORMAT, STORE_FILES, sample_digest, store_settings


def remove_store(folder: Path) -> None:
    """Remove a passage-state store that attnrank wrote (its ``states.json`` says so) and nothing
    else: a folder holding anything but the store's own files is refused, not emptied."""
    try:
        header = json.loads((folder / "states.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        header = None
    others = sorted(p.name for p in folder.iterdir() if p.name not in STORE_FILES)
    if not isinstance(header, dict) or header.get("format") != FORMAT or others:
        what = f"holds {', '.join(others[:5])}" if others else "has no states.json attnrank wrote"
        raise InputError(f"{folder} is not a passage-state store attnrank wrote (it {what}); give another folder")
    for name in STORE_FILES:
        (folder / name).unlink(missing_ok=True)
    folder.rmdir()


def write_store(
    folder: Path,
    capturer: AttentionCapturer,
    tokenizer: Any,
    docs: Sequence[Document],
    *,
    model_id: str,
    fingerprint: str,
    storage: str = "float16",
    max_doc_words: int | None = None,
    max_doc_tokens: int | None = None,
    batch_docs: int = 64,
    progress: Callable[[int], object] | None = None,
) -> dict[str, Any]:
    """Encode every passage's block states and write them to the new folder ``folder``; returns
    the header. The arrays are written as they are encoded (memory-mapped, sized from a first
    pass that only tokenizes), so a store larger than memory can be built; everything goes to a
    temporary sibling first, renamed to ``folder`` once complete."""
    if storage not in STATE_STORAGES:
        raise InputError(f"passage state storage {storage!r} is not one of {STATE_STORAGES}")
    folder = Path(folder)
    if not docs:
        raise InputError("no passages to store; give at least one document")
    if folder.exists():
        raise InputError(f"{folder} exists; passage states are written to a new folder: remove it or give another")
    prefix_ids, prefix, blocks = _checked_blocks(capturer, tokenizer, docs, max_doc_words, max_doc_tokens)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in blocks], dtype=np.int64)]).astype(np.int64)
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_folders(folder, "a passage-state write")  # (gigabytes each, at a corpus's scale)
    tmp = sibling(folder, "tmp")
    tmp.mkdir()
    lock = hold_writer_lock(tmp)  # (a later write keeps this folder while it is held)
    try:
        entries = _write_arrays(
            tmp, capturer, (prefix_ids, prefix), blocks, offsets, fingerprint, storage, batch_docs, progress
        )
        samples = {name: sample_digest(np.load(tmp / f"{name}.npy", mmap_mode="r")) for name in ARRAYS[storage]}
        np.save(tmp / "offsets.npy", offsets)
        samples["offsets"] = sample_digest(offsets, len(offsets))  # (all of it: opening reads it whole anyway)
        header = {
            "format": FORMAT,
            "version": 1,
            "encoder": ENCODER,
            "model_id": model_id,
            "storage": storage,
            **store_settings(capturer, tokenizer, fingerprint, max_doc_words, max_doc_tokens),
            "tokens": int(offsets[-1]),
            "passages": [[d.id, key] for d, key in zip(docs, entries)],
            "samples": samples,
        }
        (tmp / "states.json").write_text(json.dumps(header), encoding="utf-8")
        # (on disk before the rename: a power loss could leave a store whose states.json is empty,
        # which every open refuses and remove_store, finding no header of ours, does not remove)
        fsync_tree(tmp)
        os.rename(tmp, folder)
        fsync_folder(folder.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if lock is not None:
            os.close(lock)
    return header


def check_store(
    capturer: AttentionCapturer,
    tokenizer: Any,
    docs: Sequence[Document],
    max_doc_words: int | None = None,
    max_doc_tokens: int | None = None,
) -> None:
    """What :func:`write_store` would refuse of this model and these passages (states of more than
    one head size; a passage past a sliding window), found by tokenizing them and prefilling the
    instruction alone. Why: an index build writes its store last, after embedding the whole corpus
    (hours on a large one), which was then thrown away."""
    if docs:
        _checked_blocks(capturer, tokenizer, docs, max_doc_words, max_doc_tokens)


def _checked_blocks(
    capturer: AttentionCapturer,
    tokenizer: Any,
    docs: Sequence[Document],
    max_doc_words: int | None,
    max_doc_tokens: int | None,
) -> tuple[list[int], Any, list[list[int]]]:
    """(the instruction's ids, its prefilled cache, each passage's block ids), checked for a store."""
    prefix_ids = block_prefix_ids(tokenizer)
    prefix = capturer.prefill(prefix_ids)
    check_one_head_size(prefix)  # (a store of latent-attention states was written, then refused as damaged)
    blocks = encode_blocks_text(tokenizer, list(docs), max_doc_words, max_doc_tokens)[0]
    check_block_window(capturer, len(prefix_ids), max(len(b) for b in blocks))  # before any batch is encoded
    return prefix_ids, prefix, blocks


def _write_arrays(
    folder: Path,
    capturer: AttentionCapturer,
    prefix: tuple[list[int], Any],
    blocks: list[list[int]],
    offsets: np.ndarray,
    fingerprint: str,
    storage: str,
    batch_docs: int,
    progress: Callable[[int], object] | None,
) -> list[str]:
    """Encode ``blocks`` ``batch_docs`` at a time into memory-mapped ``.npy`` arrays of
    ``offsets[-1]`` rows (opened at the first state, whose shape they take); returns each
    block's state key. ``prefix``: the instruction's ids and their prefilled cache."""
    prefix_ids, cache = prefix
    start = len(prefix_ids)
    arrays: dict[str, np.memmap] = {}
    keys_out: list[str] = []
    for lo in range(0, len(blocks), batch_docs):
        part = blocks[lo : lo + batch_docs]
        starts = [start] * len(part)
        keys = state_keys(capturer, fingerprint, prefix_ids, part, starts)
        for i, state in enumerate(encode_blocks(capturer, cache, part, starts), start=lo):
            at, to = int(offsets[i]), int(offsets[i + 1])
            for name, t in (("keys", state.keys), ("values", state.values)):
                data, scales = _pack(t.permute(2, 0, 1, 3).float().cpu().numpy(), storage)
                for array_name, rows in ((name, data), (name[:-1] + "_scales", scales)):
                    if rows is None:
                        continue
                    if array_name not in arrays:
                        arrays[array_name] = np.lib.format.open_memmap(
                            folder / f"{array_name}.npy",
                            mode="w+",
                            dtype=rows.dtype,
                            shape=(int(offsets[-1]), *rows.shape[1:]),
                        )
                    arrays[array_name][at:to] = rows
        keys_out += keys
        if progress is not None:
            progress(len(part))
    for array in arrays.values():
        array.flush()
    return keys_out


def _pack(x: np.ndarray, storage: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``x`` ``[tokens, layers, kv, head_dim]`` as float16, or int8 with absmax scales."""
    if storage == "float16":
        return x.astype(np.float16), None
    scale = np.abs(x).max(axis=-1, keepdims=True) / 127.0
    scale = np.where(scale == 0, 1.0, scale).astype(np.float16)
    q = np.clip(np.rint(x / scale.astype(np.float32)), -127, 127).astype(np.int8)
    return q, scale[..., 0]
