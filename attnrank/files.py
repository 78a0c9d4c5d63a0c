"""Output files: written atomically (a reader sees the old file or the new one, never a half-written
one), and replaced only when attnrank recognisably wrote them (a TREC run it tagged, a batch
Parquet file), and hashed (:func:`file_sha256`) to verify what was written."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import InputError

logger = logging.getLogger(__name__)

# The siblings a write makes of ``NAME`` (:func:`sibling`): ``.NAME.tmp-PID-HEX`` while it writes
# (:func:`atomic_path`, an index's folder), ``.NAME.old-PID-HEX`` for the index a swap replaced
SIBLING = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-(?P<tag>[0-9a-f]{8})$")


# What makes a folder an attnrank index (:mod:`attnrank.index.store` writes it): its manifest, of
# one of two formats. Here, below the corpus readers, so that a folder corpus can leave an index
# inside it out of its documents.
MANIFEST = "manifest.json"
INDEX_FORMAT = "attnrank-index"
SHARDED_FORMAT = "attnrank-sharded-index"


def index_manifest(path: str | Path) -> dict[str, Any] | None:
    """The attnrank manifest of folder ``path`` (ordinary or sharded, any version), else None."""
    try:
        m = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("format") in (INDEX_FORMAT, SHARDED_FORMAT) else None


def is_index_folder(path: str | Path) -> bool:
    """True when ``path`` is a folder with a readable attnrank manifest (ordinary or sharded, any version)."""
    return index_manifest(path) is not None


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Bytes read from each end of a file for its sample digest (:func:`file_sample_sha256`).
SAMPLE_BYTES = 1 << 16


def file_sample_sha256(path: str | Path) -> str:
    """The SHA-256 (hex) of a file's size and its first and last :data:`SAMPLE_BYTES` bytes (the
    whole file where it is shorter than both): read at every load of an index, where the full
    checksum (``--verify``) reads everything. It tells a file replaced by another build's of the
    same size (a FAISS index of as many vectors), or damaged at either end, from the one written."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest.update(str(size).encode())
        digest.update(f.read(SAMPLE_BYTES))
        if size > SAMPLE_BYTES:
            f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


