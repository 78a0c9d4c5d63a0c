from __future__ import annotations

import gzip
import json

import pytest

from attnrank.corpus import load_corpus, load_queries
from attnrank.errors import InputError


def test_beir_folder(scifact_mini):
    docs, report = load_corpus(scifact_mini)
    assert len(docs) == 55 and report.loaded == 55 and not report.skipped
    assert docs[0].id and docs[0].title and docs[0].text


def test_jsonl_gz_and_metadata(tmp_path):
    p = tmp_path / "c.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps({"id": "a", "text": "alpha", "title": "T", "year": 2020}) + "\n\n")
        f.write(json.dumps({"_id": "b", "text": "beta"}) + "\n")
    docs, _ = load_corpus(p)
    assert [d.id for d in docs] == ["a", "b"] and docs[0].metadata == {"year": 2020}


def test_csv_and_tsv(tmp_path):
    (tmp_path / "c.csv").write_text('id,title,text\n1,One,"first, with comma"\n2,,second\n')
    docs, _ = load_corpus(tmp_path / "c.csv")
    assert [(d.id, d.title, d.text) for d in docs] == [("1", "One", "first, with comma"), ("2", "", "second")]
    (tmp_path / "c.tsv").write_text("docid\ttext\nx\thello\n")
    assert load_corpus(tmp_path / "c.tsv")[0][0].id == "x"


def test_csv_without_text_column(tmp_path):
    (tmp_path / "c.csv").write_text("id,body\n1,x\n")
    with pytest.raises(InputError, match=r"c\.csv:1: header .* lacks an 'id' and a 'text' column"):
        load_corpus(tmp_path / "c.csv")


def test_text_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("plain text")
    (tmp_path / "sub" / "b.md").write_text("# Heading\n\nbody")
    (tmp_path / "ignored.bin").write_bytes(b"\x00")
    docs, _ = load_corpus(tmp_path)
    assert [(d.id, d.title) for d in docs] == [("a.txt", ""), ("sub/b.md", "Heading")]


def test_duplicate_id_names_file_and_line(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "a", "text": "z"}\n')
    with pytest.raises(InputError, match=r"c\.jsonl:3: duplicate document id 'a'"):
        load_corpus(p)


def test_empty_text_and_skip_flag(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "  "}\nnot json\n')
    with pytest.raises(InputError, match=r"c\.jsonl:2: document 'b' has empty text"):
        load_corpus(p)
    docs, report = load_corpus(p, skip_invalid=True)
    assert [d.id for d in docs] == ["a"]
    assert [w.rsplit(":", 1)[1] for w, _ in report.skipped] == ["2", "3"]
    assert "invalid JSON" in report.skipped[1][1]


def test_undecodable_bytes(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"c\.jsonl:2: bytes that are not valid UTF-8.*re-encode"):
        load_corpus(p)


def test_empty_corpus(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("\n")
    with pytest.raises(InputError, match="no documents found"):
        load_corpus(p)


def test_missing_path_and_unknown_format(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_corpus(tmp_path / "nope.jsonl")
    (tmp_path / "c.parquet").write_bytes(b"x")
    with pytest.raises(InputError, match="unknown corpus format '.parquet'"):
        load_corpus(tmp_path / "c.parquet")


def test_queries_jsonl_and_tsv(scifact_mini, tmp_path):
    q = load_queries(scifact_mini / "queries.jsonl")
    assert len(q) == 12
    (tmp_path / "q.tsv").write_text("1\tfirst query\n2\tsecond\n")
    assert load_queries(tmp_path / "q.tsv") == {"1": "first query", "2": "second"}
    (tmp_path / "bad.tsv").write_text("1\tok\n2\t \n")
    with pytest.raises(InputError, match=r"bad\.tsv:2: query '2' is empty"):
        load_queries(tmp_path / "bad.tsv")
