"""Output files of the commands: checked before any work, and only replaced when attnrank wrote them.

A file that already exists at an output path is replaced only if it is empty or recognisably one
attnrank wrote (a TREC run whose every line carries an ``attnrank`` tag, the explain page, a heat
map with attnrank's PNG marker, a batch Parquet file); an output that is also one of the
command's inputs is refused, whoever wrote it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional

import typer

from ..files import check_file_target, has_png_mark, is_attnrank_run, refuse_replacing
from . import option_errors

EXPLAIN_HTML_START = b"<!doctype html><html><head><meta charset='utf-8'><title>attnrank explain</title>"


def check_output_path(path: Path, option: str = "--output") -> None:
    """Fail before any work if ``path`` cannot be a file: a folder, a special file, or a parent is a file."""
    with option_errors():
        check_file_target(path, option)


def check_not_input(path: Path, inputs: Mapping[str, Optional[Path]], option: str = "--output") -> None:
    """Refuse an output that is one of the inputs (by path or, when both exist, as the same file)."""
    for name, given in inputs.items():
        if given is not None and _same_file(path, Path(given)):
            raise typer.BadParameter(f"{option} {path} is also the {name} input; write to another file")


def check_replaceable(path: Path, ours: Callable[[Path], bool], what: str, option: str = "--output") -> None:
    """Refuse to replace an existing, non-empty ``path`` that ``ours`` does not recognise."""
    with option_errors():
        refuse_replacing(path, ours, what, option)


def check_run_output(path: Optional[Path], inputs: Mapping[str, Optional[Path]] | None = None) -> None:
    """``-o RUN``: a file path, none of the inputs, and new, empty or a run attnrank wrote."""
    if path is None:
        return
    check_output_path(path)
    check_not_input(path, inputs or {})
    check_replaceable(path, is_attnrank_run, "a TREC run")


def is_explain_page(path: Path) -> bool:
    return _starts_with(path, EXPLAIN_HTML_START)


def is_explain_png(path: Path) -> bool:
    """``explain.png`` as explain writes it: marked by attnrank. (Any matplotlib image beside
    attnrank's page was taken for one, a user's own plot saved there included.)"""
    return has_png_mark(path)


def _starts_with(path: Path, start: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(start)).lower() == start.lower()
    except OSError:
        return False


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()
