"""Corpora of records: JSON Lines (``id``/``_id``, ``text``, optional ``title``; the names other tools
give them too: :data:`ID_NAMES`, :data:`TEXT_NAMES`) and CSV/TSV with a header."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..records import (
    GZIP_ERRORS,
    QUOTED_FIX,
    field_text,
    gzip_problem,
    id_problem,
    id_text,
    json_id,
    quoted_field,
    text_lines,
    tsv_fields,
    tsv_lines,
)
from ..types import Document
from .report import LoadReport, Problems, add_document, finish, open_text


def read_jsonl_corpus(path: Path, *, skip_invalid: bool = False) -> tuple[list[Document], LoadReport]:
    """A JSON Lines corpus (``.gz`` too): one object a line, its other keys the document's metadata."""
    report = LoadReport(str(path))
    problem, docs = Problems(report, skip_invalid), dict[str, Document]()
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
        id_key = next((k for k in ("_id", "id") if obj.get(k) is not None), None)
        if did is None and not clash:  # (MS MARCO's "docid", others' "doc_id")
            id_key, clash = _one_name([k for k, v in obj.items() if v is not None], ID_NAMES, "the document id")
            did = None if id_key is None else obj[id_key]
        text_key, text_clash = _one_name(obj, TEXT_NAMES, "the text")
        if clash or text_clash:
            problem(where, clash or text_clash or "")
            continue
        if did is None or text_key is None:
            problem(
                where, f"missing an id ({_names(ID_NAMES)}) or a text ({_names(TEXT_NAMES)}) (keys: {sorted(obj)[:6]})"
            )
            continue
        raw = {"id": did, "text": obj[text_key], "title": obj.get("title")}
        fields = {k: (id_text if k == "id" else field_text)(v) for k, v in raw.items()}
        bad = next((k for k, v in fields.items() if v is None), None)
        if bad is not None:
            kind = type(raw[bad]).__name__
            problem(where, id_problem(raw[bad]) if bad == "id" else f"{bad!r} is a JSON {kind}, not a string or number")
            continue
        meta = {k: v for k, v in obj.items() if k not in ("_id", "id", id_key, text_key, "title")}
        nested = meta.get("metadata")
        if isinstance(nested, dict):  # (an index's own docs.jsonl, and others', keep it under "metadata")
            del meta["metadata"]
            both = next((k for k in nested if k in meta and meta[k] != nested[k]), None)
            if both is not None:
                problem(where, f"{both!r} is given beside 'metadata' and inside it, otherwise; keep one of them")
                continue
            meta.update(nested)
        # ids are trimmed, as in CSV and as TREC qrels and runs (split at whitespace) read them
        doc = Document((fields["id"] or "").strip(), fields["text"] or "", fields["title"] or "", meta)
        add_document(docs, doc, where, problem)
    return finish(docs, report)


# The names other tools give a record's id and text (Pyserini's JsonCollection writes "contents",
# MS MARCO's documents "docid"): read as attnrank's own "id" and "text" where those are absent.
ID_NAMES = ("id", "_id", "doc_id", "docid")
TEXT_NAMES = ("text", "contents", "body", "passage")


def _names(names: Sequence[str]) -> str:
    return ", ".join(map(repr, names[:-1])) + f" or {names[-1]!r}"


def _one_name(keys: Any, names: Sequence[str], what: str) -> tuple[str | None, str | None]:
    """The first of ``names`` among ``keys`` (a record's keys, a header's lower-case names), and a
    problem where two of them name ``what`` otherwise than the first (``text`` beside another
    is the text, the other metadata, as before these names were read)."""
    present = [n for n in names if n in keys]
    if len(present) > 1 and present[0] != names[0]:
        return None, f"{' and '.join(map(repr, present))} both name {what}; keep one of them, or name it {names[0]!r}"
    return (present[0] if present else None), None


def read_csv_corpus(path: Path, *, skip_invalid: bool = False) -> tuple[list[Document], LoadReport]:
    """A CSV (RFC 4180 quoting) or TSV (no quoting: one record a line, fields without tabs) corpus."""
    report = LoadReport(str(path))
    problem, docs = Problems(report, skip_invalid), dict[str, Document]()
    tsv = path.name.lower().endswith((".tsv", ".tsv.gz"))
    line = 1  # the line the next record starts on
    try:
        with contextlib.nullcontext(None) if tsv else open_text(path) as f:
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
    return finish(docs, report)


_FIELD_LIMIT = 1 << 30  # documents can be far longer than the csv module's default 128 KiB field limit


