"""Query sets (attnrank.queries): BEIR queries.jsonl and id<TAB>text TSV, as load_queries reads them."""

from __future__ import annotations

import gzip

import pytest

from attnrank.errors import InputError
from attnrank.queries import load_queries


def test_queries_jsonl_and_tsv(scifact_mini, tmp_path):
    q = load_queries(scifact_mini / "queries.jsonl")
    assert len(q) == 12
    (tmp_path / "q.tsv").write_text("1\tfirst query\n2\tsecond\n")
    assert load_queries(tmp_path / "q.tsv") == {"1": "first query", "2": "second"}
    (tmp_path / "bad.tsv").write_text("1\tok\n2\t \n")
    with pytest.raises(InputError, match=r"bad\.tsv:2: query '2' is empty"):
        load_queries(tmp_path / "bad.tsv")
    (tmp_path / "invisible.tsv").write_text("1\tok\n2\t\u200b\n", encoding="utf-8")  # a zero-width space alone
    with pytest.raises(InputError, match=r"invisible\.tsv:2: query '2' is empty"):
        load_queries(tmp_path / "invisible.tsv")


def test_queries_jsonl_needs_an_id_and_a_text(tmp_path):
    for i, line in enumerate(['{"qid": "1", "text": "x"}', '{"_id": "1", "text": null}']):
        (tmp_path / f"q{i}.jsonl").write_text(line + "\n")
        with pytest.raises(InputError, match=r":1: expected a JSON object with '_id'"):
            load_queries(tmp_path / f"q{i}.jsonl")


def test_tsv_query_without_an_id_is_refused(tmp_path):
    (tmp_path / "q.tsv").write_text("q1\tfirst\n\tsecond\n")
    with pytest.raises(InputError, match=r"q\.tsv:2: empty query id"):
        load_queries(tmp_path / "q.tsv")


@pytest.mark.parametrize("name", ["queries.json", "queries.ndjson", "QUERIES.JSONL"])
def test_queries_read_json_lines_under_the_names_load_corpus_accepts(tmp_path, name):
    """load_corpus reads .json/.ndjson as JSON lines; load_queries read them as TSV and failed
    with "expected 'id<TAB>text'" on every valid record."""
    (tmp_path / name).write_text('{"_id": "q1", "text": "first query"}\n{"_id": "q2", "text": "second"}\n')
    assert load_queries(tmp_path / name) == {"q1": "first query", "q2": "second"}


def test_a_queries_tsv_header_is_not_a_query(tmp_path):
    from attnrank.queries import load_queries

    p = tmp_path / "q.tsv"
    p.write_text("id\ttext\nq1\tkyoto temples\n")
    assert load_queries(p) == {"q1": "kyoto temples"}
    p.write_text("q1\tkyoto temples\nid\ttext\n")  # only a first line can be a header
    assert load_queries(p) == {"q1": "kyoto temples", "id": "text"}


def test_a_queries_tsv_with_a_third_column_is_refused(tmp_path):
    """The third column was kept in the query's text ("what is covid\\t2020") and searched."""
    p = tmp_path / "q.tsv"
    p.write_text("q1\twhat is covid\t2020\n")
    with pytest.raises(InputError, match="q.tsv:1: 3 tab-separated field\\(s\\), expected 'id<TAB>text'"):
        load_queries(p)
    p.write_text("q1\twhat is covid\t\n")  # a trailing tab is not a column
    assert load_queries(p) == {"q1": "what is covid"}


def test_queries_tsv_with_old_mac_line_endings(tmp_path):
    """A file of lone carriage returns was one "line", refused as "a query cannot hold a tab"; the
    corpus TSV reader already split such files."""
    from attnrank.queries import load_queries

    path = tmp_path / "q.tsv"
    path.write_bytes(b"q1\tfirst query\rq2\tsecond query\r")
    assert load_queries(path) == {"q1": "first query", "q2": "second query"}
    # a carriage return inside a line of a file with line feeds is text, not a line ending (the
    # whole file was split at carriage returns only: query 2 came out as 'bar\n2')
    path.write_bytes(b"1\tfoo\rbar\n2\tbaz\n")
    assert list(load_queries(path)) == ["1", "2"]
    path.write_bytes(b"q1\tfoo\rbar baz\n")  # one line, ended by a line feed
    assert list(load_queries(path)) == ["q1"]
    path.write_bytes(b"q1\tfirst query\rq2\tsecond query\r\n")  # old Mac, its last line ended by CR LF
    assert load_queries(path) == {"q1": "first query", "q2": "second query"}


def test_a_queries_header_with_another_column_name_is_not_a_query(tmp_path):
    """ "id<TAB>question" was read as a query named "id" (only a fixed list of names counted)."""
    (tmp_path / "q.tsv").write_text("id\tquestion\n1\twhat is x\n")
    assert load_queries(tmp_path / "q.tsv") == {"1": "what is x"}
    (tmp_path / "q2.tsv").write_text("qid\twhat is the id of x\n")  # a real query: more than one word
    assert load_queries(tmp_path / "q2.tsv") == {"qid": "what is the id of x"}
    # TREC's and others' names: "topic_id<TAB>title" and "number<TAB>question" were searched as queries
    for header in ("topic_id\ttitle", "number\tquestion", "topic\tdescription"):
        (tmp_path / "q3.tsv").write_text(f"{header}\n1\twhat is x\n")
        assert load_queries(tmp_path / "q3.tsv") == {"1": "what is x"}, header


def test_a_truncated_gzip_queries_file_is_one_line_naming_it(tmp_path):
    whole = gzip.compress(("q1\tsome query\n" * 300).encode())
    cut = tmp_path / "q.tsv.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"q.tsv.gz: not a complete gzip file"):
        load_queries(cut)


def test_queries_given_as_a_dict_are_named_not_a_type_error():
    with pytest.raises(InputError, match="load_queries takes a file's path, not a dict"):
        load_queries({"q": "x"})