def sibling(target: Path, kind: str) -> Path:
    """A fresh ``.NAME.<kind>-PID-HEX`` path next to ``target`` (:data:`SIBLING`)."""
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (this one, or another user's)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def hold_writer_lock(path: Path) -> int | None:
    """Open ``path`` (a file or folder being written) and hold an exclusive lock on it: the
    descriptor to close when the write ends (None where no lock can be taken: no POSIX locks, or
    a file system without them for this file). A process's locks go when it does, however it
    ends, so :func:`stale` can tell a write under way from a killed one where locks work. Waits
    for a prober's brief hold (:func:`lock_held`) rather than writing unprotected."""
    return _lock(path, wait=True)


def _lock(path: Path, *, wait: bool) -> int | None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no POSIX locks (Windows)
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError:  # no locks here (some network file systems, for a folder)
        os.close(fd)
        return None
    return fd


def lock_held(path: Path) -> bool | None:
    """Whether a writer holds :func:`hold_writer_lock` on ``path``: True, False, or None where
    that cannot be told (no locks)."""
    try:
        fd = _lock(path, wait=False)
    except BlockingIOError:
        return True
    if fd is None:
        return None
    os.close(fd)
    return False


def stale(path: Path, pid: int) -> bool:
    """Whether the temporary ``path`` that process ``pid`` began is a killed write's leftover:
    that process is gone here, and no writer holds its lock (a writer in another container, whose
    PID is not visible here, holds it). Where the lock cannot be read (a folder on NFS, whose locks
    need a file opened for writing) it is kept: a live build's folder is never judged stale on a
    guess, at the cost of a killed build's folder staying there (remove it by hand)."""
    return not process_alive(pid) and lock_held(path) is False


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove the temporary files :func:`atomic_path` left beside ``path`` when its write was
    killed (``.NAME.tmp-PID-HEX``, :func:`stale`); nothing else is touched, and a leftover that
    cannot be removed (another user's, in a sticky folder) is left and logged."""
    return _remove_stale_siblings(path, "a write", folders=False)


def remove_stale_folders(folder: Path, what: str) -> list[Path]:
    """Remove the temporary folders (``.NAME.tmp-PID-HEX``) that writes of ``folder`` (``what``:
    a passage-state store) left when they were killed (:func:`stale`: its process gone and its
    lock free); a write under way, here or on another machine that holds its lock, is left."""
    return _remove_stale_siblings(folder, what, folders=True)


def _remove_stale_siblings(path: Path, what: str, *, folders: bool) -> list[Path]:
    """The temporary files (or ``folders``) of killed writes of ``path`` removed (and logged)."""
    removed: list[Path] = []
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return removed
    for p in siblings:
        m = SIBLING.match(p.name)
        kind = p.is_dir() if folders else p.is_file()
        if not (m and m["kind"] == "tmp" and m["name"] == path.name and kind and not p.is_symlink()):
            continue
        if not stale(p, int(m["pid"])):
            continue
        try:
            shutil.rmtree(p) if folders else p.unlink(missing_ok=True)
        except OSError as e:  # (the write it guards still proceeds)
            logger.warning("could not remove %s, left by %s that was killed: %s; remove it by hand", p, what, e)
            continue
        removed.append(p)
        logger.warning("removed %s, left by %s that was killed (process %s is gone)", p, what, m["pid"])
    return removed


@contextmanager
def atomic_path(
    path: str | Path,
    *,
    fsync: bool = True,
    guard: Callable[[Path], None] | None = None,
    clean: bool = True,
) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write (``.NAME.tmp-PID-HEX``); once the block ends
    without an error it is fsynced (``fsync``, the folder too after the rename) and renamed over
    ``path``, else removed. Creates the parent folder. A file it replaces keeps its permission bits
    (a shared run file stays group-readable; a private one stays private); a symbolic link is
    written through (its target is replaced, the link kept). ``guard(path)``, called just before
    the rename, may raise :class:`InputError` to keep what is there (:func:`replace_guard`: a file
    that appeared while a long run wrote, which attnrank did not write); what was written is then
    kept at ``NAME.attnrank-new-HEX`` beside it, named in the error. Temporary siblings of ``path``
    that a killed write left are removed first (:func:`remove_stale_temps`; ``clean=False``: not
    looked for, where the caller clears its folder itself and writes many files into it)."""
    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if clean:
        remove_stale_temps(path)
    tmp = sibling(path, "tmp")
    tmp.touch(exist_ok=False)  # (created to hold its writer's lock; writers truncate it)
    lock = hold_writer_lock(tmp)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        if guard is not None:
            try:
                guard(path)
            except InputError as e:  # what was written is kept beside it: a run of hours is not lost
                kept = path.with_name(f"{path.name}.attnrank-new-{uuid.uuid4().hex[:8]}")
                os.replace(tmp, kept)
                raise InputError(f"{e}; this run's output is kept at {kept}") from None
        if path.is_file() and tmp.is_file():  # (the file replaced, not one the guard kept: its bits only)
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
        if fsync:  # the rename itself: without it a power loss can bring the old file back
            fsync_folder(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
        if lock is not None:
            os.close(lock)


def fsync_folder(folder: Path) -> None:
    """Make the entries of ``folder`` (a rename, a new file) durable; skipped where folders cannot
    be opened (the files themselves were synced)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Every file below ``root``, then every folder (deepest first): a file's entry in its folder
    is durable only once the folder itself is synced."""
    folders = [root]
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir():
            folders.append(p)
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):
        fsync_folder(folder)


@contextmanager
def held_lock(path: Path, *, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing) until the block ends:
    one builder of a cache entry, or one run of a checkpoint, at a time. ``wait``: wait for
    another process that holds it; else raise :class:`BlockingIOError` at once."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise
        except OSError as e:  # (no locks on this file system: an NFS home without lockd says ENOLCK)
            # raised, the default model could not load at all, and a training's save failed after the work
            logger.warning(
                "cannot lock %s (%s): going on without the lock; run one attnrank process on it at a time",
                path,
                e.strerror or e,
            )
        yield  # closing the file releases the lock


def check_file_target(path: str | Path, what: str) -> None:
    """Raise :class:`InputError` (naming ``what``, e.g. ``"-o"``) unless :func:`atomic_path` can
    write ``path``: not a folder, not a pipe, device or socket (the rename would replace it), and
    no parent that is a file."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{what} {path} is a folder; give a file path")
    if path.exists() and not path.is_file():
        raise InputError(f"{what} {path} is not a regular file (a device, pipe or socket); give a file path")
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise InputError(f"{what} {path}: {blocker} is a file, not a folder; choose another path")
    index = next(
        (p for p in Path(os.path.realpath(path)).parents if is_index_folder(p)), None
    )  # (ix/../run: beside it)
    if index is not None:  # (a file its manifest does not list: a rebuild then refused to replace the index)
        raise InputError(
            f"{what} {path} lies inside the attnrank index {index}, which holds its own files only; "
            "write it outside the index folder"
        )
    check_writable(path, what)


def check_writable(path: str | Path, what: str) -> None:
    """Raise :class:`InputError` (naming ``what``) unless a file can be created in the folder that
    would hold ``path``'s temporary sibling (its nearest existing ancestor: folders that do not
    exist yet are made there), tried by creating and removing an empty one. Why: the write comes
    after the work (a search, an index build) and failed only then, the work lost; os.access
    passes as root on a read-only or permission-less mount."""
    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)  # (written through, as atomic_path)
    folder = next((p for p in path.absolute().parents if p.exists()), None)
    if folder is None:
        return
    if not folder.is_dir():  # (an index folder's checks had no other: refused only after the build)
        raise InputError(f"{what} {path}: {folder} is a file, not a folder; choose another path")
    probe = sibling(folder / path.name, "tmp")
    try:
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as e:
        raise InputError(f"{what} {path}: cannot write in {folder} ({e.strerror or e}); choose another path") from None


