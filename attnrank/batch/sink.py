"""Checkpointed output of a batch run: Parquet parts committed atomically, one row per query.

Rows are buffered and committed as ``part-NNNNN.parquet`` files (written to a temporary name,
fsynced, renamed to a number no part has), so a part is either whole or absent and never replaces
another. A rerun reads the committed query ids and skips them (resume), after checking that each
still has the text it was run with. A query id already committed is never written again, so a Ray
task retried after an actor died cannot duplicate rows; :meth:`finish` checks that every query has
exactly one row before writing the TREC run and/or one consolidated Parquet file.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import atomic_path

logger = logging.getLogger(__name__)

_PART = re.compile(r"^part-(\d+)\.parquet$")


class CheckpointSink:
    """Commit rows to ``parts_dir``; ``commit_rows`` rows or ``commit_seconds`` per part."""

    def __init__(self, parts_dir: str | Path, *, commit_rows: int = 64, commit_seconds: float = 30.0):
        self.dir = Path(parts_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(".part-*.parquet.tmp-*"):  # a part whose write was killed (atomic_path's name)
            stale.unlink()
        self.commit_rows, self.commit_seconds = commit_rows, commit_seconds
        self.done: dict[str, str] = self._committed()  # query id -> the query text it was run with
        self.buffer: list[dict[str, Any]] = []
        self.duplicates = 0
        numbers = [int(m[1]) for p in self._parts() if (m := _PART.match(p.name))]
        self._next = max(numbers, default=-1) + 1  # after the last part, even if one was removed
        self._last = time.monotonic()

    def _parts(self) -> list[Path]:
        return sorted(self.dir.glob("part-*.parquet"))

    def _committed(self) -> dict[str, str]:
        import pyarrow.parquet as pq

        done: dict[str, str] = {}
        for p in self._parts():
            t = pq.read_table(p, columns=["qid", "query"])
            done.update(zip(t.column("qid").to_pylist(), t.column("query").to_pylist()))
        return done

    def check_queries(self, queries: dict[str, str]) -> None:
        """Refuse to resume when a committed query id now has another text (its rows would be stale)."""
        for qid, text in queries.items():
            old = self.done.get(qid, text)
            if old != text:
                raise InputError(
                    f"checkpoint {self.dir} holds query {qid!r} as {old[:60]!r}, not {text[:60]!r}; "
                    "delete the checkpoint or give another --checkpoint"
                )

    def add(self, rows: list[dict[str, Any]]) -> int:
        """Buffer new rows (a query id seen before is dropped and counted); returns rows kept."""
        kept = 0
        buffered = {r["qid"] for r in self.buffer}
        for row in rows:
            if row["qid"] in self.done or row["qid"] in buffered:
                self.duplicates += 1
                continue
            self.buffer.append(row)
            buffered.add(row["qid"])
            kept += 1
        if len(self.buffer) >= self.commit_rows or time.monotonic() - self._last >= self.commit_seconds:
            self.commit()
        return kept

    def commit(self) -> None:
        """Write the buffered rows as one new part (atomic: temporary file, fsync, rename)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._last = time.monotonic()
        if not self.buffer:
            return
        with atomic_path(self.dir / f"part-{self._next:05d}.parquet") as tmp:
            pq.write_table(pa.Table.from_pylist(self.buffer), tmp)
        self.done.update((r["qid"], r["query"]) for r in self.buffer)
        self._next += 1
        self.buffer = []

    def read_all(self):
        """Every committed row as one ``pyarrow.Table``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [pq.read_table(p) for p in self._parts()]
        if not tables:
            return pa.table({"qid": pa.array([], pa.string())})
        return pa.concat_tables(tables, promote_options="default")  # a part of empty lists has null types

    def finish(self, qids: list[str], *, trec: Path | None, parquet: Path | None, tag: str) -> dict[str, Any]:
        """Commit, check one row per query, write the outputs (in ``qids`` order); returns counts."""
        from ..eval import write_run

        self.commit()
        table = self.read_all()
        rows = {r["qid"]: r for r in table.to_pylist()}
        missing = [q for q in qids if q not in rows]
        if missing or len(rows) != table.num_rows:
            raise InputError(
                f"{len(missing)} queries have no row and {table.num_rows - len(rows)} have two in {self.dir} "
                "(a stage failed); rerun the same command to resume"
            )
        if trec is not None:
            write_run({q: dict(zip(rows[q]["doc_ids"], rows[q]["scores"])) for q in qids}, trec, tag=tag)
        if parquet is not None:
            _write_parquet([rows[q] for q in qids], Path(parquet))
        return {"rows": len(qids), "duplicates_dropped": self.duplicates}


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """``rows`` as one Parquet file at ``path``, atomically (temporary file, fsync, rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
