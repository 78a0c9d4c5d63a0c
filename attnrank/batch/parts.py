"""Reading a checkpoint's committed parts back, part by part: the rows of a finished batch run
are looked up by query id and written out without holding them all as Python objects.

Why: :meth:`~attnrank.batch.sink.CheckpointSink.finish` loaded every saved row as a dict (about
43 KB a query at k=100: 855 MB for 20,000 queries, some 40 GB for a million), at the end of a run
of hours and again at every resume, which could then never finish. Now it keeps one
(part, row) position and a hit count per query, and at most :data:`CACHED_PARTS` parts' rows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError

CACHED_PARTS = 8  # parts whose rows are held at once (64 rows a part by default: ~20 MB at k=100)


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
    """The committed rows of ``parts``, by query id: the first row of each id where a part holds
    it again (written twice by an interrupt; ``same(a, b)`` must hold of the two, else the
    checkpoint mixes runs: an :class:`InputError`)."""

    def __init__(self, parts: Sequence[Path], folder: Path, same: Any):
        import pyarrow.compute as pc

        self.parts, self.folder = list(parts), folder
        self.where: dict[str, tuple[int, int]] = {}
        self.hits: dict[str, int] = {}
        self._cache: OrderedDict[int, list[dict[str, Any]]] = OrderedDict()
        for p, part in enumerate(self.parts):
            table = read_part(part, columns=["qid", "doc_ids"])
            counts = pc.list_value_length(table.column("doc_ids")).to_pylist()
            for r, (qid, n) in enumerate(zip(table.column("qid").to_pylist(), counts)):
                first = self.where.setdefault(qid, (p, r))
                if first != (p, r) and not same(self._row(*first), self._row(p, r)):
                    raise InputError(
                        f"query {qid!r} has two different rows in {folder} (one in {part.name}); the "
                        "checkpoint mixes runs: delete it and rerun"
                    )
                self.hits.setdefault(qid, n or 0)

    def __contains__(self, qid: str) -> bool:
        return qid in self.where

    def row(self, qid: str) -> dict[str, Any]:
        return self._row(*self.where[qid])

    def _row(self, part: int, row: int) -> dict[str, Any]:
        rows = self._cache.get(part)
        if rows is None:
            rows = read_part(self.parts[part]).to_pylist()
            self._cache[part] = rows
            if len(self._cache) > CACHED_PARTS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(part)
        return rows[row]

    def schema(self, metadata: Mapping[bytes, bytes]) -> Any:
        """The parts' schemas as one (a part of queries without hits has null-typed lists), with ``metadata``."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.unify_schemas([pq.read_schema(p) for p in self.parts], promote_options="permissive")
        return schema.with_metadata({**(schema.metadata or {}), **metadata})


class LazyRun(Mapping[str, Mapping[str, float]]):
    """``{query id: {doc id: score}}`` of ``qids`` in order, each read from ``rows`` when asked
    (``scores(row)``: the row's ranking as :func:`~attnrank.eval.write_run` takes it)."""

    def __init__(self, rows: PartRows, qids: Sequence[str], scores: Any):
        self.rows, self.qids, self.scores = rows, list(qids), scores

    def __getitem__(self, qid: str) -> Mapping[str, float]:
        return self.scores(self.rows.row(qid))

    def __iter__(self) -> Iterator[str]:
        return iter(self.qids)

    def __len__(self) -> int:
        return len(self.qids)
