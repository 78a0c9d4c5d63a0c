"""What an index save may replace, stale temporary folders, and the atomic swap.

Rules (issue 12, "nothing lost"):

- A save replaces only a folder that holds an attnrank ``manifest.json`` (``"format":
  "attnrank-index"`` or ``"attnrank-sharded-index"``) and nothing its manifest does not list,
  or an empty folder. Anything else (a file, a symbolic link, a folder of other files, an index
  folder the user has put files of their own into, such as a run file) is refused;
  ``force=True`` (CLI ``--force``) overrides that for a non-empty folder.
- Never, not even with ``force``: a folder that is, or contains, the working directory or a
  path the caller protects (the corpus being indexed), nor a folder inside a protected folder
  (a folder corpus) that holds files other than an attnrank index's own.
- Temporary and previous-index folders are siblings named ``.NAME.tmp-PID-HEX`` and
  ``.NAME.old-PID-HEX``, where PID is the writing process. A later save of the same NAME
  removes those whose writing process is gone (a build killed by ``kill -9`` or a power cut) and
  logs a warning naming each; a temporary folder whose lock a build holds (one in another
  container, whose PID is not visible here) is kept.
- The new folder is swapped in with one ``renameat2(RENAME_EXCHANGE)`` on Linux, so the index
  path always holds a complete index; elsewhere (or on file systems without it) two renames.
  What the swap took out is checked once more before it is removed: a folder that another
  program wrote into in the moment between the last check and the swap is put back
  (:func:`swap_back`), and the build is removed instead.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeGuard

from ..config import cache_dir
from ..errors import InputError
from ..files import (
    INDEX_FORMAT,
    MANIFEST,
    SHARDED_FORMAT,
    SIBLING,
    check_writable,
    index_manifest,
    is_index_folder,
    process_alive,
    sibling,
    stale,
)

logger = logging.getLogger(__name__)

_OS_FILES = frozenset({".DS_Store", "Thumbs.db", "desktop.ini"})  # file managers' own: nothing to lose


def _listed(root: Path, m: dict[str, Any]) -> set[str]:
    """The paths (relative, POSIX) that manifest ``m`` of folder ``root`` accounts for: itself,
    its ``files`` and, for a sharded index, every shard folder's own listed files."""
    files = m.get("files")
    known = {MANIFEST, *(files if isinstance(files, dict) else ())}
    shards = m.get("shards") if m.get("format") == SHARDED_FORMAT else None
    for s in shards if isinstance(shards, list) else ():
        name = s.get("name") if isinstance(s, dict) else None
        if not _plain(name):
            continue
        sub = index_manifest(root / name)
        if sub is not None and sub.get("format") == INDEX_FORMAT:
            known |= {f"{name}/{rel}" for rel in _listed(root / name, sub)}
    return known


def _plain(name: object) -> TypeGuard[str]:
    """A folder name without separators (a shard's, as a sharded manifest names it)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name


def unlisted_files(path: Path) -> list[str]:
    """Files (and links) inside the index folder ``path`` that its manifest does not list: not
    written by the build, so replacing the folder would delete them."""
    root = Path(path)
    m = index_manifest(root)
    known = set() if m is None else _listed(root, m)
    out = []
    for p in sorted(root.rglob("*")):
        if (p.is_dir() and not p.is_symlink()) or p.name in _OS_FILES:
            continue  # a folder is judged by what it holds
        rel = p.relative_to(root).as_posix()
        if rel not in known:
            out.append(rel)
    return out


def _real(p: Path) -> Path:
    """The path with every symbolic link resolved (never raises, even on a link loop)."""
    return Path(os.path.realpath(p))


def contains(outer: Path, inner: Path) -> bool:
    """Whether ``inner`` is ``outer`` or lies in it: by path, and where ``outer`` exists also by
    file identity (a case-insensitive file system, a bind mount: another spelling of one folder)."""
    if outer == inner or outer in inner.parents:
        return True
    if not outer.exists():
        return False
    return any(_same(outer, p) for p in (inner, *inner.parents))


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # (b, or an ancestor of it, does not exist)
        return False


def _holds_files(folder: Path) -> bool:
    """Whether ``folder`` holds a file or a link at any depth other than a file manager's own
    (empty subfolders and ``.DS_Store`` hold nothing to lose; a link to a folder is the user's, as
    :func:`unlisted_files` counts it, though is_dir follows it and rglob does not enter it)."""
    return any(p.name not in _OS_FILES and (p.is_symlink() or not p.is_dir()) for p in folder.rglob("*"))


def check_no_mounts(target: Path) -> None:
    """Refuse a folder the save would replace that is, or holds, a mount point: the old folder is
    removed after the swap, and the removal went through a mount under it (a corpus or a home
    bind-mounted there was deleted); a folder that is itself one (a Docker volume) failed at the
    swap, after the whole build ("Device or resource busy"). A folder on the same device as its
    parent, and every folder under it on the same device as the target, is no mount."""
    if os.path.ismount(target):
        raise InputError(
            f"index folder {target} is a mount point, which a save cannot replace; give a folder inside it "
            f"(e.g. {target / 'index'})"
        )
    device = target.stat().st_dev
    for folder, subfolders, _ in os.walk(target):
        for name in subfolders:
            sub = Path(folder) / name
            if not sub.is_symlink() and (os.path.ismount(sub) or sub.stat().st_dev != device):
                raise InputError(
                    f"refusing to replace {target}: it holds a mount point ({sub}), whose files the removal of the "
                    "old folder would delete; unmount it, or choose another folder (--force does not override this)"
                )


# a path a save never replaces; with its name ("the embedder"), else the corpus
Protected = Path | str | tuple[str, Path]


def embedder_paths(folders: Iterable[Path]) -> list[tuple[str, Path]]:
    """The local embedder's folders as :func:`check_target` names them."""
    return [("the embedder", Path(p)) for p in folders]


