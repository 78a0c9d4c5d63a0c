"""Checkpointed output of a batch run: Parquet parts committed atomically, one row per query.

Rows are buffered and committed as ``part-NNNNN.parquet`` files (written to a temporary name,
fsynced, renamed to a number no part has), so a part is either whole or absent and never replaces
another. A rerun reads the committed query ids and skips them (resume), after checking that each
still has the text it was run with. A query id already committed is never written again, so a Ray
task retried after an actor died cannot duplicate rows; :meth:`finish` checks that every query has
exactly one row before writing the TREC run and/or one consolidated Parquet file.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import BATCH_PARQUET_MARK, RUN_GUARD, atomic_path, is_batch_parquet, replace_guard
from .parts import LazyRun, PartRows, read_part

logger = logging.getLogger(__name__)

PART_FILE = re.compile(r"^part-(\d+)\.parquet$")  # a committed part (its number)


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
        numbers = [int(m[1]) for p in self._parts() if (m := PART_FILE.match(p.name))]
        self._next = max(numbers, default=-1) + 1  # after the last part, even if one was removed
        self._last = time.monotonic()

    def _parts(self) -> list[Path]:
        return sorted(self.dir.glob("part-*.parquet"))

    def _committed(self) -> dict[str, str]:
        done: dict[str, str] = {}
        for p in self._parts():
            t = read_part(p, columns=["qid", "query"])
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
        import pyarrow.parquet as pq

        self._last = time.monotonic()
        if not self.buffer:
            return
        # The rows and the part number are taken before the write: an interrupt after it (a Ctrl-C,
        # then the caller's final commit) can then neither write the rows again nor reuse the number.
        rows, self.buffer = self.buffer, []
        path = self.dir / f"part-{self._next:05d}.parquet"
        self._next += 1
        try:
            with atomic_path(path, clean=False) as tmp:  # (the folder's killed parts were cleared at start)
                pq.write_table(batch_table(rows), tmp)
        except BaseException:
            if not path.exists():  # not written: the next commit writes them
                self.buffer = rows + self.buffer
            raise
        self.done.update((r["qid"], r["query"]) for r in rows)

    def finish(self, qids: list[str], *, trec: Path | None, parquet: Path | None, tag: str) -> dict[str, Any]:
        """Commit, check one row per query, write the outputs (in ``qids`` order); returns counts."""
        from ..eval import write_run
        from ..eval.data import strictly_decreasing

        self.commit()
        # (read from an Arrow copy of the parts: every row held as a dict took ~39 KB a query at k=100)
        with PartRows(self._parts(), self.dir, lambda a, b: _key(a) == _key(b)) as rows:
            missing = [q for q in qids if q not in rows]
            if missing:
                raise InputError(
                    f"{len(missing)} queries have no row in {self.dir} (first: {missing[0]!r}; a stage failed); "
                    "rerun the same command to resume"
                )
            if parquet is not None:  # (its rows hold the queries without a hit too: written whatever the run)
                _write_parquet(rows, qids, Path(parquet))
            empty = [q for q in qids if not rows.hits[q]]
            if trec is not None and qids and len(empty) == len(qids):  # (an empty run, which eval and rerank refuse)
                raise InputError(
                    f"no query had a hit, so nothing was written to {trec}"
                    + (f" (the rows went to {parquet})" if parquet is not None else "")
                    + "; check the queries and the index (as `search -o` refuses it)"
                )
            if trec is not None:
                # checked again now: the run began hours ago, and only a file attnrank wrote is replaced
                # ties in each row's own order, as `search -o` writes them (trec_eval would order them by doc id)
                run = LazyRun(rows, qids, lambda row: strictly_decreasing(zip(row["doc_ids"], row["scores"])))
                write_run(run, trec, tag=tag, guard=RUN_GUARD)
        return {"rows": len(qids), "duplicates_dropped": self.duplicates, "no_hits": len(empty)}


def _write_parquet(rows: PartRows, qids: list[str], path: Path, chunk: int = 1024) -> None:
    """The rows of ``qids`` (in order) as one Parquet file at ``path``, ``chunk`` rows at a time,
    atomically (temporary file, fsync, rename)."""
    import pyarrow.parquet as pq

    schema = rows.schema.with_metadata({**(rows.schema.metadata or {}), **BATCH_PARQUET_MARK})
    guard = replace_guard(is_batch_parquet, "a batch Parquet file", "--parquet")
    with atomic_path(path, guard=guard) as tmp, pq.ParquetWriter(tmp, schema) as writer:
        for i in range(0, len(qids), chunk):
            writer.write_table(rows.take(qids[i : i + chunk]).replace_schema_metadata(schema.metadata))


def batch_table(rows: list[dict[str, Any]]) -> Any:
    """``rows`` as a ``pyarrow.Table`` whose schema carries :data:`attnrank.files.BATCH_PARQUET_MARK`
    (how an output attnrank may replace is recognised)."""
    import pyarrow as pa

    table = pa.Table.from_pylist(rows)
    return table.replace_schema_metadata({**(table.schema.metadata or {}), **BATCH_PARQUET_MARK})


def _key(row: dict[str, Any]) -> str:
    """A row compared by value, NaN equal to NaN (a stage that did not score a document)."""
    return json.dumps(row, sort_keys=True, default=str)
