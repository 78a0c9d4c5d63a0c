"""Index folders: a manifest plus component folders, written atomically.

Layout of ``indexes/<name>/``::

    manifest.json   format version, attnrank version, corpus checksum, counts, settings,
                    and the size + SHA-256 of every other file
    docs.jsonl      the documents in index order (id, title, text; metadata where there is any)
    bm25/           sparse index arrays (see :mod:`attnrank.index.bm25`)
    dense/          FAISS index (see :mod:`attnrank.index.dense`)

A save writes everything into a hidden temporary sibling folder, writes the manifest last,
fsyncs, and only then swaps it into place; the previous index is removed only after the
swap. A crash mid-save therefore never leaves a folder that loads as valid, and never loses
the index that was there before. What a save may replace, and the cleanup of folders left by
killed builds, follow :mod:`attnrank.index.folders`.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from ..config import PASSAGE_STATES_FOLDER, fault_point
from ..errors import IndexFormatError
from ..files import (
    INDEX_FORMAT,
    MANIFEST,
    SAMPLE_BYTES,
    SHARDED_FORMAT,
    file_sample_sha256,
    file_sha256,
    fsync_folder,
    fsync_tree,
    hold_writer_lock,
    sibling,
)
from ..types import Document, metadata_json
from .folders import (
    Protected,
    carry_mode,
    check_target,
    not_replaceable,
    private_folder,
    remove_stale,
    swap_back,
    swap_in,
)
from .settings import INDEX_FILES

T = TypeVar("T")

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


# A folder whose manifest is damaged is no longer known for an index, so a rebuild there must be forced.
_REBUILD_DAMAGED = (
    "rebuild the index with `attnrank index CORPUS --index-dir FOLDER --force` (force=True in Python): its "
    "damaged manifest no longer marks the folder as an attnrank index, which a rebuild replaces only when forced"
)


def corpus_checksum(docs: Sequence[Document]) -> str:
    """SHA-256 of the documents' ids, titles, texts and (where there is any) metadata; a document
    without metadata hashes as before metadata was stored, so older indexes still verify."""
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{d.id}\0{d.title}\0{d.text}\n".encode())
        if d.metadata:
            h.update(b"\x01" + json.dumps(_jsonable(d.metadata), sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def _jsonable(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` as it reads back from ``docs.jsonl`` (string keys; numpy's numbers as numbers,
    other values without a JSON form as text: :func:`~attnrank.types.metadata_json`)."""
    return json.loads(json.dumps(metadata, ensure_ascii=False, default=metadata_json))


def check_built(tmp: Path, read: Callable[[Path], object] | None = None) -> None:
    """``read`` (a manifest reader; default :func:`read_manifest` with an index's required files)
    of a build's temporary folder ``tmp`` before :func:`atomic_dir` swaps it in: a file another
    process removed during the build (a stale-folder sweep in another container) is refused, and
    nothing replaced."""
    try:
        read(tmp) if read is not None else read_manifest(tmp, required=INDEX_FILES)
    except IndexFormatError as e:
        raise IndexFormatError(
            f"the build lost a file before it was saved ({e}); nothing was replaced: build again"
        ) from None


