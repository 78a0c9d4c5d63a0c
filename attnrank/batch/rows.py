"""Batch rows: one row per query, from queries to retrieval, reranking and the run file.

Queries come from BEIR ``queries.jsonl``, ``id<TAB>text`` TSV (both through
:func:`attnrank.queries.load_queries`) or Parquet (columns ``id``/``_id``/``qid`` and ``text``/``query``).
A row carries the query's whole candidate list, so one rerank call sees all its candidates:

``qid``, ``query``, ``doc_ids`` (best first), ``scores`` (the row's current score per document),
and per-stage score lists ``stage_<name>`` (``bm25``, ``dense``, ``hybrid``, ``attention``, ``likelihood``, ``fused``;
NaN where a document has no score from that stage). Between retrieval and reranking a row also
carries ``titles`` and ``texts``; they are dropped before writing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..queries import load_queries
from ..records import id_problem, id_text
from ..rerank.fused import FUSED_STAGE, LIKELIHOOD
from ..types import RankedResults, ScoredDocument, is_blank

STAGES = ("bm25", "dense", "hybrid", "attention", LIKELIHOOD, FUSED_STAGE)
TEXT_COLUMNS = ("titles", "texts")


def read_queries(path: str | Path, *, run_ids: bool = False) -> dict[str, str]:
    """``{query id: text}`` from JSONL, TSV or Parquet; ids unique, texts non-empty (checked);
    ``run_ids``: a line or row whose id a TREC run cannot hold is refused, named by its line or row."""
    p = Path(path)
    if p.suffix.lower() != ".parquet":
        return load_queries(p, run_ids=run_ids)
    if not p.is_file():
        raise InputError(f"queries file {str(p)!r} does not exist; give JSONL, TSV or Parquet queries")
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except Exception as e:  # (pyarrow's ArrowInvalid, OSError, ...: not Parquet, or damaged)
        raise InputError(f"{p} is not a readable Parquet file ({e}); give JSONL, TSV or Parquet queries") from None
    idcs = [c for c in ("id", "_id", "qid") if c in table.column_names]
    textcs = [c for c in ("text", "query") if c in table.column_names]
    if not idcs or not textcs:
        raise InputError(
            f"{p}: Parquet queries need an id column (id, _id or qid) and a text column (text or query); "
            f"found {table.column_names}"
        )
    idc, textc = idcs[0], textcs[0]
    _check_agree(p, table, idcs, lambda v: None if v is None else id_text(v))
    _check_agree(p, table, textcs, lambda v: v.strip() if isinstance(v, str) else v)
    out: dict[str, str] = {}
    for row, (qid, text) in enumerate(zip(table.column(idc).to_pylist(), table.column(textc).to_pylist()), 1):
        text_id = None if qid is None else id_text(qid)
        if qid is not None and text_id is None:  # (as JSONL queries: a float column's 1.0 is "1", 1.5 is refused)
            raise InputError(f"{p}: row {row}: query {id_problem(qid)}")
        # None, blank, or NaN (how pandas writes a missing value in a float column): str() gave "None"/"nan"
        if text_id is None or not text_id.strip():
            raise InputError(f"{p}: row {row} has no query id (column {idc!r}, a missing value); every query needs one")
        qid = text_id.strip()  # (trimmed, as JSONL and TSV queries, qrels and runs read ids)
        if qid in out:
            raise InputError(f"{p}: row {row}: duplicate query id {qid!r}; query ids must be unique")
        if run_ids and any(c.isspace() for c in qid):  # (as load_queries names a JSONL or TSV line)
            raise InputError(
                f"{p}: row {row}: query id {qid!r} holds whitespace, which a TREC run cannot hold (one field "
                "per column); give ids without whitespace"
            )
        if text is not None and not isinstance(text, str):  # (a binary or list column: not an empty query)
            raise InputError(
                f"{p}: column {textc!r} holds {table.schema.field(textc).type} values, not strings; "
                "write the query texts as a string column"
            )
        if text is None or is_blank(text):
            raise InputError(f"{p}: row {row}: query {qid!r} is empty")
        out[qid] = text.strip()
    if not out:
        raise InputError(f"{p}: no queries found")
    return out


def _check_agree(p: Path, table: Any, columns: list[str], norm: Any) -> None:
    """Refuse a row where two of ``columns`` (say ``id`` and ``_id``) give different values (as
    ``norm`` reads them): one would be read and the other dropped without a word, as a JSON
    record with both ids is refused (:func:`attnrank.corpus.json_id`)."""
    if len(columns) < 2:
        return
    values = [table.column(c).to_pylist() for c in columns]
    for row, given in enumerate(zip(*values), 1):
        read = [norm(v) for v in given]
        if any(r != read[0] for r in read[1:]):
            shown = ", ".join(f"{c!r} {v!r}" for c, v in zip(columns, given))
            raise InputError(f"{p}: row {row}: the columns {shown} differ; keep one of them")


def results_to_row(res: RankedResults, *, with_text: bool) -> dict[str, Any]:
    """One query's results as a row (see the module docstring)."""
    row: dict[str, Any] = {"qid": res.query_id, "query": res.query, "doc_ids": res.ids, "scores": res.scores}
    for stage in STAGES:
        row[f"stage_{stage}"] = [float(d.stage_scores.get(stage, math.nan)) for d in res]
    if with_text:
        row["titles"] = [d.title for d in res]
        row["texts"] = [d.text for d in res]
    return row


def row_to_results(row: dict[str, Any], stage: str = "") -> RankedResults:
    """A row (with ``titles``/``texts``) back into :class:`RankedResults` for a reranker."""
    docs = []
    for i, did in enumerate(row["doc_ids"]):
        stages = {s: row[f"stage_{s}"][i] for s in STAGES if not math.isnan(row[f"stage_{s}"][i])}
        docs.append(ScoredDocument(did, float(row["scores"][i]), i + 1, row["texts"][i], row["titles"][i], stages))
    return RankedResults(row["query"], docs, row["qid"], stage=stage)
