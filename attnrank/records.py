"""How attnrank reads users' text files and the values in them: numbered lines (strict UTF-8,
a leading byte-order mark dropped, ``.gz`` decompressed, each error naming file and line), TSV
lines and fields (no quoting), and the JSON values that become ids and texts. Corpora
(:mod:`attnrank.corpus`) and query sets (:mod:`attnrank.queries`) read their files through these."""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import InputError

# What reading a damaged or mislabelled .gz raises (a truncated download: EOFError, which the CLI
# showed as a bare "Aborted!")
GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def gzip_problem(path: Path, e: Exception) -> InputError:
    """The one-line error for a ``.gz`` file that cannot be read to its end."""
    return InputError(
        f"{path}: not a complete gzip file ({type(e).__name__}: {e}); download it again, or drop the .gz suffix "
        "of a file that is not compressed"
    )


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of a UTF-8 text file (``.gz``: decompressed), each decoded on its own, so
    that an error names its line, and without a leading byte-order mark."""
    try:
        with gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                try:
                    # a byte-order mark is no part of a line's first id: the first line's, and one starting a later
                    # line, where files that each begin with one were joined (cat a.tsv b.tsv): "\ufeffq5" matched
                    # no qrels, and strip() keeps it
                    yield lineno, raw.decode("utf-8").removeprefix("\ufeff")
                except UnicodeDecodeError as e:
                    raise InputError(
                        f"{path}:{lineno}: bytes that are not valid UTF-8 ({e.reason} at column {e.start}); "
                        f"{recoding_hint(raw)}"
                    ) from None
    except GZIP_ERRORS as e:
        raise gzip_problem(path, e) from None


def recoding_hint(start: bytes, *, decoded: bool = False) -> str:
    """What to do with bytes that are not UTF-8 (or, ``decoded``, that are but hold NUL bytes),
    by how ``start`` (a file's first bytes) begins: gzip data, UTF-16 (a byte-order mark, or NUL
    bytes of the first 200 nearly all at even or all at odd offsets, as the high bytes of ASCII
    characters fall), stray NUL bytes in UTF-8 text, else re-encoding from a legacy code page.
    Why: the one hint (iconv -f latin1) led a gzip or UTF-16 file into invalid JSON, a dead end."""
    if start.startswith(b"\x1f\x8b"):
        return "it is gzip data: name it with .gz, or gunzip it"
    if start.startswith((b"\xff\xfe", b"\xfe\xff")) or _utf16_like(start[:200]):
        return "it is UTF-16: re-encode it as UTF-8 (e.g. iconv -f utf-16 -t utf-8)"
    if decoded:
        return "remove its NUL bytes (e.g. tr -d '\\000')"
    # (cp1252, not latin1: Windows' dashes and curly quotes are C1 control characters in latin1)
    return "re-encode the file as UTF-8 (e.g. iconv -f cp1252 -t utf-8, for a file written on Windows)"


def _utf16_like(head: bytes) -> bool:
    """At least 4 NUL bytes, 90 % of them at offsets of one parity (UTF-16 without a byte-order
    mark: Russian text in it holds NULs only after its spaces and punctuation, 12 % of its bytes)."""
    at = [i for i, b in enumerate(head) if b == 0]
    odd = sum(i % 2 for i in at)
    return len(at) >= 4 and max(odd, len(at) - odd) >= 0.9 * len(at)


def field_text(value: object) -> str | None:
    """A JSON id, text or title as a string: strings and numbers as written, null and NaN (how
    pandas and json.dumps write a missing value) as ''; None for lists, objects, booleans and
    infinities, which have no faithful text form."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and math.isinf(value):
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def id_text(value: object) -> str | None:
    """A JSON id as a string: as :func:`field_text`, except that a float is written as an integer when
    it is one exactly (pandas writes an id column with a gap as 1.0, 2.0, ...) and refused (None)
    otherwise (JSON's 1.10 reads as 1.1, 1e16 as a float that may not be the id written, so the id
    would match no qrels that spell it as written): see :func:`id_problem`."""
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else None
    return field_text(value)


def id_problem(value: object) -> str:
    """Why :func:`id_text` refuses ``value``, and the fix, in words."""
    if isinstance(value, float) and math.isfinite(value):
        what = "has a fraction" if not value.is_integer() else "is too large to be exact as a float"
        return f"id {value!r} is a JSON number that {what}; write the id as a string"
    return f"id {value!r} is a JSON {type(value).__name__}, not a string or number; write the id as a string"


def tsv_lines(path: Path) -> Iterator[tuple[int, str]]:
    """:func:`text_lines` of a TSV file, and of one with old Mac line endings (lone carriage returns
    only: read as one "line") its lines split at those. A file with line feeds is read by them,
    a carriage return inside one of its lines kept as text (it was taken for old Mac endings, and the
    whole file split at carriage returns only: its lines glued together, an id renamed)."""
    lines = text_lines(path)
    for number, first in lines:
        second = next(lines, None)
        # (one line: lone carriage returns inside it are old Mac line ends, unless a line feed alone
        # ends it, which makes them text; a last line ended by CR LF is an old Mac file's too)
        mac = not first.endswith("\n") or first.endswith("\r\n")
        if second is None and mac and "\r" in first.removesuffix("\n").removesuffix("\r"):
            yield from enumerate(first.split("\r"), start=1)
            return
        yield number, first
        if second is not None:
            yield second
            yield from lines
        return


def tsv_fields(line: str) -> list[str]:
    return line.removesuffix("\n").removesuffix("\r").split("\t")


QUOTED_FIX = "write it without (csv quoting=csv.QUOTE_NONE, pandas to_csv(quoting=3)) or save it as .csv"


def quoted_field(fields: Sequence[str]) -> str | None:
    """Why a TSV line's fields are refused where one was written with CSV quoting (a csv writer with
    a tab delimiter, and pandas, wrap a field that holds a quote in quotes and double the quotes
    inside it): TSV is read without quoting, so the text would be read with its quotes doubled and
    wrapped, silently. None where no field looks quoted; the fix is :data:`QUOTED_FIX`."""
    for value in fields:
        f = value.strip()
        if len(f) >= 2 and f[0] == f[-1] == '"' and '""' in f[1:-1]:
            return f"the field {f[:40]!r} looks quoted as CSV; a TSV is read without quoting"
    return None


def check_unquoted(fields: Sequence[str], where: str) -> None:
    """Refuse a TSV line with a field written with CSV quoting (:func:`quoted_field`)."""
    reason = quoted_field(fields)
    if reason:
        raise InputError(f"{where}: {reason}, so {QUOTED_FIX}")


def json_id(obj: dict) -> tuple[Any, str | None]:
    """A JSON record's id (``_id`` or ``id``, whichever is not null) and a problem where both are
    given and differ (one of them would have been dropped without a word)."""
    given = {k: obj[k] for k in ("_id", "id") if obj.get(k) is not None}
    if len(given) == 2 and id_text(given["_id"]) != id_text(given["id"]):
        return None, f"'_id' {given['_id']!r} and 'id' {given['id']!r} differ; keep one of them"
    return next(iter(given.values()), None), None