@contextmanager
def atomic_dir(target: Path, *, force: bool = False, protect: Iterable[Protected] = ()) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``target`` in one atomic swap.

    ``target`` must be absent, empty, or an attnrank index (``force`` admits any other folder,
    ``protect`` lists paths that must never be replaced): see :mod:`attnrank.index.folders`.
    Stale temporary folders of killed builds are removed first (and logged).
    """
    target = Path(target)
    protect = list(protect)
    check_target(target, force=force, protect=protect)
    had_states = states_bytes(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target)
    found = _identity(target)
    fault_point("save-before-tmp", target)
    tmp = sibling(target, "tmp")
    tmp.mkdir()
    made = private_folder(tmp)
    lock = hold_writer_lock(tmp)  # a later build's remove_stale keeps this folder while it is held
    swapped = False
    try:
        yield tmp
        fault_point("save-before-swap", tmp)
        carry_mode(tmp, target, made)  # (a private index stays private)
        fsync_tree(tmp)  # (before the checks: what is slow, seconds for a large index, comes first)
        # it may have changed during the build (--force replaces what it was needed for; a folder a save could
        # replace without it is checked again after the swap)
        forced = check_target(target, force=force, protect=protect)  # (why, where only force admits it)
        if _identity(target) != found:  # (two builds of one folder: both said they had built it)
            raise IndexFormatError(
                f"{target} was written by another process during this build; nothing was replaced (it holds the "
                "other build's index): build again to replace it"
            )
        old = _swap_checked(tmp, target, found, forced is not None)
        swapped = True
        if forced is not None:
            logger.warning("replaced %s because of --force: %s", target, forced)
        if had_states and not (target / PASSAGE_STATES_FOLDER).is_dir():
            # (they cost a pass of the model over the corpus, hours on a large one: never dropped without a word)
            logger.warning(
                "dropped the passage states (%.1f MiB) of the index this build replaced at %s; build them again "
                "with `attnrank index ... --passage-states float16` (or int8)",
                had_states / 2**20,
                target,
            )
        fsync_folder(target.parent)
        fault_point("save-after-swap", target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
            if old.exists():  # (the new index is in place; the previous one stays hidden beside it otherwise)
                logger.warning("could not remove the previous index, kept at %s; remove it by hand", old)
    except BaseException:
        if not swapped:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            os.close(lock)


def states_bytes(index: Path) -> int:
    """The bytes of the passage states stored in the index folder ``index`` (0: none there)."""
    states = Path(index) / PASSAGE_STATES_FOLDER
    if not states.is_dir() or states.is_symlink():
        return 0
    return sum(f.stat().st_size for f in states.rglob("*") if f.is_file() and not f.is_symlink())


def _swap_checked(tmp: Path, target: Path, found: str | None, forced: bool) -> Path | None:
    """:func:`swap_in`, then what it took out checked once more: where another program wrote into the
    folder in the moment since the last check (another manifest; unless ``forced``, anything a save
    may not replace), or the check itself fails, the folder is put back (:func:`swap_back`) and the
    build removed. Returns where the previous folder now is (None where there was none)."""
    old = swap_in(tmp, target)
    if old is None:
        return None
    try:
        if _identity(old) != found or (not forced and not_replaceable(old) is not None):
            raise IndexFormatError(
                f"{target} changed while this build was swapping it in; nothing was replaced (the folder holds what "
                "was written there): build again to replace it"
            )
    except BaseException:  # (that, a walk that failed, an interrupt: put back, then raise)
        shutil.rmtree(swap_back(old, target), ignore_errors=True)
        raise
    return old


def _identity(target: Path) -> str | None:
    """What tells ``target`` (a folder or nothing) from one another process swapped in: the
    SHA-256 of its manifest ("" without one; None where there is no folder). Not inodes: some
    network and user-space file systems number a file anew once it leaves their cache."""
    if not target.exists():
        return None
    try:
        return hashlib.sha256((target / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return ""


def write_docs(path: Path, docs: Sequence[Document]) -> None:
    """One JSON record a document: id, title, text and, where it has any, its metadata (which
    search results carry, and the pruner reads pre-split ``sentences`` from)."""
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            record: dict[str, Any] = {"id": d.id, "title": d.title, "text": d.text}
            if d.metadata:
                record["metadata"] = _jsonable(d.metadata)
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_doc_ids(path: Path) -> Iterator[str]:
    """The document ids of an index's ``docs.jsonl``, one line at a time (no document is kept); a
    damaged line is an :class:`IndexFormatError` naming it."""
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    doc_id = json.loads(raw.decode("utf-8"))["id"]
                except (ValueError, KeyError, TypeError) as e:
                    raise IndexFormatError(
                        f"{path}:{lineno}: not a document record ({type(e).__name__}); the index is corrupted, "
                        "rebuild it with `attnrank index`"
                    ) from None
                yield str(doc_id)
    except OSError as e:
        raise IndexFormatError(f"{path} cannot be read ({e}); rebuild the index") from None


def read_docs(path: Path) -> list[Document]:
    """Documents of an index's ``docs.jsonl``; a damaged line is an :class:`IndexFormatError` naming it."""
    docs = []
    try:
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    o = json.loads(raw.decode("utf-8"))
                    meta = o.get("metadata", {})
                    if not isinstance(meta, dict):
                        raise TypeError("metadata is not an object")
                    docs.append(Document(o["id"], o["text"], o.get("title", ""), meta))
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    raise IndexFormatError(
                        f"{path}:{lineno}: not a document record ({type(e).__name__}: "
                        f"{str(e)[:80]}); the index is corrupted, rebuild it with `attnrank index`"
                    ) from None
    except OSError as e:
        raise IndexFormatError(f"{path} cannot be read ({e.strerror}); rebuild the index") from None
    return docs


