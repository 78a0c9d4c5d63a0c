"""Checkpointed output of a batch run: Parquet parts committed atomically, one row per query.

Rows are buffered and committed as ``part-NNNNN.parquet`` files (written to a temporary name,
fsynced, renamed), so a part is either whole or absent. A rerun reads the committed query ids
and skips them (resume). A query id already committed is never written again, so a Ray task
retried after an actor died cannot duplicate rows; :meth:`finish` checks that every query has
exactly one row before writing the TREC run and/or one consolidated Parquet file.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from ..errors import InputError

logger = logging.getLogger(__name__)


class CheckpointSink:
    """Commit rows to ``parts_dir``; ``commit_rows`` rows or ``commit_seconds`` per part."""

    def __init__(self, parts_dir: str | Path, *, commit_rows: int = 64, commit_seconds: float = 30.0):
        self.dir = Path(parts_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(".part-*.tmp"):  # a part whose write was interrupted
            stale.unlink()
        self.commit_rows, self.commit_seconds = commit_rows, commit_seconds
        self.done: set[str] = set(self._committed_ids())
        self.buffer: list[dict[str, Any]] = []
        self.duplicates = 0
        self._next = len(self._parts())
        self._last = time.monotonic()

    def _parts(self) -> list[Path]:
        return sorted(self.dir.glob("part-*.parquet"))

    def _committed_ids(self) -> list[str]:
        import pyarrow.parquet as pq

        ids: list[str] = []
        for p in self._parts():
            ids.extend(pq.read_table(p, columns=["qid"]).column("qid").to_pylist())
        return ids

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
        final = self.dir / f"part-{self._next:05d}.parquet"
        tmp = self.dir / f".{final.name}.tmp"
        pq.write_table(pa.Table.from_pylist(self.buffer), tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        self.done.update(r["qid"] for r in self.buffer)
        self._next += 1
        self.buffer = []

    def read_all(self):
        """Every committed row as one ``pyarrow.Table``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        return pa.concat_tables([pq.read_table(p) for p in self._parts()])

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
            import pyarrow as pa
            import pyarrow.parquet as pq

            tmp = parquet.with_name(f".{parquet.name}.tmp")
            pq.write_table(pa.Table.from_pylist([rows[q] for q in qids]), tmp)
            os.replace(tmp, parquet)
        return {"rows": len(qids), "duplicates_dropped": self.duplicates}
