"""Load and validate corpora (query sets: :mod:`attnrank.queries`).

Formats (chosen by :func:`load_corpus` from the path):

- BEIR folder: ``corpus.jsonl[.gz]`` (``_id``, ``title``, ``text``), ``queries.jsonl``,
  ``qrels/<split>.tsv``.
- JSONL file (``.jsonl`` / ``.jsonl.gz``): one object a line with ``id`` or ``_id``, ``text``,
  optional ``title``; other keys go to ``metadata``.
- CSV/TSV file with a header that names ``id`` and ``text`` columns (``title`` optional); other
  columns go to ``metadata`` (as strings).
- A directory of ``.txt`` / ``.md`` / ``.markdown`` files (hidden ones left out; other files are
  named in a warning): the relative path is the id; a Markdown file whose first line is a heading
  (``# Title``) has it as the title, out of the text; YAML front matter (``---`` lines) is left
  out of the text, and its ``title:`` is the title. One such file given alone is one document,
  its name the id (a file of one passage a line is no corpus of passages: make it a .tsv or .jsonl).

Every problem is reported with file and line. With ``skip_invalid=True`` bad records are
skipped instead, and :class:`LoadReport` says which and why.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputError
from .files import is_index_folder
from .markdown import markdown_title
from .records import (
    GZIP_ERRORS,
    QUOTED_FIX,
    field_text,
    gzip_problem,
    id_problem,
    id_text,
    json_id,
    quoted_field,
    recoding_hint,
    text_lines,
    tsv_fields,
    tsv_lines,
)
from .types import Document, encodable, is_blank

logger = logging.getLogger(__name__)


@dataclass
class LoadReport:
    """What a load kept and what it skipped (``(location, reason)`` pairs)."""

    source: str
    loaded: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)


class _Problems:
    """Raise on the first problem, or collect them all when skipping is allowed."""

    def __init__(self, report: LoadReport, skip: bool):
        self.report, self.skip = report, skip

    def __call__(self, where: str, reason: str, fix: str = "") -> None:
        if not self.skip:
            hint = f"; {fix}" if fix else "; pass skip_invalid=True (CLI: --skip-invalid) to skip such records"
            raise InputError(f"{where}: {reason}{hint}")
        self.report.skipped.append((where, reason))


def _open_text(path: Path) -> io.TextIOBase:
    raw = gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")  # noqa: SIM115 - the wrapper owns and closes it
    # strict decoding: undecodable bytes must be reported, not silently replaced; "utf-8-sig"
    # drops the byte-order mark editors (Excel, Notepad) put first, which would else stick to
    # the first column's name
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="strict", newline="")


def _add(docs: dict[str, Document], doc: Document, where: str, problem: _Problems) -> None:
    if not doc.id:
        problem(where, "empty document id")
    elif doc.id in docs:
        problem(where, f"duplicate document id {doc.id!r}", "document ids must be unique")
    elif is_blank(doc.text) and is_blank(doc.title):  # (U+200B alone: indexed, then refused by every reranker)
        problem(where, f"document {doc.id!r} has empty text")
    elif not encodable(doc.id, doc.title, doc.text, json.dumps(doc.metadata, ensure_ascii=False, default=str)):
        # (else found after the BM25 build, by the embedder, or by the index save for metadata)
        problem(
            where,
            f"document {doc.id!r} holds a lone surrogate (a \\ud800-style JSON escape)",
            "fix or re-encode it as UTF-8",
        )
    else:
        docs[doc.id] = doc


def read_jsonl_corpus(path: Path, *, skip_invalid: bool = False) -> tuple[list[Document], LoadReport]:
    report = LoadReport(str(path))
    problem, docs = _Problems(report, skip_invalid), dict[str, Document]()
    for lineno, line in text_lines(path):
        where = f"{path}:{lineno}"
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problem(where, f"invalid JSON ({e.msg})")
            continue
        if not isinstance(obj, dict):
            problem(where, "expected a JSON object with 'id' and 'text'")
            continue
        did, clash = json_id(obj)
        if clash:
            problem(where, clash)
            continue
        if did is None or "text" not in obj:
            problem(where, f"missing 'id'/'_id' or 'text' (keys: {sorted(obj)[:6]})")
            continue
        raw = {"id": did, "text": obj["text"], "title": obj.get("title")}
        fields = {k: (id_text if k == "id" else field_text)(v) for k, v in raw.items()}
        bad = next((k for k, v in fields.items() if v is None), None)
        if bad is not None:
            kind = type(raw[bad]).__name__
            problem(where, id_problem(raw[bad]) if bad == "id" else f"{bad!r} is a JSON {kind}, not a string or number")
            continue
        meta = {k: v for k, v in obj.items() if k not in ("_id", "id", "text", "title")}
        # ids are trimmed, as in CSV and as TREC qrels and runs (split at whitespace) read them
        doc = Document((fields["id"] or "").strip(), fields["text"] or "", fields["title"] or "", meta)
        _add(docs, doc, where, problem)
    return _finish(docs, report)


def read_csv_corpus(path: Path, *, skip_invalid: bool = False) -> tuple[list[Document], LoadReport]:
    """A CSV (RFC 4180 quoting) or TSV (no quoting: one record a line, fields without tabs) corpus."""
    report = LoadReport(str(path))
    problem, docs = _Problems(report, skip_invalid), dict[str, Document]()
    tsv = path.name.lower().endswith((".tsv", ".tsv.gz"))
    line = 1  # the line the next record starts on
    try:
        with contextlib.nullcontext(None) if tsv else _open_text(path) as f:
            reader: Any = _TsvReader(path, problem) if f is None else _dict_reader(f)
            cols = _csv_columns(path, reader.fieldnames)
            line = reader.line_num + 1
            for row in reader:  # (a TSV record is its one line; a CSV one may span several)
                where, line = f"{path}:{reader.line_num if tsv else line}", reader.line_num + 1
                _add_row(docs, row, cols, where, problem, tsv)
    except UnicodeDecodeError as e:
        for _ in text_lines(path):  # (raises naming the line and column: the reader decodes ahead of its records)
            pass
        raise InputError(f"{path}: bytes that are not valid UTF-8 ({e.reason}); re-encode the file as UTF-8") from None
    except GZIP_ERRORS as e:
        raise gzip_problem(path, e) from None
    except csv.Error as e:
        raise InputError(
            f"{path}:{line}: broken CSV quoting ({e}); a field that starts with a quote must end with one "
            '(and double the quotes inside it: "say ""hi"""); fix the file'
        ) from None
    return _finish(docs, report)


