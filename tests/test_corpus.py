from __future__ import annotations

import gzip
import json
import logging

import pytest

from attnrank.corpus import load_corpus
from attnrank.errors import InputError
from attnrank.queries import load_queries


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
    assert docs[0].metadata == {}


def test_csv_columns_besides_id_title_text_are_metadata(tmp_path):
    """As a JSONL record's other keys are (they used to be dropped)."""
    (tmp_path / "c.csv").write_text("ID,url,Text,year\n1,https://x.org/a,first,2020\n")
    (tmp_path / "c.tsv").write_text("doc_id\ttext\tsource\na\thello\twiki\n")
    assert load_corpus(tmp_path / "c.csv")[0][0].metadata == {"url": "https://x.org/a", "year": "2020"}
    assert load_corpus(tmp_path / "c.tsv")[0][0].metadata == {"source": "wiki"}


def test_csv_without_text_column(tmp_path):
    (tmp_path / "c.csv").write_text("id,summary\n1,x\n")
    with pytest.raises(InputError, match=r"c\.csv:1: header .* lacks an id column .* and a text column \('text'"):
        load_corpus(tmp_path / "c.csv")


def test_the_names_other_tools_give_the_id_and_text_are_read(tmp_path):
    """Pyserini's JsonCollection ({"id", "contents"}), MS MARCO's "docid", a CSV's "body" were
    refused ("missing 'id'/'_id' or 'text'"), and the advice to skip such records skipped them all."""
    (tmp_path / "p.jsonl").write_text('{"id": "a", "contents": "alpha"}\n{"docid": "b", "body": "beta", "url": "u"}\n')
    docs, _ = load_corpus(tmp_path / "p.jsonl")
    assert [(d.id, d.text, d.metadata) for d in docs] == [("a", "alpha", {}), ("b", "beta", {"url": "u"})]
    (tmp_path / "c.csv").write_text("doc_id,title,Body\n1,T,one\n")
    assert [(d.id, d.title, d.text) for d in load_corpus(tmp_path / "c.csv")[0]] == [("1", "T", "one")]
    # "text" is the text beside another name (kept as metadata, as before); two others are refused
    (tmp_path / "t.jsonl").write_text('{"id": "a", "text": "alpha", "contents": "c"}\n')
    assert [(d.text, d.metadata) for d in load_corpus(tmp_path / "t.jsonl")[0]] == [("alpha", {"contents": "c"})]
    (tmp_path / "two.jsonl").write_text('{"id": "a", "contents": "alpha", "body": "b"}\n')
    with pytest.raises(InputError, match=r"two.jsonl:1: 'contents' and 'body' both name the text; keep one"):
        load_corpus(tmp_path / "two.jsonl")
    (tmp_path / "two.csv").write_text("id,body,passage\n1,a,b\n")
    with pytest.raises(InputError, match=r"'body' and 'passage' both name the text"):
        load_corpus(tmp_path / "two.csv")
    (tmp_path / "ids.jsonl").write_text('{"doc_id": "a", "docid": "b", "text": "x"}\n')
    with pytest.raises(InputError, match=r"'doc_id' and 'docid' both name the document id"):
        load_corpus(tmp_path / "ids.jsonl")


def test_a_tsv_field_quoted_over_several_lines_is_one_bad_record_not_a_cut_text(tmp_path):
    """A csv writer (or pandas) with a tab delimiter quotes a text that holds line breaks: the
    refusal named its second line (too few fields), and --skip-invalid, as advised, then kept the
    record cut at its first line (27 of a user's abstracts, one beginning with a quote), without a
    word. A text that begins with a quote, of its own, stays read as it is."""
    import csv

    path = tmp_path / "c.tsv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t")
        w.writerows(
            [["id", "title", "text"], ["1", "T1", "one"], ["2", "T2", "first\nsecond\nthird"], ["3", "T3", "x"]]
        )
    with pytest.raises(
        InputError, match=r"c.tsv:3: the field '\"first' opens a quote that line 4 goes on with.*as \.csv"
    ):
        load_corpus(path)
    docs, report = load_corpus(path, skip_invalid=True)
    assert [(d.id, d.text) for d in docs] == [("1", "one"), ("3", "x")] and [w for w, _ in report.skipped] == [
        f"{path}:3"
    ]
    (tmp_path / "plain.tsv").write_text('id\ttext\n1\t"Hello, he said\n2\tnormal\n')
    assert [d.text for d in load_corpus(tmp_path / "plain.tsv")[0]] == ['"Hello, he said', "normal"]


