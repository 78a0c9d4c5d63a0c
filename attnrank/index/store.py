"""Index folders: a manifest plus component folders, written atomically.

Layout of ``indexes/<name>/``::

    manifest.json   format version, attnrank version, corpus checksum, counts, settings,
                    and the size + SHA-256 of every other file
    docs.jsonl      the documents in index order (id, title, text)
    bm25/           sparse index arrays (see :mod:`attnrank.index.bm25`)
    dense/          FAISS index (see :mod:`attnrank.index.dense`)

A save writes everything into a hidden temporary sibling folder, writes the manifest last,
fsyncs, and only then swaps it into place; the previous index is removed only after the
swap. A crash mid-save therefore never leaves a folder that loads as valid, and never loses
the index that was there before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import IndexFormatError
from ..types import Document

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def corpus_checksum(docs: Sequence[Document]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{d.id}\0{d.title}\0{d.text}\n".encode("utf-8"))
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``target`` in one rename."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_docs(path: Path, docs: Sequence[Document]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n")


def read_docs(path: Path) -> list[Document]:
    with open(path, encoding="utf-8") as f:
        return [Document(o["id"], o["text"], o.get("title", "")) for o in map(json.loads, f)]


def write_manifest(root: Path, info: dict[str, Any]) -> None:
    files = {str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}
    manifest = {"format": "attnrank-index", "format_version": FORMAT_VERSION, **info, "files": files}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def read_manifest(root: Path, *, verify: bool = False) -> dict[str, Any]:
    """Read and check a manifest: format, version, and that every listed file is intact.

    File sizes are always checked; ``verify=True`` also recomputes SHA-256 checksums.
    """
    root = Path(root)
    path = root / MANIFEST
    if not root.is_dir():
        backups = sorted(root.parent.glob(f".{root.name}.old-*"))
        hint = f"; an earlier copy survives at {backups[-1]}" if backups else ""
        raise IndexFormatError(f"no index at {root}{hint}; build one with `attnrank index CORPUS --name NAME`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexFormatError(f"{root} has no {MANIFEST}: not an index or an incomplete save; rebuild it") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexFormatError(f"{path} is corrupted ({e}); rebuild the index with `attnrank index`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != "attnrank-index":
        raise IndexFormatError(f"{path} is not an attnrank index manifest; rebuild the index")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{root} has index format version {version}, this attnrank reads version {FORMAT_VERSION}; "
            "rebuild the index with this version (`attnrank index`)")
    for name, meta in manifest.get("files", {}).items():
        f = root / name
        if not f.is_file() or f.stat().st_size != meta["bytes"]:
            raise IndexFormatError(f"{f} is missing or has the wrong size (expected {meta['bytes']} bytes); rebuild the index")
        if verify and _sha256(f) != meta["sha256"]:
            raise IndexFormatError(f"{f} fails its SHA-256 check; the index is corrupted, rebuild it")
    return manifest