def model_paths(model: str | None) -> list[tuple[str, Path]]:
    """The LLM's local folder or file (``model`` as given: a path, an HF id or None) as
    :func:`check_target` names it: ``index --force --passage-states`` replaced the folder of the
    model it had just encoded the states with."""
    path = Path(model).expanduser() if model else None  # (as the model loads: --model=~/m reaches the shell unexpanded)
    return [("the model", path)] if path is not None and path.exists() else []


def _home() -> list[tuple[str, Path]]:
    """attnrank's home (its registry of trained weights and head sets, its caches): never replaced."""
    try:
        return [("attnrank's home (its registry and caches)", cache_dir())]
    except RuntimeError:  # (Path.home() where no home is known: nothing there to replace)
        return []


def _named(protect: Iterable[Protected]) -> list[tuple[str, Path]]:
    return [(x[0], Path(x[1])) if isinstance(x, tuple) else ("the corpus", Path(x)) for x in protect]


def not_replaceable(folder: Path) -> str | None:
    """Why a save may not replace the existing folder ``folder`` without ``force``; None where it
    may: empty (or only a file manager's files and empty folders), or an attnrank index holding no
    file its manifest does not list."""
    if not _holds_files(folder):
        return None
    if not is_index_folder(folder):
        return f"{folder} exists and is not an attnrank index (no valid {MANIFEST})"
    if extra := unlisted_files(folder):
        shown = ", ".join(extra[:3]) + (f" and {len(extra) - 3} more" if len(extra) > 3 else "")
        return f"{folder} is an attnrank index but holds files its manifest does not list ({shown})"
    return None


def check_target(target: Path, *, force: bool = False, protect: Iterable[Protected] = ()) -> str | None:
    """Raise :class:`InputError` unless a save may replace ``target`` (see the module rules);
    return why, where it may only because of ``force`` (what :func:`not_replaceable` says of the
    folder), else None. Nothing is logged: a build checks its target two or three times, and the
    save that replaces it says so once (:func:`attnrank.index.store.atomic_dir`)."""
    target = Path(target)
    if target.is_symlink():
        raise InputError(f"index folder {target} is a symbolic link; give the folder it points to, or another path")
    resolved = _real(target)
    inside = next((p for p in resolved.parents if is_index_folder(p)), None)
    if inside is not None:  # (its files are not the outer manifest's: a rebuild of that one was refused)
        raise InputError(
            f"refusing to write an index at {target}: it lies inside the attnrank index {inside}, which holds its "
            "own files only; choose a folder outside it (--force does not override this)"
        )
    named = _named(protect)
    for what, p in [("the working directory", Path.cwd()), *_home(), *named]:
        if contains(resolved, _real(p)):
            raise InputError(
                f"refusing to write an index at {target}: it is or contains {what} ({p}); "
                "choose a new folder (--force does not override this)"
            )
    check_writable(target, "index folder")  # (before the corpus is read and embedded, not after)
    if target.name == "..":  # (its swap failed after the whole build: a folder cannot be renamed through "..")
        raise InputError(f"index folder {target} ends in '..'; give the folder's own path ({resolved})")
    if not target.exists():
        return None
    if not target.is_dir():
        raise InputError(f"{target} is a file, not an index folder; choose another folder")
    check_no_mounts(target)
    why = not_replaceable(target)
    if why is None:
        return None
    # (--force replaced a folder of a folder corpus's own documents: only an index may be replaced there)
    corpus = next(
        (p for what, p in named if what == "the corpus" and _real(p).is_dir() and contains(_real(p), resolved)), None
    )
    if corpus is not None:
        raise InputError(
            f"refusing to write an index at {target}: it lies inside the corpus folder {corpus} and holds files "
            f"that are no attnrank index's ({why}; the corpus's own documents, perhaps); choose a new folder "
            "(--force does not override this)"
        )
    if force:
        return why
    raise InputError(
        f"{why}; refusing to replace it and lose its files; move them away, choose another "
        "folder, or pass force=True (CLI: --force) to replace it"
    )