def test_a_header_that_is_no_header_or_uses_semicolons_is_named_as_such(tmp_path):
    """MS MARCO's collection.tsv (no header: id, text) was refused with its first passage, 1,500
    characters, printed as the "header"; an Excel CSV with ';' separators was said to lack the
    columns its header plainly names."""
    (tmp_path / "collection.tsv").write_text("0\t" + "word " * 300 + "\n1\tsecond\n")
    with pytest.raises(InputError, match=r"without a header \(MS MARCO's collection.tsv: id, text\) needs one") as e:
        load_corpus(tmp_path / "collection.tsv")
    assert len(str(e.value)) < 500
    (tmp_path / "excel.csv").write_text("id;title;text\n1;T;one\n")
    with pytest.raises(InputError, match=r"its one column 'id;title;text' holds a ';': save it with ',' separators"):
        load_corpus(tmp_path / "excel.csv")


def test_text_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("plain text")
    (tmp_path / "sub" / "b.md").write_text("# Heading\n\nbody")
    (tmp_path / "ignored.bin").write_bytes(b"\x00")
    docs, _ = load_corpus(tmp_path)
    assert [(d.id, d.title) for d in docs] == [("a.txt", ""), ("sub/b.md", "Heading")]


def test_a_markdown_file_alone_is_read_as_in_a_folder(tmp_path):
    """Alone, its front matter and heading stayed in the text (indexed) and its title was empty."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "note.md").write_text("---\ntitle: Scurvy\n---\n# Scurvy\n\nVitamin C prevents it.\n")
    (alone,), _ = load_corpus(tmp_path / "notes" / "note.md")
    (in_folder,), _ = load_corpus(tmp_path / "notes")
    assert (alone.id, alone.title, alone.text) == ("note.md", "Scurvy", "Vitamin C prevents it.")
    assert (in_folder.title, in_folder.text) == (alone.title, alone.text)


def test_a_text_folder_leaves_out_hidden_copies_and_takes_the_heading_out_of_the_text(tmp_path):
    """Jupyter's .ipynb_checkpoints copies became documents of their own (duplicate results); the
    heading was both the title and the text's first line (its words counted twice, as the two are
    read together); '#hashtag' was taken for a heading."""
    (tmp_path / "a.md").write_text("# Title\nbody words")
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "a-checkpoint.md").write_text("# Title\nbody words")
    (tmp_path / ".draft.md").write_text("hidden")
    (tmp_path / "tweet.md").write_text("#hashtag news\nmore")
    (tmp_path / "only.md").write_text("## Just a heading ##\n")
    (tmp_path / "lang.md").write_text("# Programming in C#\nbody")
    docs = {d.id: d for d in load_corpus(tmp_path)[0]}
    assert sorted(docs) == ["a.md", "lang.md", "only.md", "tweet.md"]
    assert docs["lang.md"].title == "Programming in C#"  # (a closing '#' run needs a space before it)
    assert (docs["a.md"].title, docs["a.md"].text) == ("Title", "body words")
    assert (docs["tweet.md"].title, docs["tweet.md"].text) == ("", "#hashtag news\nmore")
    assert (docs["only.md"].title, docs["only.md"].text) == ("Just a heading", "")


def test_a_text_folder_leaves_out_an_index_built_inside_it(tmp_path, caplog):
    """`attnrank index notes --index-dir notes/idx` (or `attnrank index .` with ./indexes) built, and
    then the folder was no corpus: the index's docs.jsonl was taken for a record file, refused. A
    folder that only looks like one (a manifest.json of another format) is read as before."""
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    (tmp_path / "a.txt").write_text("fleas bite")
    (tmp_path / "indexes").mkdir()
    HybridRetriever().index([Document("a.txt", "fleas bite")], show_progress=False).save(tmp_path / "indexes" / "n")
    with caplog.at_level(logging.INFO, logger="attnrank.corpus"):
        docs = load_corpus(tmp_path)[0]
    assert [d.id for d in docs] == ["a.txt"] and "an attnrank index, not part of the corpus" in caplog.text
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "manifest.json").write_text('{"format": "something else"}')
    (tmp_path / "other" / "b.txt").write_text("ticks too")
    assert [d.id for d in load_corpus(tmp_path)[0]] == ["a.txt", "other/b.txt"]


def test_a_text_folder_reads_each_subfolders_manifest_once(tmp_path, monkeypatch):
    """The folder walk runs twice (once without links, once through them); each folder's check
    for an index manifest ran in both."""
    import attnrank.corpus.folders as corpus

    for name in ("a", "b", "a/c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.txt").write_text("fleas bite")
    checked: list[str] = []
    real = corpus.is_index_folder
    monkeypatch.setattr(corpus, "is_index_folder", lambda p: checked.append(str(p)) or real(p))
    assert len(load_corpus(tmp_path)[0]) == 3
    assert sorted(checked) == sorted(str(tmp_path / n) for n in ("a", "b", "a/c"))


def test_markdown_front_matter_is_metadata_and_names_the_title(tmp_path):
    """A Jekyll/Hugo post's YAML front matter was read as the text's first lines (its keys and
    dates ranked as passage words) and hid the heading below it from the title."""
    (tmp_path / "post.md").write_text('---\ntitle: "Tea in Kyoto"\ndate: 2021-04-01\n---\n# Tea in Kyoto\nMatcha.')
    (tmp_path / "untitled.md").write_text("---\ntags: [a]\n...\n\n# Heading\nbody")
    (tmp_path / "rule.md").write_text("---\nA thematic break, never closed.")
    docs = {d.id: d for d in load_corpus(tmp_path)[0]}
    assert (docs["post.md"].title, docs["post.md"].text) == ("Tea in Kyoto", "Matcha.")
    assert (docs["untitled.md"].title, docs["untitled.md"].text) == ("Heading", "body")
    assert (docs["rule.md"].title, docs["rule.md"].text) == ("", "---\nA thematic break, never closed.")
    # prose between two thematic breaks is text, not metadata; a folded title is read whole
    (tmp_path / "breaks.md").write_text("---\n\nThe first section.\n\n---\n\nThe second section.\n")
    (tmp_path / "folded.md").write_text("---\ntitle: >\n  A long\n  title\n---\nBody.")
    docs = {d.id: d for d in load_corpus(tmp_path)[0]}
    assert "The first section." in docs["breaks.md"].text and docs["breaks.md"].title == ""
    assert (docs["folded.md"].title, docs["folded.md"].text) == ("A long title", "Body.")


def test_a_tsv_corpus_skips_a_line_of_tabs_and_spaces_as_query_files_do(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_text("id\ttext\n1\thello\n\t \t\n2\tworld\n")
    assert [d.id for d in load_corpus(path)[0]] == ["1", "2"]


def test_every_record_skipped_names_why(tmp_path):
    """With --skip-invalid, a file of bad records only said "no documents found": the reason was in
    the report the error kept from being printed."""
    path = tmp_path / "allbad.csv"
    path.write_text("id,text\n,hello\n,world\n")
    with pytest.raises(
        InputError, match=r"all 2 record\(s\) were skipped as invalid, the first at .*allbad.csv:2: empty"
    ):
        load_corpus(path, skip_invalid=True)


def test_csv_short_rows_keep_string_metadata_and_bad_bytes_name_their_line(tmp_path):
    """A field a short row leaves out was None in the metadata (documented as strings); a CSV's bad
    bytes named no line (JSONL and TSV do)."""
    path = tmp_path / "c.csv"
    path.write_text("id,text,source\n1,hello,web\n2,world\n")
    docs = load_corpus(path)[0]
    assert [d.metadata for d in docs] == [{"source": "web"}, {"source": ""}]
    path.write_bytes(b"id,text\n1,hello\n2,caf\xe9 au lait\n")
    with pytest.raises(InputError, match=r"c.csv:3: bytes that are not valid UTF-8 .* iconv"):
        load_corpus(path)


def test_a_text_folder_reads_linked_folders_and_refuses_record_files_without_a_corpus(tmp_path):
    """rglob does not enter linked folders (their documents were lost, exit 0); a folder of
    part-0.jsonl, part-1.jsonl and a README loaded the README alone."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "b.txt").write_text("linked text")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("plain text")
    (corpus / "linked").symlink_to(elsewhere)
    (corpus / "loop").symlink_to(corpus)  # walked once, not forever
    assert [d.id for d in load_corpus(corpus)[0]] == ["a.txt", "linked/b.txt"]
    parts = tmp_path / "parts"
    parts.mkdir()
    for name in ("part-0.jsonl", "part-1.jsonl", "README.md"):
        (parts / name).write_text('{"id": "d", "text": "t"}\n' if name.endswith("jsonl") else "# About\n")
    with pytest.raises(InputError, match=r"holds record files \(part-0.jsonl, part-1.jsonl\) but no corpus.jsonl"):
        load_corpus(parts)