_FIELD_LIMIT = 1 << 30  # documents can be far longer than the csv module's default 128 KiB field limit


class _TsvReader:
    """``csv.DictReader``'s rows of a TSV corpus (no quoting: one record a line), its lines split
    at newlines only (:func:`tsv_lines`), as :func:`~attnrank.queries.load_queries` reads TSV: the csv module also
    ends a record at a lone carriage return, which cut a text there (the rest taken for a record of
    its own)."""

    def __init__(self, path: Path, problem: _Problems):
        self.path, self.problem = path, problem
        self._lines = tsv_lines(path)
        self.line_num: int = 0
        self.fieldnames: list[str] | None = None
        for number, first in self._lines:
            self.line_num, self.fieldnames = number, tsv_fields(first)
            break

    def __iter__(self) -> Iterator[dict]:
        names = self.fieldnames or []
        for number, line in self._lines:
            self.line_num = number
            fields = tsv_fields(line)
            if not "".join(fields).strip():  # a blank line, or one of tabs and spaces (as query files skip them)
                continue
            quoted = quoted_field(fields)
            if quoted:  # (a bad record as any other: skipped with --skip-invalid)
                self.problem(f"{self.path}:{number}", quoted, QUOTED_FIX)
                continue
            row: dict = dict(zip(names, fields))
            if len(fields) > len(names):
                row[None] = fields[len(names) :]
            row.update({name: None for name in names[len(fields) :]})
            yield row


def _dict_reader(f: io.TextIOBase) -> csv.DictReader:
    """CSV quotes strictly (an unclosed quote is an error, not a record that swallows the rest of
    the file)."""
    csv.field_size_limit(max(csv.field_size_limit(), _FIELD_LIMIT))
    return csv.DictReader(f, delimiter=",", strict=True)


def _csv_columns(path: Path, fieldnames: Sequence[str] | None) -> dict[str, str]:
    """The header's columns by lower-case name, ``id`` under its spelling (``_id``, ``doc_id``...)."""
    if fieldnames is None:  # (an empty file: "header None lacks an 'id' and a 'text' column")
        raise InputError(f"{path} is empty; give a header line naming the id and text columns, and a row per document")
    cols = {c.lower().strip(): c for c in fieldnames or []}
    if len(cols) != len(fieldnames or []):
        raise InputError(f"{path}:1: header {fieldnames} names a column twice; give every column its own name")
    ids = [cols[k] for k in ("id", "_id", "doc_id", "docid") if k in cols]
    if len(ids) > 1:  # (JSON refuses an _id that differs from id; here the second went to metadata)
        raise InputError(
            f"{path}:1: header {fieldnames} names the document id twice ({', '.join(map(repr, ids))}); "
            "keep one id column, or rename the other"
        )
    id_col = ids[0] if ids else None
    if id_col is None or "text" not in cols:
        raise InputError(
            f"{path}:1: header {fieldnames} lacks an 'id' and a 'text' column; "
            "the first row must name them (title is optional)"
        )
    return {**cols, "id": id_col}


