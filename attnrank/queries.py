"""Load and validate query sets: BEIR ``queries.jsonl`` (``_id``, ``text``) or a TSV of
``id<TAB>text``, read line by line as :mod:`attnrank.corpus` reads corpora (every problem named
with its file and line)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .errors import InputError
from .records import check_unquoted, id_problem, id_text, json_id, text_lines, tsv_lines
from .types import encodable, is_blank

logger = logging.getLogger(__name__)


def load_queries(path: str | Path, *, run_ids: bool = False) -> dict[str, str]:
    """Read queries from BEIR ``queries.jsonl`` (``_id``, ``text``) or TSV ``id<TAB>text``.

    ``run_ids``: the queries' results go into a TREC run, whose lines cannot hold an id with
    whitespace in it: such an id is refused at its line (a BEIR id may hold a space)."""
    if not isinstance(path, (str, os.PathLike)):  # (a dict of queries failed as a bare TypeError)
        raise InputError(f"load_queries takes a file's path, not a {type(path).__name__}; pass the queries file")
    p = Path(path)
    if p.is_dir():
        p = p / "queries.jsonl"
    if not p.exists():
        raise InputError(f"queries file {str(p)!r} does not exist; give a BEIR queries.jsonl or a TSV of id<TAB>text")
    queries: dict[str, str] = {}
    is_jsonl = p.name.lower().endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson"))  # as load_corpus reads them
    for lineno, line in text_lines(p) if is_jsonl else tsv_lines(p):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        if is_jsonl:
            qid, text = _query_record(line, where)
        else:
            parts = line.rstrip("\r\n").split("\t")
            while len(parts) > 2 and not parts[-1].strip():  # trailing tabs add nothing
                parts.pop()
            if len(parts) != 2:  # a third column was searched as part of the query
                raise InputError(
                    f"{where}: {len(parts)} tab-separated field(s), expected 'id<TAB>text' (a query "
                    f"cannot hold a tab); got {line.strip()[:60]!r}"
                )
            check_unquoted(parts, where)
            qid, text = parts[0].strip(), parts[1]  # (trimmed, as qrels and runs read ids)
            if not queries and _is_header(qid, text):  # a header line ("id<TAB>text") is not a query
                logger.info("%s: read as a header, not a query: %r", where, line.strip()[:80])
                continue
            if not qid:
                raise InputError(f"{where}: empty query id before the tab; give every query an id")
        if qid in queries:
            raise InputError(f"{where}: duplicate query id {qid!r}; query ids must be unique")
        if run_ids and any(c.isspace() for c in qid):
            raise InputError(
                f"{where}: query id {qid!r} holds whitespace, which a TREC run cannot hold (one field per "
                "column); give ids without whitespace"
            )
        if is_blank(text):
            raise InputError(f"{where}: query {qid!r} is empty")
        if not encodable(qid, text):
            raise InputError(
                f"{where}: query {qid!r} holds a lone surrogate (a \\ud800-style JSON escape); fix or "
                "re-encode it as UTF-8"
            )
        queries[qid] = text.strip()
    if not queries:
        raise InputError(f"{p}: no queries found")
    return queries


_ID_HEADERS = {
    "id",
    "_id",
    "qid",
    "query-id",
    "query_id",
    "queryid",
    "topic",
    "topic-id",
    "topic_id",
    "topicid",
    "number",
}
_TEXT_HEADERS = {"text", "query", "query-text", "query_text", "title", "question", "description"}


def _is_header(qid: str, text: str) -> bool:
    """Whether the first line of a queries TSV names its columns (``id<TAB>text``, or
    ``qid<TAB>question`` and the like: an id column's name before any second name; a header
    whose second column was not in a fixed list was searched as a query named "id")."""
    return qid.lower() in _ID_HEADERS and (text.strip().lower() in _TEXT_HEADERS or " " not in text.strip())


def _query_record(line: str, where: str) -> tuple[str, str]:
    """``(id, text)`` of a queries.jsonl line; a missing id or a text that is not a string is an error."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        obj = None
    given, clash = json_id(obj) if isinstance(obj, dict) else (None, None)
    if clash:
        raise InputError(f"{where}: {clash}")
    qid = id_text(given) if given is not None else None
    if given is not None and qid is None:
        raise InputError(f"{where}: query {id_problem(given)}")
    qid = None if qid is None else qid.strip()  # (trimmed, as qrels and runs read ids)
    text = obj.get("text") if isinstance(obj, dict) else None
    if not qid or not isinstance(text, str):
        raise InputError(f"{where}: expected a JSON object with '_id' (or 'id') and a string 'text'")
    return qid, text