def test_a_folder_reached_by_its_path_and_by_a_link_is_read_at_its_path(tmp_path):
    """The first path os.walk reached a folder by claimed it, in the file system's listing order:
    the same corpus gave ids "a_alias/x.txt" here and "b_real/x.txt" on a copy, and qrels written
    for one no longer matched the other (exit 0)."""
    corpus = tmp_path / "corpus"
    (corpus / "b_real").mkdir(parents=True)
    (corpus / "b_real" / "x.txt").write_text("real text")
    (corpus / "a_alias").symlink_to(corpus / "b_real")
    (corpus / "a" / "deeper").mkdir(parents=True)
    (corpus / "a" / "deeper" / "link").symlink_to(corpus / "c")
    (corpus / "c").mkdir()
    (corpus / "c" / "y.txt").write_text("more text")
    assert [d.id for d in load_corpus(corpus)[0]] == ["b_real/x.txt", "c/y.txt"]


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


def test_byte_order_mark_is_not_data(tmp_path):
    """Excel and Notepad start UTF-8 files with a BOM: it must not rename a column or an id."""
    bom = "\ufeff".encode()
    (tmp_path / "c.csv").write_bytes(bom + b"title,id,text\nOne,1,first\n")
    assert [(d.id, d.title) for d in load_corpus(tmp_path / "c.csv")[0]] == [("1", "One")]
    (tmp_path / "c.jsonl").write_bytes(bom + b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n')
    assert [d.id for d in load_corpus(tmp_path / "c.jsonl")[0]] == ["a", "b"]
    (tmp_path / "q.tsv").write_bytes(bom + b"q1\tfirst\nq2\tsecond\n")
    assert list(load_queries(tmp_path / "q.tsv")) == ["q1", "q2"]
    (tmp_path / "md").mkdir()
    (tmp_path / "md" / "a.md").write_bytes(bom + b"# Heading\n\nbody")
    assert load_corpus(tmp_path / "md")[0][0].title == "Heading"


def test_csv_row_with_extra_fields_is_reported_not_truncated(tmp_path):
    (tmp_path / "c.csv").write_text("id,text\n1,hello, world\n2,ok\n")
    with pytest.raises(InputError, match=r"c\.csv:2: 3 fields, the header names 2; quote a field"):
        load_corpus(tmp_path / "c.csv")
    docs, report = load_corpus(tmp_path / "c.csv", skip_invalid=True)
    assert [d.text for d in docs] == ["ok"] and report.skipped[0][0].endswith("c.csv:2")


def test_tsv_quotes_are_text_and_never_join_lines(tmp_path):
    (tmp_path / "c.tsv").write_text('id\ttext\n1\t"Hamlet" is a play\n2\t"an open quote\n3\tthird\n')
    docs, _ = load_corpus(tmp_path / "c.tsv")
    assert [(d.id, d.text) for d in docs] == [("1", '"Hamlet" is a play'), ("2", '"an open quote'), ("3", "third")]


def test_csv_quoting_errors_and_long_fields(tmp_path):
    (tmp_path / "open.csv").write_text('id,text\n1,ok\n2,"never closed\n3,third\n')
    with pytest.raises(InputError, match=r"open\.csv:3: broken CSV quoting"):
        load_corpus(tmp_path / "open.csv")
    (tmp_path / "dup.csv").write_text("id,text,text\n1,a,b\n")
    with pytest.raises(InputError, match="names a column twice"):
        load_corpus(tmp_path / "dup.csv")
    long = "word " * 60_000  # 300 KB, beyond the csv module's default field limit
    (tmp_path / "long.csv").write_text(f'id,text\n1,"{long}"\n2,"multi\nline"\n')
    docs, _ = load_corpus(tmp_path / "long.csv")
    assert [(d.id, len(d.text)) for d in docs] == [("1", len(long)), ("2", 10)]


def test_json_values_that_are_not_text_are_reported(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": "a", "text": ["x", "y"]}\n{"id": 7, "text": 3.5}\n')
    with pytest.raises(InputError, match=r"c\.jsonl:1: 'text' is a JSON list"):
        load_corpus(p)
    assert [(d.id, d.text) for d in load_corpus(p, skip_invalid=True)[0]] == [("7", "3.5")]


def test_csv_row_missing_its_text_field_is_reported_not_shifted(tmp_path):
    """A short row put its text under 'title' and loaded as a passage with no text (exit 0)."""
    (tmp_path / "c.csv").write_text("id,title,text\nd1,The whole passage text\nd2,T,real text\n")
    with pytest.raises(InputError, match=r"c\.csv:2: 2 fields, the header names 3: no 'text' field"):
        load_corpus(tmp_path / "c.csv")
    docs, report = load_corpus(tmp_path / "c.csv", skip_invalid=True)
    assert [(d.id, d.title, d.text) for d in docs] == [("d2", "T", "real text")]
    assert report.skipped[0][0].endswith("c.csv:2")
    (tmp_path / "c.tsv").write_text("id\ttext\ttitle\nd1\tsome text\n")  # only a title left off: still fine
    assert [(d.id, d.title, d.text) for d in load_corpus(tmp_path / "c.tsv")[0]] == [("d1", "", "some text")]


def test_a_nan_field_is_missing_not_the_text_nan(tmp_path):
    """json.dumps writes a missing (pandas NaN) title as NaN; it was loaded as the title "nan",
    which then prefixed the text every index reads. A NaN text is an empty text, an infinite one an error."""
    rows = ['{"id": "a", "title": NaN, "text": "Paris is big."}', '{"id": "b", "title": "B", "text": NaN}']
    (tmp_path / "c.jsonl").write_text("\n".join([*rows, '{"id": "c", "text": Infinity}']) + "\n")
    docs, report = load_corpus(tmp_path / "c.jsonl", skip_invalid=True)
    assert [(d.id, d.title, d.text) for d in docs] == [("a", "", "Paris is big."), ("b", "B", "")]
    assert docs[0].full_text == "Paris is big."
    assert len(report.skipped) == 1 and "'text' is a JSON float" in report.skipped[0][1]


def test_an_upper_case_gz_suffix_is_decompressed(tmp_path):
    """X.JSONL.GZ was read without decompressing (the suffix test was case-sensitive)."""
    path = tmp_path / "CORPUS.JSONL.GZ"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write('{"id": "d1", "text": "Paris is in France."}\n')
    docs, _ = load_corpus(path)
    assert [(d.id, d.text) for d in docs] == [("d1", "Paris is in France.")]


def test_ids_are_trimmed_in_every_format_as_qrels_read_them(tmp_path):
    """A padded id would never match its qrels line (split at whitespace); two ids equal once
    trimmed are duplicates, and an id of spaces is empty."""
    (tmp_path / "c.jsonl").write_text('{"_id": " d1 ", "text": "one"}\n{"_id": "d2", "text": "two"}\n')
    assert [d.id for d in load_corpus(tmp_path / "c.jsonl")[0]] == ["d1", "d2"]
    (tmp_path / "dup.jsonl").write_text('{"_id": "d1", "text": "one"}\n{"_id": "d1 ", "text": "two"}\n')
    with pytest.raises(InputError, match=r"dup\.jsonl:2: duplicate document id 'd1'"):
        load_corpus(tmp_path / "dup.jsonl")
    (tmp_path / "blank.jsonl").write_text('{"_id": "  ", "text": "one"}\n')
    with pytest.raises(InputError, match="empty document id"):
        load_corpus(tmp_path / "blank.jsonl")
    (tmp_path / "q.tsv").write_text("q1 \tfirst question\n")
    (tmp_path / "q.jsonl").write_text('{"_id": " q1", "text": "first question"}\n')
    assert load_queries(tmp_path / "q.tsv") == load_queries(tmp_path / "q.jsonl") == {"q1": "first question"}
    (tmp_path / "blank.tsv").write_text(" \tquestion\n")
    with pytest.raises(InputError, match="empty query id"):
        load_queries(tmp_path / "blank.tsv")


def test_a_json_array_corpus_is_refused_with_the_conversion(tmp_path):
    """Read as JSON Lines it failed at line 1 advising skip_invalid, which kept only stray lines."""
    from attnrank.corpus import load_corpus
    from attnrank.errors import InputError

    p = tmp_path / "c.json"
    p.write_text('[\n {"_id": "a", "text": "x"},\n {"_id": "b", "text": "y"}\n]\n')
    with pytest.raises(InputError, match=r"c.json is one JSON array; .* jq -c '\.\[\]' c.json > c.lines.jsonl"):
        load_corpus(p, skip_invalid=True)
    # a .jsonl one: the advice wrote over its input, which the shell empties before jq reads it
    same = tmp_path / "my corpus.jsonl"
    same.write_text('[{"_id": "a", "text": "x"}]\n')
    with pytest.raises(InputError, match=r"jq -c '\.\[\]' 'my corpus.jsonl' > 'my corpus.lines.jsonl'"):
        load_corpus(same)


def test_a_record_with_both_ids_keeps_them_only_where_they_agree(tmp_path):
    """Both '_id' and 'id': the second was dropped without a word; a null '_id' read as missing."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"_id": "a", "id": "a", "text": "same"}\n{"_id": null, "id": "b", "text": "null _id"}\n'
        '{"_id": "c", "id": "d", "text": "two ids"}\n'
    )
    with pytest.raises(InputError, match=r"c.jsonl:3: '_id' 'c' and 'id' 'd' differ"):
        load_corpus(corpus)
    docs, _ = load_corpus(corpus, skip_invalid=True)
    assert [d.id for d in docs] == ["a", "b"]
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"_id": "1", "id": "2", "text": "which?"}\n')
    with pytest.raises(InputError, match="'_id' '1' and 'id' '2' differ"):
        load_queries(queries)


def test_a_lone_surrogate_is_refused_while_reading(tmp_path):
    """It was read without complaint and refused only by the embedder, after the BM25 build and
    the embedder's load (a BM25-only search ran with it)."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b", "text": "x\\ud800y"}\n')
    with pytest.raises(InputError, match=r"c\.jsonl:2: document 'b' holds a lone surrogate"):
        load_corpus(corpus)
    docs, report = load_corpus(corpus, skip_invalid=True)
    assert [d.id for d in docs] == ["a"] and len(report.skipped) == 1
    corpus.write_text('{"_id": "a", "text": "fine", "source": "x\\ud800y"}\n')  # in metadata: failed the save
    with pytest.raises(InputError, match=r"c\.jsonl:1: document 'a' holds a lone surrogate"):
        load_corpus(corpus)
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"_id": "q1", "text": "why \\udfff"}\n')
    with pytest.raises(InputError, match=r"q\.jsonl:1: query 'q1' holds a lone surrogate"):
        load_queries(queries)