def remove_stale(target: Path) -> list[Path]:
    """Remove ``.NAME.tmp-*`` / ``.NAME.old-*`` siblings of ``target`` whose writing process is gone."""
    target = Path(target)
    removed: list[Path] = []
    if not target.parent.is_dir():
        return removed
    for p in target.parent.iterdir():
        m = SIBLING.match(p.name)
        if not m or m["name"] != target.name:
            continue
        # its process is gone here, and (a temporary folder) no build holds its lock: one in another
        # container or on another machine of a shared file system, whose PID is not visible here
        if not (stale(p, int(m["pid"])) if m["kind"] == "tmp" else not process_alive(int(m["pid"]))):
            continue
        if m["kind"] == "old" and not target.exists():
            # killed between the two renames of the fallback swap (or of its undoing): this is the only copy
            # of what the folder held (an index, or a folder a save put back or was forced to replace)
            os.rename(p, target)
            logger.warning("restored %s from %s, left by an index build killed mid-swap", target, p)
            continue
        shutil.rmtree(p, ignore_errors=True)
        if p.exists():  # (a read-only folder inside it: said, not logged as removed)
            logger.warning(
                "could not remove %s, left by a killed index build (process %s); remove it by hand", p, m["pid"]
            )
            continue
        removed.append(p)
        logger.warning("removed %s, left by an index build that was killed (process %s is gone)", p, m["pid"])
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux ``renameat2``); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_in(tmp: Path, target: Path) -> Path | None:
    """Put the complete folder ``tmp`` at ``target``; return where the previous folder now is (or None)."""
    if not target.exists():
        os.rename(tmp, target)
        return None
    if _exchange(tmp, target):
        return tmp
    old = sibling(target, "old")
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)  # put the previous index back
        raise
    return old


def swap_back(old: Path, target: Path) -> Path:
    """Undo :func:`swap_in`: the previous folder, now at ``old``, back at ``target``; return where
    the folder swapped in now is (for the caller to remove). Without an atomic exchange, two
    renames: a process killed between them leaves ``target`` missing and ``old`` an ``.old``
    sibling, which the next save's :func:`remove_stale` puts back."""
    if _exchange(old, target):
        return old
    new = sibling(target, "tmp")
    os.replace(target, new)
    try:
        os.replace(old, target)
    except OSError as e:  # (something was made at target in between: leave both where they are, and say so)
        raise InputError(
            f"could not put the previous content of {target} back ({e}); it is at {old}: move it back by hand"
        ) from None
    return new


def private_folder(tmp: Path) -> int:
    """Make the new folder ``tmp`` readable by its owner alone while it is built (it sits beside
    the target under a hidden name); return the mode it was made with (the umask's)."""
    made = tmp.stat().st_mode & 0o7777
    _chmod(tmp, 0o700 | (made & 0o7000))  # (a setgid folder's group still reaches what is made in it)
    return made


def _chmod(path: str | Path, mode: int) -> None:
    """``os.chmod``, where the file system takes it: some (a CIFS share, FAT) refuse any mode, and a
    save must not fail after its build for a permission it cannot set (logged, not raised)."""
    try:
        os.chmod(path, mode)
    except OSError as e:
        logger.debug("could not set the mode of %s (%s): left as the file system made it", path, e)


def carry_mode(tmp: Path, target: Path, made: int) -> None:
    """Before ``tmp`` replaces ``target``: the folder takes ``target``'s mode (``made``, the mode
    it was made with, where there is no target), and every entry inside loses the group and
    other permissions ``target`` withheld. Why: a rebuild of a folder the user had made private
    (``chmod 700``) came back world-readable (755, its files 644), as a new folder does."""
    old = target.stat().st_mode & 0o7777 if target.is_dir() else made
    withheld = ~old & 0o077
    for root, dirs, files in os.walk(tmp):
        for name in dirs + files:
            entry = os.path.join(root, name)
            if not os.path.islink(entry):
                _chmod(entry, os.stat(entry).st_mode & 0o7777 & ~withheld)
    _chmod(tmp, old)