def file_entries(root: Path, skip: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of every file under ``root`` but its manifest and the top folders ``skip``."""
    skip = set(skip)
    return {
        p.relative_to(root).as_posix(): {
            "bytes": p.stat().st_size,
            "sha256": file_sha256(p),
            "sample_sha256": file_sample_sha256(p),
        }
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] not in skip and p.relative_to(root).as_posix() != MANIFEST
    }


def write_manifest(root: Path, info: dict[str, Any]) -> None:
    files = file_entries(root)
    manifest = {
        "format": INDEX_FORMAT,
        "format_version": FORMAT_VERSION,
        "build_id": uuid.uuid4().hex,
        **info,
        "files": files,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def read_manifest(
    root: Path, *, verify: bool = False, required: Sequence[str] = (), rebuild: str = _REBUILD_DAMAGED
) -> dict[str, Any]:
    """Read and check a manifest: format, version, and that every listed file is intact.

    Every listed path must stay inside ``root`` (no absolute paths, no ``..``, no symbolic link
    out), ``required`` files must be listed, sizes are always checked; ``verify=True`` also
    recomputes SHA-256 checksums. ``rebuild``: the advice where the manifest itself is damaged (a
    shard's names the sharded index's rebuild).
    """
    root = Path(root)
    path = root / MANIFEST
    if not root.is_dir():
        backups = sorted(root.parent.glob(f".{glob.escape(root.name)}.old-*"))
        hint = f"; an earlier copy survives at {backups[-1]}" if backups else ""
        raise IndexFormatError(f"no index at {root}{hint}; build one with `attnrank index CORPUS --index NAME`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexFormatError(f"{root} has no {MANIFEST}: not an index or an incomplete save; rebuild it") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise IndexFormatError(f"{path} is corrupted ({e}); {rebuild}") from None
    if isinstance(manifest, dict) and manifest.get("format") == SHARDED_FORMAT:
        raise IndexFormatError(
            f"{root} is a sharded index: search it with `attnrank batch` (ShardedRetriever.load), or "
            "merge it into one ordinary index with `attnrank merge-shards`"
        )
    if not isinstance(manifest, dict) or manifest.get("format") != INDEX_FORMAT:
        raise IndexFormatError(f"{path} is not an attnrank index manifest; {rebuild}")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{root} has index format version {version}, this attnrank reads version {FORMAT_VERSION}; "
            "rebuild the index with this version (`attnrank index`)"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or not set(required) <= set(files):
        missing = sorted(set(required) - set(files)) if isinstance(files, dict) else ["files"]
        raise IndexFormatError(f"{path} does not list {missing}; the manifest is damaged: {rebuild}")
    check_files(root, files, path, verify=verify, rebuild=rebuild)
    return manifest


def check_files(
    root: Path, files: dict[str, Any], manifest: Path, *, verify: bool = False, rebuild: str = _REBUILD_DAMAGED
) -> None:
    """Every file ``files`` lists (``{path: {"bytes", "sha256"}}``, as written by :func:`write_manifest`)
    is inside ``root`` and has its recorded size; ``verify=True`` also checks its SHA-256.
    ``rebuild``: the advice where the manifest is damaged (as :func:`read_manifest`'s)."""
    inside = Path(os.path.realpath(root))
    for name, meta in files.items():
        f = _confined(root, inside, name, manifest, rebuild)
        if (
            not isinstance(meta, dict)
            or not isinstance(meta.get("bytes"), int)
            or not isinstance(meta.get("sha256"), str)
        ):
            raise IndexFormatError(f"{manifest}: entry {name!r} lacks its size or checksum; rebuild the index")
        states = Path(name).parts[:1] == (PASSAGE_STATES_FOLDER,)
        if not f.is_file() or f.stat().st_size != meta["bytes"]:
            # (the states are the part a user may delete to free disk: say that a rebuild may leave them out)
            raise IndexFormatError(
                f"{f} is missing or has the wrong size (expected {meta['bytes']} bytes); rebuild the index"
                + (" (without --passage-states to leave its passage states out)" if states else "")
            )
        if verify and file_sha256(f) != meta["sha256"]:
            raise IndexFormatError(f"{f} fails its SHA-256 check; the index is corrupted, rebuild it")
        # (manifests before 2026-12-07 have none: sizes alone, as then; passage states are checked by
        # their store, which an index's reranker skips with a warning where they do not hold)
        sample = meta.get("sample_sha256")
        if not verify and not states and isinstance(sample, str) and file_sample_sha256(f) != sample:
            # (a dense index swapped in from another build of as many vectors searched with exit 0)
            raise IndexFormatError(
                f"{f} is not the file this index was built with (its first and last {SAMPLE_BYTES // 1024} KiB "
                "differ from the manifest's record: replaced or damaged since); rebuild the index"
            )


# Loads restarted because a save swapped the folder meanwhile (about 15 s in all).
LOAD_ATTEMPTS = 40


def load_unchanged(path: Path, load: Callable[[], T]) -> T:
    """``load()`` of the index folder ``path``, restarted while a save swaps the folder under it
    (its manifest changed between the start and the end), so that a reader gets the old or the new
    index, never a mix; an :class:`IndexFormatError` met while the folder changed is a restart too."""
    for attempt in range(LOAD_ATTEMPTS):
        if attempt:
            time.sleep(min(0.02 * attempt, 0.5))  # let a writer that swaps repeatedly finish
        tag = manifest_tag(path)
        try:
            loaded = load()
        except IndexFormatError:
            # swapped while we read it: read the new one; or in the middle of a swap's two renames
            # (where the folder cannot be exchanged at once: NFS, macOS), its manifest gone for a moment
            if tag is not None and manifest_tag(path) != tag:
                continue
            raise
        if manifest_tag(path) == tag:
            return loaded
    raise IndexFormatError(
        f"{path} kept changing while it was loaded (another process is rebuilding it "
        "repeatedly); try again when the build is done"
    )


def manifest_tag(root: Path) -> str | None:
    """SHA-256 of the manifest's bytes (None if unreadable): changes with every save (``build_id``)."""
    try:
        return file_sha256(Path(root) / MANIFEST)
    except OSError:
        return None


def _confined(root: Path, inside: Path, name: object, manifest: Path, rebuild: str) -> Path:
    """``root / name`` if ``name`` is a relative path that stays inside the index folder."""
    rel = name if isinstance(name, str) else ""
    bad = not rel or "\\" in rel or rel.startswith("/")
    if not bad:
        bad = ".." in PurePosixPath(rel).parts or Path(rel).is_absolute()
    f = root / rel
    if not bad:
        real = Path(os.path.realpath(f))
        bad = not (real == inside or inside in real.parents)
    if bad:
        raise IndexFormatError(
            f"{manifest} lists the file {str(name)[:80]!r}, which is outside the index folder; "
            f"the manifest is damaged or crafted: {rebuild}"
        )
    return f


def keep_passage_states(target: Path, build: Path, corpus_sha256: str) -> None:
    """Copy the passage states of the index at ``target`` into ``build`` (its new build, not yet
    in place; a retriever loaded from ``target`` saved over it: ``load``, ``set_fusion``, ``save``
    dropped them without a word) where the build writes none and indexes the same corpus. Only the
    files ``target``'s manifest lists, each copy checked against the SHA-256 listed there: the new
    manifest checksums what is kept, and must not bless damaged bytes (nothing is kept then, with a
    warning). A passage's stored states are keyed by its text, so none is served for another."""
    states = target / PASSAGE_STATES_FOLDER
    if (build / PASSAGE_STATES_FOLDER).exists() or not states.is_dir():
        return
    try:
        manifest = read_manifest(target)
    except (IndexFormatError, OSError, ValueError) as e:  # (damaged, or no index of ours)
        logger.warning("not keeping the passage states of %s: its manifest does not hold (%s)", target, e)
        return
    if manifest.get("corpus_sha256") != corpus_sha256:
        logger.warning("not keeping the passage states of %s: they were built for another corpus", target)
        return
    prefix = f"{PASSAGE_STATES_FOLDER}/"
    listed = {name: entry for name, entry in manifest.get("files", {}).items() if name.startswith(prefix)}
    for name in listed:  # copied first, the copy then checked: the bytes checked are the bytes kept
        (build / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target / name, build / name)
    damaged = [name for name, entry in listed.items() if file_sha256(build / name) != entry.get("sha256")]
    if not listed or damaged:
        shutil.rmtree(build / PASSAGE_STATES_FOLDER, ignore_errors=True)
        logger.warning(
            "not keeping the passage states of %s: %s; rebuild them with attnrank index --passage-states",
            target,
            f"{damaged[0]} does not match its checksum" if damaged else "its manifest lists none",
        )
        return
    logger.info("kept the passage states of %s (%d files)", target, len(listed))