def test_a_carriage_return_inside_a_tsv_text_is_text():
    """The csv module ends a record at a lone carriage return: the text was cut there (kept as
    'hel' with skip_invalid, the rest skipped as a record), or the error named the next line."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.tsv"
        path.write_bytes(b"id\ttitle\ttext\n1\tT\thel\rlo world\n2\tU\tbye\r\n\n3\tV\tone\ttoo many\n")
        docs, report = load_corpus(path, skip_invalid=True)
        assert [(x.id, x.text) for x in docs] == [("1", "hel\rlo world"), ("2", "bye")]
        assert "c.tsv:5" in str(report.skipped)  # the line the bad record is on
        with pytest.raises(InputError, match=r"c\.tsv:5: 4 fields, the header names 3"):
            load_corpus(path)


def test_a_tsv_with_carriage_return_line_endings_still_reads():
    """Old Mac line endings (a lone carriage return between records): the csv module read them,
    and the line reader that replaced it took the whole file for its header."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.tsv"
        path.write_bytes(b"id\ttext\r1\thello\r2\tworld\r")
        assert [(x.id, x.text) for x in load_corpus(path)[0]] == [("1", "hello"), ("2", "world")]


def test_ids_are_kept_as_written_or_refused(tmp_path):
    """A JSON id 1.10 was read as "1.1" (and 1e3 as "1000.0"), matching no qrels that spell it as
    written: a fraction is refused, a whole float (pandas writes an id column with a gap so) is an
    integer. A CSV naming two id columns kept one and put the other in the metadata."""
    rows = ['{"id": 1.10, "text": "a"}', '{"id": 2.0, "text": "b"}', '{"_id": 7, "text": "c"}']
    (tmp_path / "c.jsonl").write_text("\n".join(rows) + "\n")
    docs, report = load_corpus(tmp_path / "c.jsonl", skip_invalid=True)
    assert [d.id for d in docs] == ["2", "7"]
    assert "id 1.1 is a JSON number that has a fraction; write the id as a string" in report.skipped[0][1]
    (tmp_path / "q.jsonl").write_text('{"_id": 1.5, "text": "a"}\n')
    with pytest.raises(InputError, match="query id 1.5 is a JSON number that has a fraction"):
        load_queries(tmp_path / "q.jsonl")
    (tmp_path / "big.jsonl").write_text('{"id": 1e16, "text": "a"}\n')
    with pytest.raises(InputError, match="is too large to be exact as a float"):
        load_corpus(tmp_path / "big.jsonl")
    (tmp_path / "c.csv").write_text("id,_id,text\n0,D17,hello\n")
    with pytest.raises(InputError, match=r"names the document id twice \('id', '_id'\)"):
        load_corpus(tmp_path / "c.csv")