def check_new_folder(path: str | Path, what: str) -> None:
    """Raise :class:`InputError` unless ``path`` is absent or an empty folder. For ``what`` (e.g.
    ``"BM25Index.save"``), a part of an index that writes its files by fixed names: into a folder
    of other files it would replace one of the same name (``params.json``, ``vocab.json``) that
    attnrank did not write. A whole index is saved by ``HybridRetriever.save``, which replaces only
    an index it recognises."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{what}: {path} is a file; give a new or empty folder")
    if path.is_dir() and any(path.iterdir()):
        raise InputError(
            f"{what} writes into a new or empty folder; {path} holds files, which it could replace; choose "
            "another folder (a whole index is saved by HybridRetriever.save, which replaces only an index it wrote)"
        )


def foreign_file(path: str | Path, ours: Callable[[Path], bool]) -> bool:
    """Whether ``path`` is an existing, non-empty file that ``ours`` does not recognise."""
    path = Path(path)
    return path.is_file() and path.stat().st_size > 0 and not ours(path)


def refuse_replacing(path: str | Path, ours: Callable[[Path], bool], what: str, option: str) -> None:
    """Raise :class:`InputError` if ``path`` is an existing, non-empty file that ``ours`` does not
    recognise as ``what`` attnrank wrote (e.g. ``"a TREC run"``): outputs replace only attnrank's own."""
    if foreign_file(path, ours):
        raise InputError(
            f"{option} {path} exists and is not {what} attnrank wrote; refusing to replace it; "
            "choose another path or move the file away"
        )


def replace_guard(ours: Callable[[Path], bool], what: str, option: str) -> Callable[[Path], None]:
    """An :func:`atomic_path` guard: :func:`refuse_replacing` again at the end of the write. An
    output is checked before a run starts; hours later something else may be at its path."""
    return lambda path: refuse_replacing(path, ours, what, option)