class _TsvReader:
    """``csv.DictReader``'s rows of a TSV corpus (no quoting: one record a line), its lines split
    at newlines only (:func:`tsv_lines`), as :func:`~attnrank.queries.load_queries` reads TSV: the csv module also
    ends a record at a lone carriage return, which cut a text there (the rest taken for a record of
    its own)."""

    def __init__(self, path: Path, problem: Problems):
        self.path, self.problem = path, problem
        self._lines = tsv_lines(path)
        self.line_num: int = 0
        self.fieldnames: list[str] | None = None
        for number, first in self._lines:
            self.line_num, self.fieldnames = number, tsv_fields(first)
            break

    def __iter__(self) -> Iterator[dict]:
        names = self.fieldnames or []
        held: tuple[int, list[str]] | None = None  # a record whose last field opens a CSV quote on its line
        spanning = False  # inside such a field, its lines skipped
        for number, line in self._lines:
            fields = tsv_fields(line)
            if not "".join(fields).strip():  # a blank line, or one of tabs and spaces (as query files skip them)
                continue
            if spanning:
                spanning = not _closes_quote(fields)
                continue
            if held is not None:
                start, opened = held
                held = None
                if len(fields) < len(names):  # its text goes on here: a CSV writer's quoted line break
                    self.problem(
                        f"{self.path}:{start}",
                        f"the field {opened[-1].strip()[:40]!r} opens a quote that line {number} goes on with: a "
                        "field with a line break written with CSV quoting, and a TSV is read a record a line",
                        "save the file as .csv, whose quoting holds line breaks, or write the texts without them",
                    )
                    spanning = not _closes_quote(fields)
                    continue
                yield from self._row(start, opened, names)
            if _opens_quote(fields):
                held = (number, fields)
                continue
            yield from self._row(number, fields, names)
        if held is not None:
            yield from self._row(*held, names)

    def _row(self, number: int, fields: list[str], names: list[str]) -> Iterator[dict]:
        self.line_num = number
        quoted = quoted_field(fields)
        if quoted:  # (a bad record as any other: skipped with --skip-invalid)
            self.problem(f"{self.path}:{number}", quoted, QUOTED_FIX)
            return
        row: dict = dict(zip(names, fields))
        if len(fields) > len(names):
            row[None] = fields[len(names) :]
        row.update({name: None for name in names[len(fields) :]})
        yield row


def _opens_quote(fields: list[str]) -> bool:
    """Whether a TSV line's last field opens a CSV quote it does not close (an odd number of quotes,
    the first leading: inside CSV quotes a quote is doubled)."""
    last = fields[-1].lstrip() if fields else ""
    return last.startswith('"') and last.count('"') % 2 == 1


def _closes_quote(fields: list[str]) -> bool:
    """Whether a line within a field that a CSV quote opened closes it (its first field, the rest
    of that field, holds an odd number of quotes)."""
    return bool(fields) and fields[0].count('"') % 2 == 1


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
    # (names cut short: a passage taken for a header printed 1,500 characters)
    shown = [f if len(f) <= 40 else f[:37] + "..." for f in fieldnames][:8]
    ids = [cols[k] for k in ID_NAMES if k in cols]
    if len(ids) > 1:  # (JSON refuses an _id that differs from id; here the second went to metadata)
        raise InputError(
            f"{path}:1: header {shown} names the document id twice ({', '.join(map(repr, ids))}); "
            "keep one id column, or rename the other"
        )
    text, clash = _one_name(cols, TEXT_NAMES, "the text")
    if clash:
        raise InputError(f"{path}:1: header {shown}: {clash}")
    id_col = ids[0] if ids else None
    if id_col is None or text is None:
        headerless = len(fieldnames) == 2 and " " not in fieldnames[0].strip()
        raise InputError(
            f"{path}:1: header {shown} lacks an id column ({_names(ID_NAMES)}) and a text column "
            f"({_names(TEXT_NAMES)}); the first row must name them (title is optional)"
            + (
                "; a file without a header (MS MARCO's collection.tsv: id, text) needs one added first"
                if headerless
                else ""
            )
            + (
                f"; its one column {fieldnames[0][:40]!r} holds a ';': save it with ',' separators"
                if len(fieldnames) == 1 and ";" in fieldnames[0]
                else ""
            )
        )
    return {**cols, "id": id_col, "text": cols[text]}


def _add_row(
    docs: dict[str, Document], row: dict, cols: dict[str, str], where: str, problem: Problems, tsv: bool
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
    add_document(docs, doc, where, problem)