@pytest.mark.parametrize("name", ["c.jsonl.gz", "c.csv.gz"])
def test_a_truncated_or_mislabelled_gzip_is_one_line_naming_the_file(tmp_path, name):
    """A download cut short raised EOFError (the CLI's bare "Aborted!"); a plain file named .gz
    raised "Not a gzipped file" without its path."""
    row = '{"id": "d1", "text": "some text"}\n' if "jsonl" in name else "id,text\nd1,some text\n"
    whole = gzip.compress((row * 200).encode())
    cut = tmp_path / name
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=rf"{name}: not a complete gzip file .*download it again"):
        load_corpus(cut)
    plain = tmp_path / f"plain-{name}"
    plain.write_text(row)
    with pytest.raises(InputError, match=rf"plain-{name}: not a complete gzip file"):
        load_corpus(plain)


def test_a_tsv_written_with_csv_quoting_is_refused_not_read_with_its_quotes(tmp_path):
    """csv.writer(delimiter="\\t") and pandas quote a field holding a quote: the text was read as
    '"He said ""hi"" to me"', exit 0."""
    import csv

    from attnrank.queries import load_queries

    corpus, queries = tmp_path / "c.tsv", tmp_path / "q.tsv"
    with corpus.open("w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows([["id", "text"], ["d1", 'He said "hi" to me']])
    with pytest.raises(InputError, match=r"c.tsv:2: the field .* looks quoted as CSV"):
        load_corpus(corpus)
    with queries.open("w", newline="") as f:
        csv.writer(f, delimiter="\t").writerow(["q1", 'what is "hi"?'])
    with pytest.raises(InputError, match=r"q.tsv:1: the field .* looks quoted as CSV"):
        load_queries(queries)
    corpus.write_text('id\ttext\nd1\tHe said "hi" to me\nd2\t"quoted" whole\n')  # quotes as text: read as written
    assert [d.text for d in load_corpus(corpus)[0]] == ['He said "hi" to me', '"quoted" whole']


def test_a_folder_names_what_it_leaves_out_and_refuses_a_beir_corpus_below_it(tmp_path, caplog):
    """notes.md beside beir/scifact/corpus.jsonl indexed the note alone, and a folder's .markdown,
    .rst files and broken links were dropped without a word, exit 0."""
    corpus = tmp_path / "notes"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.md").write_text("# A\nalpha\n")
    (corpus / "sub" / "b.markdown").write_text("# Bee\nbeta\n")
    (corpus / "c.rst").write_text("gamma\n")
    (corpus / "gone.txt").symlink_to(tmp_path / "missing.txt")
    with caplog.at_level(logging.WARNING, logger="attnrank.corpus"):
        docs = load_corpus(corpus)[0]
    assert [(d.id, d.title) for d in docs] == [("a.md", "A"), ("sub/b.markdown", "Bee")]
    assert "left out 1 file(s) that are not .txt/.md/.markdown files (e.g. c.rst)" in caplog.text
    assert "left out 1 link(s) that lead nowhere (e.g. gone.txt)" in caplog.text
    (corpus / "sub" / "table.csv").write_text("a,b\n1,2\n")  # (a table the notes carry: named, not refused)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnrank.corpus"):
        assert len(load_corpus(corpus)[0]) == 2
    assert "sub/table.csv" in caplog.text
    for part in ("beir/corpus.jsonl", "data/part-0.jsonl"):
        (corpus / "sub" / part).parent.mkdir(exist_ok=True)
        (corpus / "sub" / part).write_text('{"_id": "d", "text": "t"}\n')
        with pytest.raises(InputError, match=rf"holds record files \(sub/{part}\)"):
            load_corpus(corpus)
        (corpus / "sub" / part).unlink()


def test_skip_invalid_skips_a_tsv_line_quoted_as_csv(tmp_path):
    """The check raised past --skip-invalid, so one such line stopped the whole load."""
    p = tmp_path / "c.tsv"
    p.write_text('id\ttext\nd1\tplain\nd2\t"say ""hi"""\n')
    docs, report = load_corpus(p, skip_invalid=True)
    assert [d.id for d in docs] == ["d1"]
    assert report.skipped[0][0].endswith("c.tsv:3") and "looks quoted as CSV" in report.skipped[0][1]


def test_a_byte_order_mark_starting_a_later_line_is_no_part_of_its_id(tmp_path):
    """Files that each begin with a byte-order mark, joined: the second's first id kept it
    (strip() does not remove U+FEFF) and matched no qrels."""
    from attnrank.queries import load_queries

    (tmp_path / "q.tsv").write_bytes("\ufeffq1\tfirst\n\ufeffq5\tsecond\n".encode())
    assert list(load_queries(tmp_path / "q.tsv")) == ["q1", "q5"]
    (tmp_path / "c.tsv").write_bytes("id\ttext\nd1\tone\n\ufeffd2\ttwo\n".encode())
    assert [d.id for d in load_corpus(tmp_path / "c.tsv")[0]] == ["d1", "d2"]


def test_a_file_name_that_is_not_utf8_is_named_as_a_file_name(tmp_path):
    """A Latin-1 name (café.md on Linux) became an id with a lone surrogate, refused as if the text
    held one ("re-encode it as UTF-8", which the file's text needed not)."""
    import os

    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "ok.md").write_text("fine\n")
    with open(os.path.join(os.fsencode(folder), b"caf\xe9.md"), "w") as f:
        f.write("text\n")
    with pytest.raises(InputError, match=r"the file name 'caf\\udce9.md' is not valid UTF-8; rename the file"):
        load_corpus(folder)
    assert [d.id for d in load_corpus(folder, skip_invalid=True)[0]] == ["ok.md"]


