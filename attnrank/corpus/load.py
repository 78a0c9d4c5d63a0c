"""Which reader a corpus path goes to (:func:`load_corpus`)."""

from __future__ import annotations

import shlex
from pathlib import Path

from ..errors import InputError
from ..types import Document
from .folders import TEXT_SUFFIXES, add_text_file, read_text_dir
from .report import LoadReport, Problems, finish
from .tables import read_csv_corpus, read_jsonl_corpus

_BEIR_CORPUS = ("corpus.jsonl", "corpus.jsonl.gz")


def _beir_corpus_file(path: Path) -> Path | None:
    """The folder's BEIR corpus file, if any; one that is a link leading nowhere is named (the folder
    was read as text files, which called it a record file and the folder one with no corpus.jsonl)."""
    for name in _BEIR_CORPUS:
        if (path / name).exists():
            return path / name
    for name in _BEIR_CORPUS:  # (only where no other corpus file is there: a .gz beside it is read)
        if (path / name).is_symlink():
            raise InputError(
                f"{path / name} is a symbolic link that leads nowhere (broken, or a loop); give the real file"
            )
    return None


def load_corpus(path: str | Path, *, skip_invalid: bool = False) -> tuple[list[Document], LoadReport]:
    """Load a corpus from a BEIR folder, JSONL, CSV/TSV, or a directory of .txt/.md files."""
    p = Path(path)
    if not p.exists():
        if p.is_symlink():
            raise InputError(
                f"corpus path {str(p)!r} is a symbolic link that leads nowhere (broken, or a loop); "
                "give the real file or folder"
            )
        raise InputError(
            f"corpus path {str(p)!r} does not exist; give a BEIR folder, .jsonl, .csv/.tsv, or a folder of .txt/.md"
        )
    if p.is_dir():
        beir = _beir_corpus_file(p)
        return (
            read_jsonl_corpus(beir, skip_invalid=skip_invalid) if beir else read_text_dir(p, skip_invalid=skip_invalid)
        )
    name = p.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson")):
        _refuse_json_array(p)
        return read_jsonl_corpus(p, skip_invalid=skip_invalid)
    if name.endswith((".csv", ".tsv", ".csv.gz", ".tsv.gz")):
        return read_csv_corpus(p, skip_invalid=skip_invalid)
    if name.endswith(TEXT_SUFFIXES):
        return _single_text(p)
    raise InputError(
        f"{p}: unknown corpus format {p.suffix!r}; use .jsonl, .csv, .tsv, a BEIR folder or a folder of .txt/.md"
    )


def _refuse_json_array(p: Path) -> None:
    """A .json corpus that is one JSON array, not JSON Lines: refused whole (read line by line,
    with skip_invalid only the lines that parse alone would be kept)."""
    if p.name.lower().endswith(".gz"):
        return
    with open(p, "rb") as f:
        head = f.read(4096).decode("utf-8-sig", errors="replace").lstrip()
    if head.startswith("["):
        # (to a new name: "> {stem}.jsonl" of a .jsonl input was the input, which the shell empties before jq reads it)
        target = f"{p.stem}.lines.jsonl"
        raise InputError(
            f"{p} is one JSON array; a corpus is JSON Lines (one object per line): convert it to a new file, e.g. "
            f"jq -c '.[]' {shlex.quote(p.name)} > {shlex.quote(target)}"
        )


def _single_text(p: Path) -> tuple[list[Document], LoadReport]:
    docs, report = dict[str, Document](), LoadReport(str(p))
    add_text_file(docs, p, p.name, Problems(report, False))  # (read as a folder's file is)
    return finish(docs, report)