def _add_row(
    docs: dict[str, Document], row: dict, cols: dict[str, str], where: str, problem: _Problems, tsv: bool
) -> None:
    if None in row:  # more fields than the header names: a text would lose what follows its comma/tab
        n = len(row) - 1  # the header's fields (names are unique), besides the extras under None
        fix = "a TSV field cannot hold a tab" if tsv else 'quote a field that holds a comma ("like, this")'
        problem(
            where,
            f"{n + len(row[None])} fields, the header names {n}",
            f"{fix}; or pass skip_invalid=True (CLI: --skip-invalid) to skip such records",
        )
        return
    if row[cols["text"]] is None:  # fewer fields than the header: what is there sits in the wrong columns
        n = sum(v is not None for v in row.values())
        problem(
            where,
            f"{n} fields, the header names {len(row)}: no {cols['text']!r} field",
            "give every record the header's fields, an empty one as nothing between separators; "
            "or pass skip_invalid=True (CLI: --skip-invalid) to skip such records",
        )
        return
    title = row.get(cols["title"], "") if "title" in cols else ""
    named = {cols["id"], cols["text"], cols.get("title")}
    # other columns, as a JSONL record's other keys (as strings: a field a short row leaves out is "", not None)
    meta = {k: "" if v is None else v for k, v in row.items() if k not in named}
    doc = Document(str(row[cols["id"]] or "").strip(), row[cols["text"]] or "", title or "", meta)
    _add(docs, doc, where, problem)


_RECORD_FILES = (
    ".jsonl",
    ".jsonl.gz",
    ".ndjson",
    ".csv",
    ".tsv",
    ".csv.gz",
    ".tsv.gz",
)  # (not .json: a config beside notes)


_TEXT_SUFFIXES = (".txt", ".md", ".markdown")
_MARKDOWN = (".md", ".markdown")
_BEIR_CORPUS = ("corpus.jsonl", "corpus.jsonl.gz")
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
    texts = [f for f in files if f.suffix.lower() in _TEXT_SUFFIXES and f.is_file()]
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
    problem, docs = _Problems(report, skip_invalid), dict[str, Document]()
    for f in texts:
        if not encodable(str(f.relative_to(path))):  # (a Latin-1 name: named as such, not as the text's surrogate)
            problem(f"{path}", f"the file name {str(f.relative_to(path))!r} is not valid UTF-8", "rename the file")
            continue
        _add_text_file(docs, f, str(f.relative_to(path)), problem)
    return _finish(docs, report)


def _add_text_file(docs: dict[str, Document], f: Path, doc_id: str, problem: _Problems) -> None:
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
    _add(docs, Document(doc_id, text.strip(), title), str(f), problem)


def _finish(docs: dict[str, Document], report: LoadReport) -> tuple[list[Document], LoadReport]:
    report.loaded = len(docs)
    if report.skipped:
        # the report carries them (the CLI prints it); a warning here would say it twice
        logger.info("%s: skipped %d invalid record(s), e.g. %s", report.source, len(report.skipped), report.skipped[0])
    if not docs:
        why = ""
        if report.skipped:  # (--skip-invalid: the reason was in the report the error kept from being printed)
            where, reason = report.skipped[0]
            why = f"; all {len(report.skipped)} record(s) were skipped as invalid, the first at {where}: {reason}"
        raise InputError(f"{report.source}: no documents found (0 valid records){why}; check the path and format")
    return list(docs.values()), report


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
    if name.endswith(_TEXT_SUFFIXES):
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
        raise InputError(
            f"{p} is one JSON array; a corpus is JSON Lines (one object per line): convert it, e.g. "
            f"jq -c '.[]' {p.name} > {p.stem}.jsonl"
        )


def _single_text(p: Path) -> tuple[list[Document], LoadReport]:
    docs, report = dict[str, Document](), LoadReport(str(p))
    _add_text_file(docs, p, p.name, _Problems(report, False))  # (read as a folder's file is)
    return _finish(docs, report)
