"""Reading a checkpoint's committed parts back for the outputs of a finished batch run, without
holding its rows as Python objects.

Why: :meth:`~attnrank.batch.sink.CheckpointSink.finish` loaded every saved row as a dict (about
39 KB a query at k=100: 194 MB for 5,000 queries, some 40 GB for a million), at the end of a run
of hours and again at every resume, which could then never finish. The parts are now copied once,
in their order, into one Arrow file in the checkpoint folder (:data:`FINISH_FILE`'s temporary
sibling), which is read memory-mapped: the rows of a query are taken from it by position, in any
order, decoding only what is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import remove_stale_temps, sibling

FINISH_FILE = "finish.arrow"  # (the name its temporary sibling is made from; never kept)


def read_part(part: Path, columns: list[str] | None = None) -> Any:
    """The table of the committed part ``part``; a part that cannot be read (truncated or damaged
    by a disk or a copy: its rename made it whole when written) is an :class:`InputError` naming
    it, not pyarrow's traceback. Deleting it is safe: its queries count as not run, and run again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(part, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise InputError(
            f"checkpoint part {part} cannot be read ({str(e).splitlines()[0]}); delete it (its queries are run "
            "again on resume) or the whole checkpoint"
        ) from None


class PartRows:
    """The committed rows of ``parts`` (in ``folder``), by query id: the first row of each id where
    a part holds it again (written twice by an interrupt; ``same(a, b)`` must hold of the two
    rows, else the checkpoint mixes runs: an :class:`InputError`). Use as a context manager: the
    Arrow copy is removed on exit."""

    def __init__(self, parts: Sequence[Path], folder: Path, same: Callable[[dict, dict], bool]):
        self.parts, self.folder, self.same = list(parts), folder, same
        self.where: dict[str, int] = {}  # query id -> its row's position in the copy
        self.hits: dict[str, int] = {}  # query id -> its number of results

    def __enter__(self) -> PartRows:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        remove_stale_temps(self.folder / FINISH_FILE)  # (a finish that was killed)
        self.path: Path | None = None
        if not self.parts:  # (no row at all: every query is missing, as the caller says)
            return self
        self.schema = pa.unify_schemas([pq.read_schema(p) for p in self.parts], promote_options="permissive")
        self.path = sibling(self.folder / FINISH_FILE, "tmp")
        try:
            with pa.OSFile(str(self.path), "wb") as sink, pa.ipc.new_file(sink, self.schema) as writer:
                at = 0
                for part in self.parts:  # (one part decoded at a time)
                    table = read_part(part).cast(self.schema)
                    writer.write_table(table)
                    counts = pc.list_value_length(table.column("doc_ids")).to_pylist()
                    for r, (qid, n) in enumerate(zip(table.column("qid").to_pylist(), counts)):
                        self.hits.setdefault(qid, n or 0)
                        first = self.where.setdefault(qid, at + r)
                        again = first != at + r
                        if again and not self.same(self._row_of(first, table, at), table.slice(r, 1).to_pylist()[0]):
                            raise InputError(
                                f"query {qid!r} has two different rows in {self.folder} (one in {part.name}); "
                                "the checkpoint mixes runs: delete it and rerun"
                            )
                    at += len(table)
            self.table = pa.ipc.open_file(pa.memory_map(str(self.path))).read_all()
        except BaseException:
            self.path.unlink(missing_ok=True)
            raise
        return self

    def _row_of(self, position: int, table: Any, at: int) -> dict[str, Any]:
        """The row at ``position``: in ``table`` (the part being copied, from ``at``) or in the copy so far."""
        import pyarrow.parquet as pq

        if position >= at:
            return table.slice(position - at, 1).to_pylist()[0]
        for part in self.parts:  # (a duplicate: rare; its first row sits in an earlier part)
            n = pq.read_metadata(part).num_rows
            if position < n:
                return read_part(part).cast(self.schema).slice(position, 1).to_pylist()[0]
            position -= n
        raise AssertionError("a position within the parts")  # pragma: no cover

    def __exit__(self, *exc: object) -> None:
        self.table = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def __contains__(self, qid: str) -> bool:
        return qid in self.where

    def row(self, qid: str) -> dict[str, Any]:
        return self.table.slice(self.where[qid], 1).to_pylist()[0]

    def take(self, qids: Sequence[str]) -> Any:
        """The rows of ``qids``, in that order, as one Arrow table."""
        return self.table.take([self.where[q] for q in qids])


class LazyRun(Mapping[str, Mapping[str, float]]):
    """``{query id: {doc id: score}}`` of ``qids`` in order, each read from ``rows`` when asked
    (``scores(row)``: the row's ranking as :func:`~attnrank.eval.write_run` takes it)."""

    def __init__(self, rows: PartRows, qids: Sequence[str], scores: Callable[[dict], Mapping[str, float]]):
        self.rows, self.qids, self.scores = rows, list(qids), scores

    def __getitem__(self, qid: str) -> Mapping[str, float]:
        return self.scores(self.rows.row(qid))

    def __iter__(self) -> Iterator[str]:
        return iter(self.qids)

    def __len__(self) -> int:
        return len(self.qids)
