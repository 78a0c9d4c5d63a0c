"""Reading batch queries: every format gives a query the same id."""

from __future__ import annotations

import pytest

from attnrank.errors import InputError


def test_parquet_query_ids_read_as_jsonl_ones(tmp_path):
    """A float id column (pandas writes one where a value is missing) gave "1.0" from Parquet and
    "1" from JSONL: the same queries got other ids by format, and stopped matching their qrels."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from attnrank.batch.rows import read_queries

    pq.write_table(pa.table({"id": [1.0, 2.0], "text": ["a", "b"]}), tmp_path / "q.parquet")
    assert read_queries(tmp_path / "q.parquet") == {"1": "a", "2": "b"}
    pq.write_table(pa.table({"id": [1.0, 2.5], "text": ["a", "b"]}), tmp_path / "f.parquet")
    with pytest.raises(InputError, match="row 2: query id 2.5 is a JSON number that has a fraction"):
        read_queries(tmp_path / "f.parquet")


def test_parquet_query_texts_that_are_not_strings_are_named_so(tmp_path):
    """A binary or list text column was reported as "query 'q1' is empty"."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from attnrank.batch.rows import read_queries

    pq.write_table(pa.table({"id": ["q1"], "text": [b"red apples"]}), tmp_path / "b.parquet")
    with pytest.raises(InputError, match="column 'text' holds binary values, not strings"):
        read_queries(tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": ["q1"], "text": [["red", "apples"]]}), tmp_path / "l.parquet")
    with pytest.raises(InputError, match=r"column .text. holds list<\w+: string> values, not strings"):
        read_queries(tmp_path / "l.parquet")


def test_a_parquet_queries_files_duplicate_and_blank_rows_are_named_by_row(tmp_path):
    """A duplicate id (' b' beside 'b', trimmed alike) and a blank text named the file alone."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from attnrank.batch.rows import read_queries

    pq.write_table(pa.table({"id": ["a", "b", "c", " b"], "text": ["x", "y", "z", "w"]}), tmp_path / "d.parquet")
    with pytest.raises(InputError, match=r"d\.parquet: row 4: duplicate query id 'b'"):
        read_queries(tmp_path / "d.parquet")
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "  "]}), tmp_path / "e.parquet")
    with pytest.raises(InputError, match=r"e\.parquet: row 2: query 'b' is empty"):
        read_queries(tmp_path / "e.parquet")