def is_run(path: Path, tag_ok: Callable[[bytes], bool]) -> bool:
    """Every non-blank line is ``qid Q0 docid rank score tag`` with a tag ``tag_ok`` accepts, and
    there is at least one (a file of blank lines is no run)."""
    lines = 0
    try:
        with open(path, "rb") as f:
            for raw in f:
                parts = raw.split()
                if parts and (len(parts) != 6 or not tag_ok(parts[5])):
                    return False
                lines += bool(parts)
    except OSError:
        return False
    return lines > 0


def is_attnrank_run(path: Path) -> bool:
    """A run (:func:`is_run`) whose every tag starts with ``attnrank``: one attnrank wrote."""
    return is_run(path, lambda tag: tag.startswith(b"attnrank"))


# The guard of every TREC run attnrank writes at ``-o`` (rerank, search, batch).
RUN_GUARD = replace_guard(is_attnrank_run, "a TREC run", "-o")


# The schema metadata of every Parquet file attnrank batch writes (checkpoint parts and --parquet).
BATCH_PARQUET_MARK = {b"attnrank": b"batch"}


def is_batch_parquet(path: Path) -> bool:
    """A Parquet file ``attnrank batch`` wrote: its schema carries :data:`BATCH_PARQUET_MARK`
    (files it wrote before 2026-12-05 do not, and are not replaced: a user's own file with the
    same columns could not be told from them)."""
    try:
        import pyarrow.parquet as pq

        metadata = pq.read_schema(path).metadata or {}
    except Exception:  # not Parquet, unreadable, or pyarrow missing: not recognisably ours
        return False
    return all(metadata.get(k) == v for k, v in BATCH_PARQUET_MARK.items())


PNG_SOFTWARE = "attnrank"  # the PNG "Software" text chunk of the images attnrank writes itself
_SOFTWARE = b"tEXtSoftware\x00"


def png_software(path: Path) -> str:
    """The PNG's "Software" text (matplotlib writes its own unless told another), or ``""``."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)  # the text chunks precede the image data
    except OSError:
        return ""
    at = head.find(_SOFTWARE)
    if not head.startswith(b"\x89PNG\r\n\x1a\n") or at < 8:
        return ""
    length = int.from_bytes(head[at - 4 : at], "big") - len(_SOFTWARE) + 4  # tEXt is 4 of the chunk's type
    return head[at + len(_SOFTWARE) : at + len(_SOFTWARE) + max(length, 0)].decode("latin-1")


def has_png_mark(path: Path) -> bool:
    """A PNG attnrank wrote with ``metadata={"Software": PNG_SOFTWARE}``."""
    return png_software(path).startswith(PNG_SOFTWARE)


_MKDTEMP = re.compile(r"^\..+\.tmp-[a-z0-9_]{8}$")  # tempfile.mkdtemp's names, as builds once named theirs


def remove_killed_builds(folder: Path, what: str = "a build") -> list[Path]:
    """Remove the temporary folders that builds of ``folder`` (``what``: a de-quantized GGUF, an
    embedder export) killed midway left beside it (``.NAME.tmp-PID-HEX``, and
    ``.NAME.tmp-XXXXXXXX`` that ``tempfile.mkdtemp`` named before 2026-12-06; hundreds of MB
    each). Called with the build's lock held and before this build makes its own, so every one is
    a leftover where the lock works; where it does not (some network file systems), a folder
    named by another process that runs here is left."""
    removed = []
    for p in folder.parent.iterdir():
        m = SIBLING.match(p.name)
        old = m is None and _MKDTEMP.match(p.name) is not None and p.name.startswith(f".{folder.name}.tmp-")
        if not (old or (m and m["kind"] == "tmp" and m["name"] == folder.name)) or not p.is_dir() or p.is_symlink():
            continue
        if m is not None and int(m["pid"]) != os.getpid() and process_alive(int(m["pid"])):
            continue
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p)
            logger.warning("removed %s, left by %s that was killed", p, what)
    return removed