def test_utf16_and_gzip_files_are_named_as_such_not_read_as_text(tmp_path):
    """UTF-16 without a byte-order mark decodes as UTF-8 (its NUL bytes too): a text folder indexed
    "G l a c i e r s", which no keyword matched, exit 0. And every file that was not UTF-8 got the
    one hint iconv -f latin1, which led a gzip or UTF-16 file into invalid JSON."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_bytes("Glaciers carve valleys.".encode("utf-16-le"))
    (folder / "b.txt").write_text("Rivers carry silt.", encoding="utf-8")
    with pytest.raises(InputError, match=r"a\.txt: NUL bytes in the text; it is UTF-16: .*iconv -f utf-16"):
        load_corpus(folder)
    docs, report = load_corpus(folder, skip_invalid=True)
    assert [d.id for d in docs] == ["b.txt"] and len(report.skipped) == 1
    single = tmp_path / "one.txt"
    single.write_bytes("Glaciers carve valleys.".encode("utf-16-le"))
    with pytest.raises(InputError, match=r"one\.txt: NUL bytes in the text; it is UTF-16"):
        load_corpus(single)
    packed = tmp_path / "c.jsonl"
    packed.write_bytes(gzip.compress(b'{"_id": "1", "text": "x"}\n'))
    with pytest.raises(
        InputError, match=r"c\.jsonl:1: bytes that are not valid UTF-8 .*it is gzip data: name it with \.gz"
    ):
        load_corpus(packed)
    wide = tmp_path / "w.jsonl"
    wide.write_bytes('{"_id": "1", "text": "x"}\n'.encode("utf-16"))  # (with its byte-order mark)
    with pytest.raises(InputError, match=r"w\.jsonl:1: bytes that are not valid UTF-8 .*it is UTF-16"):
        load_corpus(wide)


def test_the_recoding_hint_tells_utf16_from_a_stray_nul():
    """A UTF-8 file holding one NUL was told to iconv -f latin1 (which turns "Café" into "CafÃ©")."""
    from attnrank.records import recoding_hint

    assert recoding_hint("Café au lait, \x00".encode() * 3, decoded=True).startswith("remove its NUL bytes")
    assert recoding_hint("abcdef".encode("utf-16-le")).startswith("it is UTF-16")
    # Russian in UTF-16 without a byte-order mark is valid UTF-8: NULs only after its spaces (12 %)
    russian = "Привет мир, как дела? Всё хорошо, спасибо.".encode("utf-16-le")
    assert russian.decode("utf-8") and recoding_hint(russian, decoded=True).startswith("it is UTF-16")
    assert recoding_hint("第 1 章: 中文 文本, 没有 字节 顺序 标记.".encode("utf-16-le")).startswith("it is UTF-16")
    assert recoding_hint(b"caf\xe9 \x00").startswith("re-encode the file as UTF-8")  # (Latin-1, a stray NUL)
    assert recoding_hint(b"").startswith("re-encode the file as UTF-8")
    # the hint followed: Windows' text read as cp1252, not as latin1 (whose "–" is the control character \x96)
    hint = recoding_hint("Café – naïve".encode("cp1252"))
    assert "iconv -f cp1252 -t utf-8" in hint
    assert "Café – naïve".encode("cp1252").decode(hint.split("iconv -f ")[1].split()[0]) == "Café – naïve"


def test_a_jsonl_document_of_invisible_characters_is_refused(tmp_path):
    """A passage of U+200B alone was indexed, retrieved, and then refused by every reranker, so its
    query could not be reranked at all."""
    p = tmp_path / "c.jsonl"
    p.write_text('{"_id": "1", "text": "real"}\n{"_id": "2", "text": "\\u200b"}\n', encoding="utf-8")
    with pytest.raises(InputError, match="document '2' has empty text"):
        load_corpus(p)
    docs, report = load_corpus(p, skip_invalid=True)
    assert [d.id for d in docs] == ["1"] and len(report.skipped) == 1


@pytest.mark.parametrize("name", ["c.csv", "c.tsv"])
def test_an_empty_csv_or_tsv_is_named_empty(tmp_path, name):
    """A 0-byte file was refused as "header None lacks an 'id' and a 'text' column"."""
    (path := tmp_path / name).write_text("")
    with pytest.raises(InputError, match=rf"{name} is empty; give a header line"):
        load_corpus(path)


def test_a_beir_corpus_file_that_is_a_broken_link_is_named(tmp_path):
    """The folder was read as text files instead, which refused the dead link as a record file and
    the folder as one "with no corpus.jsonl of its own"."""
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    (tmp_path / "corpus.jsonl").symlink_to(tmp_path / "gone.jsonl")
    with pytest.raises(InputError, match=r"corpus.jsonl is a symbolic link that leads nowhere"):
        load_corpus(tmp_path)
    with gzip.open(tmp_path / "corpus.jsonl.gz", "wt") as f:  # beside a real one, as before: that one is read
        f.write('{"_id": "d1", "text": "x"}\n')
    assert [d.id for d in load_corpus(tmp_path)[0]] == ["d1"]


def test_a_metadata_object_is_the_documents_metadata_as_an_index_writes_it(tmp_path):
    """An index's own docs.jsonl ({"id", "title", "text", "metadata": {...}}) read back as a corpus
    nested every record's metadata under "metadata"."""
    from attnrank.index.retriever import HybridRetriever
    from attnrank.types import Document

    docs = [Document("a", "Paris is in France.", "", {"path": "notes/a.md", "n": 3}), Document("b", "Berlin.")]
    saved = HybridRetriever(fusion="rrf").index(docs, show_progress=False).save(tmp_path / "ix")
    back, _ = load_corpus(saved / "docs.jsonl")
    assert [(d.id, d.text, d.metadata) for d in back] == [(d.id, d.text, d.metadata) for d in docs]
    (tmp_path / "m.jsonl").write_text('{"id": "a", "text": "x", "lang": "en", "metadata": {"lang": "de"}}\n')
    with pytest.raises(InputError, match=r"m.jsonl:1: 'lang' is given beside 'metadata' and inside it"):
        load_corpus(tmp_path / "m.jsonl")
    (tmp_path / "s.jsonl").write_text('{"id": "a", "text": "x", "metadata": "not an object"}\n')
    assert load_corpus(tmp_path / "s.jsonl")[0][0].metadata == {"metadata": "not an object"}
