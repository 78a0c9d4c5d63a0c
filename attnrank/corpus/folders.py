"""Corpora of text files: a folder of ``.txt``/``.md``/``.markdown`` files, the relative path each one's id."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..errors import InputError
from ..files import is_index_folder
from ..markdown import markdown_title
from ..records import (
    recoding_hint,
)
from ..types import Document, encodable
from .report import LoadReport, Problems, add_document, finish

logger = logging.getLogger("attnrank.corpus")  # (the corpus loader's own, as before the split)

_RECORD_FILES = (
    ".jsonl",
    ".jsonl.gz",
    ".ndjson",
    ".csv",
    ".tsv",
    ".csv.gz",
    ".tsv.gz",
)  # (not .json: a config beside notes)


TEXT_SUFFIXES = (".txt", ".md", ".markdown")
_MARKDOWN = (".md", ".markdown")
_JSON_LINES = (".jsonl", ".jsonl.gz", ".ndjson")


def _files(path: Path) -> list[Path]:
    """Every file name under ``path``, in linked folders too (``rglob`` does not enter them: a
    corpus of linked folders lost their documents), each real folder walked once (no loops); hidden
    files and folders (a name starting with ".") left out: Jupyter's checkpoints and an editor's
    trash hold copies, which became documents of their own. A folder reached both by its own path
    and through a link is read at its own path, so that its documents' ids do not depend on the
    order the file system lists folders in (they did: ``alias/x.txt`` here, ``real/x.txt`` on a copy).
    An attnrank index folder inside is left out too (``attnrank index . --index notes`` writes
    ``./indexes/notes``): its ``docs.jsonl`` made the folder no corpus, so it could not be indexed again."""
    skipped: set[str] = set()
    indexes: dict[str, bool] = {}  # (both walks meet every folder: its manifest read once)

    def visible(root: str, dirs: list[str]) -> list[str]:  # (hidden: .ipynb_checkpoints, .trash, .git copies)
        out = []
        for d in sorted(dirs):
            if d.startswith("."):
                continue
            folder = os.path.join(root, d)
            if folder not in indexes:
                indexes[folder] = is_index_folder(folder)
            if indexes[folder]:
                skipped.add(folder)
                continue
            out.append(d)
        return out

    direct = set()  # the folders under path reached without a link
    for root, dirs, _ in os.walk(path):
        dirs[:] = visible(root, dirs)
        direct.add(os.path.realpath(root))
    seen: set[str] = set()
    found = []
    for root, dirs, names in os.walk(path, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = [
            d for d in visible(root, dirs) if not (os.path.islink(os.path.join(root, d)) and _real(root, d) in direct)
        ]
        found += [Path(root) / n for n in names if not n.startswith(".")]
    for folder in sorted(skipped):
        logger.info("%s: left out %s, an attnrank index, not part of the corpus", path, folder)
    return sorted(found)


def _real(root: str, name: str) -> str:
    return os.path.realpath(os.path.join(root, name))


def read_text_dir(path: Path, *, skip_invalid: bool = False) -> tuple[list[Document], LoadReport]:
    """Every text file under the folder ``path`` as a document whose id is its relative path."""
    files = _files(path)
    # record files beside the text (a README beside part-0.jsonl, part-1.jsonl: the corpus), and JSON Lines
    # below it (notes.md beside beir/scifact/corpus.jsonl, or data/part-0.jsonl: only the notes were
    # indexed); a CSV or TSV in a subfolder, more often a table the notes carry, is named in the warning
    records = [
        str(f.relative_to(path))
        for f in files
        if f.name.lower().endswith(_RECORD_FILES) and (f.parent == path or f.name.lower().endswith(_JSON_LINES))
    ]
    if records:
        raise InputError(
            f"{path} holds record files ({', '.join(records[:3])}) but no corpus.jsonl of its own, so it is no "
            "BEIR folder; give one of the files or folders to load, or a folder of .txt/.md files only"
        )
    texts = [f for f in files if f.suffix.lower() in TEXT_SUFFIXES and f.is_file()]
    kept = set(texts)
    broken = [str(f.relative_to(path)) for f in files if not f.exists()]
    others = [str(f.relative_to(path)) for f in files if f.exists() and f not in kept]
    if others:  # (said, not silent: a folder's .rst, .html or PDF files are no documents)
        logger.warning(
            "%s: left out %d file(s) that are not .txt/.md/.markdown files (e.g. %s); convert them to text "
            "or JSONL to index them",
            path,
            len(others),
            ", ".join(others[:3]),
        )
    if broken:
        logger.warning("%s: left out %d link(s) that lead nowhere (e.g. %s)", path, len(broken), ", ".join(broken[:3]))
    report = LoadReport(str(path))
    problem, docs = Problems(report, skip_invalid), dict[str, Document]()
    for f in texts:
        if not encodable(str(f.relative_to(path))):  # (a Latin-1 name: named as such, not as the text's surrogate)
            problem(f"{path}", f"the file name {str(f.relative_to(path))!r} is not valid UTF-8", "rename the file")
            continue
        add_text_file(docs, f, str(f.relative_to(path)), problem)
    return finish(docs, report)


def add_text_file(docs: dict[str, Document], f: Path, doc_id: str, problem: Problems) -> None:
    """The text file ``f`` as the document ``doc_id`` (UTF-8, a leading byte-order mark left out; a
    Markdown file's front matter and first heading are its title), or its problem."""
    raw = f.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        problem(f"{f}", f"bytes that are not valid UTF-8 at byte {e.start}", recoding_hint(raw))
        return
    if "\x00" in text:  # (UTF-16 without a byte-order mark decodes as UTF-8: indexed as "G l a c i e r s")
        problem(f"{f}", "NUL bytes in the text", recoding_hint(raw, decoded=True))
        return
    title, text = markdown_title(text) if f.suffix.lower() in _MARKDOWN else ("", text)
    add_document(docs, Document(doc_id, text.strip(), title), str(f), problem)
