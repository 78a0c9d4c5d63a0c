"""Files written atomically: a reader sees the old file or the new one, never a half-written one."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path, *, fsync: bool = True) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write (``.NAME.tmp-PID-HEX``); once the block ends
    without an error it is fsynced (``fsync``) and renamed over ``path``, else removed. Creates
    the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
