"""What a corpus load kept and skipped, and the checks every document passes on its way in."""

from __future__ import annotations

import gzip
import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..types import Document, encodable, is_blank, metadata_json

logger = logging.getLogger("attnrank.corpus")  # (the corpus loader's own, as before the split)


@dataclass
class LoadReport:
    """What a load kept and what it skipped (``(location, reason)`` pairs)."""

    source: str
    loaded: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)


class Problems:
    """Raise on the first problem, or collect them all when skipping is allowed."""

    def __init__(self, report: LoadReport, skip: bool):
        self.report, self.skip = report, skip

    def __call__(self, where: str, reason: str, fix: str = "") -> None:
        if not self.skip:
            hint = f"; {fix}" if fix else "; pass skip_invalid=True (CLI: --skip-invalid) to skip such records"
            raise InputError(f"{where}: {reason}{hint}")
        self.report.skipped.append((where, reason))


def open_text(path: Path) -> io.TextIOBase:
    """``path`` (gzip-compressed where it ends in ``.gz``) as strict UTF-8 text, its byte-order mark left out."""
    raw = gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")  # noqa: SIM115 - the wrapper owns and closes it
    # strict decoding: undecodable bytes must be reported, not silently replaced; "utf-8-sig"
    # drops the byte-order mark editors (Excel, Notepad) put first, which would else stick to
    # the first column's name
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="strict", newline="")


def add_document(docs: dict[str, Document], doc: Document, where: str, problem: Problems) -> None:
    """``doc`` into ``docs`` under its id, or its problem (read at ``where``): an empty or repeated
    id, neither text nor title, or a lone surrogate."""
    if not doc.id:
        problem(where, "empty document id")
    elif doc.id in docs:
        problem(where, f"duplicate document id {doc.id!r}", "document ids must be unique")
    elif is_blank(doc.text) and is_blank(doc.title):  # (U+200B alone: indexed, then refused by every reranker)
        problem(where, f"document {doc.id!r} has empty text")
    elif not encodable(
        doc.id, doc.title, doc.text, json.dumps(doc.metadata, ensure_ascii=False, default=metadata_json)
    ):
        # (else found after the BM25 build, by the embedder, or by the index save for metadata)
        problem(
            where,
            f"document {doc.id!r} holds a lone surrogate (a \\ud800-style JSON escape)",
            "fix or re-encode it as UTF-8",
        )
    else:
        docs[doc.id] = doc


def finish(docs: dict[str, Document], report: LoadReport) -> tuple[list[Document], LoadReport]:
    """The documents kept, in order, and ``report`` with their count; no document at all is refused."""
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
