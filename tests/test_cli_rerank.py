from __future__ import annotations

from typer.testing import CliRunner

from attnrank.cli import app
from attnrank.eval import read_run

runner = CliRunner()


def test_rerank_run_file(tmp_path, dl19_mini, tiny_dir):
    out = tmp_path / "reranked.trec"
    r = runner.invoke(
        app,
        [
            "rerank",
            "--run",
            str(dl19_mini / "run.bm25.trec"),
            "--queries",
            str(dl19_mini / "topics.tsv"),
            "--corpus",
            str(dl19_mini / "passages.jsonl"),
            "--depth",
            "3",
            "--model",
            str(tiny_dir),
            "--heads",
            "1-0,2-3",
            "-o",
            str(out),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    first, again = read_run(dl19_mini / "run.bm25.trec"), read_run(out)
    assert again.keys() == first.keys()
    for qid, docs in first.items():
        ranked = sorted(again[qid], key=lambda d: -again[qid][d])
        by_first = sorted(docs, key=lambda d: -docs[d])
        assert set(ranked[:3]) == set(by_first[:3])  # the head is reordered among itself
        assert ranked[3:] == by_first[3:]  # the tail keeps its first-stage order


def test_rerank_reports_missing_documents(tmp_path, dl19_mini, tiny_dir):
    (tmp_path / "c.jsonl").write_text('{"id": "x", "text": "unrelated"}\n')
    r = runner.invoke(
        app,
        [
            "rerank",
            "--run",
            str(dl19_mini / "run.bm25.trec"),
            "--queries",
            str(dl19_mini / "topics.tsv"),
            "--corpus",
            str(tmp_path / "c.jsonl"),
            "--model",
            str(tiny_dir),
            "-o",
            str(tmp_path / "o"),
            "-q",
        ],
    )
    assert r.exit_code != 0 and "is not in the corpus/index" in str(r.exception)
